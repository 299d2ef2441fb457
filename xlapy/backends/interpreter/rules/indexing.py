"""Gather, scatter, dynamic-slice and dynamic-update-slice.

Both gather and scatter are evaluated as one NumPy fancy-indexing operation. For every
"batch" position (gather: each start index vector; scatter: each update window) the full
operand start is assembled: start_index_map / scatter_dims_to_operand_dims place the
components of the index vector, the operand batching dimensions take the position's own
batch coordinate, every other dimension starts at 0. Adding the window offsets (an iota per
window dimension, broadcast to the result or update shape) gives one operand index array
per operand dimension.

XLA's out-of-bounds rules: gather (and dynamic-slice / dynamic-update-slice) clamp each
start so that the whole slice lies inside the operand; scatter skips an update window
entirely when any part of it would fall outside. Scatter applies the updates in row-major
order of the update tensor, so duplicates and non-commutative combiners behave as on XLA's
CPU: combiners that are a single add/multiply/max/min/and/or or that replace use NumPy's
unbuffered `ufunc.at` or an ordered assignment; any other combiner runs in rounds in which
each target occurs once, the combiner lifted over the whole round (see _lifted.py).
"""

from __future__ import annotations

import math

import numpy as np

from xlapy.backends.interpreter.registry import evaluates
from xlapy.backends.interpreter.rules._lifted import call_elementwise
from xlapy.errors import EvaluationError
from xlapy.ir.computation import HloComputation
from xlapy.ir.opcodes import Opcode


def _start_scalar(value: np.ndarray) -> int:
    return int(np.asarray(value).reshape(()))


def _clamped_starts(instr, operand_dims, sizes, starts) -> list[int]:
    if len(starts) != len(operand_dims):
        raise EvaluationError(
            f"{instr.name}: expected {len(operand_dims)} start indices, got {len(starts)}"
        )
    return [
        min(max(_start_scalar(s), 0), dim - size)
        for s, dim, size in zip(starts, operand_dims, sizes, strict=True)
    ]


@evaluates(Opcode.DYNAMIC_SLICE)
def _dynamic_slice(instr, operands, ctx):
    operand, *starts = operands
    sizes = instr.dynamic_slice_sizes
    if any(s > d for s, d in zip(sizes, operand.shape, strict=False)):
        raise EvaluationError(
            f"{instr.name}: slice sizes {list(sizes)} exceed operand dims {list(operand.shape)}"
        )
    begin = _clamped_starts(instr, operand.shape, sizes, starts)
    window = tuple(slice(b, b + s) for b, s in zip(begin, sizes, strict=True))
    return np.array(operand[window], dtype=instr.shape.dtype)


@evaluates(Opcode.DYNAMIC_UPDATE_SLICE)
def _dynamic_update_slice(instr, operands, ctx):
    operand, update, *starts = operands
    if update.ndim != operand.ndim or any(
        u > d for u, d in zip(update.shape, operand.shape, strict=True)
    ):
        raise EvaluationError(
            f"{instr.name}: update {list(update.shape)} does not fit in operand "
            f"{list(operand.shape)}"
        )
    begin = _clamped_starts(instr, operand.shape, update.shape, starts)
    result = np.array(operand, dtype=instr.shape.dtype, copy=True)
    window = tuple(slice(b, b + s) for b, s in zip(begin, update.shape, strict=True))
    result[window] = update
    return result


# -- gather and scatter: shared index arithmetic -------------------------------------------


def _index_vectors(indices: np.ndarray, index_vector_dim: int) -> np.ndarray:
    """Indices with the index vector moved last (a trailing 1 when index_vector_dim is the
    rank), as int64: shape batch + (K,)."""
    idx = np.asarray(indices)
    if index_vector_dim == idx.ndim:
        idx = idx[..., None]
    else:
        idx = np.moveaxis(idx, index_vector_dim, -1)
    if idx.dtype.kind == "u":
        return np.minimum(idx.astype(np.uint64), np.iinfo(np.int64).max).astype(np.int64)
    return idx.astype(np.int64)


def _full_starts(
    vectors: np.ndarray,
    operand_rank: int,
    index_map,
    operand_batching_dims,
    indices_batching_dims,
    index_vector_dim: int,
) -> np.ndarray:
    """Operand start per batch position: shape batch + (operand_rank,)."""
    batch_shape = vectors.shape[:-1]
    starts = np.zeros((*batch_shape, operand_rank), dtype=np.int64)
    for k, d in enumerate(index_map):
        starts[..., d] = vectors[..., k]
    for operand_dim, indices_dim in zip(operand_batching_dims, indices_batching_dims, strict=True):
        axis = indices_dim if indices_dim < index_vector_dim else indices_dim - 1
        shape = [1] * len(batch_shape)
        shape[axis] = batch_shape[axis]
        starts[..., operand_dim] = np.arange(batch_shape[axis]).reshape(shape)
    return starts


