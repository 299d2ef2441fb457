# Transcendental functions emitted as straight-line LLVM IR, so loops that call them still
# vectorize (a scalar libm call in a loop body stops the vectorizer and costs 20-40x).
#
# Every function takes a scalar `float` or `double` value and returns one of the same type.
# The recipes:
#   exp     x clamped to [lo, hi] (NaN passes), n = rint(x/ln2) by adding 1.5*2^23 (2^52) in
#           one FMA so its integer sits in the low mantissa bits, r = x - n*ln2 (two-part ln2),
#           e^r on |r| <= ln2/2 by a degree-6 minimax polynomial (f32, relative error 3.3e-9)
#           or a 14-term Taylor polynomial (f64), scaled by 2^n in two steps so results
#           reaching into the denormals stay exact. The clamp ends give inf and 0 by
#           themselves, and a NaN flows through the arithmetic: no selects.
#   log     x = m*2^e with m in [sqrt(1/2), sqrt(2)), log(m) = 2*atanh(s), s = (m-1)/(m+1),
#           odd series in s; denormal inputs are scaled by 2^k first.
#   log1p, expm1  Goldberg's and Kahan's corrections on top of log / exp (a few ulp near 0).
#   tanh    f32, all in float: |x| clamped to 9.02 (tanh rounds to 1 beyond 9.011),
#           tanh(a) = a * P(a^2) / Q(a^2) with P, Q of degree 4 in a^2 (a rational fit,
#           relative error 3e-8, fitted for xlapy by reweighted least squares, Q refitted
#           after rounding P to float), one division, the result clamped to 1, the sign
#           copied back. Rounding in the two Horner chains dominates: 5.2 ulp at most over
#           every float (measured exhaustively), as good as a float-only rational gets.
#           f64: odd Taylor polynomial below 0.55 (22 terms), 1 - 2/(exp(2|x|) + 1) above, the sign
#           restored; +-1 past saturation.
#   logistic t = exp(-|x|): 1 / (1 + t) for x >= 0, t / (1 + t) below (no underflow to 0).
#   sin, cos, tan (f32)  computed in double, for every finite float (1e20, FLT_MAX): the
#           argument reduction is Payne-Hanek's idea without its loop, since a float has 24
#           bits. x = M * 2^E with M an integer below 2^24, so x*2/pi mod 4 = M * F(E) mod 4
#           where F(E) = 2^E * 2/pi mod 4 is precomputed for every float exponent (a table
#           of 256 double-double values, `two_over_pi_table`, exact to 2^-106 relative).
#           M * F(E) is formed exactly with one FMA (hi + lo) plus M * F_lo; k = rint(hi),
#           r = ((hi - k) + lo) * pi/2, quadrant k mod 4. Branch-free (one table load per
#           half, which vectorizes as a gather); Taylor polynomials of sin and cos on
#           |r| <= pi/4.
#   atan2 (f32)  in double: octant reduction to |t| <= tan(pi/8), odd Taylor series of atan.
#   erf (f32)    in double: Taylor series for |x| < 1.5, 1 - exp(-x^2) * g(x) / x on
#           [1.5, 4) with g = x*erfcx(x) fitted by a Chebyshev least-squares polynomial,
#           +-1 beyond.
#   cbrt (f32)   in double: bit-trick guess, four Newton steps.
#   pow (f32)    in double: exp(y * log|x|) with IEEE special cases (integer y, zero, inf).
# f64 versions of sin, cos, tan, atan2, erf, cbrt and pow call libm (scalar); f64 exp, log,
# log1p, expm1, tanh and logistic are inline with longer polynomials.

from __future__ import annotations

import functools
import math
from fractions import Fraction

from llvmlite import ir

F32 = ir.FloatType()
F64 = ir.DoubleType()
I1 = ir.IntType(1)
I32 = ir.IntType(32)
I64 = ir.IntType(64)

_LIBM_F64 = {"sin", "cos", "tan", "atan2", "erf", "cbrt", "pow"}


def _c(ty, value: float):
    return ir.Constant(ty, value)


