# Fast library implementations of sort, topk, XLA's "TopK" and JAX's "ApproxTopK" custom calls.
#
# A sort comparator is recognized structurally as a lexicographic order on keys: its root is
# `compare(f(p[2i]), f(p[2i+1]))` with direction LT or GT (a key of operand i, ascending or
# descending; the parameters swapped flip the direction), or JAX's chain
# `or(lt(a, b), and(eq(a, b), <rest>))` for several keys. `f` is any scalar elementwise
# expression of the one parameter (JAX's NaN / -0 canonicalization, a convert, real/imag):
# it is evaluated once on the whole operand with the interpreter's rules, which gives
# exactly the values the comparator would compare. The compared values then become integer
# keys whose natural order is the comparison's order (the sign-magnitude flip for TOTALORDER
# floats; a float compare with a NaN key is not a strict weak order, so such a run falls back
# to the general merge sort), and NumPy's stable argsort / lexsort gives the one stable
# permutation, the same permutation the interpreter's stable merge sort produces.
# Descending keys use the bitwise complement, which reverses any integer order without
# overflow. Comparators that do not fit the pattern keep the interpreter's rule.
# Sorts of many rows split the rows (the blocks of another axis) over the pool
# (pool.split_over, its cost model deciding how many blocks): NumPy's argsort and gathers
# release the GIL, each row's permutation is the same whichever block sorts it, so results
# do not depend on the thread count.
#
# topk takes the k smallest of the (complemented, for largest) keys with ties by lower index.
# For 32-bit rows long against k it first prunes: a row is cut into G groups (group g holds the
# elements g, g + G, g + 2G, ..., so the group extremes are one elementwise max over row
# slices), and only the groups whose extreme is at least the k-th best extreme can hold a
# top-k element (the k groups with better extremes hold k elements strictly better than any
# element of a worse group). The few candidates become 64-bit words (order key << 32 | index),
# unique, so a partition and a sort of k words per row give values and ties exactly. A float
# row with a NaN skips the pruning. Otherwise: k rounds of argmin for small k on keys of up
# to 32 bits, or a partition around the k-th key plus a stable sort of the k chosen. Float
# keys with a NaN are built from the float64 value, as the interpreter does, so NaNs whose
# payloads differ only in the quiet bit tie there too.

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from xlapy.backends.cpu.runtime.loadable import loadable
from xlapy.backends.cpu.runtime.pool import split_over
from xlapy.backends.interpreter.rules._lifted import call_elementwise
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Category, Opcode

_SIGNED_OF_WIDTH = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_UNSIGNED_OF_WIDTH = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SMALL_K = 16
_GROUPS_PER_K = 16  # pruning groups per wanted element (the candidates: about k groups)
_MIN_GROUP = 4  # fewer elements per group prune too little to pay for the extra passes
_PRUNED_TYPES = frozenset({np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.uint32)})


@dataclass(frozen=True)
class SortKey:
    """One key of a lexicographic comparator: `expr` (None: the operand itself) of operand
    `operand`, compared with `kind` (TOTALORDER, FLOAT, SIGNED, UNSIGNED or None)."""

    operand: int
    expr: HloComputation | None
    descending: bool
    kind: str | None


# -- comparator recognition ----------------------------------------------------------------------


def _direction(instr: HloInstruction) -> str:
    return instr.comparison_direction or ""


def _kind(instr: HloInstruction) -> str | None:
    return instr.comparison_type


def _params_of(instr: HloInstruction, seen: dict[int, frozenset]) -> frozenset:
    key = id(instr)
    if key not in seen:
        if instr.opcode is Opcode.PARAMETER:
            seen[key] = frozenset({instr.parameter_number})
        else:
            found: frozenset = frozenset()
            for op in instr.operands:
                found |= _params_of(op, seen)
            seen[key] = found
    return seen[key]


def _scalar_elementwise(instr: HloInstruction) -> bool:
    if instr.opcode.category is Category.CONSTANT:
        return instr.shape.is_array and instr.shape.rank == 0
    if next(instr.called_computations(), None) is not None:
        return False
    return instr.opcode.is_elementwise and instr.shape.is_array and instr.shape.rank == 0


