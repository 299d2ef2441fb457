"""Sort (any comparator, any number of operands) and topk.

Sort is a bottom-up merge sort along the sort dimension, run on every row at once. At each
level runs of width w are merged pairwise; an element's place in the merged run is its
place in its own run plus the number of elements of the partner run that go before it,
found by a binary search that asks the comparator about all elements of all rows in one
lifted call per step (see _lifted.py). Elements of the left run go after partner elements
strictly less than them, elements of the right run after partner elements not greater
than them, so equal elements keep their order: the sort is stable, which is one valid
result of an unstable sort too. That costs O(log^2 n) comparator calls on whole arrays.

topk returns the k largest (or smallest) values along the last dimension with their s32
indices, ties broken by the lower index; floats are ordered by XLA's total order (a
positive NaN above +inf, a negative one below -inf, -0.0 below +0.0).
"""

from __future__ import annotations

import numpy as np

from xlapy.backends.interpreter.registry import evaluates
from xlapy.backends.interpreter.rules._lifted import call_elementwise
from xlapy.errors import EvaluationError
from xlapy.ir.opcodes import Opcode


def merge_sort_permutation(ctx, comparator, rows: list[np.ndarray]) -> np.ndarray:
    """The stable permutation that sorts `rows` (each shaped (batch, n)) by `comparator`."""
    batch, n = rows[0].shape
    perm = np.broadcast_to(np.arange(n), (batch, n)).copy()
    position = np.arange(n)
    width = 1
    while width < n:
        current = [np.take_along_axis(r, perm, axis=1) for r in rows]
        run_start = (position // (2 * width)) * (2 * width)
        in_left = position - run_start < width
        own_offset = np.where(in_left, position - run_start, position - run_start - width)
        partner_start = np.where(in_left, run_start + width, run_start)
        partner_len = np.where(in_left, np.clip(n - (run_start + width), 0, width), width)
        lo = np.zeros((batch, n), dtype=np.int64)
        hi = np.broadcast_to(partner_len, (batch, n)).copy()
        while True:
            active = lo < hi
            if not active.any():
                break
            mid = (lo + hi) // 2
            probe = np.minimum(partner_start + mid, n - 1)
            partner = [np.take_along_axis(c, probe, axis=1) for c in current]
            # p goes before a left element x when p < x, before a right one unless x < p
            lhs = [np.where(in_left, p, c) for p, c in zip(partner, current, strict=True)]
            rhs = [np.where(in_left, c, p) for p, c in zip(partner, current, strict=True)]
            args = [a for pair in zip(lhs, rhs, strict=True) for a in pair]
            less = np.asarray(call_elementwise(ctx, comparator, args), dtype=bool)
            goes_before = np.where(in_left, less, ~less)
            lo = np.where(active & goes_before, mid + 1, lo)
            hi = np.where(active & ~goes_before, mid, hi)
        target = run_start + own_offset + lo
        new_perm = np.empty_like(perm)
        np.put_along_axis(new_perm, target, perm, axis=1)
        perm = new_perm
        width *= 2
    return perm


@evaluates(Opcode.SORT)
def _sort(instr, operands, ctx):
    dims = instr.dimensions
    comparator = instr.to_apply_or_none
    if len(dims) != 1 or comparator is None:
        raise EvaluationError(f"{instr.name}: sort needs dimensions={{d}} and to_apply")
    if comparator.num_parameters != 2 * len(operands):
        raise EvaluationError(
            f"{instr.name}: the comparator takes {comparator.num_parameters} parameters, "
            f"expected {2 * len(operands)} for {len(operands)} operands"
        )
    (axis,) = dims
    shape = operands[0].shape
    if not 0 <= axis < max(len(shape), 1) or any(o.shape != shape for o in operands):
        raise EvaluationError(
            f"{instr.name}: sort dimension {axis} and operand shapes "
            f"{[list(o.shape) for o in operands]} do not fit"
        )
    if len(shape) == 0 or shape[axis] <= 1 or 0 in shape:
        result = tuple(np.array(o, copy=True) for o in operands)
    else:
        moved = [np.moveaxis(o, axis, -1) for o in operands]
        rows = [m.reshape(-1, shape[axis]) for m in moved]
        perm = merge_sort_permutation(ctx, comparator, rows)
        result = tuple(
            np.moveaxis(np.take_along_axis(r, perm, axis=1).reshape(m.shape), -1, axis)
            for r, m in zip(rows, moved, strict=True)
        )
    return result if instr.shape.is_tuple else result[0]


def _order_key(values: np.ndarray) -> np.ndarray:
    """Keys that order `values` as topk does: integers as they are; floats by XLA's total
    order (-NaN < -inf < ... < -0.0 < +0.0 < ... < +inf < +NaN)."""
    if values.dtype.kind in "iub":
        return values
    as_float = values.astype(np.float64)
    bits = as_float.view(np.int64)
    return np.where(bits < 0, -(bits & np.int64(2**63 - 1)) - 1, bits)


@evaluates(Opcode.TOPK)
def _topk(instr, operands, ctx):
    (x,) = operands
    k = instr.topk_k
    largest = instr.topk_largest
    if x.ndim == 0 or not 0 <= k <= x.shape[-1]:
        raise EvaluationError(
            f"{instr.name}: topk needs 0 <= k <= {x.shape[-1] if x.ndim else 0} along the last "
            f"dimension, got k={k}"
        )
    key = _order_key(x)
    if largest:
        # a stable descending order, ties by lower index: sort the reversed row ascending
        n = x.shape[-1]
        order = n - 1 - np.argsort(key[..., ::-1], axis=-1, kind="stable")[..., ::-1]
    else:
        order = np.argsort(key, axis=-1, kind="stable")
    indices = order[..., :k]
    values = np.take_along_axis(x, indices, axis=-1)
    value_shape, index_shape = instr.shape.tuple_shapes
    return values.astype(value_shape.dtype), indices.astype(index_shape.dtype)
