"""Interpreter elementwise ops checked against XLA on the CPU (through JAX): each case lowers a
`jax.lax` function to HLO text, evaluates it with the interpreter on fresh random inputs, and
compares with JAX's numbers. Integer edge cases (division by zero, INT_MIN / -1, shifts past
the width, saturating converts) and the ops JAX cannot express are written as HLO by hand."""

import jax
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from xlapy.backends.interpreter import evaluate
from xlapy.errors import EvaluationError
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("x64_mode")

BF16, F16, F32, F64 = (
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(np.float16),
    np.dtype(np.float32),
    np.dtype(np.float64),
)
C64, C128 = np.dtype(np.complex64), np.dtype(np.complex128)
F8E4M3FN, F8E5M2 = np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)
FLOATS = [F32, F64, F16, BF16]
INTS = [
    np.dtype(d)
    for d in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
]

# Tolerance of transcendental functions (XLA's CPU uses approximations); exact ops use 0.
TOL = {F32: 5e-6, F64: 1e-13, F16: 2e-3, BF16: 1.6e-2, C64: 5e-6, C128: 1e-13}

SHAPE = (3, 5)


def random(rng, dtype, shape=SHAPE, domain=None):
    """Fresh random values of `dtype`; integers include the range's edges."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, shape, endpoint=True, dtype=dtype)
        flat = values.reshape(-1)
        edges = np.array(sorted({info.min, info.max, 0, 1, info.max // 2}), dtype=dtype)
        flat[: len(edges)] = edges
        return values
    if dtype.kind == "c":
        parts = rng.standard_normal((2, *shape)) * 2
        return (parts[0] + 1j * parts[1]).astype(dtype)
    if domain == "positive":
        return (rng.random(shape) * 4 + 0.05).astype(dtype)
    if domain == "above_minus_one":
        return (rng.random(shape) * 4 - 0.95).astype(dtype)
    if domain == "unit":
        return (rng.random(shape) * 1.8 - 0.9).astype(dtype)
    return (rng.standard_normal(shape) * 3).astype(dtype)


def interpret_lowered(f, *args):
    """Lower `f` with JAX, evaluate the HLO with the interpreter; return (ours, jax's)."""
    text = jax.jit(f).lower(*args).as_text(dialect="hlo")
    ours = evaluate(parse_module(text), list(args))
    theirs = f(*args)
    return ours, theirs


def check_close(ours, theirs, tol):
    theirs = np.asarray(theirs)
    assert isinstance(ours, np.ndarray)
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    assert ours.shape == theirs.shape
    if ours.dtype.kind in "biu":
        np.testing.assert_array_equal(ours, theirs)
        return
    wide = np.complex128 if ours.dtype.kind == "c" else np.float64
    if tol == 0:
        np.testing.assert_array_equal(ours.astype(wide), theirs.astype(wide))
        return
    np.testing.assert_allclose(
        ours.astype(wide), theirs.astype(wide), rtol=tol, atol=tol, equal_nan=True
    )


def run_hlo(text, *args, **state):
    return evaluate(parse_module(text), list(args), **state)


# -- unary float ops -----------------------------------------------------------------------------

# (name, jax function, input domain, exact?)
UNARY_FLOAT = [
    ("abs", lax.abs, None, True),
    ("ceil", lax.ceil, None, True),
    ("floor", lax.floor, None, True),
    ("negate", lax.neg, None, True),
    ("sign", lax.sign, None, True),
    ("round_afz", lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO), None, True),
    ("round_even", lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN), None, True),
    ("is_finite", lax.is_finite, None, True),
    ("sqrt", lax.sqrt, "positive", False),
    ("rsqrt", lax.rsqrt, "positive", False),
    ("cbrt", lax.cbrt, None, False),
    ("exp", lax.exp, None, False),
    ("expm1", lax.expm1, None, False),
    ("log", lax.log, "positive", False),
    ("log1p", lax.log1p, "above_minus_one", False),
    ("logistic", lax.logistic, None, False),
    ("sin", lax.sin, None, False),
    ("cos", lax.cos, None, False),
    ("tan", lax.tan, "unit", False),
    ("tanh", lax.tanh, None, False),
    ("erf", lax.erf, None, False),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name,fn,domain,exact", UNARY_FLOAT, ids=[c[0] for c in UNARY_FLOAT])