def _same_expr(a: HloInstruction, b: HloInstruction, pa: int, pb: int) -> bool:
    """Whether `b` is `a` with parameter `pa` replaced by parameter `pb` (and no other
    parameter used), built of scalar elementwise instructions only."""
    if not _scalar_elementwise(a) or not _scalar_elementwise(b):
        return False
    if a.opcode is Opcode.PARAMETER or b.opcode is Opcode.PARAMETER:
        return (
            a.opcode is b.opcode
            and a.parameter_number == pa
            and b.parameter_number == pb
            and a.shape == b.shape
        )
    if a.opcode is Opcode.CONSTANT or b.opcode is Opcode.CONSTANT:
        return a.opcode is b.opcode and a.shape == b.shape and a.literal == b.literal
    if a.opcode is not b.opcode or a.shape != b.shape or len(a.operands) != len(b.operands):
        return False
    if a.attrs != b.attrs:
        return False
    return all(_same_expr(x, y, pa, pb) for x, y in zip(a.operands, b.operands, strict=True))


def _key_pair(lhs: HloInstruction, rhs: HloInstruction, seen) -> tuple[int, bool] | None:
    """(operand number, swapped) when lhs/rhs are one expression of operand i's two
    comparator parameters (swapped: lhs uses the second one)."""
    params = _params_of(lhs, seen)
    if len(params) != 1:
        return None
    (p,) = params
    q = p + 1 if p % 2 == 0 else p - 1
    if not _same_expr(lhs, rhs, p, q):
        return None
    return p // 2, p % 2 == 1


def _key_for(
    cmp: HloInstruction, comparator: HloComputation, seen
) -> tuple[SortKey, HloInstruction] | None:
    """The key a LT/GT compare orders by, and the compare's lhs (to match its EQ)."""
    if cmp.opcode is not Opcode.COMPARE or _direction(cmp) not in ("LT", "GT"):
        return None
    lhs, rhs = cmp.operands
    pair = _key_pair(lhs, rhs, seen)
    if pair is None or not lhs.shape.is_array:
        return None
    operand, swapped = pair
    if lhs.shape.element_type.is_complex:
        return None
    descending = (_direction(cmp) == "GT") != swapped
    expr = None if lhs.opcode is Opcode.PARAMETER else _key_computation(lhs, comparator)
    return SortKey(operand, expr, descending, _kind(cmp)), lhs


def _key_computation(root: HloInstruction, comparator: HloComputation) -> HloComputation:
    copies: dict[int, HloInstruction] = {}

    def copy(instr: HloInstruction) -> HloInstruction:
        if id(instr) in copies:
            return copies[id(instr)]
        if instr.opcode is Opcode.PARAMETER:
            new = HloInstruction("key.param", Opcode.PARAMETER, instr.shape, [], {},
                                 parameter_number=0)  # fmt: skip
        else:
            new = HloInstruction(
                instr.name,
                instr.opcode,
                instr.shape,
                [copy(o) for o in instr.operands],
                instr.attrs,
                literal=instr.literal,
            )
        copies[id(instr)] = new
        return new

    new_root = copy(root)
    ordered: list[HloInstruction] = []

    def visit(instr: HloInstruction) -> None:
        if any(i is instr for i in ordered):
            return
        for o in instr.operands:
            visit(o)
        ordered.append(instr)

    visit(new_root)
    return HloComputation(f"{comparator.name}.key", ordered, new_root)


def _is_eq_of(instr: HloInstruction, lhs: HloInstruction, kind: str | None, seen) -> bool:
    if instr.opcode is not Opcode.COMPARE or _direction(instr) != "EQ" or _kind(instr) != kind:
        return False
    a, b = instr.operands
    params = _params_of(lhs, seen)
    (p,) = params
    q = p + 1 if p % 2 == 0 else p - 1
    return (_same_expr(lhs, a, p, p) and _same_expr(lhs, b, p, q)) or (
        _same_expr(lhs, b, p, p) and _same_expr(lhs, a, p, q)
    )


