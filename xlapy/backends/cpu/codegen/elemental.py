# Elemental emission rules, one per opcode: rule(emitter, instr, index) -> LLVM value of
# `instr` at logical `index`. Integer semantics follow XLA (and the interpreter): x / 0 is -1
# (all ones unsigned), INT_MIN / -1 is INT_MIN, x % 0 is x, shifts by >= the bit width give 0
# (sign fill for arithmetic right shifts); float -> int converts saturate and map NaN to 0
# (llvm.fptosi.sat). Divisors are made safe before the division so no lane can trap.

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import (
    F16,
    F32,
    F64,
    I1,
    I16,
    I32,
    I64,
    REDUCE_BLOCK,
    UnsupportedForCodegen,
    emits,
    mem_type,
    reduce_hero,
    reg_type,
)
from xlapy.backends.cpu.codegen.complex import (
    Complex,
    complex_binary,
    complex_convert,
    complex_unary,
)
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.types import PrimitiveType

if TYPE_CHECKING:
    from xlapy.backends.cpu.codegen.emitter import KernelEmitter

P = PrimitiveType
Op = Opcode


def _et(instr: HloInstruction) -> PrimitiveType:
    return instr.shape.element_type


def _ot(instr: HloInstruction, i: int = 0) -> PrimitiveType:
    return instr.operands[i].shape.element_type


def _const(ty, v):
    return ir.Constant(ty, v)


def _all_ones(ty):
    return ir.Constant(ty, (1 << ty.width) - 1)


# -- floats ------------------------------------------------------------------------------------


def _fsign(em, x):
    b = em.b
    one = em.math.copysign(_const(x.type, 1.0), x)
    keep = b.fcmp_unordered("ueq", x, _const(x.type, 0.0))
    return b.select(keep, x, one)


def _round_afz(em, x):
    return em.math.call("round", x)


_FLOAT_UNARY = {
    Op.ABS: lambda em, x: em.math.fabs(x),
    Op.NEGATE: lambda em, x: em.b.fneg(x),
    Op.SIGN: _fsign,
    Op.FLOOR: lambda em, x: em.math.call("floor", x),
    Op.CEIL: lambda em, x: em.math.call("ceil", x),
    Op.ROUND_EVEN: lambda em, x: em.math.call("rint", x),
    Op.ROUND_AFZ: _round_afz,
    Op.SQRT: lambda em, x: em.math.sqrt(x),
    Op.RSQRT: lambda em, x: em.math.rsqrt(x),
    Op.CBRT: lambda em, x: em.math.cbrt(x),
    Op.EXP: lambda em, x: em.math.exp(x),
    Op.EXPM1: lambda em, x: em.math.expm1(x),
    Op.LOG: lambda em, x: em.math.log(x),
    Op.LOG1P: lambda em, x: em.math.log1p(x),
    Op.TANH: lambda em, x: em.math.tanh(x),
    Op.LOGISTIC: lambda em, x: em.math.logistic(x),
    Op.SIN: lambda em, x: em.math.sin(x),
    Op.COS: lambda em, x: em.math.cos(x),
    Op.TAN: lambda em, x: em.math.tan(x),
    Op.ERF: lambda em, x: em.math.erf(x),
    Op.COPY: lambda em, x: x,
}

_FLOAT_BINARY = {
    Op.ADD: lambda em, a, c: em.b.fadd(a, c),
    Op.SUBTRACT: lambda em, a, c: em.b.fsub(a, c),
    Op.MULTIPLY: lambda em, a, c: em.b.fmul(a, c),
    Op.DIVIDE: lambda em, a, c: em.b.fdiv(a, c),
    Op.REMAINDER: lambda em, a, c: em.b.frem(a, c),
    Op.MAXIMUM: lambda em, a, c: em.math.call("maximum", a, c),
    Op.MINIMUM: lambda em, a, c: em.math.call("minimum", a, c),
    Op.POWER: lambda em, a, c: em.math.pow(a, c),
    Op.ATAN2: lambda em, a, c: em.math.atan2(a, c),
}


# -- integers ----------------------------------------------------------------------------------


def _idiv(em, a, c, signed):
    b, ty = em.b, a.type
    zero = b.icmp_unsigned("==", c, _const(ty, 0))
    if not signed:
        q = b.udiv(a, b.select(zero, _const(ty, 1), c))
        return b.select(zero, _all_ones(ty), q)
    minus1 = b.icmp_signed("==", c, _all_ones(ty))
    safe = b.select(b.or_(zero, minus1), _const(ty, 1), c)
    q = b.select(minus1, b.neg(a), b.sdiv(a, safe))
    return b.select(zero, _all_ones(ty), q)


def _irem(em, a, c, signed):
    b, ty = em.b, a.type
    zero = b.icmp_unsigned("==", c, _const(ty, 0))
    if not signed:
        return b.select(zero, a, b.urem(a, b.select(zero, _const(ty, 1), c)))
    minus1 = b.icmp_signed("==", c, _all_ones(ty))
    r = b.srem(a, b.select(b.or_(zero, minus1), _const(ty, 1), c))
    return b.select(zero, a, b.select(minus1, _const(ty, 0), r))


def _shift(em, a, c, kind):
    b, ty = em.b, a.type
    big = b.icmp_unsigned(">=", c, _const(ty, ty.width))
    if kind == "ashr":
        return b.ashr(a, b.select(big, _const(ty, ty.width - 1), c))
    shifted = (b.shl if kind == "shl" else b.lshr)(a, b.select(big, _const(ty, 0), c))
    return b.select(big, _const(ty, 0), shifted)


def _ipow(em, a, c, signed):
    b, ty = em.b, a.type
    result = _const(ty, 1)
    base = a
    for k in range(ty.width):
        bit = b.icmp_unsigned("!=", b.and_(c, _const(ty, 1 << k)), _const(ty, 0))
        result = b.select(bit, b.mul(result, base), result)
        base = b.mul(base, base)
    if not signed:
        return result
    neg = b.icmp_signed("<", c, _const(ty, 0))
    even = b.icmp_unsigned("==", b.and_(c, _const(ty, 1)), _const(ty, 0))
    minus_one_pow = b.select(even, _const(ty, 1), _all_ones(ty))
    small = b.select(
        b.icmp_signed("==", a, _const(ty, 1)),
        _const(ty, 1),
        b.select(b.icmp_signed("==", a, _all_ones(ty)), minus_one_pow, _const(ty, 0)),
    )
    return b.select(neg, small, result)


def _imax(em, a, c, signed):
    cmp = em.b.icmp_signed if signed else em.b.icmp_unsigned
    return em.b.select(cmp(">", a, c), a, c)


def _imin(em, a, c, signed):
    cmp = em.b.icmp_signed if signed else em.b.icmp_unsigned
    return em.b.select(cmp("<", a, c), a, c)


_INT_BINARY = {
    Op.ADD: lambda em, a, c, s: em.b.add(a, c),
    Op.SUBTRACT: lambda em, a, c, s: em.b.sub(a, c),
    Op.MULTIPLY: lambda em, a, c, s: em.b.mul(a, c),
    Op.DIVIDE: _idiv,
    Op.REMAINDER: _irem,
    Op.MAXIMUM: _imax,
    Op.MINIMUM: _imin,
    Op.AND: lambda em, a, c, s: em.b.and_(a, c),
    Op.OR: lambda em, a, c, s: em.b.or_(a, c),
    Op.XOR: lambda em, a, c, s: em.b.xor(a, c),
    Op.POWER: _ipow,
    Op.SHIFT_LEFT: lambda em, a, c, s: _shift(em, a, c, "shl"),
    Op.SHIFT_RIGHT_LOGICAL: lambda em, a, c, s: _shift(em, a, c, "lshr"),
    Op.SHIFT_RIGHT_ARITHMETIC: lambda em, a, c, s: _shift(em, a, c, "ashr"),
}

