"""Complex (c64, c128) elementwise kernels (codegen/complex.py) against the interpreter: a
table of (op, operand maker) run for both types on fresh random values, then on edge cases
(zeros of both signs, infinities, NaN, subnormal and huge parts), with per-type tolerances;
every instruction must be a kernel (no fallback). Ops left to the rule are declined loudly."""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("kernel_cache")
RNG = np.random.default_rng(20261127)

TYPES = {"c64": (np.complex64, "f32", np.float32), "c128": (np.complex128, "f64", np.float64)}
# (rtol, atol relative to the largest finite magnitude of the expected values)
TOL = {"c64": (2e-6, 1e-6), "c128": (1e-14, 1e-14)}
SHAPE = (6, 11)


def _complex(dtype, shape=SHAPE, scale=1.0):
    re, im = RNG.standard_normal(shape), RNG.standard_normal(shape)
    return ((re + 1j * im) * scale).astype(dtype)


def _edges(dtype, shape=SHAPE):
    """Random values with parts replaced by 0, -0, +-inf, NaN, subnormals and huge values."""
    part = np.finfo(np.float32 if dtype == np.complex64 else np.float64)
    specials = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, part.tiny / 4, -part.tiny / 8, part.max / 8, 1.0]
    )
    re, im = RNG.standard_normal(shape), RNG.standard_normal(shape)
    for p in (re, im):
        picks = RNG.random(shape) < 0.4
        p[picks] = specials[RNG.integers(0, len(specials), int(picks.sum()))]
    return (re + 1j * im).astype(dtype)


# name -> (HLO body with x, y (complex) and r (real) parameters; result type; edge cases)
# "edge" says whether the kernel is held to the rule on the edge cases too.
OPS = {
    "add": ("{t}[6,11] add(x, y)", True),
    "subtract": ("{t}[6,11] subtract(x, y)", True),
    "negate": ("{t}[6,11] negate(x)", True),
    "multiply": ("{t}[6,11] multiply(x, y)", False),
    "divide": ("{t}[6,11] divide(x, y)", False),
    "abs": ("{f}[6,11] abs(x)", True),
    "exponential": ("{t}[6,11] exponential(x)", False),
    "log": ("{t}[6,11] log(x)", False),
    "sqrt": ("{t}[6,11] sqrt(x)", False),
    "real": ("{f}[6,11] real(x)", True),
    "imag": ("{f}[6,11] imag(x)", True),
    "complex": ("{t}[6,11] complex(r, r)", True),
    "convert_real": ("{t}[6,11] convert(r)", True),
    "compare_eq": ("pred[6,11] compare(x, y), direction=EQ", True),
    "compare_ne": ("pred[6,11] compare(x, y), direction=NE", True),
}


def _module(t: str, body: str) -> str:
    f = TYPES[t][1]
    return f"""HloModule complex_{t}
ENTRY e {{
  x = {t}[6,11] parameter(0)
  y = {t}[6,11] parameter(1)
  r = {f}[6,11] parameter(2)
  ROOT o = {body.format(t=t, f=f)}
}}"""


def _check(text: str, args, t: str) -> None:
    # subnormals kept (kernels flush them by default, as XLA:CPU does; the rule keeps them)
    program = CpuProgram(parse_module(text), {"denormals": "ieee"})
    assert program.fallbacks == [], program.fallbacks
    got = np.asarray(program.run(args))
    want = np.asarray(evaluate(parse_module(text), args))
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == np.bool_:
        np.testing.assert_array_equal(got, want)
        return
    rtol, atol = TOL[t]
    finite = np.abs(want[np.isfinite(want)])
    scale = float(finite.max()) if finite.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale)


@pytest.mark.parametrize("t", list(TYPES))
@pytest.mark.parametrize("name", list(OPS))
def test_complex_op_random(name, t):
    dtype, _, real = TYPES[t]
    args = [_complex(dtype), _complex(dtype), RNG.standard_normal(SHAPE).astype(real)]
    _check(_module(t, OPS[name][0]), args, t)


@pytest.mark.parametrize("t", list(TYPES))
@pytest.mark.parametrize("name", [n for n, (_, edge) in OPS.items() if edge])
def test_complex_op_edge_cases(name, t):
    dtype, _, real = TYPES[t]
    parts = _edges(dtype).real.astype(real)
    _check(_module(t, OPS[name][0]), [_edges(dtype), _edges(dtype), parts], t)


@pytest.mark.parametrize("t", list(TYPES))
def test_complex_division_and_abs_do_not_overflow(t):
    """Smith's division and the scaled hypot stay finite where the naive formulas overflow
    (|y|^2 and re^2 + im^2 beyond the type's range)."""
    dtype, _, real = TYPES[t]
    big = np.finfo(real).max / 16
    x, y = _complex(dtype, scale=big), _complex(dtype, scale=big)
    _check(_module(t, OPS["divide"][0]), [x, y, np.ones(SHAPE, real)], t)
    _check(_module(t, OPS["abs"][0]), [x, y, np.ones(SHAPE, real)], t)