def match_comparator(comparator: HloComputation) -> list[SortKey] | None:
    """The keys a sort comparator orders by lexicographically, or None if it is not one of
    the recognized forms (see the file comment)."""
    seen: dict[int, frozenset] = {}
    keys: list[SortKey] = []
    node = comparator.root
    if node is None:
        return None
    while True:
        found = _key_for(node, comparator, seen)
        if found is not None:
            keys.append(found[0])
            return keys
        if node.opcode is not Opcode.OR or len(node.operands) != 2:
            return None
        matched = False
        for first, second in (node.operands, node.operands[::-1]):
            found = _key_for(first, comparator, seen)
            if found is None or second.opcode is not Opcode.AND or len(second.operands) != 2:
                continue
            for eq, rest in (second.operands, second.operands[::-1]):
                if _is_eq_of(eq, found[1], found[0].kind, seen):
                    keys.append(found[0])
                    node = rest
                    matched = True
                    break
            if matched:
                break
        if not matched:
            return None


# -- keys --------------------------------------------------------------------------------------


def order_keys(values: np.ndarray, kind: str | None) -> np.ndarray | None:
    """Integers (or bools) whose natural order is `values`' order under a compare of type
    `kind`; None when that order is not strict weak (a NaN under a float compare)."""
    dt = values.dtype
    if dt.kind == "b":
        return values
    if dt.kind in "iu":
        if kind == "UNSIGNED" and dt.kind == "i":
            return values.view(_UNSIGNED_OF_WIDTH[dt.itemsize])
        if kind == "SIGNED" and dt.kind == "u":
            return values.view(_SIGNED_OF_WIDTH[dt.itemsize])
        return values
    if dt.itemsize not in _SIGNED_OF_WIDTH or np.iscomplexobj(values):
        return None
    if kind != "TOTALORDER":
        if np.isnan(values.astype(np.float32) if dt.itemsize < 4 else values).any():
            return None
        values = values + np.zeros((), dt)  # -0.0 + 0.0 is +0.0: the two zeros compare equal
    signed = _SIGNED_OF_WIDTH[dt.itemsize]
    bits = np.ascontiguousarray(values).view(signed)
    flip = signed((1 << (8 * dt.itemsize - 1)) - 1)
    return np.where(bits < 0, bits ^ flip, bits)


def _descending(key: np.ndarray) -> np.ndarray:
    return ~key  # reverses integer order without overflow (and is logical not for bools)


def flush_subnormals(values: np.ndarray) -> np.ndarray:
    """`values` with subnormal floats replaced by zero of the same sign (what a comparator
    reads under XLA:CPU's denormals-are-zero); other arrays unchanged."""
    if values.dtype.kind != "f" and values.dtype != ml_dtypes.bfloat16:
        return values
    smallest = ml_dtypes.finfo(values.dtype).smallest_normal
    with np.errstate(invalid="ignore"):
        tiny = np.abs(values) < smallest
    if not tiny.any():
        return values
    return np.where(tiny, np.copysign(np.zeros((), values.dtype), values), values)


def key_arrays(
    ctx, keys: list[SortKey], operands: list[np.ndarray], flush_denormals: bool = False
) -> list[np.ndarray] | None:
    """One ascending integer key array per SortKey, or None to fall back. With
    `flush_denormals` the comparator reads subnormals as zero, as XLA:CPU's sort does."""
    out = []
    for k in keys:
        values = operands[k.operand]
        if flush_denormals:
            values = flush_subnormals(values)
        if k.expr is not None:
            values = np.asarray(call_elementwise(ctx.interpreter, k.expr, [values]))
        key = order_keys(values, k.kind)
        if key is None:
            return None
        out.append(_descending(key) if k.descending else key)
    return out


def stable_permutation(keys: list[np.ndarray], axis: int) -> np.ndarray:
    """The stable permutation sorting lexicographically by `keys` (first most significant)."""
    if len(keys) == 1:
        return np.argsort(keys[0], axis=axis, kind="stable")
    return np.lexsort(keys[::-1], axis=axis)


# -- the library entry points --------------------------------------------------------------------

FastFn = Callable[[list, object, object], bool]

