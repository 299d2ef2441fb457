# 8-bit floats (f8e4m3fn, f8e5m2 and friends) in kernels: f32 in registers, like f16 and bf16,
# rounded to the 8-bit type after every op; one byte in memory.
#
# Reading: a byte becomes its f32 value through a 256-entry table made by ml_dtypes (every
# code exact, NaNs included). Writing (and rounding a register value to the type): the f32
# is rounded to nearest, ties to even, as ml_dtypes and XLA convert, in integer arithmetic on
# its bits. With E exponent and M mantissa bits and bias B, a magnitude at or above the
# smallest normal 2^(1-B) keeps its top M mantissa bits (rounded, a carry moving into the
# exponent) and is rebiased; a smaller one is a subnormal code, roundeven(|x| * 2^(M-1+B))
# (exact scaling by a power of two; 2^M there is the smallest normal's code). Past the
# largest finite code, and for infinities: inf where the type has one (IEEE-like: e5m2,
# e4m3, e3m4), else NaN (e4m3fn's S.1111.111; the fnuz types' 0x80). NaN stays NaN. The fnuz
# types have no negative zero: -0 and negative values rounding to zero are +0.

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from llvmlite import ir

from xlapy.backends.cpu.codegen.common import F32, I8, I32
from xlapy.ir.types import PrimitiveType

if TYPE_CHECKING:
    from xlapy.backends.cpu.codegen.emitter import KernelEmitter

P = PrimitiveType


@dataclass(frozen=True, slots=True)
class F8Format:
    """An 8-bit float format: exponent and mantissa bits, bias, and its specials."""

    exponent: int
    mantissa: int
    bias: int
    kind: str  # "ieee" (inf and NaNs), "fn" (NaN is S.1..1, no inf), "fnuz" (NaN is 0x80)

    @property
    def max_code(self) -> int:
        """The largest finite magnitude code (7 bits)."""
        if self.kind == "ieee":
            return ((1 << self.exponent) - 1 << self.mantissa) - 1
        return 0x7E if self.kind == "fn" else 0x7F


F8_FORMATS = {
    P.F8E4M3FN: F8Format(4, 3, 7, "fn"),
    P.F8E5M2: F8Format(5, 2, 15, "ieee"),
    P.F8E4M3: F8Format(4, 3, 7, "ieee"),
    P.F8E3M4: F8Format(3, 4, 3, "ieee"),
    P.F8E4M3FNUZ: F8Format(4, 3, 8, "fnuz"),
    P.F8E5M2FNUZ: F8Format(5, 2, 16, "fnuz"),
    P.F8E4M3B11FNUZ: F8Format(4, 3, 11, "fnuz"),
}
"""The 8-bit float types kernels handle (f8e8m0fnu, an exponent alone, is not one)."""


def _c(v: int):
    return ir.Constant(I32, v)


def f8_to_f32(em: KernelEmitter, byte, t: PrimitiveType):
    """The f32 value of the 8-bit float code `byte` (an i8)."""
    name = f"f8table.{t.text}"
    table = em.module.globals.get(name)
    if table is None:
        values = np.arange(256, dtype=np.uint8).view(t.dtype).astype(np.float32)
        arrty = ir.ArrayType(I32, 256)
        table = ir.GlobalVariable(em.module, arrty, name)
        table.global_constant = True
        table.linkage = "private"
        table.initializer = ir.Constant(arrty, [int(v) for v in values.view(np.uint32)])
    b = em.b
    at = b.gep(table, [_c(0), b.zext(byte, I32)], True)
    return b.bitcast(b.load(at), F32)


def f32_to_f8(em: KernelEmitter, x, t: PrimitiveType):
    """The 8-bit float code (an i8) of f32 `x` rounded to type t (see the file comment)."""
    fmt = F8_FORMATS[t]
    b = em.b
    bits = b.bitcast(x, I32)
    sign = b.lshr(bits, _c(31))
    mag = b.and_(bits, _c(0x7FFFFFFF))
    shift = 23 - fmt.mantissa
    e_min = 1 - fmt.bias
    # normal in the target: round the mantissa at `shift`, ties to even, and rebias
    odd = b.and_(b.lshr(mag, _c(shift)), _c(1))
    rounded = b.add(mag, b.add(_c((1 << (shift - 1)) - 1), odd))
    normal = b.sub(b.lshr(rounded, _c(shift)), _c((127 - fmt.bias) << fmt.mantissa))
    # subnormal in the target: an integer count of the smallest subnormal
    fabs = b.bitcast(mag, F32)
    scaled = b.fmul(fabs, ir.Constant(F32, float(2.0 ** (fmt.mantissa - e_min))))
    roundeven = em.module.declare_intrinsic("llvm.roundeven", [F32])
    sub = b.fptoui(b.call(roundeven, [scaled]), I32)
    is_normal = b.icmp_unsigned(">=", mag, _c((127 + e_min) << 23))
    code = b.select(is_normal, normal, sub)
    inf_or_nan = b.icmp_unsigned(">=", mag, _c(0x7F800000))
    is_nan = b.icmp_unsigned(">", mag, _c(0x7F800000))
    over = b.or_(b.icmp_unsigned(">", code, _c(fmt.max_code)), inf_or_nan)
    if fmt.kind == "ieee":
        inf = (1 << fmt.exponent) - 1 << fmt.mantissa
        code = b.select(over, _c(inf), code)
        code = b.select(is_nan, _c(inf | 1 << (fmt.mantissa - 1)), code)
        result = b.or_(code, b.shl(sign, _c(7)))
    elif fmt.kind == "fn":
        code = b.select(over, _c(0x7F), code)
        result = b.or_(code, b.shl(sign, _c(7)))
    else:  # fnuz: one NaN, 0x80, and no negative zero
        zero = b.icmp_unsigned("==", code, _c(0))
        signed = b.select(zero, code, b.or_(code, b.shl(sign, _c(7))))
        result = b.select(over, _c(0x80), signed)
    return b.trunc(result, I8)
