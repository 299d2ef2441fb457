# Fast library implementations of reduce-window.
#
# Prefix scans: JAX lowers cumsum / cumprod / cummax / cummin along an axis of length n to a
# reduce-window whose window spans w >= n elements of that axis, with w - 1 elements of low
# padding, stride 1 and size-1 windows elsewhere. Output i then folds init, x[0], ..., x[i]
# in that order, which is exactly `ufunc.accumulate` along the axis after folding init into
# the first element: the same operations in the same order as the interpreter's rule, so the
# results agree bit for bit (floats included; integers wrap in their own type).
#
# A reverse scan (the window's padding is high: w - 1 elements after the axis, as JAX
# writes cumsum(reverse=True) and the gradient of cumsum) folds init, x[i], ..., x[n-1]:
# accumulate over the reversed axis, init folded into the last element. For max/min (and
# integers) that is the rule's result bit for bit; a float sum or product is folded from
# the other end, so it may differ from the rule in the last bits (as XLA's own rewrite of
# scans into blocked associative scans does). A reducer that is not one NumPy ufunc
# (cumlogsumexp's) is lifted to whole slices (interpreter rules, one call per position
# along the axis): O(n) reducer calls instead of the rule's O(n^2) element visits, and the
# rule's order in the forward direction.
#
# Pooling windows fold the window offsets in row-major order into the output in place
# (`ufunc(acc, strided view, out=acc)`), again the rule's order, without the validity masks
# the general rule builds. A max (min)
# whose init is -inf (+inf, or the integer extreme) leaves every element unchanged, so the
# init pass is left out and the first two offsets are combined in the first pass. With
# padding or base dilation they run over the operand padded (dilated) with init where init
# is neutral for the reducer (0 for a sum, -inf for a max): the fold leaves it unchanged,
# as the rule leaves the padding out; any other init declines to the rule.
#
# select-and-scatter (the max-pool gradient) with a select that is one compare of its two
# parameters and a one-op scatter: the window offsets are visited in row-major order over
# strided views, keeping per window the current selection and its offset; a later element
# replaces it where the compare of (current, element) is false, which is the rule's
# selection including ties and NaN. Padding never takes part (the rule skips it). The
# selected operand positions then receive the source values through `ufunc.at` in
# row-major source order, again the rule's order, so results agree bit for bit.

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np

from xlapy.backends.cpu.runtime.loadable import loadable
from xlapy.backends.cpu.runtime.pool import byte_seconds, split_over
from xlapy.backends.interpreter.rules.elementwise import float_maximum, float_minimum
from xlapy.backends.interpreter.rules.reduction import simple_reducer
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode

_COMPARES = {
    "LT": np.less,
    "LE": np.less_equal,
    "GT": np.greater,
    "GE": np.greater_equal,
}
_MIRRORED = {
    np.less: np.greater,
    np.less_equal: np.greater_equal,
    np.greater: np.less,
    np.greater_equal: np.less_equal,
}
_SELECT_DTYPES = frozenset(map(np.dtype, ("f4", "f8", "i1", "i2", "i4", "i8")))


def _trivial(d) -> bool:
    return (
        d.size == 1
        and d.stride == 1
        and not (d.pad_low or d.pad_high)
        and (d.window_dilation == 1 and d.base_dilation == 1)
    )


def _scan_axis(window, dims: tuple[int, ...]) -> tuple[int, bool] | None:
    """(axis, reverse) of a prefix-scan window over `dims`, or None."""
    found = None
    for a, (d, n) in enumerate(zip(window.dims, dims, strict=True)):
        if d.stride != 1 or d.window_dilation != 1 or d.base_dilation != 1 or d.reversal:
            return None
        if d.size == 1 and d.pad_low == 0 and d.pad_high == 0:
            continue
        if found is not None or d.size < n:
            return None
        if d.pad_low == d.size - 1 and d.pad_high == 0:
            found = (a, False)
        elif d.pad_high == d.size - 1 and d.pad_low == 0:
            found = (a, True)
        else:
            return None
    return found


