# Indexing: dynamic-update-slice on the arena (DynamicUpdateSliceThunk: writes only the
# update's window; when buffer assignment put the result on its operand, in place, nothing
# else moves), and fast library implementations of gather and scatter for the row pattern
# JAX emits for `table[ids]`, `x.at[ids].op(u)` and segment sums. Both normally compile to
# native kernels (the emitter's gather rule, codegen/emit_scatter.py); these serve what the
# kernels decline.
#
# The pattern: no batching dimensions; the index vector addresses leading operand dims
# 0..m-1 (in any component order), each with a window of size 1 that the result collapses
# (gather) or the updates insert (scatter); every other operand dim takes the window
# [0, size). The operand is then a matrix of R = prod(leading dims) rows, one flat row
# number per index vector, and the op is row indexing:
#
# - gather clamps each component into [0, dim - 1] (XLA's clamp, since the window is 1) and
#   takes rows with np.take, then moves the batch dims to their result positions;
# - scatter skips an index vector with any component outside [0, dim - 1] (XLA skips the
#   whole window) and applies the update rows in row-major update order, as the interpreter
#   does: "replace" keeps the last write per row; a one-op combiner (add, multiply, and, or,
#   integer max / min) runs in rounds, round r combining every row's r-th update with one
#   vectorized op. When the most-hit row needs many rounds for the number of updated
#   elements (segment sums of narrow rows), `ufunc.at` on flat element indices runs instead:
#   it too applies the updates one at a time in index order. Either way each element sees
#   its updates in order, so float results match the interpreter's `ufunc.at` bit for bit.
# Everything else keeps the interpreter's rule. The CPU compiler runs one-operand scatters as
# native in-order loops (codegen/emit_scatter.py) whenever it can; `plan_scatter` serves
# the rest.

from __future__ import annotations

import math

import numpy as np

from xlapy.backends.cpu.runtime.loadable import loadable
from xlapy.backends.cpu.runtime.thunk import BufferSlice, ExecutionContext, Thunk
from xlapy.backends.interpreter.rules.indexing import _REPLACE, _simple_combiner
from xlapy.ir.instruction import HloInstruction

_MAX_ROUNDS = 256
# One round costs about as much as applying this many updated elements with ufunc.at on
# flat element indices (NumPy >= 1.25's fast ufunc.at); the cheaper of the two runs.
_ROUND_COST = 20_000


def _leading_map(index_map: tuple[int, ...], single_dims: tuple[int, ...]) -> bool:
    m = len(index_map)
    return sorted(index_map) == list(range(m)) and set(single_dims) >= set(index_map)


def _index_matrix(indices: np.ndarray, index_vector_dim: int) -> np.ndarray:
    """Index vectors as an int64 (batch..., K) array."""
    idx = (
        indices[..., None]
        if index_vector_dim == indices.ndim
        else np.moveaxis(indices, index_vector_dim, -1)
    )
    return idx.astype(np.int64, copy=False)


def _row_numbers(vectors, index_map, dims, clamp: bool):
    """Flat row numbers of the leading dims; with clamp=False also which are in bounds."""
    m = len(index_map)
    lead = dims[:m]
    strides = [math.prod(lead[d + 1 :]) for d in range(m)]
    rows = np.zeros(vectors.shape[:-1], np.int64)
    ok = None if clamp else np.ones(vectors.shape[:-1], bool)
    for k, d in enumerate(index_map):
        v = vectors[..., k]
        if clamp:
            v = np.clip(v, 0, lead[d] - 1)
        else:
            inside = (v >= 0) & (v < lead[d])
            ok &= inside
            v = np.where(inside, v, 0)
        rows += v * strides[d]
    return rows, ok


def _index_dtype_ok(shape) -> bool:
    dt = shape.dtype
    return dt.kind == "i" or (dt.kind == "u" and dt.itemsize < 8)