SORT_SECONDS_PER_KEY = 3e-9
"""About the seconds a stable argsort spends per element and comparison level (log2 of
the sorted length), for the split decision."""


@loadable
def plan_sort(instr: HloInstruction, flush_denormals: bool = False) -> FastFn | None:
    """A fast sort for `instr` when its comparator is recognized, else None.
    `flush_denormals`: the comparator reads subnormal floats as zero (the CPU backend's
    default, XLA:CPU's behaviour); the values sorted keep their bits either way."""
    dims = instr.dimensions
    comparator = instr.to_apply_or_none
    if len(dims) != 1 or comparator is None:
        return None
    n_ops = len(instr.operands)
    if comparator.num_parameters != 2 * n_ops:
        return None
    shape = instr.operands[0].shape
    (axis,) = dims
    if not shape.is_array or not 0 <= axis < shape.rank:
        return None
    if any(o.shape.dims != shape.dims for o in instr.operands):
        return None
    keys = match_comparator(comparator)
    if keys is None or any(k.operand >= n_ops for k in keys):
        return None
    is_tuple = instr.shape.is_tuple
    outer = 1 if axis == 0 else 0  # the axis whose blocks sort apart
    units = shape.dims[outer] if shape.rank > 1 else 1
    n = max(shape.dims[axis], 2)
    seconds = SORT_SECONDS_PER_KEY * shape.num_elements * math.log2(n) * len(keys) * n_ops

    def run(values, outs, ctx) -> bool:
        arrays = [np.asarray(v) for v in values]
        key = key_arrays(ctx, keys, arrays, flush_denormals)
        if key is None:
            return False
        targets = outs if is_tuple else (outs,)

        def block(lo: int, hi: int) -> None:
            part = (slice(None),) * outer + (slice(lo, hi),) if shape.rank > 1 else ()
            perm = stable_permutation([k[part] for k in key], axis)
            # every operand is read before any result is written: a result sorted in place
            # may share its buffer with a later operand (sort(x, x) reads x twice)
            taken = [np.take_along_axis(a[part], perm, axis=axis) for a in arrays]
            for t, v in zip(targets, taken, strict=True):
                np.copyto(t[part], v, casting="no")

        if units > 1:
            split_over(units, seconds, block)
        else:
            block(0, units)
        return True

    return run


def smallest_k(key: np.ndarray, k: int) -> np.ndarray:
    """Indices (along the last axis) of the k smallest keys per row, ascending, ties by
    lower index: the first k of a stable argsort."""
    n = key.shape[-1]
    if k == 0:
        return np.zeros((*key.shape[:-1], 0), np.intp)
    if k == n:
        return np.argsort(key, axis=-1, kind="stable")
    if k <= _SMALL_K and key.dtype.itemsize <= 4:
        work = key.astype(np.int64)
        sentinel = np.iinfo(np.int64).max  # above every key of at most 32 bits
        rows = work.reshape(-1, n)
        picked = np.empty((rows.shape[0], k), np.intp)
        at = np.arange(rows.shape[0])
        for j in range(k):
            i = np.argmin(rows, axis=1)
            picked[:, j] = i
            rows[at, i] = sentinel
        return picked.reshape(*key.shape[:-1], k)
    kth = np.partition(key, k - 1, axis=-1)[..., k - 1 : k]
    less = key < kth
    equal = key == kth
    need = k - less.sum(axis=-1, keepdims=True)
    chosen = less | (equal & (np.cumsum(equal, axis=-1) <= need))
    idx = np.nonzero(chosen.reshape(-1, n))[1].reshape(*key.shape[:-1], k)
    sub = np.take_along_axis(key, idx, axis=-1)
    return np.take_along_axis(idx, np.argsort(sub, axis=-1, kind="stable"), axis=-1)