@loadable
def plan_reduce_window(instr: HloInstruction):
    """A fast reduce-window for one input with a one-op reducer, or None."""
    if len(instr.operands) != 2 or not instr.shape.is_array:
        return None
    x = instr.operands[0]
    window = instr.window_or_none
    reducer = instr.to_apply_or_none
    if reducer is None or window is None or not x.shape.is_array:
        return None
    dims = x.shape.dims
    if len(window.dims) != len(dims) or 0 in dims or x.shape.dtype != instr.shape.dtype:
        return None
    ufunc = simple_reducer(reducer)
    scan = _scan_axis(window, dims)
    if scan is not None:
        if ufunc is None:
            return _lifted_scan(reducer, *scan)
        return _prefix_scan(ufunc, *scan, _split_axis(window, dims))
    if ufunc is None and all(_trivial(d) for d in window.dims):
        return _lifted_scan(reducer, None, False)  # out[i] = reducer(init, x[i])
    if ufunc is None or any(d.reversal for d in window.dims):
        return None
    if 0 in instr.shape.dims:
        return None
    if any(d.pad_low or d.pad_high or d.base_dilation != 1 for d in window.dims):
        return _padded_pooling(ufunc, window, instr.shape.dims)
    return _pooling(ufunc, window, instr.shape.dims)


def _split_axis(window, dims: tuple[int, ...]) -> int | None:
    """The axis a reduce-window or select-and-scatter is split along over the pool: of the
    axes whose window is one element (no padding, stride or dilation: each output position
    reads only its own input position there), the longest; None without one."""
    best = None
    for a, (d, n) in enumerate(zip(window.dims, dims, strict=True)):
        if _trivial(d) and n > 1 and (best is None or n > dims[best]):
            best = a
    return best


def _along(axis: int, lo: int, hi: int) -> tuple[slice, ...]:
    return (slice(None),) * axis + (slice(lo, hi),)


def _split(axis: int | None, extent: int, seconds: float, body) -> None:
    """`body(lo, hi)` over blocks of [0, extent) along the split axis (pool.split_over), or
    once over everything when there is no such axis."""
    if axis is None:
        body(0, extent)
    else:
        split_over(extent, seconds, body)


def _prefix_scan(ufunc: np.ufunc, axis: int, reverse: bool, split: int | None):
    def scan(x: np.ndarray, init, out: np.ndarray) -> None:
        target = np.flip(out, axis) if reverse else out
        source = np.flip(x, axis) if reverse else x
        first = (slice(None),) * axis + (slice(0, 1),)
        np.copyto(target, source)
        target[first] = ufunc(init, source[first])
        ufunc.accumulate(target, axis=axis, dtype=out.dtype, out=target)

    def run(values, out, ctx) -> bool:
        x, init = values
        if np.may_share_memory(x, out):
            x = x.copy()

        def block(lo: int, hi: int) -> None:
            at = _along(split, lo, hi) if split is not None else ()
            scan(x[at], init, out[at])

        # a copy and an accumulate: each reads and writes the result once
        extent = out.shape[split] if split is not None else 1
        _split(split, extent, 4 * out.nbytes * byte_seconds(), block)
        return True

    return run


def _lifted_scan(reducer, axis: int | None, reverse: bool):
    """A scan whose reducer is any scalar computation, one lifted call per position along
    `axis`; with no axis (a window of one element), one call on the whole operand."""
    from xlapy.backends.interpreter.rules._lifted import call_elementwise, lifted

    if reducer.root is None or lifted(reducer, (1,)) is None:
        return None  # not purely scalar: the rule (element by element) is as good

    def run(values, out, ctx) -> bool:
        x, init = values
        if axis is None:
            acc = np.broadcast_to(np.asarray(init, dtype=out.dtype), x.shape)
            out[...] = call_elementwise(ctx.interpreter, reducer, [acc, x])
            return True
        if np.may_share_memory(x, out):
            x = x.copy()
        n = x.shape[axis]
        rest = x.shape[:axis] + x.shape[axis + 1 :]
        acc = np.broadcast_to(np.asarray(init, dtype=out.dtype), rest).copy()
        order = range(n - 1, -1, -1) if reverse else range(n)
        for i in order:
            at = (slice(None),) * axis + (i,)
            acc = np.asarray(call_elementwise(ctx.interpreter, reducer, [acc, x[at]]))
            out[at] = acc
        return True

    return run


