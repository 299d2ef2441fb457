"""The native pooling kernel (codegen/emit_window.py) against the interpreter: a table of
reducers, element types, windows (size, stride, padding, window and base dilation, negative
padding), layouts (the windowed dim minor or not), a variadic (value, index) max-pool, and
the kernel's row range split into pieces. The kernel folds in the rule's order, so results
are the rule's bit for bit."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from xlapy.backends import execute
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.codegen.emit_window import emit_window, window_reason
from xlapy.backends.cpu.jit.kernel import Kernel
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("kernel_cache")

RNG = np.random.default_rng(20261127)

_P = "a = T[] parameter(0)\n  b = T[] parameter(1)\n  "
REDUCERS = {
    "add": (_P + "ROOT r = T[] add(a, b)", "0"),
    "maximum": (_P + "ROOT r = T[] maximum(a, b)", "-inf"),
    "minimum": (_P + "ROOT r = T[] minimum(a, b)", "inf"),
    # neither one ufunc nor commutative: the fold order shows
    "a_times_b_plus_b": (_P + "p = T[] multiply(a, b)\n  ROOT r = T[] add(p, b)", "0.5"),
}
INT_INITS = {"maximum": "-128", "minimum": "127", "add": "3"}
TYPES = {
    "f32": np.float32,
    "f64": np.float64,
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "s32": np.int32,
    "s8": np.int8,
}


def _module(reducer, t, dims, window, layout=""):
    body, init = REDUCERS[reducer]
    if t in ("s32", "s8"):
        init = INT_INITS.get(reducer, "1")
    shape = f"{t}[{','.join(map(str, dims))}]{layout}"
    text = f"""HloModule pool_{reducer}_{t}

r {{
  {body.replace("T[]", f"{t}[]")}
}}

