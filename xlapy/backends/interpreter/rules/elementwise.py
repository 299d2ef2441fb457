"""Evaluation rules of the elementwise ops (unary, binary, ternary), with XLA's semantics.

Integers are computed in a wide domain (int64 for signed types, uint64 for unsigned ones)
and wrapped back to their width, so overflow wraps as in two's complement and the sub-byte
types of ml_dtypes work like the others. The cases where C++ would be undefined follow XLA:
x / 0 is -1 (all ones for unsigned), INT_MIN / -1 is INT_MIN, x % 0 is x, INT_MIN % -1 is 0,
shifts by at least the bit width (amount read as unsigned) give 0, or the sign fill for an
arithmetic right shift.

Floats: f16, f32, f64 and complex types compute in their own type (NumPy's f16 arithmetic
rounds each operation's exact result once). bf16, the f8 family and f4 compute in float32
and round the result to the type once per op. Transcendental functions of f16 compute in
float32 as well; the results are correctly rounded NumPy values, where XLA's CPU backend uses
polynomial approximations, so backends are compared with a small tolerance.

Conversions follow XLA on CPU: float -> int truncates toward zero, saturates at the range
and maps NaN to 0; int -> float and float -> float round to nearest even (f64 -> narrower
than f32 goes through a round-to-odd float32 so that it rounds once); anything -> pred is
`!= 0`; complex -> real keeps the real part.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

from xlapy.backends.interpreter.registry import evaluates
from xlapy.errors import EvaluationError
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.types import PrimitiveType

# -- element-type helpers --------------------------------------------------------------------

_NATIVE_FLOATS = frozenset(
    np.dtype(d) for d in (np.float16, np.float32, np.float64, np.complex64, np.complex128)
)


def ptype_of(array: np.ndarray) -> PrimitiveType:
    """The element type of an interpreter value."""
    return PrimitiveType.from_dtype(array.dtype)


def out_type(instr: HloInstruction) -> PrimitiveType:
    return instr.shape.element_type


def as_value(result, dtype) -> np.ndarray:
    """`result` as an ndarray of exactly `dtype` (0-d for scalars)."""
    return np.asarray(result).astype(dtype, copy=False)


def quiet(rule):
    """Run `rule` with NumPy floating-point and integer warnings silenced."""

    @functools.wraps(rule)
    def wrapper(*args):
        with np.errstate(all="ignore"):
            return rule(*args)

    return wrapper


def wide(x: np.ndarray) -> np.ndarray:
    """An integer or pred array in the wide domain: int64 (signed) or uint64 (unsigned)."""
    t = ptype_of(x)
    if t.is_signed_integral:
        return x.astype(np.int64)
    return x.astype(np.uint64)


def wrap(v: np.ndarray, t: PrimitiveType) -> np.ndarray:
    """A wide-domain integer array wrapped (mod 2**bits) into type `t`."""
    if t.is_pred:
        return as_value(v != 0, np.bool_)
    if t.bits >= 8:
        return as_value(v, t.dtype)
    mask = (1 << t.bits) - 1
    u = v.astype(np.uint64) & np.uint64(mask)
    if t.is_signed_integral:
        s = u.astype(np.int64)
        return as_value(np.where(s >= (1 << (t.bits - 1)), s - (1 << t.bits), s), t.dtype)
    return as_value(u, t.dtype)


def unsigned_bits(x: np.ndarray) -> np.ndarray:
    """The raw bit pattern of each element as uint64 (masked to the element width)."""
    t = ptype_of(x)
    if t.is_integral or t.is_pred:
        u = x.astype(np.int64).astype(np.uint64) if t.is_signed_integral else x.astype(np.uint64)
    else:
        size = x.dtype.itemsize
        u = np.asarray(x, order="C").view(np.dtype(f"u{size}")).astype(np.uint64)
    if t.bits >= 64:
        return u
    return u & np.uint64((1 << t.bits) - 1)


def from_bits(u: np.ndarray, t: PrimitiveType) -> np.ndarray:
    """Elements of type `t` whose bit patterns are the uint64 values `u`."""
    if t.is_integral:
        return wrap(u, t)
    size = t.dtype.itemsize
    return as_value(u.astype(np.dtype(f"u{size}")).view(t.dtype), t.dtype)


def to_signed(u: np.ndarray, bits: int) -> np.ndarray:
    """uint64 bit patterns of width `bits` read as two's-complement int64 values."""
    if bits >= 64:
        return u.view(np.int64)
    s = u.astype(np.int64)
    return np.where(s >= (1 << (bits - 1)), s - (1 << bits), s)