_PRED_BINARY = {
    Op.AND: "and_",
    Op.OR: "or_",
    Op.XOR: "xor",
    Op.ADD: "or_",
    Op.MAXIMUM: "or_",
    Op.MULTIPLY: "and_",
    Op.MINIMUM: "and_",
}


def _iabs(em, x, signed):
    if not signed:
        return x
    return em.b.select(em.b.icmp_signed("<", x, _const(x.type, 0)), em.b.neg(x), x)


def _isign(em, x, signed):
    b, ty = em.b, x.type
    pos = b.zext(b.icmp_unsigned("!=", x, _const(ty, 0)), ty)
    if not signed:
        return pos
    return b.select(b.icmp_signed("<", x, _const(ty, 0)), _all_ones(ty), pos)


def _intrinsic_int(em, name, x, extra=()):
    ty = x.type
    fnty = ir.FunctionType(ty, [ty] + [e.type for e in extra])
    full = f"llvm.{name}.i{ty.width}"
    fn = em.module.globals.get(full) or ir.Function(em.module, fnty, full)
    return em.b.call(fn, [x, *extra])


_INT_UNARY = {
    Op.ABS: _iabs,
    Op.NEGATE: lambda em, x, s: em.b.neg(x),
    Op.SIGN: _isign,
    Op.NOT: lambda em, x, s: em.b.not_(x),
    Op.POPCNT: lambda em, x, s: _intrinsic_int(em, "ctpop", x),
    Op.CLZ: lambda em, x, s: _intrinsic_int(em, "ctlz", x, (ir.Constant(I1, 0),)),
    Op.COPY: lambda em, x, s: x,
}


# -- rules ---------------------------------------------------------------------------------------


def _unsupported(instr, what):
    return UnsupportedForCodegen(f"{instr.name}: {instr.opcode.text} {what}")


@emits(*(set(_FLOAT_UNARY) | set(_INT_UNARY)), Op.IS_FINITE)
def _unary(em: KernelEmitter, instr, index):
    x = em.operand_at(instr, 0, index)
    t = _ot(instr)
    if instr.opcode is Op.IS_FINITE:
        return em.b.fcmp_ordered("<", em.math.fabs(x), _const(x.type, math.inf))
    if t.is_complex:
        return complex_unary(em, instr, x)
    if t is P.PRED:
        if instr.opcode is Op.NOT:
            return em.b.not_(x)
        if instr.opcode in (Op.COPY, Op.ABS):
            return x
        raise _unsupported(instr, "is not defined on pred")
    if t.is_integral:
        int_fn = _INT_UNARY.get(instr.opcode)
        if int_fn is None:
            raise _unsupported(instr, f"needs a float operand, got {t}")
        return int_fn(em, x, t.is_signed_integral)
    float_fn = _FLOAT_UNARY.get(instr.opcode)
    if float_fn is None:
        raise _unsupported(instr, f"needs an integer operand, got {t}")
    return em.round_to(float_fn(em, x), _et(instr))


@emits(*(set(_FLOAT_BINARY) | set(_INT_BINARY)))
def _binary(em: KernelEmitter, instr, index):
    a = em.operand_at(instr, 0, index)
    c = em.operand_at(instr, 1, index)
    t = _ot(instr)
    if t.is_complex:
        return complex_binary(em, instr, a, c)
    if t is P.PRED:
        name = _PRED_BINARY.get(instr.opcode)
        if name is None:
            raise _unsupported(instr, "is not defined on pred")
        return getattr(em.b, name)(a, c)
    if t.is_integral:
        int_fn = _INT_BINARY.get(instr.opcode)
        if int_fn is None:
            raise _unsupported(instr, f"needs float operands, got {t}")
        return int_fn(em, a, c, t.is_signed_integral)
    float_fn = _FLOAT_BINARY.get(instr.opcode)
    if float_fn is None:
        raise _unsupported(instr, f"needs integer operands, got {t}")
    return em.round_to(float_fn(em, a, c), _et(instr))


_FCMP = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}


def _total_order_key(em, x):
    b = em.b
    ity = I32 if x.type == F32 else I64
    s = b.bitcast(x, ity)
    mask = b.and_(b.ashr(s, _const(ity, ity.width - 1)), _const(ity, (1 << (ity.width - 1)) - 1))
    return b.xor(s, mask)


@emits(Op.COMPARE)
def _compare(em: KernelEmitter, instr, index):
    a = em.operand_at(instr, 0, index)
    c = em.operand_at(instr, 1, index)
    t = _ot(instr)
    direction = instr.comparison_direction
    op = _FCMP.get(str(direction)) if direction is not None else None
    if op is None:
        raise _unsupported(instr, f"needs direction=EQ|NE|LT|LE|GT|GE, got {direction}")
    kind = instr.comparison_type or ""
    b = em.b
    if t.is_complex:
        return Complex(em).compare(op, a, c)
    if t.is_float:
        if kind == "TOTALORDER":
            return b.icmp_signed(op, _total_order_key(em, a), _total_order_key(em, c))
        if op == "!=":
            return b.fcmp_unordered(op, a, c)
        return b.fcmp_ordered(op, a, c)
    signed = t.is_signed_integral
    if kind == "SIGNED":
        signed = True
    elif kind == "UNSIGNED":
        signed = False
    return (b.icmp_signed if signed else b.icmp_unsigned)(op, a, c)


@emits(Op.SELECT)
def _select(em: KernelEmitter, instr, index):
    p = em.operand_at(instr, 0, index)
    return em.b.select(p, em.operand_at(instr, 1, index), em.operand_at(instr, 2, index))


@emits(Op.CLAMP)
def _clamp(em: KernelEmitter, instr, index):
    lo = em.operand_at(instr, 0, index)
    x = em.operand_at(instr, 1, index)
    hi = em.operand_at(instr, 2, index)
    t = _et(instr)
    if t.is_float:
        return em.math.call("minimum", em.math.call("maximum", x, lo), hi)
    signed = t.is_signed_integral
    return _imin(em, _imax(em, x, lo, signed), hi, signed)


# -- conversions ---------------------------------------------------------------------------------


def _round_to_odd_f32(em, x):
    """f64 -> f32 rounding to odd, so a following round to f16/bf16 rounds only once."""
    b = em.b
    y = b.fptrunc(x, F32)
    bits = b.bitcast(y, I32)
    away = b.fcmp_ordered(">", em.math.fabs(b.fpext(y, F64)), em.math.fabs(x))
    bits = b.select(away, b.sub(bits, _const(I32, 1)), bits)
    inexact = b.fcmp_ordered("!=", b.fpext(b.bitcast(bits, F32), F64), x)
    bits = b.select(inexact, b.or_(bits, _const(I32, 1)), bits)
    return b.select(em.math.isnan(x), b.fptrunc(x, F32), b.bitcast(bits, F32))