def _int_of(ty):
    return I32 if ty == F32 else I64


class MathEmitter:
    """Emits math functions into `module` with builder `b` (set `b` before each use)."""

    def __init__(self, module: ir.Module):
        self.module = module
        self._b: ir.IRBuilder | None = None
        self._decls: dict[tuple[str, str], ir.Function] = {}

    @property
    def b(self) -> ir.IRBuilder:
        """The builder the next instructions go to."""
        if self._b is None:
            raise RuntimeError("MathEmitter used before its builder `b` was set")
        return self._b

    @b.setter
    def b(self, builder: ir.IRBuilder) -> None:
        self._b = builder

    # -- small helpers -------------------------------------------------------------------
    def intrinsic(self, name: str, ty, nargs: int = 1, ret=None):
        """The declaration of LLVM intrinsic `name` overloaded on `ty`."""
        suffix = "f32" if ty == F32 else "f64"
        key = (name, suffix)
        if key not in self._decls:
            fnty = ir.FunctionType(ret or ty, [ty] * nargs)
            self._decls[key] = ir.Function(self.module, fnty, f"llvm.{name}.{suffix}")
        return self._decls[key]

    def call(self, name: str, *args):
        return self.b.call(self.intrinsic(name, args[0].type, len(args)), list(args))

    def libm(self, name: str, *args):
        """A scalar libm call (double versions only)."""
        key = ("libm", name)
        if key not in self._decls:
            fnty = ir.FunctionType(F64, [F64] * len(args))
            self._decls[key] = ir.Function(self.module, fnty, name)
        return self.b.call(self._decls[key], list(args))

    def fma(self, a, b, c):
        return self.call("fmuladd", a, b, c)

    def horner(self, x, coeffs):
        """coeffs[0] + coeffs[1]*x + ... (highest power last)."""
        ty = x.type
        acc = _c(ty, coeffs[-1])
        for c in reversed(coeffs[:-1]):
            acc = self.fma(acc, x, _c(ty, c))
        return acc

    def select(self, cond, a, b):
        return self.b.select(cond, a, b)

    def clamp(self, x, lo: float, hi: float):
        """x limited to [lo, hi]; a NaN passes through (one min and one max instruction)."""
        b, ty = self.b, x.type
        x = b.select(b.fcmp_ordered("<", x, _c(ty, lo)), _c(ty, lo), x)
        return b.select(b.fcmp_ordered(">", x, _c(ty, hi)), _c(ty, hi), x)

    def isnan(self, x):
        return self.b.fcmp_unordered("uno", x, x)

    def fabs(self, x):
        return self.call("fabs", x)

    def copysign(self, mag, sign):
        return self.call("copysign", mag, sign)

    def ext(self, x):
        return self.b.fpext(x, F64) if x.type == F32 else x

    def trunc(self, x, ty):
        return self.b.fptrunc(x, F32) if ty == F32 else x

    def ldexp(self, x, n):
        """x * 2^n for integer n (same width as x's bits) in the normal exponent range."""
        ity = _int_of(x.type)
        mant, bias = (23, 127) if x.type == F32 else (52, 1023)
        bits = self.b.shl(self.b.add(n, ir.Constant(ity, bias)), ir.Constant(ity, mant))
        return self.b.fmul(x, self.b.bitcast(bits, x.type))

    # -- exp / log family ------------------------------------------------------------------
    _EXP_F32 = (
        1.0, 1.0, 0.4999999403953552, 0.1666652262210846, 0.04166823625564575,
        0.008368583396077156, 0.0013824569759890437,
    )  # fmt: skip

    def exp(self, x):
        b, ty = self.b, x.type
        ity = _int_of(ty)
        f32 = ty == F32
        hi, lo = (88.8, -104.0) if f32 else (709.9, -745.2)
        xs = self.clamp(x, lo, hi)
        magic = _c(ty, 1.5 * 2.0 ** (23 if f32 else 52))
        shifted = self.fma(xs, _c(ty, 1 / math.log(2)), magic)
        n = b.fsub(shifted, magic)
        ni = b.sub(b.bitcast(shifted, ity), b.bitcast(magic, ity))
        ln2_hi = 0.693145751953125 if f32 else 0.6931471803691238
        ln2_lo = 1.428606765330187e-06 if f32 else 1.9082149292705877e-10
        r = self.fma(n, _c(ty, -ln2_hi), xs)
        r = self.fma(n, _c(ty, -ln2_lo), r)
        coeffs = self._EXP_F32 if f32 else [1 / math.factorial(k) for k in range(14)]
        p = self.horner(r, list(coeffs))
        n1 = b.ashr(ni, ir.Constant(ity, 1))
        return self.ldexp(self.ldexp(p, n1), b.sub(ni, n1))

    def log(self, x):
        b, ty = self.b, x.type
        ity = _int_of(ty)
        f32 = ty == F32
        mant, bias, tiny, scale = (
            (23, 127, 1.1754943508222875e-38, 25)
            if f32
            else (52, 1023, 2.2250738585072014e-308, 60)
        )
        denormal = b.fcmp_ordered("<", x, _c(ty, tiny))
        xs = self.select(denormal, b.fmul(x, _c(ty, 2.0**scale)), x)
        bits = b.bitcast(xs, ity)
        e = b.sub(b.lshr(bits, ir.Constant(ity, mant)), ir.Constant(ity, bias))
        e = self.select(denormal, b.sub(e, ir.Constant(ity, scale)), e)
        mbits = b.or_(
            b.and_(bits, ir.Constant(ity, (1 << mant) - 1)), ir.Constant(ity, bias << mant)
        )
        m = b.bitcast(mbits, ty)
        big = b.fcmp_ordered(">", m, _c(ty, math.sqrt(2.0)))
        m = self.select(big, b.fmul(m, _c(ty, 0.5)), m)
        e = self.select(big, b.add(e, ir.Constant(ity, 1)), e)
        f = b.fsub(m, _c(ty, 1.0))
        s = b.fdiv(f, b.fadd(m, _c(ty, 1.0)))
        s2 = b.fmul(s, s)
        terms = 6 if f32 else 12
        series = self.horner(s2, [2.0 / (2 * k + 1) for k in range(terms)])
        ef = b.sitofp(e, ty)
        ln2_hi = 0.693145751953125 if f32 else 0.6931471803691238
        ln2_lo = 1.428606765330187e-06 if f32 else 1.9082149292705877e-10
        tail = self.fma(s, series, b.fmul(ef, _c(ty, ln2_lo)))
        result = self.fma(ef, _c(ty, ln2_hi), tail)
        result = self.select(b.fcmp_ordered("==", x, _c(ty, 0.0)), _c(ty, -math.inf), result)
        result = self.select(b.fcmp_ordered("<", x, _c(ty, 0.0)), _c(ty, math.nan), result)
        result = self.select(b.fcmp_ordered("==", x, _c(ty, math.inf)), x, result)
        return self.select(self.isnan(x), x, result)

    def log1p(self, x):
        b, ty = self.b, x.type
        u = b.fadd(x, _c(ty, 1.0))
        d = b.fsub(u, _c(ty, 1.0))
        corrected = b.fmul(self.log(u), b.fdiv(x, d))
        result = self.select(b.fcmp_ordered("==", d, _c(ty, 0.0)), x, corrected)
        result = self.select(b.fcmp_ordered("==", x, _c(ty, math.inf)), x, result)
        result = self.select(b.fcmp_ordered("==", x, _c(ty, -1.0)), _c(ty, -math.inf), result)
        result = self.select(b.fcmp_ordered("<", x, _c(ty, -1.0)), _c(ty, math.nan), result)
        return self.select(self.isnan(x), x, result)

    def expm1(self, x):
        b, ty = self.b, x.type
        u = self.exp(x)
        um1 = b.fsub(u, _c(ty, 1.0))
        corrected = b.fmul(um1, b.fdiv(x, self.log(u)))
        result = self.select(b.fcmp_ordered("==", u, _c(ty, 1.0)), x, corrected)
        result = self.select(b.fcmp_ordered("==", um1, _c(ty, -1.0)), _c(ty, -1.0), result)
        result = self.select(b.fcmp_ordered("==", u, _c(ty, math.inf)), u, result)
        return self.select(self.isnan(x), x, result)

    _TANH_P = (
        1.0, 0.1338144838809967, 0.003495982149615884, 2.0611252693925053e-05,
        1.3349492178349465e-08,
    )  # fmt: skip
    _TANH_Q = (
        1.0, 0.46714767813682556, 0.02587876096367836, 0.0003286093124188483,
        7.776176289553405e-07,
    )  # fmt: skip

    def tanh(self, x):
        if x.type == F32:
            return self._tanh_f32(x)
        b, ty = self.b, x.type
        ax = self.fabs(x)
        e = self.exp(b.fmul(ax, _c(ty, 2.0)))
        big = b.fsub(_c(ty, 1.0), b.fdiv(_c(ty, 2.0), b.fadd(e, _c(ty, 1.0))))
        x2 = b.fmul(ax, ax)
        small = b.fmul(ax, self.horner(x2, list(tanh_taylor(22))))
        t = self.select(b.fcmp_ordered("<", ax, _c(ty, TANH_TAYLOR_BELOW)), small, big)
        t = self.select(b.fcmp_ordered(">", ax, _c(ty, 19.1)), _c(ty, 1.0), t)
        return self.select(self.isnan(x), x, self.copysign(t, x))

    def _tanh_f32(self, x):
        b = self.b
        a = self.clamp(self.fabs(x), 0.0, 9.02)
        t = b.fmul(a, a)
        ratio = b.fdiv(b.fmul(a, self.horner(t, list(self._TANH_P))), self.horner(t, self._TANH_Q))
        # exactly 1 from saturation on: without FMA (max_isa below AVX2, an x86 without it)
        # the rational's unfused Horner steps gave 1 - 2^-24 there
        ratio = self.select(b.fcmp_ordered(">=", a, _c(F32, 9.02)), _c(F32, 1.0), ratio)
        return self.copysign(self.clamp(ratio, 0.0, 1.0), x)

    def logistic(self, x):
        b, ty = self.b, x.type
        t = self.exp(b.fneg(self.fabs(x)))
        r = b.fdiv(_c(ty, 1.0), b.fadd(_c(ty, 1.0), t))
        return self.select(b.fcmp_unordered("<", x, _c(ty, 0.0)), b.fmul(t, r), r)

    # -- functions computed in double for f32 ------------------------------------------------
    def _table(self, name: str, values: tuple[float, ...]) -> ir.GlobalVariable:
        if name in self.module.globals:
            return self.module.globals[name]
        ty = ir.ArrayType(F64, len(values))
        table = ir.GlobalVariable(self.module, ty, name)
        table.global_constant = True
        table.linkage = "internal"
        table.initializer = ir.Constant(ty, list(values))
        return table

    def _sincos_reduce(self, x):
        """(r, q) for float `x`: x = (4n + q + r*2/pi) * pi/2 with |r| <= pi/4 (about),
        r in double (see the file comment)."""
        b = self.b
        bits = b.bitcast(x, I32)
        biased = b.and_(b.lshr(bits, ir.Constant(I32, 23)), ir.Constant(I32, 0xFF))
        mant = b.and_(bits, ir.Constant(I32, 0x7FFFFF))
        normal = b.icmp_unsigned("!=", biased, ir.Constant(I32, 0))
        m = self.select(normal, b.or_(mant, ir.Constant(I32, 0x800000)), mant)
        md = b.sitofp(m, F64)
        md = self.select(b.icmp_signed("<", bits, ir.Constant(I32, 0)), b.fneg(md), md)
        hi_table, lo_table = two_over_pi_table()
        index = [ir.Constant(I32, 0), biased]
        f_hi = b.load(b.gep(self._table("xlapy.two_over_pi.hi", hi_table), index))
        f_lo = b.load(b.gep(self._table("xlapy.two_over_pi.lo", lo_table), index))
        hi = b.fmul(md, f_hi)
        lo = self.call("fma", md, f_hi, b.fneg(hi))  # exact: the product's low part
        lo = self.call("fma", md, f_lo, lo)
        k = self.call("rint", hi)
        r = b.fmul(b.fadd(b.fsub(hi, k), lo), _c(F64, math.pi / 2))
        q = b.and_(b.fptosi(k, I64), ir.Constant(I64, 3))
        return r, q

    def _sin_poly(self, r):
        r2 = self.b.fmul(r, r)
        coeffs = [(-1) ** k / math.factorial(2 * k + 1) for k in range(8)]
        return self.b.fmul(r, self.horner(r2, coeffs))

    def _cos_poly(self, r):
        r2 = self.b.fmul(r, r)
        return self.horner(r2, [(-1) ** k / math.factorial(2 * k) for k in range(9)])

    def _sincos(self, x, want_sin: bool):
        b, ty = self.b, x.type
        xd = self.ext(x)
        r, q = self._sincos_reduce(x)
        s, c = self._sin_poly(r), self._cos_poly(r)
        if not want_sin:
            q = b.add(q, ir.Constant(I64, 1))
        q = b.and_(q, ir.Constant(I64, 3))
        odd = b.icmp_unsigned("!=", b.and_(q, ir.Constant(I64, 1)), ir.Constant(I64, 0))
        neg = b.icmp_unsigned("!=", b.and_(q, ir.Constant(I64, 2)), ir.Constant(I64, 0))
        v = self.select(odd, c, s)
        v = self.select(neg, b.fneg(v), v)
        v = self.call("minnum", self.call("maxnum", v, _c(F64, -1.0)), _c(F64, 1.0))
        v = self.select(b.fcmp_unordered("uno", b.fsub(xd, xd), _c(F64, 0)), _c(F64, math.nan), v)
        if want_sin:
            v = self.select(b.fcmp_ordered("==", xd, _c(F64, 0.0)), xd, v)
        return self.trunc(v, ty)

    def sin(self, x):
        if x.type == F64:
            return self.libm("sin", x)
        return self._sincos(x, True)

    def cos(self, x):
        if x.type == F64:
            return self.libm("cos", x)
        return self._sincos(x, False)

    def tan(self, x):
        if x.type == F64:
            return self.libm("tan", x)
        b = self.b
        xd = self.ext(x)
        r, q = self._sincos_reduce(x)
        s, c = self._sin_poly(r), self._cos_poly(r)
        odd = b.icmp_unsigned("!=", b.and_(q, ir.Constant(I64, 1)), ir.Constant(I64, 0))
        t = self.select(odd, b.fdiv(b.fneg(c), s), b.fdiv(s, c))
        t = self.select(b.fcmp_unordered("uno", b.fsub(xd, xd), _c(F64, 0)), _c(F64, math.nan), t)
        t = self.select(b.fcmp_ordered("==", xd, _c(F64, 0.0)), xd, t)
        return self.trunc(t, F32)

    def atan2(self, y, x):
        if x.type == F64:
            return self.libm("atan2", y, x)
        b = self.b
        yd, xd = self.ext(y), self.ext(x)
        ay, ax = self.fabs(yd), self.fabs(xd)
        both_inf = b.and_(
            b.fcmp_ordered("==", ay, _c(F64, math.inf)), b.fcmp_ordered("==", ax, _c(F64, math.inf))
        )
        ay = self.select(both_inf, _c(F64, 1.0), ay)
        ax = self.select(both_inf, _c(F64, 1.0), ax)
        swap = b.fcmp_ordered(">", ay, ax)
        num = self.select(swap, ax, ay)
        den = self.select(swap, ay, ax)
        t = b.fdiv(num, den)
        t = self.select(b.fcmp_ordered("==", den, _c(F64, 0.0)), _c(F64, 0.0), t)
        big = b.fcmp_ordered(">", t, _c(F64, math.tan(math.pi / 8)))
        t = self.select(big, b.fdiv(b.fsub(t, _c(F64, 1.0)), b.fadd(t, _c(F64, 1.0))), t)
        t2 = b.fmul(t, t)
        a = b.fmul(t, self.horner(t2, [(-1) ** k / (2 * k + 1) for k in range(13)]))
        a = self.select(big, b.fadd(a, _c(F64, math.pi / 4)), a)
        a = self.select(swap, b.fsub(_c(F64, math.pi / 2), a), a)
        xneg = b.icmp_signed("<", b.bitcast(xd, I64), ir.Constant(I64, 0))
        a = self.select(xneg, b.fsub(_c(F64, math.pi), a), a)
        a = self.copysign(a, yd)
        nan = b.or_(self.isnan(xd), self.isnan(yd))
        return self.trunc(self.select(nan, b.fadd(xd, yd), a), F32)

    _ERF_TAIL = (
        0.5325707647570755,
        0.024698240339432593,
        -0.013908603436875746,
        0.006717141584643846,
        -0.002943101247480197,
        0.0012008087780791096,
        -0.00046318146851523524,
        0.0001711820329745021,
        -6.054582018318704e-05,
        1.9490467767913262e-05,
        -6.413712752087927e-06,
        2.989634327684407e-06,
        -9.414695981504961e-07,
    )

    def erf(self, x):
        if x.type == F64:
            return self.libm("erf", x)
        b = self.b
        xd = self.ext(x)
        ax = self.fabs(xd)
        a = self.call("minnum", ax, _c(F64, 4.0))
        a2 = b.fmul(a, a)
        small_terms = [
            2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1))
            for n in range(22)
        ]
        small = b.fmul(a, self.horner(a2, small_terms))
        t = b.fmul(b.fsub(a, _c(F64, 2.75)), _c(F64, 1 / 1.25))
        g = self.horner(t, list(self._ERF_TAIL))
        large = b.fsub(_c(F64, 1.0), b.fdiv(b.fmul(self.exp(b.fneg(a2)), g), a))
        v = self.select(b.fcmp_ordered("<", ax, _c(F64, 1.5)), small, large)
        v = self.select(b.fcmp_ordered(">=", ax, _c(F64, 4.0)), _c(F64, 1.0), v)
        v = self.copysign(v, xd)
        return self.trunc(self.select(self.isnan(xd), xd, v), F32)

    def cbrt(self, x):
        if x.type == F64:
            return self.libm("cbrt", x)
        b = self.b
        xd = self.ext(x)
        ax = self.fabs(xd)
        bits = b.bitcast(ax, I64)
        guess_bits = b.add(b.udiv(bits, ir.Constant(I64, 3)), ir.Constant(I64, 0x2A9F7893782DA1CE))
        y = b.bitcast(guess_bits, F64)
        for _ in range(5):
            y3 = b.fmul(b.fmul(y, y), y)
            y = b.fsub(y, b.fdiv(b.fsub(y3, ax), b.fmul(_c(F64, 3.0), b.fmul(y, y))))
        special = b.or_(
            b.fcmp_unordered("==", ax, _c(F64, 0.0)), b.fcmp_unordered("==", ax, _c(F64, math.inf))
        )
        y = self.select(special, ax, y)
        return self.trunc(self.copysign(y, xd), F32)

    def pow(self, x, y):
        if x.type == F64:
            return self.libm("pow", x, y)
        b = self.b
        xd, yd = self.ext(x), self.ext(y)
        ax = self.fabs(xd)
        mag = self.exp(b.fmul(yd, self.log(ax)))
        y_int = b.fcmp_ordered("==", self.call("trunc", yd), yd)
        half = b.fmul(yd, _c(F64, 0.5))
        y_odd = b.and_(y_int, b.fcmp_ordered("!=", self.call("trunc", half), half))
        y_odd = b.and_(y_odd, b.fcmp_ordered("<", self.fabs(yd), _c(F64, 2.0**53)))
        xneg = b.icmp_signed("<", b.bitcast(xd, I64), ir.Constant(I64, 0))
        signed = self.select(b.and_(xneg, y_odd), b.fneg(mag), mag)
        # x < 0 with a non-integer y is NaN (-inf and -0 keep their limits)
        bad = b.and_(
            b.fcmp_ordered("<", xd, _c(F64, 0.0)),
            b.and_(b.not_(y_int), b.fcmp_ordered("<", xd, _c(F64, -0.0))),
        )
        bad = b.and_(bad, b.fcmp_ordered("!=", xd, _c(F64, -math.inf)))
        bad = b.and_(bad, b.fcmp_ordered("<", self.fabs(yd), _c(F64, math.inf)))
        r = self.select(bad, _c(F64, math.nan), signed)
        # |x| == 1 with y = +-inf is 1; y == 0 or x == 1 gives 1 even for NaN
        one = b.or_(b.fcmp_ordered("==", yd, _c(F64, 0.0)), b.fcmp_ordered("==", xd, _c(F64, 1.0)))
        unit_inf = b.and_(
            b.fcmp_ordered("==", ax, _c(F64, 1.0)),
            b.fcmp_ordered("==", self.fabs(yd), _c(F64, math.inf)),
        )
        r = self.select(b.or_(one, unit_inf), _c(F64, 1.0), r)
        return self.trunc(r, F32)

    def sqrt(self, x):
        return self.call("sqrt", x)

    def rsqrt(self, x):
        return self.b.fdiv(_c(x.type, 1.0), self.call("sqrt", x))