def _identity(ufunc: np.ufunc, init: np.ndarray) -> bool:
    """Whether `ufunc(init, x)` is `x` bit for bit for every x (NaN included): -inf (the
    least integer) for max, +inf (the greatest) for min."""
    if ufunc not in (np.maximum, np.minimum) or init.dtype.kind not in "fiu":
        return False
    big = ufunc is np.minimum
    if init.dtype.kind == "f":
        return bool(init == (np.inf if big else -np.inf))
    info = np.iinfo(init.dtype)
    return bool(init == (info.max if big else info.min))


def _signed_zeros_matter(ufunc: np.ufunc, x: np.ndarray, init) -> bool:
    """Whether a max/min fold of `x` from `init` needs XLA's order of zeros (+0 above -0):
    np.maximum and np.minimum return either zero of a tie, which only shows when a -0 takes
    part, in the operand or as init (rare: then the fold takes the slower IEEE pairwise
    functions)."""
    if ufunc not in (np.maximum, np.minimum) or x.dtype.kind != "f":
        return False
    init = np.asarray(init)
    if init == 0 and np.signbit(init):
        return True
    return bool(np.any(np.signbit(x) & (x == 0)))


def _fold(ufunc: np.ufunc, window, out_dims: tuple[int, ...], split: int | None):
    """`fold(x, init, out)`: every window offset folded into `out` in row-major order. The
    offsets' views take the split axis whole (its window is one element), so the same views
    serve a block of the operand and result along it."""

    def view(a: int, o: int, d, n: int) -> slice:
        if a == split:
            return slice(None)
        start = o * d.window_dilation
        return slice(start, start + (n - 1) * d.stride + 1, d.stride)

    views = [
        tuple(
            view(a, o, d, n)
            for a, (o, d, n) in enumerate(zip(offset, window.dims, out_dims, strict=True))
        )
        for offset in itertools.product(*(range(d.size) for d in window.dims))
    ]

    def fold(x: np.ndarray, init, out: np.ndarray) -> None:
        if _signed_zeros_matter(ufunc, x, init):
            pairwise = float_maximum if ufunc is np.maximum else float_minimum
            out[...] = init
            for index in views:
                out[...] = pairwise(out, x[index])
            return
        rest = views
        if not _identity(ufunc, np.asarray(init)):
            out[...] = init
        elif len(views) > 1:  # init left out: the first two offsets make the first pass
            ufunc(x[views[0]], x[views[1]], out=out)
            rest = views[2:]
        else:
            np.copyto(out, x[views[0]])
            rest = []
        for index in rest:
            ufunc(out, x[index], out=out)

    return fold, len(views)


def _pooling(ufunc: np.ufunc, window, out_dims: tuple[int, ...]):
    split = _split_axis(window, out_dims)
    fold, passes = _fold(ufunc, window, out_dims, split)

    def run(values, out, ctx) -> bool:
        x, init = values
        if np.may_share_memory(x, out):
            x = x.copy()

        def block(lo: int, hi: int) -> None:
            at = _along(split, lo, hi) if split is not None else ()
            fold(x[at], init, out[at])

        extent = out.shape[split] if split is not None else 1
        _split(split, extent, 3 * passes * out.nbytes * byte_seconds(), block)
        return True

    return run