def pruning_groups(n: int, k: int) -> int | None:
    """The group count for pruned top-k on rows of n (see the file comment), or None when no
    divisor of n fits: at least 2k groups of at least _MIN_GROUP elements."""
    if k == 0 or n >= 1 << 31:
        return None
    target = _GROUPS_PER_K * k
    fits = [g for g in range(2 * k, min(n // _MIN_GROUP, 4 * target) + 1) if n % g == 0]
    if not fits:
        return None
    return min(fits, key=lambda g: max(g, target) / min(g, target))


def _unsigned_order(values: np.ndarray) -> np.ndarray:
    """uint32 keys in the total order of 32-bit `values` (floats: -0.0 below +0.0)."""
    bits = values.view(np.uint32)
    if values.dtype.kind == "u":
        return bits
    if values.dtype.kind == "i":
        return bits ^ np.uint32(1 << 31)
    negative = (values.view(np.int32) >> 31).view(np.uint32)  # all ones where the sign is set
    return bits ^ (negative | np.uint32(1 << 31))


def pruned_top_k(rows: np.ndarray, k: int, largest: bool, groups: int) -> np.ndarray | None:
    """Indices of the k largest (smallest) of each row of 32-bit `rows` in total order, best
    first, ties by lower index; None for a float row with a NaN (see the file comment)."""
    count, n = rows.shape
    size = n // groups
    parts = rows.reshape(count, size, groups)
    better = np.maximum if largest else np.minimum
    extreme = better(parts[:, 0], parts[:, 1])
    for i in range(2, size):
        better(extreme, parts[:, i], out=extreme)
    if extreme.dtype.kind == "f" and np.isnan(extreme).any():
        return None
    if largest:
        bound = np.partition(extreme, groups - k, axis=1)[:, groups - k, None]
        keep = extreme >= bound
    else:
        bound = np.partition(extreme, k - 1, axis=1)[:, k - 1, None]
        keep = extreme <= bound
    at_row, group = np.divmod(np.flatnonzero(keep), groups)
    at = group[:, None] + groups * np.arange(size)  # the candidates' places in their rows
    key = _unsigned_order(rows.reshape(-1).take(at + (n * at_row)[:, None]))
    if largest:
        key = ~key
    words = key.astype(np.uint64) << np.uint64(32)
    words |= at.astype(np.uint64)
    kept = keep.sum(axis=1)
    widest = int(kept.max())
    if (kept == widest).all():
        words = words.reshape(count, widest * size)
    else:
        padded = np.full((count, widest, size), np.iinfo(np.uint64).max)
        padded[at_row, (np.cumsum(keep, axis=1) - 1)[at_row, group]] = words
        words = padded.reshape(count, widest * size)
    best = np.partition(words, k - 1, axis=1)[:, :k]
    best.sort(axis=1)
    return (best & np.uint64(0xFFFFFFFF)).astype(np.intp)


def _topk_keys(values: np.ndarray) -> np.ndarray | None:
    """Ascending total-order keys of `values` as the interpreter's topk orders them (a float
    NaN through its float64 value)."""
    small_float = values.dtype.kind == "f" and values.dtype.itemsize < 8
    if small_float and np.isnan(values.astype(np.float32, copy=False)).any():
        values = values.astype(np.float64)
    return order_keys(values, "TOTALORDER")


@loadable
def plan_topk(instr: HloInstruction) -> FastFn | None:
    """topk: the k largest / smallest along the last dimension in total order."""
    k = instr.topk_k
    largest = instr.topk_largest
    (x,) = instr.operands
    if not x.shape.is_array or x.shape.rank == 0 or not 0 <= k <= x.shape.dims[-1]:
        return None
    if not instr.shape.is_tuple or len(instr.shape.tuple_shapes) != 2:
        return None
    n = x.shape.dims[-1]
    groups = pruning_groups(n, k) if x.shape.dtype in _PRUNED_TYPES else None

    def run(values, outs, ctx) -> bool:
        (v,) = values
        v = np.asarray(v)
        idx = None
        if groups is not None and v.size:
            idx = pruned_top_k(v.reshape(-1, n), k, largest, groups)
        if idx is None:
            key = _topk_keys(v)
            if key is None:
                return False
            idx = smallest_k(_descending(key) if largest else key, k)
        idx = idx.reshape(*v.shape[:-1], k)
        out_values, out_indices = outs
        np.copyto(out_values, np.take_along_axis(v, idx, axis=-1), casting="no")
        np.copyto(out_indices, idx, casting="unsafe")
        return True

    return run


@loadable
def plan_xla_topk(instr: HloInstruction) -> FastFn | None:
    """XLA's "TopK" custom call: the first k of a stable sort by its comparator."""
    called: tuple[HloComputation, ...] = instr.custom_call_computations
    comparator = instr.to_apply_or_none or (called[0] if len(called) == 1 else None)
    if comparator is None or not instr.shape.is_tuple or len(instr.operands) != 1:
        return None
    (x,) = instr.operands
    if not x.shape.is_array or x.shape.rank == 0 or comparator.num_parameters not in (2, 4):
        return None
    keys = match_comparator(comparator)
    if keys is None:
        return None
    values_shape, indices_shape = instr.shape.tuple_shapes
    k, n = values_shape.dims[-1], x.shape.dims[-1]
    iota = np.arange(n, dtype=indices_shape.dtype)

    def run(values, outs, ctx) -> bool:
        (v,) = values
        rows = np.asarray(v).reshape(-1, n)
        operands = [rows, np.broadcast_to(iota, rows.shape)]
        key = key_arrays(ctx, keys, operands)
        if key is None:
            return False
        if len(key) == 1 or (len(key) == 2 and keys[1].operand == 1 and not keys[1].descending):
            perm = smallest_k(key[0], k)  # ties by ascending index either way
        else:
            perm = stable_permutation(key, axis=-1)[:, :k]
        out_values, out_indices = outs
        np.copyto(out_values, np.take_along_axis(rows, perm, axis=1).reshape(out_values.shape))
        np.copyto(out_indices, perm.reshape(out_indices.shape), casting="unsafe")
        return True

    return run


def plan_approx_topk(instr: HloInstruction) -> FastFn | None:
    """JAX's "ApproxTopK" custom call, as XLA runs it off TPUs: its inputs (values, indices)
    stably sorted along reduction_dim by the comparator, each cut to the result's size."""
    from xlapy.backends.custom_calls import approx_topk_dimension

    called: tuple[HloComputation, ...] = instr.custom_call_computations
    count = len(instr.operands) // 2
    dim = approx_topk_dimension(instr)
    results = [s for _, s in instr.shape.leaves()]
    if len(called) != 1 or dim is None or count == 0 or len(results) != count:
        return None
    first = instr.operands[0].shape
    if not first.is_array or not 0 <= dim < first.rank or not all(s.is_array for s in results):
        return None
    keys = match_comparator(called[0])
    if keys is None or any(k.operand >= count for k in keys):
        return None
    n, size = first.dims[dim], results[0].dims[dim]
    only = keys[0] if len(keys) == 1 else None
    prunable = (
        only is not None
        and only.expr is None
        and only.operand == 0
        and only.kind in ("FLOAT", "TOTALORDER")
        and first.dtype in _PRUNED_TYPES
    )
    groups = pruning_groups(n, size) if prunable else None

    def run(values, outs, ctx) -> bool:
        moved = [np.moveaxis(np.asarray(v), dim, -1) for v in values[:count]]
        rows = [m.reshape(-1, n) for m in moved]
        perm = None
        if groups is not None and only is not None and rows[0].size:
            # a FLOAT compare ties -0.0 with +0.0: the total order after -0.0 + 0.0 = +0.0
            zeroed = rows[0] + rows[0].dtype.type(0) if only.kind == "FLOAT" else rows[0]
            perm = pruned_top_k(zeroed, size, only.descending, groups)  # None: a NaN
        if perm is None:
            key = key_arrays(ctx, keys, rows)
            if key is None:
                return False
            if len(key) == 1:
                perm = smallest_k(key[0], size)  # ties by lower index: a stable sort's first
            else:
                perm = stable_permutation(key, axis=-1)[:, :size]
        for m, row, out in zip(moved, rows, outs, strict=True):
            top = np.take_along_axis(row, perm, axis=1).reshape(*m.shape[:-1], size)
            np.copyto(out, np.moveaxis(top, -1, dim), casting="no")
        return True

    return run
