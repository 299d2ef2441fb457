# Complex (c64, c128) values in fused kernels.
#
# A complex value is an LLVM struct {T, T} (real, imaginary; T float for c64, double for
# c128) in registers and in memory, the layout NumPy and XLA use, so parameters and results
# load and store whole. Data movement (broadcast, transpose, slice, pad, concatenate,
# select...) is type-agnostic and needs nothing here; the arithmetic is written out on the
# two parts with the formulas NumPy's loops use:
#   add, subtract, negate   part by part
#   multiply                (ac - bd, ad + bc)
#   divide                  Smith's algorithm (scale by the larger part of the divisor)
#   abs                     hypot: max * sqrt(1 + (min/max)^2), inf where either part is inf
#   exp                     e^re (cos im, sin im)
#   log                     (log |z|, atan2(im, re))
#   sqrt                    principal root: t = sqrt((|z| + |re|) / 2) (parts scaled by 1/4
#                           first where one is above 1), then (t, im / 2t)
#                           for re >= 0, else (|im| / 2t, copysign(t, im))
#   real, imag, complex     extract / build the struct
#   compare EQ / NE         both parts
#   convert                 from a real type (imaginary part 0) and between c64 and c128
#   reduce                  folds through its reducer computation, in the rule's order
# Anything else on a complex operand or result is declined (complex_reason) before emission,
# so the instruction keeps its interpreter rule, listed as a fallback.

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from xlapy.backends.cpu.codegen.common import (
    C64_TYPE,
    C128_TYPE,
    F32,
    F64,
    UnsupportedForCodegen,
)
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.types import PrimitiveType

if TYPE_CHECKING:
    from xlapy.backends.cpu.codegen.emitter import KernelEmitter

P = PrimitiveType
Op = Opcode

COMPLEX_OPCODES = frozenset(
    {
        Op.ADD, Op.SUBTRACT, Op.NEGATE, Op.MULTIPLY, Op.DIVIDE, Op.ABS, Op.EXP, Op.LOG,
        Op.SQRT, Op.REAL, Op.IMAG, Op.COMPLEX, Op.COMPARE, Op.CONVERT, Op.SELECT, Op.COPY,
        Op.PARAMETER, Op.CONSTANT, Op.BROADCAST, Op.TRANSPOSE, Op.RESHAPE, Op.BITCAST,
        Op.SLICE, Op.CONCATENATE, Op.PAD, Op.REVERSE, Op.DYNAMIC_SLICE,
        Op.DYNAMIC_UPDATE_SLICE, Op.TUPLE, Op.GET_TUPLE_ELEMENT, Op.REDUCE, Op.GATHER,
    }
)  # fmt: skip
"""Opcodes a kernel computes with complex operands or results."""


def complex_type(t: PrimitiveType):
    return C64_TYPE if t is P.C64 else C128_TYPE


def part_type(t: PrimitiveType):
    """The element type of either part of complex type `t`."""
    return P.F32 if t is P.C64 else P.F64


def complex_reason(instr: HloInstruction) -> str | None:
    """Why a kernel cannot compute `instr` on complex values, or None when it can."""
    types = [s.element_type for o in instr.operands for _, s in o.shape.leaves()]
    types += [s.element_type for _, s in instr.shape.leaves()]
    if not any(t is not None and t.is_complex for t in types):
        return None
    if instr.opcode not in COMPLEX_OPCODES:
        return f"{instr.name}: the CPU emitter has no complex rule for '{instr.opcode.text}'"
    if instr.opcode is Op.COMPARE and str(instr.comparison_direction) not in ("EQ", "NE"):
        return f"{instr.name}: complex numbers compare for EQ and NE only"
    if instr.opcode is Op.CONVERT and not instr.shape.element_type.is_complex:
        return f"{instr.name}: a convert from complex to a real type"
    return None