def _neutral(ufunc: np.ufunc, init: np.ndarray) -> bool:
    """Whether folding `init` into an accumulator that started at `init` leaves it as it is
    (so padding filled with `init` may take part in the fold): 0 for add, 1 for multiply,
    the extremes for max/min, false for or/xor, true for and."""
    if ufunc in (np.maximum, np.minimum):
        return _identity(ufunc, init)
    neutral: dict[np.ufunc, int] = {
        np.add: 0,
        np.multiply: 1,
        np.logical_or: 0,
        np.logical_xor: 0,
        np.logical_and: 1,
    }
    value = neutral.get(ufunc)
    return value is not None and init.dtype.kind in "fiub" and bool(init == value)


def _padded_pooling(ufunc: np.ufunc, window, out_dims: tuple[int, ...]):
    """Pooling over the operand dilated and padded with init: the rule leaves padding out of
    the fold, which is the same when init is neutral (_neutral); otherwise it declines."""
    from xlapy.backends.interpreter.rules.contraction import dilate_and_pad

    plain = type(window)(
        tuple(replace(d, pad_low=0, pad_high=0, base_dilation=1) for d in window.dims)
    )
    split = _split_axis(window, out_dims)  # not padded nor dilated: blocks are padded alone
    fold, passes = _fold(ufunc, plain, out_dims, split)

    def run(values, out, ctx) -> bool:
        x, init = values
        init = np.asarray(init)
        if not _neutral(ufunc, init):
            return False

        def block(lo: int, hi: int) -> None:
            at = _along(split, lo, hi) if split is not None else ()
            part = x[at]
            for axis, d in enumerate(window.dims):
                part = dilate_and_pad(part, axis, d, init)
            fold(part, init, out[at])

        extent = out.shape[split] if split is not None else 1
        _split(split, extent, (3 * passes + 2) * out.nbytes * byte_seconds(), block)
        return True

    return run


def _select_compare(comp, dtype: np.dtype):
    """(compare ufunc, operands swapped) when `comp` is one compare of its parameters."""
    params, root = comp.parameters, comp.root
    if len(params) != 2 or root is None or len(comp.instructions) != 3:
        return None
    if root.opcode is not Opcode.COMPARE or len(root.operands) != 2:
        return None
    direction = root.comparison_direction
    fn = _COMPARES.get(str(direction)) if direction is not None else None
    kind = root.comparison_type
    if fn is None or kind not in (None, "FLOAT" if dtype.kind == "f" else "SIGNED"):
        return None
    lhs, rhs = root.operands
    p0, p1 = sorted(params, key=lambda p: p.parameter_number)
    if lhs is p0 and rhs is p1:
        return fn, False
    if lhs is p1 and rhs is p0:
        return fn, True
    return None


def _window_count(n: int, d) -> int:
    padded = d.pad_low + n + d.pad_high
    span = (d.size - 1) * d.window_dilation + 1
    return 0 if padded < span else (padded - span) // d.stride + 1


@loadable
def plan_select_and_scatter(instr: HloInstruction):
    """A fast select-and-scatter for a compare select and a one-op scatter, or None."""
    if len(instr.operands) != 3 or not instr.shape.is_array:
        return None
    operand, source = instr.operands[:2]
    window = instr.window_or_none
    select, scatter = instr.select_computation, instr.scatter_computation
    if window is None:
        return None
    if not (operand.shape.is_array and source.shape.is_array):
        return None
    dtype = operand.shape.dtype
    if dtype not in _SELECT_DTYPES or {source.shape.dtype, instr.shape.dtype} != {dtype}:
        return None
    compare = _select_compare(select, dtype)
    ufunc = simple_reducer(scatter)
    dims = operand.shape.dims
    if compare is None or ufunc is None or len(window.dims) != len(dims) or 0 in dims:
        return None
    wd = window.dims
    if any(d.base_dilation != 1 or d.reversal or d.pad_low < 0 or d.pad_high < 0 for d in wd):
        return None
    out_shape = tuple(_window_count(n, d) for n, d in zip(dims, wd, strict=True))
    if 0 in out_shape or tuple(source.shape.dims) != out_shape:
        return None
    return _select_and_scatter(compare, ufunc, wd, dims, out_shape)


