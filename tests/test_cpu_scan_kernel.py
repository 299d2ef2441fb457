"""The native scan kernel (codegen/emit_scan.py) against the interpreter: a table of reducers,
element types, scan axes, directions and layouts written as HLO reduce-windows, a variadic
(value, index) scan, size-1 windows, and the kernel's tile range split into pieces. Forward
scans are bit for bit the interpreter's fold; reverse float sums and products are folded from
the other end (a tolerance); min/max and integers are exact both ways."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from xlapy.backends import execute
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.codegen.emit_scan import emit_scan, scan_reason
from xlapy.backends.cpu.jit.kernel import Kernel
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("kernel_cache")

RNG = np.random.default_rng(20261127)

_P = "a = T[] parameter(0)\n  b = T[] parameter(1)\n  "
REDUCERS = {
    "add": _P + "ROOT r = T[] add(a, b)",
    "multiply": _P + "ROOT r = T[] multiply(a, b)",
    "maximum": _P + "ROOT r = T[] maximum(a, b)",
    "minimum": _P + "ROOT r = T[] minimum(a, b)",
    "and": _P + "ROOT r = T[] and(a, b)",
    "or": _P + "ROOT r = T[] or(a, b)",
    # cumlogsumexp's reducer as JAX writes it: max + log1p(exp(-|a - b|)), NaN-aware
    "logaddexp": _P + "m = T[] maximum(a, b)\n  d = T[] subtract(a, b)\n  ab = T[] abs(d)\n  "
    "ne = T[] negate(ab)\n  e = T[] exponential(ne)\n  l = T[] log-plus-one(e)\n  "
    "s = T[] add(m, l)\n  n = pred[] compare(d, d), direction=NE\n  "
    "sum = T[] add(a, b)\n  ROOT r = T[] select(n, sum, s)",
    # a reducer that is neither one ufunc nor commutative: forward scans only
    "a_times_b_plus_b": _P + "p = T[] multiply(a, b)\n  ROOT r = T[] add(p, b)",
}
INITS = {"add": "0", "multiply": "1", "maximum": "-inf", "minimum": "inf", "and": "true",
         "or": "false", "logaddexp": "-inf", "a_times_b_plus_b": "0"}  # fmt: skip
INT_INITS = {"maximum": "-2147483648", "minimum": "2147483647"}

TYPES = {
    "f32": np.float32,
    "f64": np.float64,
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "s32": np.int32,
    "u8": np.uint8,
    "s64": np.int64,
    "pred": np.bool_,
}


def _window(dims, axis, reverse, extra=0):
    """The window JAX writes for a scan over `axis` (size n + extra, padding on one side)."""
    sizes, pads = [], []
    for a, n in enumerate(dims):
        if a == axis:
            w = n + extra
            sizes.append(str(w))
            pads.append(f"0_{w - 1}" if reverse else f"{w - 1}_0")
        else:
            sizes.append("1")
            pads.append("0_0")
    return f"size={'x'.join(sizes)} pad={'x'.join(pads)}"


def _module(reducer, t, dims, axis, reverse, layout="", extra=0):
    init = INITS[reducer]
    if t in ("s32", "s64", "u8"):
        init = {"maximum": "-128", "minimum": "127"}.get(reducer, init)
        if t == "u8" and reducer == "maximum":
            init = "0"
    shape = f"{t}[{','.join(map(str, dims))}]{layout}"
    return f"""HloModule scan_{reducer}_{t}

r {{
  {REDUCERS[reducer].replace("T[]", f"{t}[]")}
}}