@loadable
def plan_gather(instr: HloInstruction):
    """A fast gather for the row pattern (see the file comment), or None."""
    operand, indices = instr.operands
    a = instr.gather_dimension_numbers
    if a.operand_batching_dims or a.start_indices_batching_dims:
        return None
    if not (operand.shape.is_array and indices.shape.is_array and _index_dtype_ok(indices.shape)):
        return None
    if operand.shape.dtype != instr.shape.dtype:
        return None
    dims = operand.shape.dims
    index_map = a.start_index_map
    collapsed = a.collapsed_slice_dims
    offset_dims = a.offset_dims
    sizes = a.slice_sizes
    ivd = a.index_vector_dim
    m = len(index_map)
    if not index_map or len(sizes) != len(dims) or 0 in dims:
        return None
    if not _leading_map(index_map, collapsed):
        return None
    if any(sizes[d] != 1 for d in index_map) or set(collapsed) - set(range(len(dims))):
        return None
    rest = list(range(m, len(dims)))
    window = tuple(slice(0, sizes[d]) if d not in collapsed else 0 for d in rest)
    kept = [d for d in rest if d not in collapsed]
    out_rank = instr.shape.rank
    batch_positions = [p for p in range(out_rank) if p not in offset_dims]
    if len(offset_dims) != len(kept):
        return None
    nb = len(batch_positions)
    perm = [0] * out_rank
    for i, p in enumerate(batch_positions):
        perm[p] = i
    for i, p in enumerate(offset_dims):
        perm[p] = nb + i
    R = math.prod(dims[:m])

    def run(values, out, ctx) -> bool:
        x, idx = values
        vectors = _index_matrix(np.asarray(idx), ivd)
        if vectors.shape[-1] != m or vectors.ndim - 1 != nb:
            return False
        rows, _ = _row_numbers(vectors, index_map, dims, clamp=True)
        table = x.reshape(R, *dims[m:])[(slice(None), *window)]
        got = np.take(table, rows, axis=0)
        np.copyto(out, got.transpose(perm), casting="no")
        return True

    return run


@loadable
def plan_scatter(instr: HloInstruction):
    """A fast one-operand scatter for the row pattern (see the file comment), or None."""
    if len(instr.operands) != 3 or not instr.shape.is_array:
        return None
    operand, indices, updates = instr.operands
    a = instr.scatter_dimension_numbers
    if a.input_batching_dims or a.scatter_indices_batching_dims:
        return None
    if not (operand.shape.is_array and updates.shape.is_array and _index_dtype_ok(indices.shape)):
        return None
    combiner = instr.to_apply_or_none
    simple = _simple_combiner(combiner, operand.shape.dtype) if combiner is not None else None
    if simple is None or updates.shape.dtype != operand.shape.dtype:
        return None
    dims = operand.shape.dims
    index_map = a.scatter_dims_to_operand_dims
    inserted = a.inserted_window_dims
    window_dims = a.update_window_dims
    ivd = a.index_vector_dim
    m = len(index_map)
    if not index_map or 0 in dims or set(inserted) != set(index_map):
        return None
    if not _leading_map(index_map, inserted):
        return None
    u_rank = updates.shape.rank
    nb = u_rank - len(window_dims)
    if window_dims != tuple(range(nb, u_rank)) or len(window_dims) != len(dims) - m:
        return None
    wsizes = updates.shape.dims[nb:]
    if any(w > d for w, d in zip(wsizes, dims[m:], strict=True)):
        return None
    window = tuple(slice(0, w) for w in wsizes)
    R = math.prod(dims[:m])
    row_size = math.prod(dims[m:])
    cols = np.arange(row_size, dtype=np.int64).reshape(dims[m:])[window].reshape(-1)
    n_updates = math.prod(updates.shape.dims[:nb])

    def run(values, out, ctx) -> bool:
        x, idx, upd = values
        if not out.flags.c_contiguous:
            return False  # reshaping it would copy, and the writes would be lost
        vectors = _index_matrix(np.asarray(idx), ivd)
        if vectors.shape[-1] != m or vectors.shape[:-1] != updates.shape.dims[:nb]:
            return False
        if np.may_share_memory(upd, out):
            upd = upd.copy()
        if not _same_view(x, out):
            if np.may_share_memory(x, out):
                x = x.copy()
            np.copyto(out, x)
        rows, ok = _row_numbers(vectors, index_map, dims, clamp=False)
        rows = rows.reshape(-1)
        ok = ok.reshape(-1)
        src = upd.reshape(n_updates, *wsizes)
        if not ok.all():
            rows, src = rows[ok], src[ok]
        if rows.size == 0:
            return True
        target = out.reshape(R, *dims[m:])[(slice(None), *window)]
        _combine_rows(simple, target, rows, src, out.reshape(-1), row_size, cols)
        return True

    return run