def float_compute_dtype(t: PrimitiveType) -> np.dtype:
    """The dtype float arithmetic on `t` runs in (see the module comment)."""
    return t.dtype if t.dtype in _NATIVE_FLOATS else np.dtype(np.float32)


def _float_math(fn, out: PrimitiveType, *xs: np.ndarray) -> np.ndarray:
    """fn applied to the float operands in their compute dtype, rounded to `out`."""
    args = [x.astype(float_compute_dtype(ptype_of(x)), copy=False) for x in xs]
    return as_value(fn(*args), out.dtype)


def _transcendental(fn, out: PrimitiveType, x: np.ndarray) -> np.ndarray:
    t = ptype_of(x)
    dtype = float_compute_dtype(t)
    if dtype == np.float16:
        dtype = np.dtype(np.float32)
    return as_value(fn(x.astype(dtype)), out.dtype)


# -- conversion --------------------------------------------------------------------------------


def _round_to_odd_f32(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounding to odd: truncate, then set the last bit if inexact. A
    later round-to-nearest-even to any narrower type is then a correct single rounding."""
    y = x.astype(np.float32)
    finite = np.isfinite(x)
    away = finite & (np.abs(y.astype(np.float64)) > np.abs(x))
    y = np.where(away, np.nextafter(y, np.float32(0)), y).astype(np.float32)
    inexact = finite & (y.astype(np.float64) != x)
    bits = y.view(np.uint32) | np.where(inexact, np.uint32(1), np.uint32(0))
    return bits.astype(np.uint32).view(np.float32)


def _int_to_float64_exact(v: np.ndarray, mantissa: int) -> np.ndarray:
    """Integers (int64 or uint64) rounded to nearest even at `mantissa` significant bits, as
    exactly representable float64 values."""
    if v.dtype == np.int64:
        neg = v < 0
        # |v| as uint64 (two's-complement negation, so |INT64_MIN| = 2**63 fits)
        mag = np.where(neg, ~v.view(np.uint64) + np.uint64(1), v.view(np.uint64))
    else:
        neg = np.zeros(v.shape, bool)
        mag = v
    mag = mag.astype(np.uint64)
    length = np.zeros(v.shape, np.int64)
    m = mag.copy()
    for step in (32, 16, 8, 4, 2, 1):
        big = m >= (np.uint64(1) << np.uint64(step))
        m = np.where(big, m >> np.uint64(step), m)
        length += np.where(big, step, 0)
    length += (m > 0).astype(np.int64)
    shift = np.maximum(length - mantissa, 0).astype(np.uint64)
    q = mag >> shift
    rem = mag - (q << shift)
    half = np.where(shift > 0, np.uint64(1) << (np.maximum(shift, 1) - np.uint64(1)), 0)
    up = (shift > 0) & ((rem > half) | ((rem == half) & ((q & np.uint64(1)) == 1)))
    q = q + up.astype(np.uint64)
    result = np.ldexp(q.astype(np.float64), shift.astype(np.int64))
    return np.where(neg, -result, result)


def _float_mantissa_bits(t: PrimitiveType) -> int:
    return int(ml_dtypes.finfo(t.dtype).nmant) + 1


def convert_array(x: np.ndarray, to: PrimitiveType) -> np.ndarray:
    """XLA's `convert` of array `x` to element type `to` (see the module comment)."""
    frm = ptype_of(x)
    if frm is to:
        return x.copy()
    if to.is_pred:
        return as_value(x != 0, np.bool_)
    if frm.is_complex and not to.is_complex:
        return convert_array(np.asarray(x.real, order="C"), to)
    if to.is_complex:
        real = x if frm.is_complex else x.astype(np.float64)
        return as_value(real, to.dtype)
    if to.is_integral:
        if frm.is_integral or frm.is_pred:
            return wrap(wide(x), to)
        return _float_to_int(x, to)
    # to is a real float type
    if frm.is_pred:
        return as_value(x.astype(np.float32), to.dtype)
    if frm.is_integral:
        if to.dtype in (np.float32, np.float64):
            return as_value(wide(x), to.dtype)
        exact = _int_to_float64_exact(wide(x), _float_mantissa_bits(to))
        return as_value(exact.astype(to.dtype), to.dtype)
    if frm.dtype == np.float64 and to.bits < 32:
        return as_value(_round_to_odd_f32(x).astype(to.dtype), to.dtype)
    if to.dtype in _NATIVE_FLOATS or frm.dtype in _NATIVE_FLOATS:
        return as_value(x.astype(to.dtype), to.dtype)
    return as_value(x.astype(np.float32).astype(to.dtype), to.dtype)


def _float_to_int(x: np.ndarray, to: PrimitiveType) -> np.ndarray:
    f = np.trunc(x.astype(np.float64))
    if to.is_signed_integral:
        lo, hi = -(2.0 ** (to.bits - 1)), 2.0 ** (to.bits - 1)
        ilo, ihi = -(1 << (to.bits - 1)), (1 << (to.bits - 1)) - 1
        inner = np.where((f >= lo) & (f < hi), f, 0).astype(np.int64)
        v = np.where(f >= hi, ihi, np.where(f < lo, ilo, inner)).astype(np.int64)
    else:
        hi = 2.0**to.bits
        inner = np.where((f >= 0) & (f < hi), f, 0).astype(np.uint64)
        v = np.where(f >= hi, np.uint64((1 << to.bits) - 1), inner).astype(np.uint64)
    v = np.where(np.isnan(f), 0, v).astype(v.dtype)
    return wrap(v, to)


@evaluates(Opcode.CONVERT)
@quiet
def _convert(instr, operands, ctx):
    return convert_array(operands[0], out_type(instr))


@evaluates(Opcode.BITCAST_CONVERT)
def _bitcast_convert(instr, operands, ctx):
    x = operands[0]
    frm, to = ptype_of(x), out_type(instr)
    if frm.bits == to.bits and frm.bits <= 64:  # c128's 128 bits: the byte view below
        return from_bits(unsigned_bits(x), to).reshape(instr.shape.dims)
    if frm.bits % 8 or to.bits % 8:
        raise EvaluationError(
            f"{instr.name}: bitcast-convert between {frm} and {to} changes the width of a "
            f"sub-byte type, which the interpreter does not support"
        )
    data = np.ascontiguousarray(x)
    if frm.bits > to.bits:
        result = data.reshape((*x.shape, 1)).view(to.dtype)
    else:
        result = data.view(to.dtype)
    result = result.reshape(instr.shape.dims)
    return as_value(result.copy(), to.dtype)


@evaluates(Opcode.REDUCE_PRECISION)
@quiet
def _reduce_precision(instr, operands, ctx):
    x = operands[0]
    t = ptype_of(x)
    exp_bits, mant_bits = instr.exponent_bits, instr.mantissa_bits
    if t.dtype in (np.float16, np.float32, np.float64):
        return reduce_precision(x, exp_bits, mant_bits)
    if t.is_float:
        wide_x = reduce_precision(x.astype(np.float32), exp_bits, mant_bits)
        return as_value(wide_x.astype(t.dtype), t.dtype)
    raise EvaluationError(f"{instr.name}: reduce-precision needs a float operand, got {t}")


_IEEE_LAYOUT = {
    np.dtype(np.float16): (5, 10),
    np.dtype(np.float32): (8, 23),
    np.dtype(np.float64): (11, 52),
}


def reduce_precision(x: np.ndarray, exponent_bits: int, mantissa_bits: int) -> np.ndarray:
    """Round IEEE floats to `exponent_bits`/`mantissa_bits`: nearest even on the mantissa,
    exponent overflow to signed infinity, underflow to signed zero, NaN kept."""
    src_exp, src_mant = _IEEE_LAYOUT[x.dtype]
    bits = x.dtype.itemsize * 8
    ut = np.dtype(f"u{x.dtype.itemsize}")
    one = ut.type(1)
    u = np.asarray(x, order="C").view(ut).copy()
    if mantissa_bits < src_mant:
        drop = src_mant - mantissa_bits
        last = one << ut.type(drop)
        bias = (last >> one) - one
        lsb = (u & last) >> ut.type(drop)
        u = ((u + lsb + bias) & ~(last - one)).astype(ut)
    if exponent_bits < src_exp:
        sign_mask = one << ut.type(bits - 1)
        exp_mask = ((one << ut.type(src_exp)) - one) << ut.type(src_mant)
        src_bias = (1 << (src_exp - 1)) - 1
        red_bias = (1 << (exponent_bits - 1)) - 1
        max_exp = ut.type(src_bias + red_bias) << ut.type(src_mant)
        min_exp = ut.type(src_bias - red_bias) << ut.type(src_mant)
        exponent = u & exp_mask
        signed_zero = u & sign_mask
        u = np.where(
            exponent > max_exp,
            signed_zero | exp_mask,
            np.where(exponent <= min_exp, signed_zero, u),
        ).astype(ut)
    result = np.where(np.isnan(x), x, u.view(x.dtype))
    return as_value(result, x.dtype)


# -- unary ops -----------------------------------------------------------------------------------


def _int_abs(x, t):
    if t.is_unsigned_integral or t.is_pred:
        return x.copy()
    w = wide(x)
    return wrap(np.where(w < 0, -w, w), t)


@evaluates(Opcode.ABS)
@quiet
def _abs(instr, operands, ctx):
    x = operands[0]
    t = ptype_of(x)
    if t.is_integral or t.is_pred:
        return _int_abs(x, t)
    return _float_math(np.abs, out_type(instr), x)


@evaluates(Opcode.NEGATE)
@quiet
def _negate(instr, operands, ctx):
    x = operands[0]
    t = ptype_of(x)
    if t.is_integral:
        return wrap(np.negative(wide(x)), t)
    return _float_math(np.negative, t, x)


@evaluates(Opcode.SIGN)
@quiet
def _sign(instr, operands, ctx):
    x = operands[0]
    t = ptype_of(x)
    if t.is_integral:
        w = wide(x)
        return wrap(np.where(w > 0, 1, np.where(w == 0, 0, -1)).astype(w.dtype), t)
    if t.is_complex:
        mag = np.abs(x)
        return as_value(np.where(mag == 0, x, x / np.where(mag == 0, 1, mag)), t.dtype)
    return _float_math(lambda v: np.where(v == 0, v, np.sign(v)), t, x)


@evaluates(Opcode.NOT)
def _not(instr, operands, ctx):
    x = operands[0]
    t = ptype_of(x)
    if t.is_pred:
        return np.asarray(np.logical_not(x))
    if not t.is_integral:
        raise EvaluationError(f"{instr.name}: not needs a pred or integer operand, got {t}")
    return wrap(~wide(x), t)


@evaluates(Opcode.POPCNT)
def _popcnt(instr, operands, ctx):
    x = operands[0]
    return wrap(np.bitwise_count(unsigned_bits(x)).astype(np.int64), ptype_of(x))


@evaluates(Opcode.CLZ)
def _clz(instr, operands, ctx):
    x = operands[0]
    t = ptype_of(x)
    u = unsigned_bits(x)
    length = np.zeros(u.shape, np.int64)
    for step in (32, 16, 8, 4, 2, 1):
        big = u >= (np.uint64(1) << np.uint64(step))
        u = np.where(big, u >> np.uint64(step), u)
        length += np.where(big, step, 0)
    length += (u > 0).astype(np.int64)
    return wrap(t.bits - length, t)


@evaluates(Opcode.REAL)
def _real(instr, operands, ctx):
    x = operands[0]
    return as_value(np.real(x).copy(), out_type(instr).dtype)


@evaluates(Opcode.IMAG)
def _imag(instr, operands, ctx):
    x = operands[0]
    if ptype_of(x).is_complex:
        return as_value(np.imag(x).copy(), out_type(instr).dtype)
    return np.zeros(x.shape, out_type(instr).dtype)


@evaluates(Opcode.IS_FINITE)
def _is_finite(instr, operands, ctx):
    x = operands[0]
    return np.asarray(np.isfinite(x.astype(float_compute_dtype(ptype_of(x)))))


def _round_afz(v):
    whole = np.trunc(v)
    away = whole + np.where(np.abs(v - whole) >= 0.5, np.sign(v), 0).astype(v.dtype)
    return np.copysign(away, v).astype(v.dtype)  # -0.3 and -0.0 round to -0.0, not +0.0


def _rsqrt(v):
    return 1 / np.sqrt(v)


def _logistic(v):
    if np.iscomplexobj(v):  # expit has no complex loop; XLA computes 1 / (1 + exp(-x))
        return 1 / (1 + np.exp(-v))
    from scipy.special import expit  # (scipy loads on first use: a warm compile never evaluates)

    return expit(v)


def _erf(v):
    from scipy.special import erf

    return erf(v)


def _atan2(y, x):
    """atan2, and on complex operands XLA's definition -i * log((x + iy) / sqrt(x^2 + y^2))
    (NaN where x^2 + y^2 is zero with x + iy, as XLA:CPU gives)."""
    if not np.iscomplexobj(y):
        return np.arctan2(y, x)
    return -1j * np.log((x + 1j * y) / np.sqrt(x * x + y * y))


_EXACT_UNARY = {
    Opcode.CEIL: np.ceil,
    Opcode.FLOOR: np.floor,
    Opcode.ROUND_AFZ: _round_afz,
    Opcode.ROUND_EVEN: np.rint,
}

_TRANSCENDENTAL_UNARY = {
    Opcode.CBRT: np.cbrt,
    Opcode.COS: np.cos,
    Opcode.ERF: _erf,
    Opcode.EXP: np.exp,
    Opcode.EXPM1: np.expm1,
    Opcode.LOG: np.log,
    Opcode.LOG1P: np.log1p,
    Opcode.LOGISTIC: _logistic,
    Opcode.RSQRT: _rsqrt,
    Opcode.SIN: np.sin,
    Opcode.SQRT: np.sqrt,
    Opcode.TAN: np.tan,
    Opcode.TANH: np.tanh,
}


@evaluates(*_EXACT_UNARY)
@quiet
def _exact_unary(instr, operands, ctx):
    return _float_math(_EXACT_UNARY[instr.opcode], out_type(instr), operands[0])


@evaluates(*_TRANSCENDENTAL_UNARY)
@quiet
def _transcendental_unary(instr, operands, ctx):
    x = operands[0]
    if not ptype_of(x).is_floating_or_complex:
        raise EvaluationError(
            f"{instr.name}: {instr.opcode.text} needs a float operand, got {ptype_of(x)}"
        )
    return _transcendental(_TRANSCENDENTAL_UNARY[instr.opcode], out_type(instr), x)


# -- binary ops ----------------------------------------------------------------------------------


def _int_div(a, b, t):
    if t.is_signed_integral:
        safe = np.where((b == 0) | (b == -1), 1, b).astype(np.int64)
        q = a // safe
        r = a - q * safe
        q = q + ((r != 0) & ((a < 0) != (safe < 0))).astype(np.int64)
        q = np.where(b == -1, -a, q)
        return wrap(np.where(b == 0, -1, q).astype(np.int64), t)
    safe = np.where(b == 0, 1, b).astype(np.uint64)
    q = np.where(b == 0, np.uint64((1 << t.bits) - 1 if t.bits < 64 else 2**64 - 1), a // safe)
    return wrap(q.astype(np.uint64), t)


def _int_rem(a, b, t):
    if t.is_signed_integral:
        safe = np.where((b == 0) | (b == -1), 1, b).astype(np.int64)
        r = np.fmod(a, safe)
        return wrap(np.where(b == 0, a, r).astype(np.int64), t)
    safe = np.where(b == 0, 1, b).astype(np.uint64)
    return wrap(np.where(b == 0, a, a % safe).astype(np.uint64), t)


def _shift_out_of_range(b, t):
    return unsigned_bits(wrap(b, t)) >= np.uint64(t.bits)


def _shift_left(a, b, t):
    big = _shift_out_of_range(b, t)
    amount = np.where(big, 0, b).astype(np.uint64)
    u = unsigned_bits(wrap(a, t)) << amount
    return wrap(np.where(big, np.uint64(0), u).astype(np.uint64), t)


def _shift_right_logical(a, b, t):
    big = _shift_out_of_range(b, t)
    amount = np.where(big, 0, b).astype(np.uint64)
    u = unsigned_bits(wrap(a, t)) >> amount
    return wrap(np.where(big, np.uint64(0), u).astype(np.uint64), t)


def _shift_right_arithmetic(a, b, t):
    big = _shift_out_of_range(b, t)
    amount = np.where(big, t.bits - 1, b).astype(np.int64)
    signed = to_signed(unsigned_bits(wrap(a, t)), t.bits)
    return wrap(signed >> amount, t)


def _int_pow(a, b, t):
    if t.is_signed_integral:
        negative_result = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0))
        exponent = np.where(b < 0, 0, b).astype(np.uint64)
    else:
        negative_result = None
        exponent = b.astype(np.uint64)
    result = np.ones(np.broadcast_shapes(a.shape, b.shape), a.dtype)
    base = np.broadcast_to(a, result.shape).copy()
    exponent = np.broadcast_to(exponent, result.shape).copy()
    while np.any(exponent):
        odd = (exponent & np.uint64(1)) == 1
        result = np.where(odd, result * base, result).astype(a.dtype)
        base = (base * base).astype(a.dtype)
        exponent = exponent >> np.uint64(1)
    if negative_result is not None:
        result = np.where(b < 0, negative_result, result).astype(a.dtype)
    return wrap(result, t)