def _operand_indices(
    starts: np.ndarray,
    out_rank: int,
    batch_positions,
    window_operand_dims,
    window_positions,
    window_sizes,
) -> tuple[np.ndarray, ...]:
    """One index array per operand dimension, broadcastable to the result (gather) or the
    update (scatter): start at the batch position plus the offset inside the window."""
    batch_shape = starts.shape[:-1]
    placed = [1] * out_rank
    for pos, size in zip(batch_positions, batch_shape, strict=True):
        placed[pos] = size
    index = []
    for d in range(starts.shape[-1]):
        value = starts[..., d].reshape(placed)
        if d in window_operand_dims:
            i = window_operand_dims.index(d)
            shape = [1] * out_rank
            shape[window_positions[i]] = window_sizes[i]
            value = value + np.arange(window_sizes[i]).reshape(shape)
        index.append(value)
    return tuple(index)


def _check_dims(instr, name, dims, rank):
    if any(not 0 <= d < rank for d in dims):
        raise EvaluationError(
            f"{instr.name}: {name}={{{','.join(map(str, dims))}}} is out of range for rank {rank}"
        )


@evaluates(Opcode.GATHER)
def _gather(instr, operands, ctx):
    operand, indices = operands
    a = instr.gather_dimension_numbers
    offset_dims = a.offset_dims
    collapsed = a.collapsed_slice_dims
    index_map = a.start_index_map
    operand_batching = a.operand_batching_dims
    indices_batching = a.start_indices_batching_dims
    index_vector_dim = a.index_vector_dim
    slice_sizes = a.slice_sizes
    if len(slice_sizes) != operand.ndim:
        raise EvaluationError(
            f"{instr.name}: slice_sizes has {len(slice_sizes)} entries for an operand of rank "
            f"{operand.ndim}"
        )
    for name, dims in (
        ("collapsed_slice_dims", collapsed),
        ("start_index_map", index_map),
        ("operand_batching_dims", operand_batching),
    ):
        _check_dims(instr, name, dims, operand.ndim)
    vectors = _index_vectors(indices, index_vector_dim)
    if vectors.shape[-1] != len(index_map):
        raise EvaluationError(
            f"{instr.name}: index vectors have {vectors.shape[-1]} components but "
            f"start_index_map has {len(index_map)}"
        )
    starts = _full_starts(
        vectors, operand.ndim, index_map, operand_batching, indices_batching, index_vector_dim
    )
    upper = np.array(operand.shape, dtype=np.int64) - np.array(slice_sizes, dtype=np.int64)
    starts = np.clip(starts, 0, np.maximum(upper, 0))
    window_operand_dims = [
        d for d in range(operand.ndim) if d not in collapsed and d not in operand_batching
    ]
    out_rank = instr.shape.rank
    batch_positions = [d for d in range(out_rank) if d not in offset_dims]
    if len(batch_positions) != vectors.ndim - 1 or len(offset_dims) != len(window_operand_dims):
        raise EvaluationError(
            f"{instr.name}: result rank {out_rank} does not match {vectors.ndim - 1} batch "
            f"dimensions and {len(window_operand_dims)} offset dimensions"
        )
    index = _operand_indices(
        starts,
        out_rank,
        batch_positions,
        window_operand_dims,
        offset_dims,
        [slice_sizes[d] for d in window_operand_dims],
    )
    if math.prod(operand.shape) == 0:
        return np.zeros(instr.shape.dims, dtype=instr.shape.dtype)
    result = operand[index]
    return np.array(np.broadcast_to(result, instr.shape.dims), dtype=instr.shape.dtype)


# -- scatter ------------------------------------------------------------------------------

# combiner root opcode -> NumPy ufunc applied with ufunc.at (bool arrays use the logical ones)
_AT_UFUNCS = {
    Opcode.ADD: np.add,
    Opcode.MULTIPLY: np.multiply,
    Opcode.MAXIMUM: np.maximum,
    Opcode.MINIMUM: np.minimum,
    Opcode.AND: np.bitwise_and,
    Opcode.OR: np.bitwise_or,
}
_REPLACE = "replace"


def _simple_combiner(comp: HloComputation, dtype: np.dtype):
    """The ufunc (or _REPLACE) a one-operand combiner amounts to, or None."""
    root = comp.root
    if comp.num_parameters != 2 or root is None:
        return None
    if root.opcode is Opcode.PARAMETER:
        return _REPLACE if root.parameter_number == 1 else None
    ufunc = _AT_UFUNCS.get(root.opcode)
    if ufunc is None or any(op.opcode is not Opcode.PARAMETER for op in root.operands):
        return None
    if [op.parameter_number for op in root.operands] not in ([0, 1], [1, 0]):
        return None
    if dtype.kind not in "biuf" or (dtype.kind == "f" and dtype.itemsize < 4):
        return None  # bf16/f16/f8: round each step in the type, like the general path
    if ufunc in (np.maximum, np.minimum) and dtype.kind == "f":
        return None  # NaN propagation and -0/+0 follow XLA's max/min rule, not NumPy's
    return ufunc