def test_unary_float(name, fn, domain, exact, dtype):
    rng = np.random.default_rng(abs(hash((name, str(dtype)))) % 2**32)
    x = random(rng, dtype, domain=domain)
    if name.startswith("round"):
        x[0, :3] = np.array([2.5, -0.5, 1.5], dtype=dtype)
    ours, theirs = interpret_lowered(fn, x)
    check_close(ours, theirs, 0 if exact else TOL[dtype])


def test_sign_keeps_signed_zero_and_nan():
    x = np.array([-0.0, 0.0, np.nan, -3.0, np.inf], np.float32)
    ours = run_hlo(
        """HloModule m
ENTRY e {
  x = f32[5] parameter(0)
  ROOT s = f32[5] sign(x)
}""",
        x,
    )
    np.testing.assert_array_equal(np.signbit(ours), [True, False, False, True, False])
    np.testing.assert_array_equal(ours, [0, 0, np.nan, -1, 1])


# -- binary float ops ----------------------------------------------------------------------------

BINARY_FLOAT = [
    ("add", lax.add, None, True),
    ("sub", lax.sub, None, True),
    ("mul", lax.mul, None, True),
    ("div", lax.div, None, True),
    ("max", lax.max, None, True),
    ("min", lax.min, None, True),
    ("rem", lax.rem, None, True),
    ("pow", lax.pow, "positive", False),
    ("atan2", lax.atan2, None, False),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name,fn,domain,exact", BINARY_FLOAT, ids=[c[0] for c in BINARY_FLOAT])
def test_binary_float(name, fn, domain, exact, dtype):
    rng = np.random.default_rng(abs(hash((name, str(dtype)))) % 2**32)
    a, b = random(rng, dtype, domain=domain), random(rng, dtype)
    ours, theirs = interpret_lowered(fn, a, b)
    check_close(ours, theirs, 0 if exact else TOL[dtype])


def test_max_min_propagate_nan():
    a = np.array([np.nan, 1.0, 2.0], np.float32)
    b = np.array([1.0, np.nan, 3.0], np.float32)
    for fn in (lax.max, lax.min):
        ours, theirs = interpret_lowered(fn, a, b)
        check_close(ours, theirs, 0)
        assert np.isnan(ours[:2]).all()


@pytest.mark.parametrize("dtype", [F32, BF16, F8E5M2], ids=str)
def test_max_min_order_signed_zeros_and_clamp_too(dtype):
    # corner fuzz seed 601727: np.maximum / np.minimum return either zero on a tie, so
    # minimum(-0, +0) gave +0; XLA:CPU (and the CPU backend) take -0 < +0
    x = np.array([-0.0, 0.0, -0.0, 0.0], dtype)
    y = np.array([0.0, -0.0, -0.0, 0.0], dtype)
    for fn, want in ((lax.max, [0, 0, 1, 0]), (lax.min, [1, 1, 1, 0])):
        ours, theirs = interpret_lowered(fn, x, y)
        assert list(np.signbit(ours.astype(np.float32))) == [bool(w) for w in want]
        assert list(np.signbit(theirs.astype(np.float32))) == [bool(w) for w in want]
    ours, theirs = interpret_lowered(
        lambda v: lax.clamp(np.array(0, dtype), v, np.array(1, dtype)), x
    )
    assert not np.signbit(ours.astype(np.float32)).any()


@pytest.mark.parametrize("dtype", [F8E4M3FN, F8E5M2], ids=str)
@pytest.mark.parametrize("fn", [lax.add, lax.mul, lax.sub, lax.div], ids=lambda f: f.__name__)
def test_f8_arithmetic_rounds_once_per_op(fn, dtype):
    rng = np.random.default_rng(7)
    a = random(rng, dtype, domain="positive")
    b = random(rng, dtype, domain="positive")
    ours, theirs = interpret_lowered(fn, a, b)
    check_close(ours, theirs, 0)


# -- complex ops ---------------------------------------------------------------------------------

COMPLEX_OPS = [
    ("add", lax.add, 2, True),
    ("mul", lax.mul, 2, False),
    ("div", lax.div, 2, False),
    ("neg", lax.neg, 1, True),
    ("abs", lax.abs, 1, False),
    ("sign", lax.sign, 1, False),
    ("exp", lax.exp, 1, False),
    ("log", lax.log, 1, False),
    ("sqrt", lax.sqrt, 1, False),
    ("atan2", lax.atan2, 2, False),  # XLA's -i log((x + iy) / sqrt(x^2 + y^2))
    ("logistic", lax.logistic, 1, False),
    ("real", lax.real, 1, True),
    ("imag", lax.imag, 1, True),
    ("eq", lax.eq, 2, True),
    ("ne", lax.ne, 2, True),
]


@pytest.mark.parametrize("dtype", [C64, C128], ids=str)
@pytest.mark.parametrize("name,fn,arity,exact", COMPLEX_OPS, ids=[c[0] for c in COMPLEX_OPS])
def test_complex(name, fn, arity, exact, dtype):
    rng = np.random.default_rng(abs(hash((name, str(dtype)))) % 2**32)
    args = [random(rng, dtype) for _ in range(arity)]
    if name in ("eq", "ne"):
        args[1][0] = args[0][0]
    ours, theirs = interpret_lowered(fn, *args)
    check_close(ours, theirs, 0 if exact else TOL[dtype])


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_complex_from_parts(dtype):
    rng = np.random.default_rng(3)
    a, b = random(rng, dtype), random(rng, dtype)
    ours, theirs = interpret_lowered(lax.complex, a, b)
    check_close(ours, theirs, 0)


# -- integer ops ---------------------------------------------------------------------------------

INT_BINARY = [
    ("add", lax.add),
    ("sub", lax.sub),
    ("mul", lax.mul),
    ("div", lax.div),
    ("rem", lax.rem),
    ("max", lax.max),
    ("min", lax.min),
    ("and", lax.bitwise_and),
    ("or", lax.bitwise_or),
    ("xor", lax.bitwise_xor),
]


@pytest.mark.parametrize("dtype", INTS, ids=str)
@pytest.mark.parametrize("name,fn", INT_BINARY, ids=[c[0] for c in INT_BINARY])
def test_int_binary(name, fn, dtype):
    rng = np.random.default_rng(abs(hash((name, str(dtype)))) % 2**32)
    a, b = random(rng, dtype), random(rng, dtype)
    if name in ("div", "rem"):
        b[0, :2] = 0
        b[1, :3] = np.array(-1).astype(dtype)
        b[2, :] = rng.integers(1, 9, b.shape[1]).astype(dtype)
        a[1, 0] = np.iinfo(dtype).min
    ours, theirs = interpret_lowered(fn, a, b)
    check_close(ours, theirs, 0)


INT_UNARY = [
    ("neg", lax.neg),
    ("abs", lax.abs),
    ("sign", lax.sign),
    ("not", lax.bitwise_not),
    ("popcnt", lax.population_count),
    ("clz", lax.clz),
]


# jax.lax rejects neg, abs and sign on unsigned types, so those pairs are not in the table.
INT_UNARY_CASES = [
    (name, fn, dtype)
    for name, fn in INT_UNARY
    for dtype in INTS
    if not (name in ("abs", "sign", "neg") and dtype.kind == "u")
]


@pytest.mark.parametrize(
    "name,fn,dtype", INT_UNARY_CASES, ids=[f"{c[0]}-{c[2]}" for c in INT_UNARY_CASES]
)
def test_int_unary(name, fn, dtype):
    rng = np.random.default_rng(abs(hash((name, str(dtype)))) % 2**32)
    ours, theirs = interpret_lowered(fn, random(rng, dtype))
    check_close(ours, theirs, 0)


@pytest.mark.parametrize("dtype", INTS, ids=str)
@pytest.mark.parametrize(
    "fn",
    [lax.shift_left, lax.shift_right_logical, lax.shift_right_arithmetic],
    ids=lambda f: f.__name__,
)
def test_shifts_including_out_of_range_amounts(fn, dtype):
    rng = np.random.default_rng(abs(hash((fn.__name__, str(dtype)))) % 2**32)
    bits = dtype.itemsize * 8
    a = random(rng, dtype)
    a[0, 0] = np.iinfo(dtype).min if dtype.kind == "i" else np.iinfo(dtype).max
    amounts = [0, 1, bits - 1, bits, bits + 1, 2 * bits, np.iinfo(dtype).max]
    if dtype.kind == "i":
        amounts += [-1, np.iinfo(dtype).min]
    amounts += list(rng.integers(0, bits, SHAPE[0] * SHAPE[1] - len(amounts)))
    b = np.array(amounts, dtype=dtype).reshape(SHAPE)
    ours, theirs = interpret_lowered(fn, a, b)
    check_close(ours, theirs, 0)


def test_logical_ops_on_pred():
    rng = np.random.default_rng(11)
    a, b = rng.random(SHAPE) < 0.5, rng.random(SHAPE) < 0.5
    for fn in (lax.bitwise_and, lax.bitwise_or, lax.bitwise_xor):
        ours, theirs = interpret_lowered(fn, a, b)
        check_close(ours, theirs, 0)
    ours, theirs = interpret_lowered(lax.bitwise_not, a)
    check_close(ours, theirs, 0)


POWER_HLO = """HloModule m
ENTRY e {
  a = s32[12] parameter(0)
  b = s32[12] parameter(1)
  ROOT p = s32[12] power(a, b)
}"""


def test_integer_power_is_exact_and_zero_for_negative_exponents():
    cases = [
        (2, -1, 0),
        (1, -5, 1),
        (-1, -3, -1),
        (-1, -4, 1),
        (0, -1, 0),
        (3, 4, 81),
        (2, 31, -(2**31)),
        (-2, 3, -8),
        (0, 0, 1),
        (7, 0, 1),
        (-3, 5, -243),
        (3, 21, 1870418611),
    ]
    a = np.array([c[0] for c in cases], np.int32)
    b = np.array([c[1] for c in cases], np.int32)
    expected = np.array([c[2] for c in cases], np.int32)
    np.testing.assert_array_equal(run_hlo(POWER_HLO, a, b), expected)


# -- compare -------------------------------------------------------------------------------------

DIRECTIONS = {"EQ": lax.eq, "NE": lax.ne, "LT": lax.lt, "LE": lax.le, "GT": lax.gt, "GE": lax.ge}


@pytest.mark.parametrize("dtype", [F32, BF16, F16, np.dtype(np.int32), np.dtype(np.uint8)], ids=str)
@pytest.mark.parametrize("direction", list(DIRECTIONS))
def test_compare(direction, dtype):
    rng = np.random.default_rng(abs(hash((direction, str(dtype)))) % 2**32)
    a, b = random(rng, dtype), random(rng, dtype)
    b[0] = a[0]
    if dtype.kind == "f":
        a[1, 0] = np.nan
    ours, theirs = interpret_lowered(DIRECTIONS[direction], a, b)
    check_close(ours, theirs, 0)


TOTAL_ORDER_HLO = """HloModule m
ENTRY e {{
  a = {t}[8,8] parameter(0)
  b = {t}[8,8] parameter(1)
  ROOT c = pred[8,8] compare(a, b), direction={d}, type=TOTALORDER
}}"""


@pytest.mark.parametrize(
    "t,dtype",
    [("f32", np.float32), ("f64", np.float64), ("bf16", ml_dtypes.bfloat16), ("f16", np.float16)],
)
@pytest.mark.parametrize("direction", ["LT", "LE", "EQ", "GT", "NE"])
def test_total_order_compare(t, dtype, direction):
    nan = np.array(np.nan, np.float32)
    ordered = np.array([-nan, -np.inf, -1.5, -0.0, 0.0, 2.0, np.inf, nan], np.float32)
    values = ordered.astype(dtype)
    assert np.signbit(values[0]) and not np.signbit(values[7])
    a, b = np.repeat(values[:, None], 8, 1), np.repeat(values[None, :], 8, 0)
    i, j = np.indices((8, 8))
    expected = {"LT": i < j, "LE": i <= j, "EQ": i == j, "GT": i > j, "NE": i != j}
    ours = run_hlo(TOTAL_ORDER_HLO.format(t=t, d=direction), a, b)
    np.testing.assert_array_equal(ours, expected[direction])


def test_float_compare_nan_unordered_and_signed_zero_equal():
    text = TOTAL_ORDER_HLO.replace(", type=TOTALORDER", "").format(t="f32", d="EQ")
    v = np.array([np.nan, -0.0, 0.0, 1, 2, 3, 4, 5], np.float32)
    ours = run_hlo(text, np.repeat(v[:, None], 8, 1), np.repeat(v[None, :], 8, 0))
    assert not ours[0, 0] and ours[1, 2] and ours[2, 1] and ours[3, 3]


def test_compare_unsigned_type_on_signed_operands():
    text = """HloModule m
ENTRY e {
  a = s8[3] parameter(0)
  b = s8[3] parameter(1)
  ROOT c = pred[3] compare(a, b), direction=LT, type=UNSIGNED
}"""
    ours = run_hlo(text, np.array([-1, 1, 5], np.int8), np.array([1, -1, 6], np.int8))
    np.testing.assert_array_equal(ours, [False, True, True])


# -- converts ------------------------------------------------------------------------------------

CONVERT_PAIRS = [
    (F32, np.dtype(np.int32)),
    (F32, np.dtype(np.int8)),
    (F32, np.dtype(np.uint8)),
    (F32, np.dtype(np.uint32)),
    (F64, np.dtype(np.int64)),
    (F64, np.dtype(np.uint64)),
    (F32, np.dtype(np.int16)),
    (BF16, np.dtype(np.int32)),
    (F16, np.dtype(np.int8)),
    (np.dtype(np.int32), F32),
    (np.dtype(np.int64), F32),
    (np.dtype(np.int64), F16),
    (np.dtype(np.int32), BF16),
    (np.dtype(np.uint64), BF16),
    (np.dtype(np.uint32), F16),
    (F32, BF16),
    (F32, F16),
    (F64, F32),
    (BF16, F32),
    (F16, BF16),
    (BF16, F16),
    (F32, F8E4M3FN),
    (F32, F8E5M2),
    (F8E4M3FN, F32),
    (BF16, F8E5M2),
    (np.dtype(np.int32), np.dtype(np.int8)),
    (np.dtype(np.int8), np.dtype(np.uint32)),
    (np.dtype(np.uint64), np.dtype(np.int16)),
    (np.dtype(np.int32), np.dtype(np.bool_)),
    (F32, np.dtype(np.bool_)),
    (np.dtype(np.bool_), F32),
    (C64, F32),
    (F32, C64),
    (np.dtype(np.int32), C128),
]


@pytest.mark.parametrize("frm,to", CONVERT_PAIRS, ids=lambda d: str(d))
def test_convert(frm, to):
    rng = np.random.default_rng(abs(hash((str(frm), str(to)))) % 2**32)
    if frm == np.bool_:
        x = rng.random(SHAPE) < 0.5
    elif frm.kind == "f" and to.kind in "iu":
        info = np.iinfo(to)
        x = (rng.standard_normal(SHAPE) * float(info.max) * 0.8).astype(frm)
        edge = [np.nan, np.inf, -np.inf, -1.5, 2.5, float(info.max) * 4, float(info.min) * 4 - 8]
        x.reshape(-1)[: len(edge)] = np.array(edge).astype(frm)
    elif frm.kind == "f" and to.kind == "f":
        x = (rng.standard_normal(SHAPE) * 50).astype(frm)
        x.reshape(-1)[:4] = np.array([np.nan, np.inf, -np.inf, -0.0]).astype(frm)
    else:
        x = random(rng, frm)
    ours, theirs = interpret_lowered(lambda v: lax.convert_element_type(v, to), x)
    check_close(ours, theirs, 0)


def test_convert_float_to_int_saturates_and_maps_nan_to_zero():
    text = """HloModule m
ENTRY e {
  x = f32[6] parameter(0)
  ROOT c = s32[6] convert(x)
}"""
    x = np.array([np.nan, 3e9, -3e9, -2.9, 2.9, np.inf], np.float32)
    np.testing.assert_array_equal(run_hlo(text, x), [0, 2**31 - 1, -(2**31), -2, 2, 2**31 - 1])
    text_u = text.replace("s32[6] convert", "u8[6] convert")
    np.testing.assert_array_equal(run_hlo(text_u, x), [0, 255, 0, 0, 2, 255])


def test_convert_f64_to_bf16_rounds_once():
    text = """HloModule m
ENTRY e {
  x = f64[2] parameter(0)
  ROOT c = bf16[2] convert(x)
}"""
    x = np.array([1 + 2**-8 + 2**-30, -(1 + 2**-8)], np.float64)
    ours = run_hlo(text, x).astype(np.float64)
    np.testing.assert_array_equal(ours, [1 + 2**-7, -1.0])


@pytest.mark.parametrize(
    "t,expected",
    [
        ("f16", np.array([2048, 2052, np.inf, -np.inf], np.float16)),
        ("bf16", np.array([2048, 2048, 2**40 + 2**33, -(2.0**63)]).astype(ml_dtypes.bfloat16)),
    ],
)
def test_convert_large_int64_to_narrow_floats_rounds_to_nearest_even(t, expected):
    text = f"""HloModule m
ENTRY e {{
  x = s64[4] parameter(0)
  ROOT c = {t}[4] convert(x)
}}"""
    x = np.array([2049, 2051, 2**40 + 2**33 + 1, -(2**63)], np.int64)
    np.testing.assert_array_equal(run_hlo(text, x), expected)


# -- bitcast-convert -----------------------------------------------------------------------------

BITCAST_PAIRS = [
    (F32, np.dtype(np.int32)),
    (F32, np.dtype(np.uint32)),
    (np.dtype(np.int32), F32),
    (F64, np.dtype(np.uint64)),
    (BF16, np.dtype(np.int16)),
    (F16, BF16),
    (F32, np.dtype(np.uint8)),
    (F32, BF16),
    (F64, np.dtype(np.int32)),
    (np.dtype(np.uint8), F32),
    (np.dtype(np.int16), F64),
    (F32, F16),
]


@pytest.mark.parametrize("frm,to", BITCAST_PAIRS, ids=lambda d: str(d))
def test_bitcast_convert(frm, to):
    rng = np.random.default_rng(abs(hash((str(frm), str(to)))) % 2**32)
    ratio = to.itemsize / frm.itemsize
    shape = (3, 4) if ratio >= 1 else (3,)
    if ratio > 1:
        shape = (3, int(ratio))
    x = random(rng, frm, shape)
    ours, theirs = interpret_lowered(lambda v: lax.bitcast_convert_type(v, to), x)
    check_close(ours, theirs, 0)
    expected = np.ascontiguousarray(x).view(to).reshape(theirs.shape)
    np.testing.assert_array_equal(ours.view(np.uint8), expected.view(np.uint8))


NAME = {F16: "f16", BF16: "bf16", F32: "f32", F64: "f64"}


@pytest.mark.parametrize("dtype", [F16, BF16, F32, F64], ids=str)
def test_round_away_from_zero_keeps_the_sign_of_zero(dtype):
    # corner fuzz seed 20261131: round-nearest-afz of -0.0 (and of -0.3) gave +0.0 (trunc's
    # -0.0 plus a 0 of the other sign); XLA:CPU and the CPU backend give -0.0
    text = f"""HloModule m
ENTRY e {{
  p = {NAME[dtype]}[5] parameter(0)
  ROOT r = {NAME[dtype]}[5] round-nearest-afz(p)
}}"""
    x = np.array([-0.0, -0.3, -0.5, 0.3, -2.5], dtype)
    out = run_hlo(text, x).astype(np.float64)
    np.testing.assert_array_equal(out, [-0.0, -0.0, -1.0, 0.0, -3.0])
    assert list(np.signbit(out)) == [True, True, True, False, True]


def test_bitcast_convert_of_128_bit_complex_to_itself():
    # corner fuzz seed 318: c128 -> c128 raised "data type 'u16' not understood" (the
    # same-width path read the bits as a 16-byte unsigned integer, which NumPy lacks)
    text = """HloModule m
ENTRY e {
  p = c128[1,3] parameter(0)
  ROOT r = c128[1,3] bitcast-convert(p)
}"""
    x = np.array([[1 + 2j, np.nan - np.inf * 1j, -0.0 + 5e-324j]], np.complex128)
    out = run_hlo(text, x)
    assert out.dtype == np.complex128
    np.testing.assert_array_equal(out.view(np.uint64), x.view(np.uint64))


# -- reduce-precision ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
@pytest.mark.parametrize(
    "exponent_bits,mantissa_bits", [(5, 10), (8, 7), (4, 3), (5, 2), (8, 0), (3, 23)]
)
def test_reduce_precision(exponent_bits, mantissa_bits, dtype):
    rng = np.random.default_rng(exponent_bits * 100 + mantissa_bits)
    x = (rng.standard_normal((4, 8)) * 10.0 ** rng.integers(-8, 8, (4, 8))).astype(dtype)
    x.reshape(-1)[:5] = np.array([np.nan, np.inf, -np.inf, 1e30, -0.0]).astype(dtype)
    x.reshape(-1)[5] = 1 + 2.0**-11 if mantissa_bits == 10 else 3.0
    ours, theirs = interpret_lowered(
        lambda v: lax.reduce_precision(v, exponent_bits=exponent_bits, mantissa_bits=mantissa_bits),
        x,
    )
    check_close(ours, theirs, 0)


def test_reduce_precision_to_f16_matches_f16_conversion_for_normals():
    text = """HloModule m
ENTRY e {
  x = f32[64] parameter(0)
  ROOT r = f32[64] reduce-precision(x), exponent_bits=5, mantissa_bits=10
}"""
    x = np.random.default_rng(1).uniform(-60000, 60000, 64).astype(np.float32)
    np.testing.assert_array_equal(run_hlo(text, x), x.astype(np.float16).astype(np.float32))


# -- ternary ops ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F32, BF16, np.dtype(np.int32), np.dtype(np.uint8)], ids=str)
def test_clamp_with_scalar_bounds(dtype):
    rng = np.random.default_rng(5)
    x = random(rng, dtype)
    lo, hi = np.array(2).astype(dtype), np.array(60).astype(dtype)
    if dtype.kind == "f":
        x[0, 0] = np.nan
        lo = np.array(-1.0).astype(dtype)
        hi = np.array(1.0).astype(dtype)
    ours, theirs = interpret_lowered(lax.clamp, lo, x, hi)
    check_close(ours, theirs, 0)


def test_clamp_with_array_bounds():
    rng = np.random.default_rng(6)
    x, lo = random(rng, F32), random(rng, F32) - 2
    hi = lo + 3
    ours, theirs = interpret_lowered(lax.clamp, lo, x, hi)
    check_close(ours, theirs, 0)


@pytest.mark.parametrize("dtype", [F32, BF16, np.dtype(np.int64), C64], ids=str)
def test_select(dtype):
    rng = np.random.default_rng(8)
    pred = rng.random(SHAPE) < 0.5
    a, b = random(rng, dtype), random(rng, dtype)
    ours, theirs = interpret_lowered(lax.select, pred, a, b)
    check_close(ours, theirs, 0)


def test_select_with_scalar_pred():
    text = """HloModule m
ENTRY e {
  p = pred[] parameter(0)
  a = f32[3] parameter(1)
  b = f32[3] parameter(2)
  ROOT s = f32[3] select(p, a, b)
}"""
    a, b = np.array([1, 2, 3], np.float32), np.array([4, 5, 6], np.float32)
    np.testing.assert_array_equal(run_hlo(text, np.array(True), a, b), a)
    np.testing.assert_array_equal(run_hlo(text, np.array(False), a, b), b)


def test_results_are_0d_arrays_not_numpy_scalars():
    text = """HloModule m
ENTRY e {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT d = s32[] add(a, b)
}"""
    ours = run_hlo(text, np.array(2**31 - 1, np.int32), np.array(1, np.int32))
    assert isinstance(ours, np.ndarray) and ours.shape == () and ours.dtype == np.int32
    assert int(ours) == -(2**31)


def test_not_on_float_is_a_clear_error():
    text = """HloModule m
ENTRY e {
  a = f32[] parameter(0)
  ROOT n = f32[] not(a)
}"""
    with pytest.raises(EvaluationError, match="not needs a pred or integer"):
        run_hlo(text, np.array(1.0, np.float32))


def test_stochastic_convert_rounds_by_random_bits():
    text = """HloModule m
ENTRY e {
  x = f32[4] parameter(0)
  r = u32[4] parameter(1)
  ROOT c = s32[4] stochastic-convert(x, r)
}"""
    x = np.array([1.25, 1.25, -2.75, np.nan], np.float32)
    r = np.array([0, 2**31, 2**30, 5], np.uint32)
    np.testing.assert_array_equal(run_hlo(text, x, r), [2, 1, -3, 0])


# -- 0-d values stay arrays ----------------------------------------------------------------------

# (opcode text, operand type, result type): NumPy returns scalars for 0-d inputs of some
# ufuncs; a rule must hand back a 0-d ndarray, or a while condition built on it fails.
SCALAR_OPS = [
    *[(op, t, t) for op in ("abs", "negate", "sign", "exponential", "floor") for t in ("f32",)],
    *[(op, t, t) for op in ("not", "popcnt") for t in ("s32", "u8")],
    ("not", "pred", "pred"),
    ("is-finite", "f32", "pred"),
    ("is-finite", "f64", "pred"),
    *[(op, "pred", "pred") for op in ("and", "or", "xor")],
    *[(op, "f32", "f32") for op in ("add", "maximum", "power", "atan2", "remainder")],
]


@pytest.mark.parametrize("op,operand,result", SCALAR_OPS, ids=lambda c: str(c))
def test_scalar_results_are_0d_arrays(op, operand, result):
    binary = op in ("and", "or", "xor", "add", "maximum", "power", "atan2", "remainder")
    args = "p, p" if binary else "p"
    text = f"HloModule m\nENTRY e {{\n  p = {operand}[] parameter(0)\n"
    text += f"  ROOT r = {result}[] {op}({args})\n}}"
    dtype = {"pred": np.bool_, "s32": np.int32, "u8": np.uint8, "f32": np.float32}
    dtype["f64"] = np.float64
    value = np.asarray(0.75 if operand.startswith("f") else 3).astype(dtype[operand])
    out = run_hlo(text, value)
    assert type(out) is np.ndarray and out.shape == ()


def test_while_condition_ending_in_not():
    text = """HloModule m
cond {
  s = s32[] parameter(0)
  ten = s32[] constant(10)
  ge = pred[] compare(s, ten), direction=GE
  ROOT keep = pred[] not(ge)
}
body {
  s = s32[] parameter(0)
  one = s32[] constant(1)
  ROOT next = s32[] add(s, one)
}
ENTRY e {
  p = s32[] parameter(0)
  ROOT w = s32[] while(p), condition=cond, body=body
}"""
    assert int(run_hlo(text, np.asarray(3, np.int32))) == 10