_INT_BINARY = {
    Opcode.ADD: lambda a, b, t: wrap(a + b, t),
    Opcode.SUBTRACT: lambda a, b, t: wrap(a - b, t),
    Opcode.MULTIPLY: lambda a, b, t: wrap(a * b, t),
    Opcode.DIVIDE: _int_div,
    Opcode.REMAINDER: _int_rem,
    Opcode.MAXIMUM: lambda a, b, t: wrap(np.maximum(a, b), t),
    Opcode.MINIMUM: lambda a, b, t: wrap(np.minimum(a, b), t),
    Opcode.AND: lambda a, b, t: wrap(a & b, t),
    Opcode.OR: lambda a, b, t: wrap(a | b, t),
    Opcode.XOR: lambda a, b, t: wrap(a ^ b, t),
    Opcode.POWER: _int_pow,
    Opcode.SHIFT_LEFT: _shift_left,
    Opcode.SHIFT_RIGHT_LOGICAL: _shift_right_logical,
    Opcode.SHIFT_RIGHT_ARITHMETIC: _shift_right_arithmetic,
}

_PRED_BINARY = {
    Opcode.AND: np.logical_and,
    Opcode.OR: np.logical_or,
    Opcode.XOR: np.logical_xor,
    Opcode.ADD: np.logical_or,
    Opcode.MAXIMUM: np.logical_or,
    Opcode.MULTIPLY: np.logical_and,
    Opcode.MINIMUM: np.logical_and,
}