def _select_and_scatter(compare, ufunc, wd, dims, out_shape):
    """The run, split over the pool along the first axis when its window is one element:
    each block of that axis is a select-and-scatter of its own (plans per block length)."""
    split = bool(_trivial(wd[0]) and dims[0] > 1)
    plans: dict[int, object] = {}

    def plan(n: int):
        found = plans.get(n)
        if found is None:
            found = plans[n] = _select_and_scatter_block(
                compare, ufunc, wd, (n, *dims[1:]), (n, *out_shape[1:])
            )
        return found

    passes = 3 * math.prod(d.size for d in wd)
    whole = _select_and_scatter_block(compare, ufunc, wd, dims, out_shape) if not split else None

    def run(values, out, ctx) -> bool:
        x, src, init = values
        if not out.flags.c_contiguous or src.shape != out_shape:
            return False
        if np.may_share_memory(src, out):
            src = src.copy()
        if np.may_share_memory(x, out):
            x = x.copy()
        if whole is not None:  # the first axis may be windowed: the whole operand and source
            whole(x, src, init, out)
            return True

        def block(lo: int, hi: int) -> None:
            plan(hi - lo)(x[lo:hi], src[lo:hi], init, out[lo:hi])

        split_over(dims[0], passes * src.nbytes * byte_seconds(), block)
        return True

    return run


def _select_and_scatter_block(compare, ufunc, wd, dims, out_shape):
    fn, swapped = compare
    if swapped:
        fn = _MIRRORED[fn]
    extreme = np.maximum if fn in (np.greater, np.greater_equal) else np.minimum
    sizes = tuple(d.size for d in wd)
    offsets = list(itertools.product(*(range(n) for n in sizes)))
    views = [
        tuple(
            slice(o * d.window_dilation, o * d.window_dilation + (n - 1) * d.stride + 1, d.stride)
            for o, d, n in zip(offset, wd, out_shape, strict=True)
        )
        for offset in offsets
    ]
    padded = any(d.pad_low or d.pad_high for d in wd)
    pads = [(d.pad_low, d.pad_high) for d in wd]
    rank = len(dims)
    strides = [int(np.prod(dims[i + 1 :], dtype=np.int64)) for i in range(rank)]
    origin = np.zeros(out_shape, np.int64)  # flat operand position of each window's offset 0
    for i, d in enumerate(wd):
        shape = [1] * rank
        shape[i] = out_shape[i]
        first = np.arange(out_shape[i], dtype=np.int64) * d.stride - d.pad_low
        origin += first.reshape(shape) * strides[i]
    step = np.array(
        [sum(o * d.window_dilation * st for o, d, st in zip(off, wd, strides)) for off in offsets],
        np.int64,
    )
    kind = np.uint8 if len(views) <= 255 else np.intp

    def run(x: np.ndarray, src: np.ndarray, init, out: np.ndarray) -> None:
        mask = None
        if padded:
            x = np.pad(x, pads)
            mask = np.pad(np.ones(dims, bool), pads)
        # without NaN the kept value is the max (min) of those seen: a -0 / +0 swap is
        # invisible to every later compare
        fold = mask is None and (x.dtype.kind != "f" or not np.isnan(x).any())
        best = np.zeros(out_shape, kind)
        cur = x[views[0]].copy()
        have = None if mask is None else mask[views[0]].copy()
        for k in range(1, len(views)):
            val = x[views[k]]
            swap = ~fn(cur, val)
            if mask is not None and have is not None:
                valid = mask[views[k]]
                swap = valid & ((have & swap) | ~have)
                have |= valid
            best += swap.view(np.uint8) * (kind(k) - best)
            if fold:
                extreme(cur, val, out=cur)
            else:
                np.copyto(cur, val, where=swap)
        targets, updates = (origin + step[best]).reshape(-1), src.reshape(-1)
        if have is not None and not have.all():
            keep = have.reshape(-1)
            targets, updates = targets[keep], updates[keep]
        out[...] = init
        ufunc.at(out.reshape(-1), targets, updates)

    return run
