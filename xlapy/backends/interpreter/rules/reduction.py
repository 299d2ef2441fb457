"""Evaluation rules for reductions: reduce, reduce-window and select-and-scatter.

A reducer computation of two scalar parameters whose root is one add / multiply / maximum /
minimum / and / or / xor of those parameters is recognised and run as the matching NumPy
ufunc. Sums therefore follow NumPy's order (`np.add.reduce`: pairwise summation along the
innermost reduced axis), with the init value added last: a defined, deterministic order,
though not XLA's element-by-element fold, so float sums may differ from a sequential sum in
the last bits.

Every other reducer (variadic argmax, a reducer with a compare and select, ...) is folded in
XLA's order: the accumulator starts at the init values and takes the reduced elements one at
a time, in row-major order of the reduced dims. The fold is vectorized across all kept
positions at once: when the reducer holds only elementwise instructions, it is evaluated on
1-D arrays instead of scalars (one call per reduced element); otherwise it falls back to
one call per (kept, reduced) pair.

reduce-window pads and dilates each input, records which positions are real elements, and
folds the window offsets in row-major order into an init-valued accumulator of the output
shape: padding and base-dilation holes are skipped (the accumulator keeps its value there),
as XLA's evaluator does. select-and-scatter walks the window offsets the same way, keeping
per window the selected element (the first valid one, replaced by a later one whenever
select(current, candidate) is false), then combines each source element into the
init-valued output at its window's selected position, in row-major source order.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from xlapy.backends.interpreter.registry import EvalContext, evaluates
from xlapy.backends.interpreter.rules.contraction import dilate_and_pad, window_output_size
from xlapy.backends.interpreter.rules.elementwise import float_maximum, float_minimum
from xlapy.errors import EvaluationError
from xlapy.ir.attributes import Window
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode

_LOGICAL = {Opcode.AND: np.logical_and, Opcode.OR: np.logical_or, Opcode.XOR: np.logical_xor}
_BITWISE = {Opcode.AND: np.bitwise_and, Opcode.OR: np.bitwise_or, Opcode.XOR: np.bitwise_xor}
_ARITH = {
    Opcode.ADD: np.add,
    Opcode.MULTIPLY: np.multiply,
    Opcode.MAXIMUM: np.maximum,
    Opcode.MINIMUM: np.minimum,
}
_SCALAR_SAFE = (Opcode.PARAMETER, Opcode.CONSTANT, Opcode.TUPLE, Opcode.GET_TUPLE_ELEMENT)


def simple_reducer(comp: HloComputation) -> np.ufunc | None:
    """The ufunc equal to `comp` when it is one binary op of its two parameters, else None."""
    params = comp.parameters
    root = comp.root
    if len(params) != 2 or root is None or len(comp.instructions) != 3:
        return None
    if sorted(map(id, root.operands)) != sorted(map(id, params)):
        return None
    if root.shape.is_tuple or not root.shape.is_array:
        return None
    if root.opcode in _ARITH:
        return _ARITH[root.opcode]
    if root.opcode in _LOGICAL:
        return _LOGICAL[root.opcode] if root.shape.element_type.is_pred else _BITWISE[root.opcode]
    return None


def _is_real_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or (dtype.kind == "V" and dtype.itemsize <= 2)  # bf16, f8


def _pairwise(ufunc: np.ufunc, dtype: np.dtype):
    """`ufunc` for two arrays, with XLA's max/min on floats (+0 above -0; np.maximum keeps
    whichever zero comes second)."""
    if _is_real_float(dtype) and ufunc is np.maximum:
        return float_maximum
    if _is_real_float(dtype) and ufunc is np.minimum:
        return float_minimum
    return ufunc


def _zero_signs(ufunc: np.ufunc, x, dims, init, result):
    """A max/min reduction's zeros with XLA's sign: +0 when a +0 takes part in a max, -0
    when a -0 takes part in a min (corner fuzz seed 601727)."""
    if ufunc not in (np.maximum, np.minimum) or not _is_real_float(x.dtype):
        return result
    zero = result == 0
    if not np.any(zero):
        return result
    negative = ufunc is np.minimum
    with_sign = (x == 0) & (np.signbit(x) == negative)
    present = np.logical_or.reduce(with_sign, axis=dims) if dims else with_sign
    present = present | ((init == 0) & (np.signbit(init) == negative))
    signed = np.where(present == negative, -0.0, 0.0).astype(x.dtype)
    return np.where(zero, signed, result).astype(x.dtype)


def _is_elementwise(comp: HloComputation) -> bool:
    return all(i.opcode.is_elementwise or i.opcode in _SCALAR_SAFE for i in comp.instructions)


def _leaf_dtypes(comp: HloComputation) -> list[np.dtype]:
    shape = comp.root_instruction().shape
    if shape.is_tuple:
        return [s.dtype for s in shape.tuple_shapes]
    return [shape.dtype]


def call_elementwise(
    ctx: EvalContext, comp: HloComputation, args: list[np.ndarray]
) -> list[np.ndarray]:
    """Apply the scalar computation `comp` to equally long 1-D `args`, element by element;
    returns one 1-D array per leaf of its result."""
    n = len(args[0]) if args else 0
    dtypes = _leaf_dtypes(comp)
    if _is_elementwise(comp):
        res = ctx.call(comp, args)
        leaves = list(res) if isinstance(res, tuple) else [res]
        if len(leaves) == len(dtypes) and all(np.shape(v) in ((n,), ()) for v in leaves):
            return [
                np.broadcast_to(np.asarray(v, dt), (n,)).copy()
                for v, dt in zip(leaves, dtypes, strict=True)
            ]
    outs = [np.empty(n, dt) for dt in dtypes]
    for i in range(n):
        res = ctx.call(comp, [np.asarray(a[i]) for a in args])
        values = res if isinstance(res, tuple) else (res,)
        for out, v in zip(outs, values, strict=True):
            out[i] = v
    return outs


def _split_operands(instr: HloInstruction, operands: list) -> tuple[list, list]:
    if len(operands) % 2:
        raise EvaluationError(
            f"{instr.name}: {instr.opcode.text} needs as many init values as inputs, "
            f"got {len(operands)} operands"
        )
    n = len(operands) // 2
    inputs, inits = list(operands[:n]), list(operands[n:])
    for x in inputs[1:]:
        if x.shape != inputs[0].shape:
            raise EvaluationError(
                f"{instr.name}: inputs differ in dims: {list(inputs[0].shape)} vs {list(x.shape)}"
            )
    for v in inits:
        if np.ndim(v) != 0:
            raise EvaluationError(f"{instr.name}: init values must be scalars")
    return inputs, inits


def _pack(values: list[np.ndarray], instr: HloInstruction):
    if instr.shape.is_tuple:
        return tuple(values)
    return values[0]


@evaluates(Opcode.REDUCE)
def _reduce(instr, operands, ctx):
    inputs, inits = _split_operands(instr, operands)
    comp = instr.to_apply_or_none
    if comp is None:
        raise EvaluationError(f"{instr.name}: reduce needs to_apply")
    rank = inputs[0].ndim
    dims = instr.dimensions
    if any(not 0 <= d < rank for d in dims) or len(set(dims)) != len(dims):
        raise EvaluationError(f"{instr.name}: dimensions={dims} invalid for rank {rank}")
    kept = [d for d in range(rank) if d not in dims]
    kept_shape = tuple(inputs[0].shape[d] for d in kept)
    reduced = math.prod(inputs[0].shape[d] for d in dims)

    if reduced == 0 or 0 in kept_shape:
        return _pack([np.full(kept_shape, v, v.dtype) for v in inits], instr)
    ufunc = simple_reducer(comp) if len(inputs) == 1 else None
    if ufunc is not None:
        x, init = inputs[0], inits[0]
        partial = ufunc.reduce(x, axis=dims, dtype=x.dtype) if dims else x
        result = np.asarray(ufunc(init, partial), dtype=x.dtype)
        return _pack([_zero_signs(ufunc, x, dims, init, result)], instr)

    order = [*kept, *dims]
    k = math.prod(kept_shape)
    flat = [x.transpose(order).reshape(k, reduced) for x in inputs]
    accs = [np.full(k, v, v.dtype) for v in inits]
    for r in range(reduced):
        accs = call_elementwise(ctx, comp, [*accs, *(x[:, r] for x in flat)])
    return _pack([a.reshape(kept_shape) for a in accs], instr)


def _window_of(instr: HloInstruction, rank: int) -> Window:
    window = instr.window_or_none
    if window is None:
        raise EvaluationError(f"{instr.name}: {instr.opcode.text} needs a window")
    if len(window.dims) != rank:
        raise EvaluationError(
            f"{instr.name}: window has {len(window.dims)} dims, the operand has rank {rank}"
        )
    return window


def _padded_with_mask(x: np.ndarray, window: Window, fill) -> tuple[np.ndarray, np.ndarray]:
    """`x` dilated and padded per the window, and a bool array marking the real elements."""
    mask = np.ones(x.shape, bool)
    for axis, d in enumerate(window.dims):
        x = dilate_and_pad(x, axis, d, fill)
        mask = dilate_and_pad(mask, axis, d, False)
    return x, mask


def _offsets(window: Window, out_shape: tuple[int, ...]):
    """(window offset, index tuple) for each window position in row-major order; the index
    picks, from a padded array, that offset's element of every window."""
    for offset in itertools.product(*(range(d.size) for d in window.dims)):
        index = tuple(
            slice(o * d.window_dilation, o * d.window_dilation + (n - 1) * d.stride + 1, d.stride)
            for o, d, n in zip(offset, window.dims, out_shape, strict=True)
        )
        yield offset, index