_FLOAT_BINARY = {
    Opcode.ADD: np.add,
    Opcode.SUBTRACT: np.subtract,
    Opcode.MULTIPLY: np.multiply,
    Opcode.DIVIDE: np.divide,
    Opcode.REMAINDER: np.fmod,
    Opcode.MAXIMUM: lambda a, b: float_maximum(a, b),
    Opcode.MINIMUM: lambda a, b: float_minimum(a, b),
    Opcode.POWER: np.power,
    Opcode.ATAN2: _atan2,
}


def float_maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE maximum as XLA computes it: NaN propagates and +0 is above -0 (np.maximum
    returns either zero; corner fuzz seed 601727)."""
    r = np.maximum(a, b)
    if r.dtype.kind == "c":
        return r
    return np.where((a == 0) & (b == 0), np.where(np.signbit(a), b, a), r)


def float_minimum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE minimum: NaN propagates and -0 is below +0."""
    r = np.minimum(a, b)
    if r.dtype.kind == "c":
        return r
    return np.where((a == 0) & (b == 0), np.where(np.signbit(a), a, b), r)


@evaluates(*(set(_INT_BINARY) | set(_FLOAT_BINARY)))
@quiet
def _binary(instr, operands, ctx):
    a, b = operands
    t = ptype_of(a)
    if t.is_pred:
        fn = _PRED_BINARY.get(instr.opcode)
        if fn is None:
            raise EvaluationError(f"{instr.name}: {instr.opcode.text} is not defined on pred")
        return as_value(fn(a, b), np.bool_)
    if t.is_integral:
        fn = _INT_BINARY.get(instr.opcode)
        if fn is None:
            raise EvaluationError(
                f"{instr.name}: {instr.opcode.text} needs float operands, got {t}"
            )
        return fn(wide(a), wide(b), t)
    fn = _FLOAT_BINARY.get(instr.opcode)
    if fn is None:
        raise EvaluationError(f"{instr.name}: {instr.opcode.text} needs integer operands, got {t}")
    if t.is_complex and instr.opcode is Opcode.REMAINDER:
        raise EvaluationError(f"{instr.name}: remainder is not defined on {t}")
    return _float_math(fn, out_type(instr), a, b)


