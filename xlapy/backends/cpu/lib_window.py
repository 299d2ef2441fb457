# Fast library implementations of reduce-window.
#
# Prefix scans: JAX lowers cumsum / cumprod / cummax / cummin along an axis of length n to a
# reduce-window whose window spans w >= n elements of that axis, with w - 1 elements of low
# padding, stride 1 and size-1 windows elsewhere. Output i then folds init, x[0], ..., x[i]
# in that order, which is exactly `ufunc.accumulate` along the axis after folding init into
# the first element: the same operations in the same order as the interpreter's rule, so the
# results agree bit for bit (floats included; integers wrap in their own type).
#
# Pooling windows without padding or base dilation fold the window offsets in row-major
# order into the output in place (`ufunc(acc, strided view, out=acc)`), again the rule's
# order, without the padded copies and validity masks the general rule builds.

from __future__ import annotations

import itertools

import numpy as np

from xlapy.backends.interpreter.rules.reduction import simple_reducer
from xlapy.ir.instruction import HloInstruction


def _scan_axis(window, dims: tuple[int, ...]) -> int | None:
    """The axis of a prefix-scan window over `dims`, or None."""
    axis = None
    for a, (d, n) in enumerate(zip(window.dims, dims, strict=True)):
        if d.stride != 1 or d.window_dilation != 1 or d.base_dilation != 1:
            return None
        if d.size == 1 and d.pad_low == 0 and d.pad_high == 0:
            continue
        if axis is not None or d.size < n or d.pad_low != d.size - 1 or d.pad_high:
            return None
        axis = a
    return axis


def plan_reduce_window(instr: HloInstruction):
    """A fast reduce-window for one input with a one-op reducer, or None."""
    if len(instr.operands) != 2 or not instr.shape.is_array:
        return None
    x = instr.operands[0]
    window = instr.attrs.get("window")
    ufunc = simple_reducer(instr.attrs.get("to_apply"))
    if window is None or ufunc is None or not x.shape.is_array:
        return None
    dims = x.shape.dims
    if len(window.dims) != len(dims) or 0 in dims or x.shape.dtype != instr.shape.dtype:
        return None
    if any(d.reversal for d in window.dims):
        return None
    axis = _scan_axis(window, dims)
    if axis is not None:
        return _prefix_scan(ufunc, axis)
    if any(d.pad_low or d.pad_high or d.base_dilation != 1 for d in window.dims):
        return None
    if 0 in instr.shape.dims:
        return None
    return _pooling(ufunc, window, instr.shape.dims)


def _prefix_scan(ufunc: np.ufunc, axis: int):
    def run(values, out, ctx) -> bool:
        x, init = values
        if np.may_share_memory(x, out):
            x = x.copy()
        first = (slice(None),) * axis + (slice(0, 1),)
        np.copyto(out, x)
        out[first] = ufunc(init, x[first])
        ufunc.accumulate(out, axis=axis, dtype=out.dtype, out=out)
        return True

    return run


def _pooling(ufunc: np.ufunc, window, out_dims: tuple[int, ...]):
    offsets = list(itertools.product(*(range(d.size) for d in window.dims)))

    def run(values, out, ctx) -> bool:
        x, init = values
        if np.may_share_memory(x, out):
            x = x.copy()
        out[...] = init
        for offset in offsets:
            index = tuple(
                slice(o * d.window_dilation, o * d.window_dilation + (n - 1) * d.stride + 1,
                      d.stride)
                for o, d, n in zip(offset, window.dims, out_dims, strict=True)
            )  # fmt: skip
            ufunc(out, x[index], out=out)
        return True

    return run