LIBM_FUNCTIONS = frozenset(_LIBM_F64)
"""The libm symbols f64 kernels may call (the JIT resolves them in the process)."""


TANH_TAYLOR_BELOW = 0.55
"""f64 tanh uses its Taylor series below this |x|: above it 1 - 2/(exp(2|x|) + 1) cancels
less than one bit (below, at 0.2, it lost two: 6 ulp, XLA 1)."""


@functools.cache
def tanh_taylor(terms: int) -> tuple[float, ...]:
    """The coefficients of tanh's odd Taylor series in powers of x^2 (x, x^3, x^5, ...):
    2^2n (2^2n - 1) B_2n / (2n)!, from exact Bernoulli numbers (Akiyama-Tanigawa)."""
    a: list[Fraction] = []
    bernoulli = []
    for m in range(2 * terms + 1):
        a.append(Fraction(1, m + 1))
        for j in range(m, 0, -1):
            a[j - 1] = j * (a[j - 1] - a[j])
        bernoulli.append(a[0])
    return tuple(
        float(Fraction(4**n * (4**n - 1)) * bernoulli[2 * n] / math.factorial(2 * n))
        for n in range(1, terms + 1)
    )


def _pi_fixed(bits: int) -> int:
    """floor(pi * 2^bits), by Machin's formula in integers."""

    def atan_inv(n: int, one: int) -> int:
        total, term, k, sign = 0, one // n, 1, 1
        while term:
            total += sign * (term // k)
            term //= n * n
            k += 2
            sign = -sign
        return total

    guard = 64
    one = 1 << (bits + guard)
    return (16 * atan_inv(5, one) - 4 * atan_inv(239, one)) >> guard


@functools.cache
def two_over_pi_table() -> tuple[tuple[float, ...], tuple[float, ...]]:
    """F(E) = 2^E * 2/pi mod 4 as double-double (hi, lo) tables indexed by a float's biased
    exponent field b: E = b - 150 (the exponent of its 24-bit integer mantissa), E = -149
    for b = 0 (subnormals); entry 255 (inf, NaN) is 0."""
    precision = 480
    two_over_pi = Fraction(2 << (2 * precision), _pi_fixed(precision) << precision)
    his, los = [], []
    for biased in range(256):
        if biased == 255:
            his.append(0.0)
            los.append(0.0)
            continue
        e = -149 if biased == 0 else biased - 150
        f = (two_over_pi * Fraction(2) ** e) % 4
        hi = float(f)
        his.append(hi)
        los.append(float(f - Fraction(hi)))
    return tuple(his), tuple(los)