@evaluates(Opcode.SCATTER)
def _scatter(instr, operands, ctx):
    count = len(operands) // 2
    if len(operands) != 2 * count + 1 or count == 0:
        raise EvaluationError(
            f"{instr.name}: scatter takes N operands, the indices and N updates; got "
            f"{len(operands)} operands"
        )
    inputs = operands[:count]
    indices = operands[count]
    updates = operands[count + 1 :]
    a = instr.scatter_dimension_numbers
    window_dims = a.update_window_dims
    inserted = a.inserted_window_dims
    index_map = a.scatter_dims_to_operand_dims
    input_batching = a.input_batching_dims
    indices_batching = a.scatter_indices_batching_dims
    index_vector_dim = a.index_vector_dim
    combiner = instr.to_apply_or_none
    if combiner is None:
        raise EvaluationError(f"{instr.name}: scatter needs a to_apply combiner")
    operand_shape = inputs[0].shape
    update_shape = updates[0].shape
    rank = len(operand_shape)
    for name, dims in (
        ("inserted_window_dims", inserted),
        ("scatter_dims_to_operand_dims", index_map),
        ("input_batching_dims", input_batching),
    ):
        _check_dims(instr, name, dims, rank)
    vectors = _index_vectors(indices, index_vector_dim)
    if vectors.shape[-1] != len(index_map):
        raise EvaluationError(
            f"{instr.name}: index vectors have {vectors.shape[-1]} components but "
            f"scatter_dims_to_operand_dims has {len(index_map)}"
        )
    starts = _full_starts(
        vectors, rank, index_map, input_batching, indices_batching, index_vector_dim
    )
    window_operand_dims = [d for d in range(rank) if d not in inserted and d not in input_batching]
    scatter_positions = [d for d in range(len(update_shape)) if d not in window_dims]
    if len(window_operand_dims) != len(window_dims) or len(scatter_positions) != vectors.ndim - 1:
        raise EvaluationError(
            f"{instr.name}: updates of rank {len(update_shape)} do not match "
            f"{len(window_operand_dims)} window and {vectors.ndim - 1} scatter dimensions"
        )
    window_sizes = [update_shape[p] for p in window_dims]
    extent = np.ones(rank, dtype=np.int64)
    extent[window_operand_dims] = window_sizes
    # (starts <= shape - extent, not starts + extent <= shape: a start near the int64
    # limit, e.g. a clamped u64 index, would overflow)
    upper = np.array(operand_shape, dtype=np.int64) - extent
    in_bounds = np.all((starts >= 0) & (starts <= upper), axis=-1)

    index = _operand_indices(
        starts, len(update_shape), scatter_positions, window_operand_dims, window_dims, window_sizes
    )
    placed = [1] * len(update_shape)
    for pos, size in zip(scatter_positions, in_bounds.shape, strict=True):
        placed[pos] = size
    keep = np.broadcast_to(in_bounds.reshape(placed), update_shape).reshape(-1)
    if rank:
        flat = np.broadcast_to(
            np.ravel_multi_index(
                tuple(np.where(in_bounds.reshape(placed), i, 0) for i in index),
                operand_shape,
            ),
            update_shape,
        ).reshape(-1)[keep]
    else:
        flat = np.zeros(int(keep.sum()), dtype=np.int64)
    values = [np.asarray(u).reshape(-1)[keep] for u in updates]
    results = [
        np.array(x, dtype=s.dtype, copy=True).reshape(-1)
        for x, s in zip(inputs, _result_shapes(instr), strict=True)
    ]
    _apply_updates(ctx, combiner, results, flat, values)
    out = tuple(r.reshape(operand_shape) for r in results)
    return out if instr.shape.is_tuple else out[0]


def _result_shapes(instr):
    return instr.shape.tuple_shapes if instr.shape.is_tuple else (instr.shape,)


def _apply_updates(ctx, combiner, results, targets, values):
    """results[targets[i]] = combiner(results[targets[i]], values[i]) for i in order."""
    if len(targets) == 0:
        return
    if len(results) == 1:
        simple = _simple_combiner(combiner, results[0].dtype)
        if simple is _REPLACE:
            last = len(targets) - 1 - np.unique(targets[::-1], return_index=True)[1]
            results[0][targets[last]] = values[0][last]
            return
        if simple is not None:
            simple.at(results[0], targets, values[0].astype(results[0].dtype))
            return
    order = np.argsort(targets, kind="stable")
    sorted_targets = targets[order]
    first = np.searchsorted(sorted_targets, sorted_targets, side="left")
    occurrence = np.empty_like(order)
    occurrence[order] = np.arange(len(order)) - first
    for r in range(int(occurrence.max()) + 1):
        chosen = np.nonzero(occurrence == r)[0]
        where = targets[chosen]
        args = [res[where] for res in results] + [v[chosen] for v in values]
        new = call_elementwise(ctx, combiner, args)
        new = new if isinstance(new, tuple) else (new,)
        for res, n in zip(results, new, strict=True):
            res[where] = n