def convert_value(em: KernelEmitter, x, frm: PrimitiveType, to: PrimitiveType):
    """XLA's convert of register value `x` from `frm` to `to`."""
    b = em.b
    if frm is to:
        return x
    if to.is_complex:
        return complex_convert(em, x, frm, to, convert_value)
    if to is P.PRED:
        if frm.is_float:
            return b.fcmp_unordered("!=", x, _const(x.type, 0.0))
        return b.icmp_unsigned("!=", x, _const(x.type, 0))
    if frm is P.PRED:
        if to.is_float:
            return b.uitofp(x, reg_type(to))
        return b.zext(x, reg_type(to))
    if to.is_integral:
        ty = reg_type(to)
        if frm.is_integral:
            if to.bits < frm.bits:
                return b.trunc(x, ty)
            if to.bits == frm.bits:
                return x
            return (b.sext if frm.is_signed_integral else b.zext)(x, ty)
        name = "fptosi.sat" if to.is_signed_integral else "fptoui.sat"
        fname = f"llvm.{name}.i{to.bits}.{'f32' if x.type == F32 else 'f64'}"
        fn = em.module.globals.get(fname) or ir.Function(
            em.module, ir.FunctionType(ty, [x.type]), fname
        )
        return b.call(fn, [x])
    # to a float type
    if frm.is_integral:
        conv = b.sitofp if frm.is_signed_integral else b.uitofp
        if to is P.F64 or to is P.F32:
            return conv(x, reg_type(to))
        wide = conv(x, F64)
        return em.round_to(_round_to_odd_f32(em, wide), to)
    if to is P.F64:
        return b.fpext(x, F64)
    if frm is P.F64:
        if to is P.F32:
            return b.fptrunc(x, F32)
        return em.round_to(_round_to_odd_f32(em, x), to)
    return em.round_to(x, to)


@emits(Op.REAL, Op.IMAG)
def _real_imag(em: KernelEmitter, instr, index):
    x = em.operand_at(instr, 0, index)
    if not _ot(instr).is_complex:  # of a real value: itself, or 0
        return x if instr.opcode is Op.REAL else _const(x.type, 0.0)
    return em.b.extract_value(x, 0 if instr.opcode is Op.REAL else 1)


@emits(Op.COMPLEX)
def _complex(em: KernelEmitter, instr, index):
    re, im = em.operand_at(instr, 0, index), em.operand_at(instr, 1, index)
    return Complex(em).make(re, im)


_IEEE_LAYOUT = {P.F16: (5, 10), P.F32: (8, 23), P.F64: (11, 52)}


def _reduce_precision_bits(em: KernelEmitter, u, src: tuple[int, int], exp_bits, mant_bits):
    """XLA's reduce-precision on the bits `u` of an IEEE float with (exponent, mantissa)
    widths `src`: round the mantissa to nearest even, then send exponents beyond the reduced
    range to signed infinity (above) or signed zero (below)."""
    b, ity = em.b, u.type
    src_exp, src_mant = src
    if mant_bits < src_mant:
        drop = src_mant - mant_bits
        last = 1 << drop
        lsb = b.lshr(b.and_(u, _const(ity, last)), _const(ity, drop))
        u = b.add(u, b.add(lsb, _const(ity, (last >> 1) - 1)))
        u = b.and_(u, _const(ity, ~(last - 1) & ((1 << ity.width) - 1)))
    if exp_bits < src_exp:
        exp_mask = ((1 << src_exp) - 1) << src_mant
        src_bias, red_bias = (1 << (src_exp - 1)) - 1, (1 << (exp_bits - 1)) - 1
        exponent = b.and_(u, _const(ity, exp_mask))
        signed_zero = b.and_(u, _const(ity, 1 << (ity.width - 1)))
        over = b.icmp_unsigned(">", exponent, _const(ity, (src_bias + red_bias) << src_mant))
        under = b.icmp_unsigned("<=", exponent, _const(ity, (src_bias - red_bias) << src_mant))
        inf = b.or_(signed_zero, _const(ity, exp_mask))
        u = b.select(over, inf, b.select(under, signed_zero, u))
    return u


@emits(Op.REDUCE_PRECISION)
def _reduce_precision(em: KernelEmitter, instr, index):
    x = em.operand_at(instr, 0, index)
    t = _ot(instr)
    exp_bits, mant_bits = instr.exponent_bits, instr.mantissa_bits
    if not t.is_float:
        raise _unsupported(instr, "needs a float operand, exponent_bits and mantissa_bits")
    b = em.b
    if t is P.F16:  # the register holds an f32 that is an f16 value: work on its f16 bits
        bits = b.bitcast(b.fptrunc(x, F16), I16)
        bits = _reduce_precision_bits(em, bits, _IEEE_LAYOUT[P.F16], exp_bits, mant_bits)
        result = b.fpext(b.bitcast(bits, F16), F32)
    else:  # bf16 is reduced as the f32 it is in registers, then rounded back (as the rule)
        layout = _IEEE_LAYOUT[P.F64 if t is P.F64 else P.F32]
        ity = I64 if t is P.F64 else I32
        bits = _reduce_precision_bits(em, b.bitcast(x, ity), layout, exp_bits, mant_bits)
        result = em.round_to(b.bitcast(bits, x.type), t)
    return b.select(em.math.isnan(x), x, result)


@emits(Op.CONVERT)
def _convert(em: KernelEmitter, instr, index):
    return convert_value(em, em.operand_at(instr, 0, index), _ot(instr), _et(instr))