ENTRY main {{
  x = {shape} parameter(0)
  i = {t}[] constant({init})
  ROOT s = OUT reduce-window(x, i), window={{{window}}}, to_apply=r
}}
"""
    return text


def _out_dims(dims, window):
    fields = dict(f.split("=") for f in window.split())
    n = len(dims)
    get = lambda k, d: [int(v) for v in fields[k].split("x")] if k in fields else [d] * n  # noqa: E731
    sizes, strides = get("size", 1), get("stride", 1)
    rhs, lhs = get("rhs_dilate", 1), get("lhs_dilate", 1)
    pads = [tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x")] if (
        "pad" in fields) else [(0, 0)] * n  # fmt: skip
    out = []
    for x, k, s, wd, bd, (lo, hi) in zip(dims, sizes, strides, rhs, lhs, pads, strict=True):
        padded = (x - 1) * bd + 1 + lo + hi
        span = (k - 1) * wd + 1
        out.append(0 if padded < span else (padded - span) // s + 1)
    return out


def _text(reducer, t, dims, window, layout=""):
    out = _out_dims(dims, window)
    shape = f"{t}[{','.join(map(str, out))}]{layout}"
    return _module(reducer, t, dims, window, layout).replace("OUT", shape)


def _values(dims, t):
    dtype = np.dtype(TYPES[t])
    if dtype.kind in "iu":
        return RNG.integers(-20, 20, dims).astype(dtype)
    return (RNG.standard_normal(dims) * 0.5 + 1.0).astype(dtype)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a if a.dtype.kind in "biu" else a.view(f"u{a.dtype.itemsize}")


def _check(text, args):
    listing = CpuProgram(parse_module(text)).thunk_listing()
    lines = [line.strip() for line in listing.splitlines() if "= reduce-window" in line]
    assert lines and all(line.startswith("kernel") for line in lines), listing
    got = execute(parse_module(text), args, "cpu")
    want = evaluate(parse_module(text), args)
    pairs = zip(got, want, strict=True) if isinstance(want, tuple) else [(got, want)]
    for g, w in pairs:
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(_bits(g), _bits(w))


NHWC_POOL = "size=1x3x3x1 stride=1x2x2x1 pad=0_0x0_1x0_1x0_0"
# (reducer, type, dims, window, layout)
CASES = [
    ("maximum", "f32", (2, 9, 9, 5), NHWC_POOL, ""),
    ("maximum", "f32", (2, 8, 8, 16), "size=1x2x2x1 stride=1x2x2x1", ""),
    ("add", "f32", (2, 8, 8, 16), "size=1x2x2x1 stride=1x2x2x1", ""),
    ("add", "f32", (2, 7, 6, 3), "size=1x3x2x1 stride=1x1x1x1 pad=0_0x1_1x1_0x0_0", ""),
    ("minimum", "f64", (2, 9, 9, 5), NHWC_POOL, ""),
    ("maximum", "f16", (2, 9, 9, 5), NHWC_POOL, ""),
    ("add", "bf16", (2, 9, 9, 5), NHWC_POOL, ""),
    ("add", "f16", (2, 9, 9, 5), NHWC_POOL, ""),
    ("maximum", "s32", (2, 9, 9, 5), NHWC_POOL, ""),
    ("add", "s8", (2, 9, 9, 5), NHWC_POOL, ""),
    ("a_times_b_plus_b", "f32", (2, 9, 9, 5), NHWC_POOL, ""),
    # NCHW: the minor dim is windowed (registers accumulate)
    ("maximum", "f32", (2, 3, 10, 11), "size=1x1x3x3 stride=1x1x2x2 pad=0_0x0_0x1_1x1_1", ""),
    ("add", "f32", (2, 3, 10, 11), "size=1x1x2x2 stride=1x1x2x2", ""),
    # a layout that puts the windowed dims minor, and one that puts features minor
    ("add", "f32", (2, 6, 7, 4), "size=1x2x3x1 stride=1x2x1x1 pad=0_0x0_0x1_1x0_0", "{1,2,3,0}"),
    ("maximum", "f32", (2, 6, 7, 4), "size=1x2x3x1 stride=1x1x2x1", "{0,3,2,1}"),
    # window dilation, base dilation (avg-pool gradients), negative padding
    ("add", "f32", (2, 9, 9, 3), "size=1x3x3x1 rhs_dilate=1x2x2x1 pad=0_0x2_2x2_2x0_0", ""),
    ("add", "f32", (2, 4, 5, 3), "size=1x2x2x1 lhs_dilate=1x2x2x1 pad=0_0x1_1x1_1x0_0", ""),
    ("a_times_b_plus_b", "f32", (2, 4, 5, 3),
     "size=1x3x3x1 stride=1x2x1x1 lhs_dilate=1x3x2x1 pad=0_0x2_1x1_2x0_0", ""),
    ("maximum", "f32", (2, 9, 9, 3), "size=1x2x2x1 stride=1x2x2x1 pad=0_0x-1_0x0_-1x0_0", ""),
    # 1-D, 3-D, a window larger than the unrolled limit, an all-padding window
    ("add", "f32", (50,), "size=5 stride=3 pad=2_2", ""),
    ("maximum", "f32", (2, 5, 6, 7, 3), "size=1x2x3x2x1 stride=1x1x2x2x1 pad=0_0x1_0x1_1x0_1x0_0",
     ""),
    ("add", "f32", (3, 20, 20, 2), "size=1x9x9x1 stride=1x4x4x1 pad=0_0x4_4x4_4x0_0", ""),
    ("add", "f32", (2, 3, 4), "size=1x2x2 pad=0_0x3_0x0_0", ""),
]  # fmt: skip


@pytest.mark.parametrize(("reducer", "t", "dims", "window", "layout"), CASES)
def test_window_kernel_matches_interpreter(reducer, t, dims, window, layout):
    _check(_text(reducer, t, dims, window, layout), [_values(dims, t)])


def test_specials_fold_in_the_rules_order():
    x = _values((2, 8, 8, 4), "f32")
    x[0, 1, 1, 0], x[1, 2, 3, 1], x[0, 5, 5, 2], x[1, 6, 0, 3] = np.nan, np.inf, -np.inf, -0.0
    for reducer in ("maximum", "add", "minimum"):
        _check(_text(reducer, "f32", (2, 8, 8, 4), NHWC_POOL), [x])


VARIADIC = """HloModule argmax_pool
r {
  a = f32[] parameter(0)
  ai = s32[] parameter(1)
  b = f32[] parameter(2)
  bi = s32[] parameter(3)
  g = pred[] compare(a, b), direction=GE
  m = f32[] select(g, a, b)
  mi = s32[] select(g, ai, bi)
  ROOT t = (f32[], s32[]) tuple(m, mi)
}
ENTRY main {
  x = f32[2,7,7,3] parameter(0)
  ix = s32[2,7,7,3] parameter(1)
  ninf = f32[] constant(-inf)
  z = s32[] constant(-1)
  ROOT s = (f32[2,4,4,3], s32[2,4,4,3]) reduce-window(x, ix, ninf, z),
    window={size=1x3x3x1 stride=1x2x2x1 pad=0_0x1_1x1_1x0_0}, to_apply=r
}
"""


def test_variadic_argmax_pool():
    x = _values((2, 7, 7, 3), "f32")
    ix = np.arange(x.size, dtype=np.int32).reshape(x.shape)
    _check(VARIADIC, [x, ix])


def test_row_range_in_pieces_is_the_whole():
    """Rows are independent: any split of the outer range gives the same result."""
    text = _text("add", "f32", (3, 9, 9, 5), NHWC_POOL)
    instr = parse_module(text).entry.root_instruction()
    assert window_reason(instr) is None
    spec = emit_window(instr)
    assert spec.outer_extent == 3 * 4 * 4
    kernel = Kernel(spec, "pool")
    x = _values((3, 9, 9, 5), "f32")
    init = np.zeros((), np.float32)
    whole = np.empty((3, 4, 4, 5), np.float32)
    kernel.run_raw([whole.ctypes.data, x.ctypes.data, init.ctypes.data])
    pieces = np.full_like(whole, np.nan)
    for lo, hi in ((0, 7), (7, 8), (8, 30), (30, 48)):
        kernel.run_raw([pieces.ctypes.data, x.ctypes.data, init.ctypes.data], lo, hi)
    np.testing.assert_array_equal(pieces, whole)


def test_reasons_decline_what_the_kernel_does_not_do():
    text = _text("add", "f32", (2, 6, 6, 3), "size=1x2x2x1 stride=1x2x2x1")
    reversed_ = text.replace("stride=1x2x2x1", "stride=1x2x2x1 rhs_reversal=0x1x0x0")
    instr = parse_module(reversed_).entry.root_instruction()
    assert window_reason(instr) == "a reversed window"