class Complex:
    """Complex arithmetic on struct values for one kernel emitter."""

    def __init__(self, em: KernelEmitter):
        self.em = em
        self.b = em.b

    def parts(self, z):
        return self.b.extract_value(z, 0), self.b.extract_value(z, 1)

    def make(self, re, im):
        ty = ir.LiteralStructType([re.type, im.type])
        z = self.b.insert_value(ir.Constant(ty, ir.Undefined), re, 0)
        return self.b.insert_value(z, im, 1)

    def constant(self, value: complex, t: PrimitiveType):
        part = F32 if t is P.C64 else F64
        re, im = ir.Constant(part, value.real), ir.Constant(part, value.imag)
        return ir.Constant(complex_type(t), [re, im])

    # -- arithmetic --------------------------------------------------------------------------
    def add(self, x, y):
        (a, c), (e, f) = self.parts(x), self.parts(y)
        return self.make(self.b.fadd(a, e), self.b.fadd(c, f))

    def subtract(self, x, y):
        (a, c), (e, f) = self.parts(x), self.parts(y)
        return self.make(self.b.fsub(a, e), self.b.fsub(c, f))

    def negate(self, x):
        a, c = self.parts(x)
        return self.make(self.b.fneg(a), self.b.fneg(c))

    def multiply(self, x, y):
        b = self.b
        (a, c), (e, f) = self.parts(x), self.parts(y)
        return self.make(b.fsub(b.fmul(a, e), b.fmul(c, f)), b.fadd(b.fmul(a, f), b.fmul(c, e)))

    def divide(self, x, y):
        """Smith's algorithm, as NumPy's complex division."""
        b, m = self.b, self.em.math
        (a, c), (e, f) = self.parts(x), self.parts(y)
        wide = b.fcmp_ordered(">=", m.fabs(e), m.fabs(f))
        # |e| >= |f|: r = f / e, d = e + f r, ((a + c r) / d, (c - a r) / d)
        r1 = b.fdiv(f, e)
        d1 = b.fadd(e, b.fmul(f, r1))
        re1 = b.fdiv(b.fadd(a, b.fmul(c, r1)), d1)
        im1 = b.fdiv(b.fsub(c, b.fmul(a, r1)), d1)
        # otherwise: r = e / f, d = f + e r, ((a r + c) / d, (c r - a) / d)
        r2 = b.fdiv(e, f)
        d2 = b.fadd(f, b.fmul(e, r2))
        re2 = b.fdiv(b.fadd(b.fmul(a, r2), c), d2)
        im2 = b.fdiv(b.fsub(b.fmul(c, r2), a), d2)
        return self.make(b.select(wide, re1, re2), b.select(wide, im1, im2))

    def abs(self, x):
        """hypot(re, im) without overflow: inf if either part is inf, NaN if one is NaN."""
        return self.hypot(*self.parts(x))

    def hypot(self, re, im):
        b, m = self.b, self.em.math
        a, c = m.fabs(re), m.fabs(im)
        big = m.call("maximum", a, c)
        small = m.call("minimum", a, c)
        zero, one, inf = (ir.Constant(a.type, v) for v in (0.0, 1.0, float("inf")))
        ratio = b.fdiv(small, big)
        scaled = b.fmul(big, m.sqrt(b.fadd(one, b.fmul(ratio, ratio))))
        result = b.select(b.fcmp_ordered("==", big, zero), zero, scaled)
        either_inf = b.or_(b.fcmp_ordered("==", a, inf), b.fcmp_ordered("==", c, inf))
        return b.select(either_inf, inf, result)

    def exp(self, x):
        b, m = self.b, self.em.math
        a, c = self.parts(x)
        r = m.exp(a)
        return self.make(b.fmul(r, m.cos(c)), b.fmul(r, m.sin(c)))

    def log(self, x):
        a, c = self.parts(x)
        return self.make(self.em.math.log(self.abs(x)), self.em.math.atan2(c, a))

    def sqrt(self, x):
        b, m = self.b, self.em.math
        a, c = self.parts(x)
        zero, half, two = (ir.Constant(a.type, v) for v in (0.0, 0.5, 2.0))
        # sqrt((|z| + |re|) / 2) as sqrt(2) sqrt(|z / 4| + |re / 4|) where a part is above 1:
        # the sum overflowed for re = -3.4e38 (corner fuzz seed 701644: sqrt gave (0, inf),
        # not (6.6e-20, 1.8e19)); scaling first would lose subnormal bits, so only there
        quarter = ir.Constant(a.type, 0.25)
        aq, cq = b.fmul(a, quarter), b.fmul(c, quarter)
        one, root2 = ir.Constant(a.type, 1.0), ir.Constant(a.type, 2.0**0.5)
        large = b.fcmp_ordered(">", m.call("maximum", m.fabs(a), m.fabs(c)), one)
        scaled = b.fmul(m.sqrt(b.fadd(self.hypot(aq, cq), m.fabs(aq))), root2)
        whole = m.sqrt(b.fmul(b.fadd(self.abs(x), m.fabs(a)), half))
        t = b.select(large, scaled, whole)
        twice = b.fmul(t, two)
        positive = b.fcmp_unordered(">=", a, zero)
        re = b.select(positive, t, b.fdiv(m.fabs(c), twice))
        im = b.select(positive, b.fdiv(c, twice), m.copysign(t, c))
        is_zero = b.and_(b.fcmp_ordered("==", a, zero), b.fcmp_ordered("==", c, zero))
        return self.make(b.select(is_zero, zero, re), b.select(is_zero, c, im))

    def compare(self, op: str, x, y):
        b = self.b
        (a, c), (e, f) = self.parts(x), self.parts(y)
        if op == "==":
            return b.and_(b.fcmp_ordered("==", a, e), b.fcmp_ordered("==", c, f))
        return b.or_(b.fcmp_unordered("!=", a, e), b.fcmp_unordered("!=", c, f))


def complex_unary(em: KernelEmitter, instr: HloInstruction, x):
    cx = Complex(em)
    rule = {
        Op.NEGATE: cx.negate, Op.ABS: cx.abs, Op.EXP: cx.exp, Op.LOG: cx.log,
        Op.SQRT: cx.sqrt, Op.COPY: lambda v: v,
    }.get(instr.opcode)  # fmt: skip
    if rule is None:
        raise UnsupportedForCodegen(f"{instr.name}: no complex rule for '{instr.opcode.text}'")
    return rule(x)


def complex_binary(em: KernelEmitter, instr: HloInstruction, x, y):
    cx = Complex(em)
    rule = {
        Op.ADD: cx.add, Op.SUBTRACT: cx.subtract, Op.MULTIPLY: cx.multiply,
        Op.DIVIDE: cx.divide,
    }.get(instr.opcode)  # fmt: skip
    if rule is None:
        raise UnsupportedForCodegen(f"{instr.name}: no complex rule for '{instr.opcode.text}'")
    return rule(x, y)


def complex_convert(em: KernelEmitter, x, frm: PrimitiveType, to: PrimitiveType, real_convert):
    """XLA's convert to complex type `to`: a real value (through `real_convert` to the part
    type) gets imaginary part 0; c64 <-> c128 converts both parts."""
    cx = Complex(em)
    part = part_type(to)
    if frm.is_complex:
        re, im = cx.parts(x)
        frm_part = part_type(frm)
        return cx.make(real_convert(em, re, frm_part, part), real_convert(em, im, frm_part, part))
    re = real_convert(em, x, frm, part)
    return cx.make(re, ir.Constant(re.type, 0.0))