@emits(Op.BITCAST_CONVERT)
def _bitcast_convert(em: KernelEmitter, instr, index):
    """Same width: the bits reinterpreted. To a narrower type the result has one more, minor
    dim of `wide / narrow` elements, element k being the k-th least significant chunk of the
    operand element (what the bytes of a little-endian host hold); to a wider type the
    operand has that dim and its elements are combined the same way."""
    frm, to = _ot(instr), _et(instr)
    if P.PRED in (frm, to) or frm.bits % 8 or to.bits % 8:
        raise _unsupported(instr, f"bitcast-convert from {frm} to {to} is not supported")
    b = em.b

    def bits_of(value, t: PrimitiveType):
        return b.bitcast(em.to_mem(value, t), ir.IntType(t.bits))

    def value_of(bits):
        return bits if to.is_integral else em.from_mem(b.bitcast(bits, mem_type(to)), to)

    if frm.bits == to.bits:
        return value_of(bits_of(em.operand_at(instr, 0, index), frm))
    wide = ir.IntType(max(frm.bits, to.bits))
    if frm.bits > to.bits:  # index[-1] picks the chunk
        bits = bits_of(em.operand_at(instr, 0, tuple(index[:-1])), frm)
        shift = b.mul(index[-1], ir.Constant(I64, to.bits))
        shift = shift if wide.width == 64 else b.trunc(shift, wide)
        return value_of(b.trunc(b.lshr(bits, shift), ir.IntType(to.bits)))
    acc = ir.Constant(wide, 0)
    for k in range(to.bits // frm.bits):
        part = bits_of(em.operand_at(instr, 0, (*index, ir.Constant(I64, k))), frm)
        acc = b.or_(acc, b.shl(b.zext(part, wide), ir.Constant(wide, k * frm.bits)))
    return value_of(acc)


# -- shape ops -----------------------------------------------------------------------------------


def _c64(v: int):
    return ir.Constant(I64, v)


@emits(Op.BROADCAST)
def _broadcast(em: KernelEmitter, instr, index):
    dims = instr.dimensions
    return em.gen(instr.operands[0], tuple(index[d] for d in dims))


@emits(Op.TRANSPOSE)
def _transpose(em: KernelEmitter, instr, index):
    dims = instr.dimensions
    op_index = [None] * len(dims)
    for i, d in enumerate(dims):
        op_index[d] = index[i]
    return em.gen(instr.operands[0], tuple(op_index))


def _linearize(em, index, dims, order):
    """Linear position of `index` when dimensions are laid out in `order` (major first)."""
    b = em.b
    if not order:
        return _c64(0)
    total = index[order[0]]
    for d in order[1:]:
        total = b.add(b.mul(total, _c64(dims[d]), flags=["nsw"]), index[d], flags=["nsw"])
    return total


def _delinearize(em, linear, dims, order):
    """The index of `linear` (< the product of `dims`) in dimensions laid out in `order`
    (major first); the most major dimension takes what is left, without a remainder."""
    b = em.b
    index = [None] * len(dims)
    for k, d in enumerate(reversed(order)):
        if dims[d] == 1:
            index[d] = _c64(0)
        elif k == len(order) - 1:
            index[d] = linear
        else:
            index[d] = b.urem(linear, _c64(dims[d]))
            linear = b.udiv(linear, _c64(dims[d]))
    return tuple(index)


def reshape_groups(a: list[int], b: list[int]) -> list[tuple[range, range]]:
    """The runs of dimensions of two shapes with as many elements (`a` and `b`, major first)
    whose element counts agree: (positions in a, positions in b) per run, in order, as
    small as they can be; a dimension of size 1 is a run of its own. An index of `a` maps to
    one of `b` run by run, so the runs of one dimension on each side need no arithmetic."""
    groups: list[tuple[range, range]] = []
    i = j = 0
    while i < len(a) or j < len(b):
        if i < len(a) and a[i] == 1:
            groups.append((range(i, i + 1), range(j, j)))
            i += 1
            continue
        if j < len(b) and b[j] == 1:
            groups.append((range(i, i), range(j, j + 1)))
            j += 1
            continue
        si, sj = i, j
        pa, pb = a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                pa, i = pa * a[i], i + 1
            else:
                pb, j = pb * b[j], j + 1
        groups.append((range(si, i), range(sj, j)))
    return groups


@emits(Op.RESHAPE, Op.BITCAST)
def _reshape(em: KernelEmitter, instr, index):
    op = instr.operands[0]
    if op.shape.element_type is not _et(instr):
        raise _unsupported(instr, "changes the element type; not supported")
    out, src = instr.shape, op.shape
    if instr.opcode is Op.BITCAST:
        out_order = list(reversed(out.layout_or_default.minor_to_major))
        src_order = list(reversed(src.layout_or_default.minor_to_major))
    else:
        out_order, src_order = list(range(out.rank)), list(range(src.rank))
    if src.rank == 0:
        return em.gen(op, ())
    if 0 in out.dims:
        linear = _linearize(em, index, out.dims, out_order)
        return em.gen(op, _delinearize(em, linear, src.dims, src_order))
    # Run by run (dimensions whose element counts agree), so that a dimension kept as it
    # is needs no division: a division by a constant per element costs the vectorized
    # loop a long multiply-high sequence (and LLVM its time).
    src_index: list = [_c64(0)] * src.rank
    out_dims = [out.dims[d] for d in out_order]
    src_dims = [src.dims[d] for d in src_order]
    for run_out, run_src in reshape_groups(out_dims, src_dims):
        if not run_out or not run_src:
            continue  # a dimension of size 1: index 0
        if len(run_out) == 1 and len(run_src) == 1:
            src_index[src_order[run_src[0]]] = index[out_order[run_out[0]]]
            continue
        outs = [out_order[k] for k in run_out]
        srcs = [src_order[k] for k in run_src]
        linear = _linearize(em, index, out.dims, outs)
        part = _delinearize(em, linear, src.dims, srcs)
        for d in srcs:
            src_index[d] = part[d]
    return em.gen(op, tuple(src_index))


@emits(Op.SLICE)
def _slice(em: KernelEmitter, instr, index):
    spec = instr.slice_spec.dims
    b = em.b
    op_index = []
    for i, (start, _limit, stride) in zip(index, spec, strict=True):
        v = i if stride == 1 else b.mul(i, _c64(stride), flags=["nsw"])
        op_index.append(v if start == 0 else b.add(v, _c64(start), flags=["nsw"]))
    return em.gen(instr.operands[0], tuple(op_index))


def _clamp_index(em, i, lo: int, hi: int):
    b = em.b
    i = b.select(b.icmp_signed("<", i, _c64(lo)), _c64(lo), i)
    return b.select(b.icmp_signed(">", i, _c64(hi)), _c64(hi), i)


@emits(Op.CONCATENATE)
def _concatenate(em: KernelEmitter, instr, index):
    (dim,) = instr.dimensions
    b = em.b
    offsets, off = [], 0
    for op in instr.operands:
        offsets.append(off)
        off += op.shape.dims[dim]
    result = None
    for op, start in reversed(list(zip(instr.operands, offsets, strict=True))):
        size = op.shape.dims[dim]
        if size == 0:
            continue
        local = _clamp_index(em, b.sub(index[dim], _c64(start)), 0, size - 1)
        value = em.gen(op, (*index[:dim], local, *index[dim + 1 :]))
        if result is None:
            result = value
            continue
        inside = b.icmp_signed("<", index[dim], _c64(start + size))
        result = b.select(inside, value, result)
    if result is None:  # every operand is empty along `dim`: so is the result (never read)
        return em.scalar_constant(0, _et(instr))
    return result


@emits(Op.PAD)
def _pad(em: KernelEmitter, instr, index):
    op, pad_value = instr.operands
    b = em.b
    in_bounds = ir.Constant(I1, 1)
    op_index = []
    for i, (lo, _hi, interior), size in zip(
        index, instr.padding_config.dims, op.shape.dims, strict=True
    ):
        shifted = b.sub(i, _c64(lo))
        step = interior + 1
        pos = shifted if step == 1 else b.sdiv(shifted, _c64(step))
        ok = b.and_(b.icmp_signed(">=", shifted, _c64(0)), b.icmp_signed("<", pos, _c64(size)))
        if step != 1:
            ok = b.and_(ok, b.icmp_signed("==", b.srem(shifted, _c64(step)), _c64(0)))
        in_bounds = b.and_(in_bounds, ok)
        op_index.append(_clamp_index(em, pos, 0, max(size - 1, 0)))
    fill = em.gen(pad_value, ())
    if 0 in op.shape.dims:
        return fill
    return b.select(in_bounds, em.gen(op, tuple(op_index)), fill)


@emits(Op.IOTA)
def _iota(em: KernelEmitter, instr, index):
    i = index[instr.iota_dimension]
    return convert_value(em, i, P.S64, _et(instr))


@emits(Op.REVERSE)
def _reverse(em: KernelEmitter, instr, index):
    dims = set(instr.dimensions)
    sizes = instr.shape.dims
    op_index = tuple(
        em.b.sub(_c64(sizes[d] - 1), i) if d in dims else i for d, i in enumerate(index)
    )
    return em.gen(instr.operands[0], op_index)


def dynamic_starts(em, instr, operand_dims, sizes, first: int):
    """Clamped start indices of a dynamic-(update-)slice, as i64 values."""
    starts = []
    for k, (dim, size) in enumerate(zip(operand_dims, sizes, strict=True)):
        op = instr.operands[first + k]
        starts.append(_clamped_start(em, em.gen(op, ()), op.shape.element_type, dim - size))
    return starts


@emits(Op.DYNAMIC_SLICE)
def _dynamic_slice(em: KernelEmitter, instr, index):
    op = instr.operands[0]
    if len(instr.operands) != 1 + op.shape.rank:
        raise _unsupported(instr, "with a single index-vector operand is not supported")
    starts = dynamic_starts(em, instr, op.shape.dims, instr.shape.dims, 1)
    op_index = tuple(em.b.add(i, s) for i, s in zip(index, starts, strict=True))
    return em.gen(op, op_index)


@emits(Op.DYNAMIC_UPDATE_SLICE)
def _dynamic_update_slice(em: KernelEmitter, instr, index):
    op, update = instr.operands[:2]
    if len(instr.operands) != 2 + op.shape.rank:
        raise _unsupported(instr, "with a single index-vector operand is not supported")
    b = em.b
    starts = dynamic_starts(em, instr, op.shape.dims, update.shape.dims, 2)
    inside = ir.Constant(I1, 1)
    up_index = []
    for i, s, size in zip(index, starts, update.shape.dims, strict=True):
        local = b.sub(i, s)
        inside = b.and_(inside, b.icmp_signed(">=", local, _c64(0)))
        inside = b.and_(inside, b.icmp_signed("<", local, _c64(size)))
        up_index.append(_clamp_index(em, local, 0, max(size - 1, 0)))
    base = em.gen(op, index)
    if 0 in update.shape.dims:
        return base
    return b.select(inside, em.gen(update, tuple(up_index)), base)


@emits(Op.CONSTANT)
def _constant(em: KernelEmitter, instr, index):
    lit = instr.literal
    if lit is None:
        raise _unsupported(instr, "is an elided constant (its value is not in the text)")
    t = _et(instr)
    arr = lit.array
    if arr.size == 1:
        value = arr.reshape(()).item() if t is not P.BF16 else float(arr.reshape(()))
        return em.scalar_constant(value, t)
    key = ("const", id(instr))
    ptr = em.scopes[0].get(key)
    if ptr is None:
        ptr = em.global_array(arr, t)
        em.scopes[0][key] = ptr
    linear = _linearize(em, index, instr.shape.dims, list(range(instr.shape.rank)))
    return em.from_mem(em.b.load(em.b.gep(ptr, [linear], True)), t)


@emits(Op.GET_TUPLE_ELEMENT)
def _gte(em: KernelEmitter, instr, index):
    value = em.gen(instr.operands[0], index)
    if not isinstance(value, tuple):
        raise _unsupported(instr, "of a non-tuple value")
    return value[instr.tuple_index]


@emits(Op.TUPLE)
def _tuple(em: KernelEmitter, instr, index):
    return tuple(em.gen(op, index) for op in instr.operands)


# -- reduce --------------------------------------------------------------------------------------

_SIMPLE_REDUCERS = {Op.ADD, Op.MULTIPLY, Op.MAXIMUM, Op.MINIMUM, Op.AND, Op.OR}


def simple_reducer(comp) -> Opcode | None:
    """The opcode of a reducer computation `(a, b) -> op(a, b)`, if it is one of the simple
    associative ones; None otherwise."""
    root = comp.root
    if root.opcode not in _SIMPLE_REDUCERS or len(root.operands) != 2:
        return None
    if {op.opcode for op in root.operands} != {Op.PARAMETER}:
        return None
    if {op.parameter_number for op in root.operands} != {0, 1}:
        return None
    return root.opcode


def _identity(op: Opcode, t: PrimitiveType):
    if t.is_complex:  # complex reduces fold through their reducer computation
        return None
    ty = reg_type(t)
    if t.is_float:
        value = {
            Op.ADD: 0.0,
            Op.MULTIPLY: 1.0,
            Op.MAXIMUM: -math.inf,
            Op.MINIMUM: math.inf,
        }.get(op)
        return None if value is None else ir.Constant(ty, value)
    bits = ty.width
    if t is P.PRED:
        return ir.Constant(I1, 1 if op in (Op.AND, Op.MULTIPLY, Op.MINIMUM) else 0)
    signed = t.is_signed_integral
    table = {
        Op.ADD: 0,
        Op.MULTIPLY: 1,
        Op.OR: 0,
        Op.AND: (1 << bits) - 1,
        Op.MAXIMUM: (1 << (bits - 1)) if signed else 0,
        Op.MINIMUM: ((1 << (bits - 1)) - 1) if signed else (1 << bits) - 1,
    }
    return ir.Constant(ty, table[op])


def _combine(em: KernelEmitter, op: Opcode, t: PrimitiveType, a, c, reassoc: bool):
    b = em.b
    if t.is_float:
        flags = ("reassoc",) if reassoc else ()
        if op is Op.ADD:
            return b.fadd(a, c, flags=flags)
        if op is Op.MULTIPLY:
            return b.fmul(a, c, flags=flags)
        if op is Op.MAXIMUM:
            return em.math.call("maximum", a, c)
        if op is Op.MINIMUM:
            return em.math.call("minimum", a, c)
        raise UnsupportedForCodegen(f"reducer {op.text} is not defined on {t}")
    if t is P.PRED:
        return getattr(b, _PRED_BINARY[op])(a, c)
    return _INT_BINARY[op](em, a, c, t.is_signed_integral)


def rounds(op: Opcode, t: PrimitiveType) -> bool:
    """Does combining with `op` on `t` round (float add / multiply)? Only such reducers need
    the blocked cascade; the others are exact in any order and run as one vector loop."""
    return t.is_float and op in (Op.ADD, Op.MULTIPLY)


CASCADE_BLOCK = 16
"""Partial results of one level summed into the next level's accumulator."""


def emit_cascade(em: KernelEmitter, size: int, blocks, clear, flush, elements) -> None:
    """Accumulate elements [0, size) of a reduced dimension in a cascade of partial results:
    level 0 takes runs of blocks[0] elements (`elements(lo, hi)`), each higher level takes
    blocks[1] results of the level below, the top level goes into the total. `clear(k)` resets
    level k's accumulator; `flush(k, top)` combines level k into level k + 1 (or into the
    total when `top`). The serial chain at every level stays short, so the rounding error of a
    float sum grows like log(size) rather than like size."""
    spans = [blocks[0]]
    while spans[-1] < size:
        spans.append(spans[-1] * blocks[1])
    if len(spans) > 1:  # a level whose span covers the whole size runs once: the level
        spans.pop()  # below it flushes into the total instead
    b = em.b

    def level(k: int, lo, hi, top: bool):
        if k < 0:
            elements(lo, hi)
            return
        step = spans[k]
        with em.loop(lo, hi, f"cascade{k}", step=step) as c:
            clear(k)
            limit = b.add(c, _c64(step))
            limit = b.select(b.icmp_signed("<", limit, hi), limit, hi)
            level(k - 1, c, limit, False)
            flush(k, top)

    level(len(spans) - 1, _c64(0), _c64(size), True)


def emit_float_extremum(em: KernelEmitter, op: Opcode, t: PrimitiveType, size: int, value_at):
    """The maximum (or minimum) of `value_at(i)` for i in [0, size), size > 0, equal to a
    fold of llvm.maximum (minimum): NaN if any element is NaN, +0 above -0.

    llvm.maximum costs several vector instructions per step on x86. Instead the loop keeps
    three cheap accumulators that vectorize: a compare-and-select extremum that ignores NaN
    and the sign of zero, an any-NaN flag, and the AND (OR for minimum) of the elements' bits,
    whose sign bit says whether every element (any element) is negative. When the extremum
    is zero, it is -0 exactly when that sign bit is set, because no element lies beyond it."""
    b = em.b
    fty = reg_type(t)
    ity = I64 if isinstance(fty, ir.DoubleType) else I32
    fast = ("nnan", "nsz")
    is_max = op is Op.MAXIMUM
    best = em.alloca(fty, "ext.best")
    nan = em.alloca(I1, "ext.nan")
    bits = em.alloca(ity, "ext.bits")
    b.store(ir.Constant(fty, -math.inf if is_max else math.inf), best)
    b.store(ir.Constant(I1, 0), nan)
    b.store(ir.Constant(ity, -1 if is_max else 0), bits)
    with em.loop(_c64(0), _c64(size), "ext") as i:
        x = value_at(i)
        current = b.load(best)
        beyond = b.fcmp_ordered(">" if is_max else "<", x, current, flags=fast)
        b.store(b.select(beyond, x, current, flags=fast), best)
        b.store(b.or_(b.load(nan), b.fcmp_unordered("uno", x, x)), nan)
        merged = (b.and_ if is_max else b.or_)(b.load(bits), b.bitcast(x, ity))
        b.store(merged, bits)
    value = b.load(best)
    sign = ir.Constant(ity, 1 << (ity.width - 1))
    zero = b.bitcast(b.and_(b.load(bits), sign), fty)
    value = b.select(b.fcmp_ordered("==", value, ir.Constant(fty, 0.0)), zero, value)
    return b.select(b.load(nan), ir.Constant(fty, math.nan), value)


FOLD_LANES = 64
"""Contiguous chunks of a row folded side by side by a selection reducer."""


def selection_reducer(comp) -> bool:
    """Is every result of reducer `comp` a select between its accumulator and element
    parameters (argmax, argmin, max by key)? Such a reducer never rounds: its result is one
    of its inputs, whatever the bracketing."""
    root = comp.root
    outs = root.operands if root.opcode is Op.TUPLE else [root]
    n = len(outs)
    if comp.num_parameters != 2 * n:
        return False
    for i, out in enumerate(outs):
        if out.opcode is not Op.SELECT:
            return False
        picks = {id(x) for x in out.operands[1:]}
        if picks != {id(comp.parameter(i)), id(comp.parameter(n + i))}:
            return False
    return all(not x.has_side_effect for x in comp.instructions)


def _chunked_fold(em: KernelEmitter, comp, accs, size: int, element_values, src_index, d):
    """Fold elements [0, size) of dimension d into `accs` with a selection reducer, as
    FOLD_LANES contiguous chunks folded side by side (each lane starts at its chunk's first
    element), then the lanes into `accs` in order, then the leftover tail in order. Only the
    bracketing changes, which XLA allows (the reduction order is unspecified; the reducer is
    assumed associative): a serial fold is one long dependency chain, while the lanes vectorize.
    """
    b = em.b
    chunk = size // FOLD_LANES
    lanes = [em.alloca(ir.ArrayType(a.type.pointee, FOLD_LANES), "fold.lanes") for a in accs]

    def slots(k):
        return [b.gep(arr, [ir.Constant(I32, 0), k], True) for arr in lanes]

    def at(j, k):
        src_index[d] = b.add(b.mul(k, _c64(chunk), flags=["nsw"]), j, flags=["nsw"])
        return element_values()

    with em.loop(_c64(0), _c64(FOLD_LANES), "fold.first") as k:
        for slot, v in zip(slots(k), at(_c64(0), k), strict=True):
            b.store(v, slot)
    with (
        em.loop(_c64(1), _c64(chunk), "fold.step") as j,
        em.loop(_c64(0), _c64(FOLD_LANES), "fold.lane") as k,
    ):
        values = at(j, k)
        current = slots(k)
        result = em.call_scalar(comp, [*(b.load(x) for x in current), *values])
        result = result if isinstance(result, tuple) else (result,)
        for slot, v in zip(current, result, strict=True):
            b.store(v, slot)

    def merge(values):
        result = em.call_scalar(comp, [*(b.load(a) for a in accs), *values])
        result = result if isinstance(result, tuple) else (result,)
        for acc, v in zip(accs, result, strict=True):
            b.store(v, acc)

    with em.loop(_c64(0), _c64(FOLD_LANES), "fold.merge") as k:
        merge([b.load(x) for x in slots(k)])
    with em.loop(_c64(chunk * FOLD_LANES), _c64(size), "fold.tail") as i:
        src_index[d] = i
        merge(element_values())


@emits(Op.REDUCE)
def _reduce(em: KernelEmitter, instr, index):
    n = len(instr.operands) // 2
    inputs, inits = instr.operands[:n], instr.operands[n:]
    comp = instr.to_apply
    reduced = instr.dimensions
    src = inputs[0].shape
    kept = [d for d in range(src.rank) if d not in reduced]
    order = [d for d in reversed(src.layout_or_default.minor_to_major) if d in reduced]
    order = [d for d in order if src.dims[d] != 1] or order[:1]
    init_values = [em.gen(v, ()) for v in inits]
    types = [v.shape.element_type for v in inputs]
    op = simple_reducer(comp) if n == 1 else None
    if op is not None and _identity(op, types[0]) is None:
        op = None
    accs = [em.alloca(reg_type(t)) for t in types]
    for acc, v in zip(accs, init_values, strict=True):
        em.b.store(v, acc)
    if not reduced:
        result = em.call_scalar(comp, [*init_values, *(em.gen(x, index) for x in inputs)])
        return result
    if 0 in (src.dims[d] for d in reduced):
        return tuple(init_values) if instr.shape.is_tuple else init_values[0]

    src_index: list = [None] * src.rank
    for d, i in zip(kept, index, strict=True):
        src_index[d] = i
    for d in reduced:
        if src.dims[d] == 1:
            src_index[d] = _c64(0)

    def element_values():
        values = [em.gen(x, tuple(src_index)) for x in inputs]
        em.store_input_outputs(instr, tuple(src_index))
        return values

    def general_step():
        values = element_values()
        current = [em.b.load(a) for a in accs]
        result = em.call_scalar(comp, [*current, *values])
        result = result if isinstance(result, tuple) else (result,)
        for acc, v in zip(accs, result, strict=True):
            em.b.store(v, acc)

    def nest(level: int, body):
        if level == len(order) - 1:
            body(order[level])
            return
        d = order[level]
        with em.loop(_c64(0), _c64(src.dims[d]), f"r{d}") as i:
            src_index[d] = i
            nest(level + 1, body)  # noqa: F821 (deleted after use)

    if op is None:

        def innermost(d):
            if selection_reducer(comp) and src.dims[d] >= 4 * FOLD_LANES:
                _chunked_fold(em, comp, accs, src.dims[d], element_values, src_index, d)
                return
            with em.loop(_c64(0), _c64(src.dims[d]), f"r{d}") as i:
                src_index[d] = i
                general_step()

        nest(0, innermost)
        del nest  # the recursive closure is a reference cycle through em (ir_release.py)
        loaded = [em.b.load(a) for a in accs]
        return tuple(loaded) if instr.shape.is_tuple else loaded[0]

    t = types[0]
    identity = _identity(op, t)
    levels: list = []

    def level_acc(k):
        while len(levels) <= k:
            levels.append(em.alloca(reg_type(t), f"acc.l{len(levels)}"))
        return levels[k]

    def blocked(d):
        def elements(lo, hi):
            with em.loop(lo, hi, f"r{d}") as i:
                src_index[d] = i
                (x,) = element_values()
                acc = level_acc(0)
                em.b.store(_combine(em, op, t, em.b.load(acc), x, True), acc)

        def flush(k, top):
            target = accs[0] if top else level_acc(k + 1)
            value = em.b.load(level_acc(k))
            em.b.store(_combine(em, op, t, em.b.load(target), value, False), target)

        if t.is_float and op in (Op.MAXIMUM, Op.MINIMUM):

            def value_at(i):
                src_index[d] = i
                return element_values()[0]

            extremum = emit_float_extremum(em, op, t, src.dims[d], value_at)
            em.b.store(_combine(em, op, t, em.b.load(accs[0]), extremum, False), accs[0])
            return
        if not rounds(op, t):
            em.b.store(identity, level_acc(0))
            elements(_c64(0), _c64(src.dims[d]))
            flush(0, True)
            return
        emit_cascade(
            em,
            src.dims[d],
            (REDUCE_BLOCK, CASCADE_BLOCK),
            lambda k: em.b.store(identity, level_acc(k)),
            flush,
            elements,
        )

    nest(0, blocked)
    del nest  # the recursive closure is a reference cycle through em (ir_release.py)
    value = em.b.load(accs[0])
    return em.round_to(value, t) if t.is_float else value


# -- reductions that keep the physically minor dimension ----------------------------------------
#
# A reduce whose input's contiguous (most minor, size > 1) dimension is kept -- a column sum
# [N, M] -> [M], a middle-axis reduction [A, R, B] -> [A, B] -- would walk a strided loop per
# output element if emitted elementally. Instead the kernel tiles the kept minor dimension
# into rows of at most VECTOR_TILE outputs and streams the reduced rows through them: the
# reduced dimensions are outer loops, and the innermost loop runs over the contiguous tile
# (vectorizable, unit stride in input and accumulators). Accuracy: simple reducers sum
# REDUCE_BLOCK rows of the innermost reduced dimension into per-lane partials, then add the
# partials into per-lane totals, so a long f32 column sum degrades like a blocked sum, not
# like one serial chain. Other reducers apply their computation row by row, in the same
# order the elemental path uses. Kernel signature and [start, end) are unchanged: the range
# is still the output's outermost dimension, whichever kept dimension that is.

VECTOR_TILE = 1024
"""Outputs of the kept minor dimension accumulated together (partials stay in L1)."""

COLUMN_BLOCK = 32
"""Rows added into one lane's level-0 partial before it is flushed up the cascade."""


@dataclass(frozen=True, slots=True)
class LanePlan:
    """A kernel run as lanes of outputs that each fold their own reduction (see above)."""

    reduces: tuple[HloInstruction, ...]
    lane_dim: int
    width: int


def kept_minor_reduces(leaves) -> LanePlan | None:
    """A LanePlan for a kernel whose outputs are all reduces of equally shaped inputs over
    the same dimensions (besides outputs over their input, see `reduce_hero`), keeping the
    input's contiguous dimension: lanes over that dimension, VECTOR_TILE at a time. Else
    None."""
    reduces: list[HloInstruction] = []
    hero = reduce_hero([leaf for leaf, _, _ in leaves])
    over_input = hero.operands[0].shape.dims if hero is not None else None
    for leaf, _element, shape in leaves:
        if leaf.opcode is not Op.REDUCE and shape.dims == over_input:
            continue
        if leaf.opcode is not Op.REDUCE:
            return None
        if all(leaf is not r for r in reduces):
            reduces.append(leaf)
    first = reduces[0]
    src = first.operands[0].shape
    dims = first.dimensions
    for r in reduces:
        shape = r.operands[0].shape
        if (
            shape.dims != src.dims
            or shape.layout_or_default.minor_to_major != src.layout_or_default.minor_to_major
            or r.dimensions != dims
        ):
            return None
    if not dims or any(src.dims[d] == 0 for d in dims):
        return None
    minor = next((d for d in src.layout_or_default.minor_to_major if src.dims[d] > 1), None)
    if minor is None or minor in dims:
        return None
    return LanePlan(tuple(reduces), minor, VECTOR_TILE)


class _ReduceLanes:
    """Per-lane accumulators of one reduce over a tile of the kept minor dimension."""

    def __init__(self, em: KernelEmitter, instr: HloInstruction, width: int):
        n = len(instr.operands) // 2
        self.instr = instr
        self.inputs, self.inits = instr.operands[:n], instr.operands[n:]
        self.types = [v.shape.element_type for v in self.inputs]
        self.comp = instr.to_apply
        op = simple_reducer(self.comp) if n == 1 else None
        if op is not None and _identity(op, self.types[0]) is None:
            op = None
        self.op = op
        self.tile = [ir.ArrayType(reg_type(t), width) for t in self.types]
        self.totals = [em.alloca(ty, "acc.total") for ty in self.tile]
        self.levels: list = []
        self.em = em

    def level(self, k: int):
        """The lane array of cascade level k (simple reducers only)."""
        while len(self.levels) <= k:
            name = f"acc.l{len(self.levels)}"
            self.levels.append(self.em.alloca(self.tile[0], name))
        return self.levels[k]

    @staticmethod
    def slot(em, array, lane):
        return em.b.gep(array, [ir.Constant(I32, 0), lane], True)


def emit_kept_minor_reduce(em: KernelEmitter, plan: LanePlan, out_ptrs, start, end) -> None:
    """The loop nest of a kernel made by `kept_minor_reduces` (see the block comment)."""
    b = em.b
    reduces, minor, width = plan.reduces, plan.lane_dim, plan.width
    src = reduces[0].operands[0].shape
    reduced = reduces[0].dimensions
    kept = [d for d in range(src.rank) if d not in reduced]
    m_out = kept.index(minor)
    out_shape = em.loop_shape()
    out_order = list(reversed(out_shape.layout_or_default.minor_to_major))
    red_order = [d for d in reversed(src.layout_or_default.minor_to_major) if d in reduced]
    red_order = [d for d in red_order if src.dims[d] != 1] or red_order[:1]
    lanes = [_ReduceLanes(em, r, width) for r in reduces]
    src_index: list = [None] * src.rank
    out_index: list = [None] * out_shape.rank
    for d in reduced:
        if src.dims[d] == 1:
            src_index[d] = _c64(0)

    def bounds(k: int):
        if k == out_order[0]:
            return start, end
        return _c64(0), _c64(out_shape.dims[k])

    def lane_loop(base, limit, body):
        # Only the accumulating loop runs once per row; the others (totals set, partials
        # cleared and flushed, outputs stored) are vectorized but not interleaved: LLVM's
        # interleaved copy of each, with its remainder loop, was most of the kernel's code.
        interleave = None if body is accumulate else 1
        with em.loop(base, limit, "lane", interleave=interleave) as j:
            src_index[minor] = j
            out_index[m_out] = j
            body(b.sub(j, base))

    def init_totals(lane):
        for acc in lanes:
            for total, init in zip(acc.totals, acc.inits, strict=True):
                b.store(em.gen(init, ()), acc.slot(em, total, lane))

    def clear(k):
        def body(lane):
            for acc in lanes:
                if acc.op is not None:
                    b.store(_identity(acc.op, acc.types[0]), acc.slot(em, acc.level(k), lane))

        return body

    def accumulate(lane):
        em.store_input_outputs(em.hero, tuple(src_index))
        for acc in lanes:
            values = [em.gen(x, tuple(src_index)) for x in acc.inputs]
            if acc.op is not None:
                slot = acc.slot(em, acc.level(0), lane)
                t = acc.types[0]
                b.store(_combine(em, acc.op, t, b.load(slot), values[0], False), slot)
                continue
            slots = [acc.slot(em, total, lane) for total in acc.totals]
            result = em.call_scalar(acc.comp, [*(b.load(s) for s in slots), *values])
            result = result if isinstance(result, tuple) else (result,)
            for s, v in zip(slots, result, strict=True):
                b.store(v, s)

    def flush(k, top):
        def body(lane):
            for acc in lanes:
                if acc.op is None:
                    continue
                target = acc.slot(em, acc.totals[0] if top else acc.level(k + 1), lane)
                value = b.load(acc.slot(em, acc.level(k), lane))
                b.store(_combine(em, acc.op, acc.types[0], b.load(target), value, False), target)

        return body

    def store_outputs(lane):
        results = {}
        for acc in lanes:
            values = [b.load(acc.slot(em, total, lane)) for total in acc.totals]
            if acc.op is not None and acc.types[0].is_float:
                values = [em.round_to(values[0], acc.types[0])]
            results[id(acc.instr)] = values
        index = tuple(out_index)
        for k, (leaf, element, shape) in enumerate(em.out_leaves):
            if k in em.input_outputs:
                continue
            ptr = out_ptrs[k]
            value = results[id(leaf)][element or 0]
            addr = b.gep(ptr, [em.offset(shape, index)], True)
            b.store(em.to_mem(value, shape.element_type), addr)

    def reduce_rows(level: int, base, limit):
        d = red_order[level]
        if level < len(red_order) - 1:
            with em.loop(_c64(0), _c64(src.dims[d]), f"r{d}") as i:
                src_index[d] = i
                reduce_rows(level + 1, base, limit)
            return

        def elements(lo, hi):
            with em.loop(lo, hi, f"r{d}") as i:
                src_index[d] = i
                lane_loop(base, limit, accumulate)

        emit_cascade(
            em,
            src.dims[d],
            (COLUMN_BLOCK, CASCADE_BLOCK),
            lambda k: lane_loop(base, limit, clear(k)),
            lambda k, top: lane_loop(base, limit, flush(k, top)),
            elements,
        )

    def tile():
        lo, hi = bounds(m_out)
        with em.loop(lo, hi, "tile", step=width) as base:
            limit = b.add(base, _c64(width))
            limit = b.select(b.icmp_signed("<", limit, hi), limit, hi)
            lane_loop(base, limit, init_totals)
            reduce_rows(0, base, limit)
            lane_loop(base, limit, store_outputs)

    outer = [k for k in out_order if k != m_out]

    def nest(level: int):
        if level == len(outer):
            tile()
            return
        k = outer[level]
        lo, hi = bounds(k)
        with em.loop(lo, hi, f"k{kept[k]}") as i:
            out_index[k] = i
            src_index[kept[k]] = i
            nest(level + 1)  # noqa: F821 (deleted after use)

    nest(0)
    del nest  # the recursive closure is a reference cycle through em (ir_release.py)


# -- gather --------------------------------------------------------------------------------------
#
# An output index splits into batch coordinates (the output dims not in offset_dims, in
# order: the start-indices dims other than index_vector_dim) and window offsets (offset_dims,
# walking the operand dims that are neither collapsed nor batching, in order). The batch
# coordinates pick an index vector; start_index_map places its components in the operand
# start, operand_batching_dims take the matching batch coordinate, every other dim starts at
# 0. Each start is clamped so the whole slice lies inside the operand (unsigned components
# never go below 0; those beyond INT64_MAX clamp to the top, as in the interpreter), and the
# value is operand[start + offset]. Constant positions (index-vector components, unindexed
# starts) are shared per kernel: gen memoizes by the identity of index values, so a constant
# freed after one call must not lend its identity to another.


def _held_c64(em: KernelEmitter, v: int):
    return em.scopes[0].setdefault(("gather.c64", v), _c64(v))


def _gather_component(em: KernelEmitter, indices, index, t: PrimitiveType, upper: int):
    """One index-vector component as an i64 clamped to [0, upper]."""
    return _clamped_start(em, em.gen(indices, index), t, upper)


def _clamped_start(em: KernelEmitter, v, t: PrimitiveType, upper: int):
    """An index `v` of integer type `t` as an i64 clamped to [0, upper]: a u64 index past
    INT64_MAX clamps to the top (corner fuzz seed 600530: u64 2**64 - 1 read as -1 took
    the bottom), as XLA and the interpreter do."""
    b = em.b
    if t.is_signed_integral:
        v = convert_value(em, v, t, P.S64) if t is not P.S64 else v
        return _clamp_index(em, v, 0, upper)
    if t.bits < 64:
        v = b.zext(v, I64)
    return b.select(b.icmp_unsigned(">", v, _c64(upper)), _c64(upper), v)


@emits(Op.GATHER)
def _gather(em: KernelEmitter, instr, index):
    operand, indices = instr.operands
    a = instr.gather_dimension_numbers
    dims = operand.shape.dims
    offset_dims = a.offset_dims
    collapsed = a.collapsed_slice_dims
    index_map = a.start_index_map
    operand_batching = a.operand_batching_dims
    indices_batching = a.start_indices_batching_dims
    ivd = a.index_vector_dim
    sizes = a.slice_sizes
    t = indices.shape.element_type
    if not t.is_integral:
        raise _unsupported(instr, f"needs integer start indices, got {t}")
    if operand.shape.element_type is not _et(instr):
        raise _unsupported(instr, "changes the element type; not supported")
    rank = operand.shape.rank
    batch_rank = indices.shape.rank - (1 if ivd < indices.shape.rank else 0)
    components = indices.shape.dims[ivd] if ivd < indices.shape.rank else 1
    window = [d for d in range(rank) if d not in collapsed and d not in operand_batching]
    positions = [d for d in range(instr.shape.rank) if d not in offset_dims]
    if (
        len(sizes) != rank
        or len(index_map) != components
        or len(positions) != batch_rank
        or len(offset_dims) != len(window)
        or len(operand_batching) != len(indices_batching)
        or any(not 0 <= d < rank for d in (*index_map, *collapsed, *operand_batching))
    ):
        raise _unsupported(instr, "has inconsistent dimension numbers")
    if 0 in dims:
        return em.scalar_constant(0, _et(instr))
    batch = [index[p] for p in positions]
    upper = [max(dim - size, 0) for dim, size in zip(dims, sizes, strict=True)]
    starts: list = [_held_c64(em, 0)] * rank
    for k, d in enumerate(index_map):
        at = list(batch)
        if ivd < indices.shape.rank:
            at.insert(ivd, _held_c64(em, k))
        starts[d] = _gather_component(em, indices, tuple(at), t, upper[d])
    for od, idd in zip(operand_batching, indices_batching, strict=True):
        starts[od] = _clamp_index(em, batch[idd if idd < ivd else idd - 1], 0, upper[od])
    op_index = list(starts)
    for d, p in zip(window, offset_dims, strict=True):
        op_index[d] = em.b.add(starts[d], index[p], flags=["nsw"])
    return em.gen(operand, tuple(op_index))