ENTRY main {{
  x = {shape} parameter(0)
  i = {t}[] constant({init})
  ROOT s = {shape} reduce-window(x, i), window={{{_window(dims, axis, reverse, extra)}}}, to_apply=r
}}
"""


def _values(dims, t):
    dtype = np.dtype(TYPES[t])
    if t == "pred":
        return RNG.integers(0, 2, dims).astype(bool)
    if dtype.kind in "iu":
        return RNG.integers(0 if t == "u8" else -100, 100, dims).astype(dtype)
    return (RNG.standard_normal(dims) * 0.5 + 1.0).astype(dtype)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a if a.dtype.kind in "biu" else a.view(f"u{a.dtype.itemsize}")


def _check(text, args, exact, rtol=0.0):
    listing = CpuProgram(parse_module(text)).thunk_listing()
    lines = [line.strip() for line in listing.splitlines() if "= reduce-window" in line]
    assert lines and all(line.startswith("kernel") for line in lines), listing
    got = execute(parse_module(text), args, "cpu")
    want = evaluate(parse_module(text), args)
    pairs = zip(got, want, strict=True) if isinstance(want, tuple) else [(got, want)]
    for g, w in pairs:
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        if exact:
            np.testing.assert_array_equal(_bits(g), _bits(w))
        else:
            np.testing.assert_allclose(
                g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=rtol
            )


# (reducer, type, dims, axis, reverse, layout)
CASES = [
    ("add", "f32", (5, 37), 1, False, ""),
    ("add", "f32", (40, 3), 0, False, ""),
    ("add", "f32", (3, 9, 20), 1, False, ""),
    ("add", "f32", (3, 9, 20), 1, True, ""),
    ("add", "f32", (6, 33), 1, True, "{0,1}"),
    ("add", "f32", (6, 33), 0, False, "{0,1}"),
    ("add", "f64", (4, 50), 1, False, ""),
    ("add", "f16", (4, 50), 1, False, ""),
    ("add", "bf16", (7, 19), 0, False, ""),
    ("multiply", "f32", (8, 24), 1, False, ""),
    ("multiply", "f64", (8, 24), 0, True, ""),
    ("maximum", "f32", (9, 31), 1, True, ""),
    ("minimum", "f32", (31, 9), 0, False, ""),
    ("maximum", "bf16", (31, 9), 0, True, ""),
    ("add", "s32", (17, 23), 1, True, ""),
    ("add", "u8", (17, 23), 1, False, ""),
    ("multiply", "s64", (5, 12), 1, False, ""),
    ("maximum", "s32", (3, 4, 30), 2, True, ""),
    ("minimum", "s32", (30, 4, 3), 0, False, "{0,2,1}"),
    ("and", "pred", (6, 40), 1, False, ""),
    ("or", "pred", (40, 6), 0, True, ""),
    ("logaddexp", "f32", (5, 37), 1, False, ""),
    ("logaddexp", "f32", (37, 5), 0, True, ""),
    ("logaddexp", "f64", (6, 20), 1, True, ""),
    ("a_times_b_plus_b", "f32", (4, 25), 1, False, ""),
    ("add", "f32", (1, 1), 1, False, ""),
    ("add", "f32", (129,), 0, False, ""),
]


def _exact(reducer, t, reverse):
    if reducer == "logaddexp":
        return False  # native exp/log1p against NumPy's
    if t not in ("f32", "f64", "f16", "bf16") or reducer in ("maximum", "minimum"):
        return True
    return not reverse


@pytest.mark.parametrize(("reducer", "t", "dims", "axis", "reverse", "layout"), CASES)
def test_scan_kernel_matches_interpreter(reducer, t, dims, axis, reverse, layout):
    text = _module(reducer, t, dims, axis, reverse, layout)
    rtol = {"f16": 5e-3, "bf16": 4e-2, "f64": 1e-12}.get(t, 2e-6) * 4
    _check(text, [_values(dims, t)], _exact(reducer, t, reverse), rtol)


def test_window_longer_than_the_axis():
    """A window of w > n elements (all of them padding beyond the axis) folds the same."""
    text = _module("add", "f32", (4, 10), 1, False, extra=5)
    _check(text, [_values((4, 10), "f32")], True)


def test_forward_float_sum_is_the_rule_bit_for_bit_with_specials():
    x = _values((6, 64), "f32")
    x[1, 3], x[2, 0], x[3, 7], x[4, 9] = np.nan, np.inf, -np.inf, -0.0
    _check(_module("add", "f32", (6, 64), 1, False), [x], True)


def test_size_one_windows_apply_the_reducer_to_init_and_each_element():
    text = """HloModule one
r {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
ENTRY main {
  x = f32[5,7] parameter(0)
  i = f32[] constant(0.25)
  ROOT s = f32[5,7] reduce-window(x, i), window={size=1x1}, to_apply=r
}
"""
    _check(text, [_values((5, 7), "f32") - 1.0], True)


VARIADIC = """HloModule argmax_scan
r {
  av = f32[] parameter(0)
  ai = s32[] parameter(1)
  bv = f32[] parameter(2)
  bi = s32[] parameter(3)
  gt = pred[] compare(bv, av), direction=GT
  v = f32[] select(gt, bv, av)
  i = s32[] select(gt, bi, ai)
  ROOT t = (f32[], s32[]) tuple(v, i)
}
ENTRY main {
  x = f32[6,45] parameter(0)
  k = s32[6,45] parameter(1)
  vi = f32[] constant(-inf)
  ii = s32[] constant(-1)
  ROOT s = (f32[6,45], s32[6,45]) reduce-window(x, k, vi, ii), window={WINDOW}, to_apply=r
}
"""


@pytest.mark.parametrize("reverse", [False, True])
def test_variadic_scan_carries_value_and_index(reverse):
    text = VARIADIC.replace("WINDOW", _window((6, 45), 1, reverse))
    x = _values((6, 45), "f32")
    k = np.broadcast_to(np.arange(45, dtype=np.int32), (6, 45)).copy()
    _check(text, [x, k], True)


@pytest.mark.parametrize(
    ("dims", "axis"), [((64, 300), 1), ((300, 64), 0), ((5, 2100, 3), 1), ((3000, 40), 0)]
)
def test_tile_range_in_pieces_equals_the_whole(dims, axis):
    """The kernel's (start, end) range splits into independent tiles (the pool's blocks)."""
    text = _module("add", "f32", dims, axis, False)
    instr = parse_module(text).entry_computation().root_instruction()
    assert scan_reason(instr) is None
    spec = emit_scan(instr)
    kernel = Kernel(spec, "scan")
    x = _values(dims, "f32")
    init = np.zeros((), np.float32)
    whole, pieces = np.empty_like(x), np.full_like(x, np.nan)
    kernel.run_raw([whole.ctypes.data, x.ctypes.data, init.ctypes.data])
    bounds = np.linspace(0, spec.outer_extent, 4).astype(int)
    for lo, hi in itertools.pairwise(bounds):
        kernel.run_raw([pieces.ctypes.data, x.ctypes.data, init.ctypes.data], lo, hi)
    np.testing.assert_array_equal(whole, pieces)
    np.testing.assert_array_equal(whole, np.cumsum(x, axis=axis, dtype=np.float32))


def test_pooling_windows_are_not_scans():
    text = """HloModule pool
r {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
ENTRY main {
  x = f32[8,8] parameter(0)
  i = f32[] constant(-inf)
  ROOT s = f32[4,4] reduce-window(x, i), window={size=2x2 stride=2x2}, to_apply=r
}
"""
    reason = scan_reason(parse_module(text).entry_computation().root_instruction())
    assert reason is not None and "prefix scan" in reason