@evaluates(Opcode.REDUCE_WINDOW)
def _reduce_window(instr, operands, ctx):
    inputs, inits = _split_operands(instr, operands)
    comp = instr.to_apply_or_none
    if comp is None:
        raise EvaluationError(f"{instr.name}: reduce-window needs to_apply")
    window = _window_of(instr, inputs[0].ndim)
    padded, mask = [], None
    for x, v in zip(inputs, inits, strict=True):
        p, mask = _padded_with_mask(x, window, v)
        padded.append(p)
    out_shape = tuple(
        window_output_size(n, d) for n, d in zip(mask.shape, window.dims, strict=True)
    )
    accs = [np.full(out_shape, v, v.dtype) for v in inits]
    if 0 in out_shape:
        return _pack(accs, instr)
    ufunc = simple_reducer(comp) if len(inputs) == 1 else None
    pairwise = _pairwise(ufunc, accs[0].dtype) if ufunc is not None else None
    everywhere = bool(mask.all())
    for _, index in _offsets(window, out_shape):
        valid = mask[index]
        if ufunc is not None:
            new = [np.asarray(pairwise(accs[0], padded[0][index]), accs[0].dtype)]
        else:
            new = call_elementwise(
                ctx, comp, [*(a.ravel() for a in accs), *(p[index].ravel() for p in padded)]
            )
            new = [n.reshape(out_shape) for n in new]
        accs = (
            new if everywhere else [np.where(valid, n, a) for n, a in zip(new, accs, strict=True)]
        )
    return _pack(accs, instr)