@pytest.mark.parametrize("t", list(TYPES))
def test_complex_sqrt_and_log_branch_cuts(t):
    """The negative real axis with both signs of zero imaginary part, and zero itself."""
    dtype, _, real = TYPES[t]
    re = np.concatenate([-np.abs(RNG.standard_normal(40)) - 0.1, np.zeros(26)]).astype(real)
    im = np.where(np.arange(66) % 2 == 0, 0.0, -0.0).astype(real)
    x = (re + 1j * im).astype(dtype).reshape(SHAPE)
    x.imag[...] = im.reshape(SHAPE)  # keep -0.0
    args = [x, x, re.reshape(SHAPE)]
    _check(_module(t, OPS["sqrt"][0]), args, t)
    got = np.asarray(CpuProgram(parse_module(_module(t, OPS["sqrt"][0]))).run(args))
    np.testing.assert_array_equal(np.signbit(got.imag), np.signbit(x.imag))


def test_a_fused_complex_chain_is_one_kernel():
    text = """HloModule chain
ENTRY e {
  x = c64[6,11] parameter(0)
  y = c64[6,11] parameter(1)
  r = f32[6,11] parameter(2)
  m = c64[6,11] multiply(x, y)
  k = c64[] constant((0.5, -2))
  b = c64[6,11] broadcast(k), dimensions={}
  d = c64[6,11] divide(m, b)
  c = c64[6,11] complex(r, r)
  a = c64[6,11] add(d, c)
  t = c64[11,6] transpose(a), dimensions={1,0}
  ROOT e = c64[11,6] exponential(t)
}"""
    program = CpuProgram(parse_module(text))
    assert program.fallbacks == []
    assert program.thunk_listing().count("kernel") >= 1
    args = [_complex(np.complex64), _complex(np.complex64), RNG.standard_normal(SHAPE)]
    args[2] = args[2].astype(np.float32)
    _check(text, args, "c64")


def test_complex_ops_without_a_rule_are_listed_fallbacks():
    text = """HloModule tanh
ENTRY e {
  x = c64[4] parameter(0)
  ROOT t = c64[4] tanh(x)
}"""
    program = CpuProgram(parse_module(text))
    [fallback] = program.fallbacks
    assert "no complex rule for 'tanh'" in fallback.reason
    x = _complex(np.complex64, (4,))
    np.testing.assert_allclose(program.run([x]), np.tanh(x), rtol=1e-5)


REDUCES = [  # (operand dims, layout, reduced dimensions)
    ((6, 11), "{1,0}", "{1}"),
    ((6, 11), "{1,0}", "{0}"),
    ((6, 11), "{0,1}", "{0}"),
    ((6, 11), "{1,0}", "{0,1}"),
    ((3, 4, 70), "{2,1,0}", "{0,2}"),
]


@pytest.mark.parametrize("t", list(TYPES))
@pytest.mark.parametrize(
    "dims,layout,reduced", REDUCES, ids=[f"{r[0]}{r[1]}->{r[2]}" for r in REDUCES]
)
def test_complex_sum_is_a_kernel(t, dims, layout, reduced):
    axes = [int(a) for a in reduced.strip("{}").split(",")]
    kept = [d for i, d in enumerate(dims) if i not in axes]
    shape = ",".join(map(str, dims))
    text = f"""HloModule complex_sum
add {{
  a = {t}[] parameter(0)
  b = {t}[] parameter(1)
  ROOT s = {t}[] add(a, b)
}}
ENTRY e {{
  x = {t}[{shape}]{layout} parameter(0)
  z = {t}[] constant((0, 0))
  m = {t}[{shape}]{layout} multiply(x, x)
  ROOT r = {t}[{",".join(map(str, kept))}] reduce(m, z), dimensions={reduced}, to_apply=add
}}"""
    x = _complex(TYPES[t][0], dims)
    _check(text, [x], t)


@pytest.mark.parametrize("t", list(TYPES))
def test_sqrt_of_a_huge_negative_real_part_does_not_overflow(t):
    # corner fuzz seed 701644: sqrt(-3.4e38 + 2.45i) gave (0, inf): (|z| + |re|) / 2
    # overflowed before the halving; XLA and the interpreter give (6.6e-20, 1.8e19)
    dtype, _, real = TYPES[t]
    big = float(np.finfo(real).max)
    x = np.full(SHAPE, 1 + 1j, dtype)
    x.reshape(-1)[:4] = [complex(-big, 2.45), complex(big, -3.0), complex(-big, -big / 4), -big]
    args = [x, x, np.ones(SHAPE, real)]
    text = _module(t, OPS["sqrt"][0])
    got = np.asarray(CpuProgram(parse_module(text), {"denormals": "ieee"}).run(args))
    want = np.asarray(evaluate(parse_module(text), args))
    assert np.isfinite(got.reshape(-1)[:4]).all(), got.reshape(-1)[:4]
    np.testing.assert_allclose(got, want, rtol=TOL[t][0])