@evaluates(Opcode.COMPLEX)
def _complex(instr, operands, ctx):
    a, b = operands
    out = np.empty(np.broadcast_shapes(a.shape, b.shape), out_type(instr).dtype)
    out.real = a
    out.imag = b
    return out


# -- compare -------------------------------------------------------------------------------------


def total_order_keys(x: np.ndarray) -> np.ndarray:
    """int64 keys ordering floats as -NaN < -inf < ... < -0 < +0 < ... < inf < NaN."""
    t = ptype_of(x)
    s = to_signed(unsigned_bits(x), t.bits)
    return np.where(s < 0, s ^ np.int64((1 << (t.bits - 1)) - 1), s)


_COMPARISONS = {
    "EQ": np.equal,
    "NE": np.not_equal,
    "LT": np.less,
    "LE": np.less_equal,
    "GT": np.greater,
    "GE": np.greater_equal,
}


@evaluates(Opcode.COMPARE)
@quiet
def _compare(instr, operands, ctx):
    a, b = operands
    t = ptype_of(a)
    direction = instr.comparison_direction
    fn = _COMPARISONS.get(str(direction)) if direction is not None else None
    if fn is None:
        raise EvaluationError(
            f"{instr.name}: compare needs direction=EQ|NE|LT|LE|GT|GE, got {direction}"
        )
    kind = instr.comparison_type
    if t.is_complex:
        if str(direction) not in ("EQ", "NE"):
            raise EvaluationError(f"{instr.name}: complex values only compare EQ or NE")
        return as_value(fn(a, b), np.bool_)
    if kind == "TOTALORDER" and t.is_float:
        return as_value(fn(total_order_keys(a), total_order_keys(b)), np.bool_)
    if t.is_float:
        dt = float_compute_dtype(t)
        return as_value(fn(a.astype(dt), b.astype(dt)), np.bool_)
    if t.is_pred:
        return as_value(fn(a.astype(np.uint8), b.astype(np.uint8)), np.bool_)
    if kind == "SIGNED" and t.is_unsigned_integral:
        a, b = to_signed(unsigned_bits(a), t.bits), to_signed(unsigned_bits(b), t.bits)
    elif kind == "UNSIGNED" and t.is_signed_integral:
        a, b = unsigned_bits(a), unsigned_bits(b)
    else:
        a, b = wide(a), wide(b)
    return as_value(fn(a, b), np.bool_)