def _occurrence_rank(targets: np.ndarray) -> np.ndarray:
    """For each entry, how many earlier entries have the same target."""
    order = np.argsort(targets, kind="stable")
    sorted_t = targets[order]
    starts = np.r_[0, np.flatnonzero(sorted_t[1:] != sorted_t[:-1]) + 1]
    run_start = np.repeat(starts, np.diff(np.r_[starts, len(sorted_t)]))
    rank = np.empty(len(targets), np.int64)
    rank[order] = np.arange(len(targets)) - run_start
    return rank


@evaluates(Opcode.SELECT_AND_SCATTER)
def _select_and_scatter(instr, operands, ctx):
    operand, source, init = operands
    select, scatter = instr.select_computation, instr.scatter_computation
    window = _window_of(instr, operand.ndim)
    if any(d.base_dilation != 1 for d in window.dims):
        raise EvaluationError(f"{instr.name}: select-and-scatter takes no base dilation")
    padded, mask = _padded_with_mask(operand, window, np.zeros((), operand.dtype))
    positions = np.arange(operand.size).reshape(operand.shape)
    padded_pos, _ = _padded_with_mask(positions, window, -1)
    out_shape = tuple(
        window_output_size(n, d) for n, d in zip(mask.shape, window.dims, strict=True)
    )
    if source.shape != out_shape:
        raise EvaluationError(
            f"{instr.name}: source dims {list(source.shape)} do not match the window "
            f"positions {list(out_shape)}"
        )
    output = np.full(operand.size, init, operand.dtype)
    if source.size == 0:
        return output.reshape(operand.shape)

    cur_val = np.zeros(source.size, operand.dtype)
    cur_pos = np.full(source.size, -1, np.int64)
    for _, index in _offsets(window, out_shape):
        valid = mask[index].ravel()
        val = padded[index].ravel()
        pos = padded_pos[index].ravel()
        have = cur_pos >= 0
        first = valid & ~have
        contest = np.flatnonzero(valid & have)
        if contest.size:
            (keep,) = call_elementwise(ctx, select, [cur_val[contest], val[contest]])
            swap = contest[~keep.astype(bool)]
            cur_val[swap], cur_pos[swap] = val[swap], pos[swap]
        cur_val[first], cur_pos[first] = val[first], pos[first]

    chosen = np.flatnonzero(cur_pos >= 0)
    targets, src = cur_pos[chosen], source.ravel()[chosen]
    ufunc = simple_reducer(scatter)
    if ufunc is not None:
        ufunc.at(output, targets, src)
        return output.reshape(operand.shape)
    rank = _occurrence_rank(targets)
    for r in range(int(rank.max()) + 1 if rank.size else 0):
        sel = rank == r
        t = targets[sel]
        (output[t],) = call_elementwise(ctx, scatter, [output[t], src[sel]])
    return output.reshape(operand.shape)