def _same_view(a: np.ndarray, b: np.ndarray) -> bool:
    return (
        a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
        and a.shape == b.shape
        and a.strides == b.strides
        and a.dtype == b.dtype
    )


def _combine_rows(simple, target, rows, src, flat, row_size: int, cols) -> None:
    """target[rows[i]] = combine(target[rows[i]], src[i]) for i in order; `flat` is the 1-D
    view under `target`, whose row r holds the elements r * row_size + cols."""
    if simple is _REPLACE:
        last = len(rows) - 1 - np.unique(rows[::-1], return_index=True)[1]
        target[rows[last]] = src[last]
        return
    most = int(np.bincount(rows, minlength=target.shape[0]).max())
    if most * _ROUND_COST > rows.size * cols.size or most > _MAX_ROUNDS:
        where = (rows[:, None] * row_size + cols).reshape(-1)
        simple.at(flat, where, src.reshape(-1))
        return
    small = rows.astype(np.uint16) if target.shape[0] <= 1 << 16 else rows
    order = np.argsort(small, kind="stable")  # 16-bit keys take NumPy's radix sort
    sorted_rows = rows[order]
    starts = np.flatnonzero(np.r_[True, sorted_rows[1:] != sorted_rows[:-1]])
    counts = np.diff(np.r_[starts, len(rows)])
    rank = (np.arange(len(rows)) - np.repeat(starts, counts)).astype(np.uint16)
    by_round = np.argsort(rank, kind="stable")  # updates of round 0, then round 1, ...
    bounds = np.searchsorted(rank[by_round], np.arange(most + 1), side="left")
    picked = order[by_round]
    bounds = np.r_[bounds, len(rows)]
    for r in range(len(bounds) - 1):
        chosen = picked[bounds[r] : bounds[r + 1]]
        where = rows[chosen]
        target[where] = simple(target[where], src[chosen])


class DynamicUpdateSliceThunk(Thunk):
    """Copies the operand into the result unless they share bytes, then writes the update
    at the clamped start indices."""

    kind = "library"

    def __init__(self, instr, operand: BufferSlice, update: BufferSlice, starts, out):
        self.instr, self.operand, self.update, self.starts, self.out = (
            instr,
            operand,
            update,
            tuple(starts),
            out,
        )
        self.in_place = operand.same_bytes(out)

    def run(self, ctx: ExecutionContext) -> None:
        if not self.in_place:
            np.copyto(ctx.view(self.out), ctx.view(self.operand))
        update = ctx.view(self.update)
        window = []
        for s, dim, size in zip(self.starts, self.out.shape.dims, update.shape, strict=True):
            begin = min(max(int(ctx.physical(s).reshape(())), 0), dim - size)
            window.append(slice(begin, begin + size))
        ctx.view(self.out)[tuple(window)] = update

    def describe(self) -> list[str]:
        note = "in place" if self.in_place else "copy, then update"
        return [
            f"library {self.instr.name} = dynamic-update-slice ({note})",
            f"operand: {self.operand}",
            f"update: {self.update}",
            f"out: {self.out}",
        ]