# -- ternary ops ---------------------------------------------------------------------------------


@evaluates(Opcode.SELECT)
def _select(instr, operands, ctx):
    pred, on_true, on_false = operands
    result = np.where(pred, on_true, on_false)
    return np.broadcast_to(
        as_value(result, out_type(instr).dtype),
        np.broadcast_shapes(pred.shape, on_true.shape, on_false.shape),
    ).copy()


@evaluates(Opcode.CLAMP)
@quiet
def _clamp(instr, operands, ctx):
    lo, x, hi = operands
    t = ptype_of(x)
    if t.is_integral:
        v = np.minimum(np.maximum(wide(x), wide(lo)), wide(hi))
        return wrap(np.broadcast_to(v, x.shape), t)
    if t.is_pred:
        v = np.minimum(np.maximum(x, lo), hi)
        return as_value(np.broadcast_to(v, x.shape).copy(), np.bool_)
    result = _float_math(
        lambda lo_, x_, hi_: float_minimum(float_maximum(x_, lo_), hi_), t, lo, x, hi
    )
    return np.broadcast_to(result, x.shape).copy()


@evaluates(Opcode.STOCHASTIC_CONVERT)
@quiet
def _stochastic_convert(instr, operands, ctx):
    x, random = operands
    frm, to = ptype_of(x), out_type(instr)
    if not frm.is_float or not to.is_integral:
        raise EvaluationError(
            f"{instr.name}: the interpreter evaluates stochastic-convert "
            f"from a float to an integer type only, not {frm} -> {to}"
        )
    # Round |x| up when the random bits, read as a fraction of 2**bits, fall below the
    # fractional part of |x|; the sign is applied afterwards, then the result saturates.
    f = x.astype(np.float64)
    mag = np.abs(f)
    whole = np.floor(mag)
    fraction = np.ldexp(unsigned_bits(random).astype(np.float64), -ptype_of(random).bits)
    rounded = whole + ((mag - whole) > fraction)
    return _float_to_int(np.where(np.isnan(f), f, np.copysign(rounded, f)), to)
