"""chlo ops, decomposed into HLO.

JAX leaves a few special functions to the `chlo` dialect; XLA expands them before compiling,
and so does this file, into plain HLO arithmetic. Real floating-point inputs narrower than
64 bits are computed in f64 and rounded once at the end, so the result is at least as
accurate as XLA's f32 polynomials; f64 inputs are computed in f64. The exception is erf_inv,
the last step of every normal sample (jax.random.normal): for inputs narrower than f64 it is
XLA's own f32 polynomial, ~8x cheaper than an f64 Newton solve, and the same samples as
XLA's to a few ulps. The formulas:

  erfc          1 - erf(x) below x = 2; above, exp(-x^2)/sqrt(pi) times the continued
                fraction 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))) evaluated bottom-up
  erf_inv       f32 and narrower: Giles' single-precision polynomials in w = -log1p(-x^2)
                (XLA's); f64: Winitzki's closed form as a first guess, then Newton steps
                on erf(y) = x
  lgamma        Lanczos (g = 7, 9 terms) for x >= 1/2, reflection below
  digamma       the derivative of the same Lanczos sum, reflection below 1/2
  zeta          Hurwitz zeta by Euler-Maclaurin: 9 terms of the sum, then the integral
                and 12 Bernoulli corrections
  polygamma     digamma for n = 0, else (-1)^(n+1) n! zeta(n+1, x)
  bessel_i1e    the power series of I1 times exp(-|x|) up to |x| = 15, the asymptotic
                series of exp(-x) I1(x) above
  asin, acos    2 atan2(x, 1 + sqrt(1 - x^2)) and 2 atan2(sqrt(1 - x^2), 1 + x)
  atan          atan2(x, 1)
  sinh, cosh    through expm1 (small |x|) and exp(|x| - ln 2) (no early overflow)
  asinh, acosh  through log1p, with log(|x|) + ln 2 where x^2 would overflow
  atanh         log1p(2x / (1 - x)) / 2
  next_after    the integer bits of x stepped by one toward y
  top_k         HLO's topk
"""

from __future__ import annotations

import math

from xlapy.ir.shapes import Shape
from xlapy.ir.types import PrimitiveType
from xlapy.stablehlo.convert import Converter, Scope, rule
from xlapy.stablehlo.mlir import Op, Typed

_LANCZOS_G = 7.0
_LANCZOS = (
    0.99999999999980993,
    676.5203681218851,
    -1259.1392167224028,
    771.32342877765313,
    -176.61502916214059,
    12.507343278686905,
    -0.13857109526572012,
    9.9843695780195716e-6,
    1.5056327351493116e-7,
)
# B_2k / (2k)! for k = 1..12
_BERNOULLI = (
    1 / 6,
    -1 / 30,
    1 / 42,
    -1 / 30,
    5 / 66,
    -691 / 2730,
    7 / 6,
    -3617 / 510,
    43867 / 798,
    -174611 / 330,
    854513 / 138,
    -236364091 / 2730,
)
_BERNOULLI_OVER_FACTORIAL = tuple(b / math.factorial(2 * k + 2) for k, b in enumerate(_BERNOULLI))


class Ex:
    """Writes elementwise HLO in one compute shape; values are instruction names."""

    def __init__(
        self, conv: Converter, scope: Scope, like: Shape, compute: PrimitiveType = PrimitiveType.F64
    ):
        self.conv = conv
        self.scope = scope
        self.out = like
        et = like.element_type
        if et.kind.value != "float":
            raise conv.error(f"'{conv.op.name if conv.op else 'chlo'}' needs a real float type")
        self.compute = compute
        self.shape = Shape.array(compute, like.dims)
        self.pred = Shape.array(PrimitiveType.PRED, like.dims)
        self.consts: dict[float, str] = {}

    def op(self, opcode: str, *xs: str, shape: Shape | None = None, attrs: str = "") -> str:
        return self.conv.add(self.scope, opcode, shape or self.shape, list(xs), attrs)[0]

    def c(self, value: float) -> str:
        name = self.consts.get(value)
        if name is None:
            name = self.conv.scalar(self.scope, value, self.shape)[0]
            self.consts[value] = name
        return name

    def up(self, x: str) -> str:
        if self.out.element_type is self.compute:
            return x
        return self.op("convert", x)

    def down(self, x: str) -> tuple[str, Shape]:
        if self.out.element_type is self.compute:
            return x, self.out
        return self.conv.add(self.scope, "convert", self.out, [x])

    def cmp(self, a: str, b: str, direction: str) -> str:
        return self.op("compare", a, b, shape=self.pred, attrs=f", direction={direction}")

    def sel(self, p: str, a: str, b: str) -> str:
        return self.op("select", p, a, b)

    def add(self, a: str, b: str) -> str:
        return self.op("add", a, b)

    def sub(self, a: str, b: str) -> str:
        return self.op("subtract", a, b)

    def mul(self, a: str, b: str) -> str:
        return self.op("multiply", a, b)

    def div(self, a: str, b: str) -> str:
        return self.op("divide", a, b)

    def f(self, opcode: str, a: str) -> str:
        return self.op(opcode, a)

    def poly_sum(self, z: str) -> tuple[str, str]:
        """The Lanczos sum a(z) = p0 + sum p_i / (z + i) and its derivative a'(z)."""
        a, da = self.c(_LANCZOS[0]), self.c(0.0)
        for i, p in enumerate(_LANCZOS[1:], start=1):
            d = self.add(z, self.c(float(i)))
            a = self.add(a, self.div(self.c(p), d))
            da = self.sub(da, self.div(self.c(p), self.mul(d, d)))
        return a, da

    def lgamma(self, x: str) -> str:
        half = self.c(0.5)
        reflect = self.cmp(x, half, "LT")
        y = self.sel(reflect, self.sub(self.c(1.0), x), x)  # y >= 1/2
        z = self.sub(y, self.c(1.0))
        a, _ = self.poly_sum(z)
        gh = _LANCZOS_G + 0.5
        t = self.add(z, self.c(gh))
        log_t = self.add(self.c(math.log(gh)), self.f("log-plus-one", self.div(z, self.c(gh))))
        value = self.add(
            self.c(0.5 * math.log(2 * math.pi)),
            self.sub(self.mul(self.add(z, half), log_t), self.sub(t, self.f("log", a))),
        )
        # reflection: lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x)
        frac = self.sub(x, self.f("floor", x))
        sin = self.f("abs", self.f("sine", self.mul(self.c(math.pi), frac)))
        reflected = self.sub(self.f("log", self.div(self.c(math.pi), sin)), value)
        out = self.sel(reflect, reflected, value)
        inf = self.c(math.inf)
        pole = self.op(
            "and",
            self.cmp(x, self.f("floor", x), "EQ"),
            self.cmp(x, self.c(0.0), "LE"),
            shape=self.pred,
        )
        out = self.sel(pole, inf, out)
        return self.sel(self.cmp(self.f("abs", x), inf, "EQ"), inf, out)

    def digamma(self, x: str) -> str:
        reflect = self.cmp(x, self.c(0.5), "LT")
        y = self.sel(reflect, self.sub(self.c(1.0), x), x)
        z = self.sub(y, self.c(1.0))
        a, da = self.poly_sum(z)
        gh = _LANCZOS_G + 0.5
        t = self.add(z, self.c(gh))
        log_t = self.add(self.c(math.log(gh)), self.f("log-plus-one", self.div(z, self.c(gh))))
        value = self.sub(self.add(log_t, self.div(da, a)), self.div(self.c(_LANCZOS_G), t))
        # reflection: digamma(x) = digamma(1 - x) - pi / tan(pi x)
        frac = self.sub(x, self.f("floor", x))
        tan = self.f("tan", self.mul(self.c(math.pi), frac))
        out = self.sel(reflect, self.sub(value, self.div(self.c(math.pi), tan)), value)
        pole = self.op(
            "and",
            self.cmp(x, self.f("floor", x), "EQ"),
            self.cmp(x, self.c(0.0), "LE"),
            shape=self.pred,
        )
        return self.sel(pole, self.c(math.nan), out)

    def zeta(self, s: str, q: str) -> str:
        n = 9
        total = self.c(0.0)
        neg_s = self.f("negate", s)
        for k in range(n):
            total = self.add(total, self.op("power", self.add(q, self.c(float(k))), neg_s))
        w = self.add(q, self.c(float(n)))
        w_neg_s = self.op("power", w, neg_s)
        total = self.add(total, self.div(self.mul(w, w_neg_s), self.sub(s, self.c(1.0))))
        total = self.add(total, self.mul(self.c(0.5), w_neg_s))
        # sum_j B_2j / (2j)! * s (s+1) ... (s+2j-2) * w^(-s-2j+1)
        factor = self.div(self.mul(s, w_neg_s), w)  # s * w^(-s-1)
        w2 = self.mul(w, w)
        for j, coeff in enumerate(_BERNOULLI_OVER_FACTORIAL):
            total = self.add(total, self.mul(self.c(coeff), factor))
            if j + 1 < len(_BERNOULLI_OVER_FACTORIAL):
                rising = self.mul(
                    self.add(s, self.c(2.0 * j + 1)), self.add(s, self.c(2.0 * j + 2))
                )
                factor = self.div(self.mul(factor, rising), w2)
        nan, inf = self.c(math.nan), self.c(math.inf)
        total = self.sel(self.cmp(s, self.c(1.0), "LT"), nan, total)
        total = self.sel(self.cmp(s, self.c(1.0), "EQ"), inf, total)
        q_int = self.cmp(q, self.f("floor", q), "EQ")
        q_nonpos = self.cmp(q, self.c(0.0), "LE")
        s_int = self.cmp(s, self.f("floor", s), "EQ")
        bad = self.op("and", q_nonpos, self.op("not", s_int, shape=self.pred), shape=self.pred)
        total = self.sel(bad, nan, total)
        return self.sel(self.op("and", q_nonpos, q_int, shape=self.pred), inf, total)


def _unary(name: str, single: bool = False):
    """Registers `fn(ex, x)` as the decomposition of chlo.`name`, computed in f64 (with
    `single`, in f32 for inputs narrower than f64, as XLA computes them)."""

    def register(fn):
        def convert(conv: Converter, op: Op, scope: Scope, operands):
            like = operands[0][1]
            narrow = like.element_type is not PrimitiveType.F64
            compute = PrimitiveType.F32 if single and narrow else PrimitiveType.F64
            ex = Ex(conv, scope, like, compute)
            return [ex.down(fn(ex, ex.up(operands[0][0])))]

        rule(f"chlo.{name}")(convert)
        return fn

    return register


@_unary("erfc")
def _erfc(ex: Ex, x: str) -> str:
    small = ex.sub(ex.c(1.0), ex.f("erf", x))
    xs = ex.f("abs", x)
    xs = ex.sel(ex.cmp(xs, ex.c(2.0), "LT"), ex.c(2.0), xs)  # keep the fraction finite
    t = xs
    for k in range(60, 0, -1):
        t = ex.add(xs, ex.div(ex.c(k / 2), t))
    large = ex.div(
        ex.f("exponential", ex.f("negate", ex.mul(xs, xs))), ex.mul(ex.c(math.sqrt(math.pi)), t)
    )
    return ex.sel(ex.cmp(x, ex.c(2.0), "LT"), small, large)


# Giles' single-precision erfinv ("Approximating the erfinv function", GPU Computing Gems,
# 2011): the polynomial XLA evaluates for f32 (and, widened, f16/bf16) inputs.
_ERF_INV_W_BELOW_5 = (
    2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
    -0.00125372503, -0.00417768164, 0.246640727, 1.50140941,
)  # fmt: skip
_ERF_INV_W_ABOVE_5 = (
    -0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
    -0.0076224613, 0.00943887047, 1.00167406, 2.83297682,
)  # fmt: skip


@_unary("erf_inv", single=True)
def _erf_inv(ex: Ex, x: str) -> str:
    if ex.compute is PrimitiveType.F32:
        return _erf_inv_f32(ex, x)
    a = 0.147
    ln = ex.f("log", ex.mul(ex.sub(ex.c(1.0), x), ex.add(ex.c(1.0), x)))  # log(1 - x^2)
    b = ex.add(ex.c(2 / (math.pi * a)), ex.mul(ex.c(0.5), ln))
    guess = ex.f("sqrt", ex.sub(ex.f("sqrt", ex.sub(ex.mul(b, b), ex.div(ln, ex.c(a)))), b))
    y = ex.mul(ex.f("sign", x), guess)
    two_over_sqrt_pi = ex.c(2 / math.sqrt(math.pi))
    for _ in range(4):
        deriv = ex.mul(two_over_sqrt_pi, ex.f("exponential", ex.f("negate", ex.mul(y, y))))
        y = ex.sub(y, ex.div(ex.sub(ex.f("erf", y), x), deriv))
    one = ex.cmp(ex.f("abs", x), ex.c(1.0), "EQ")
    y = ex.sel(one, ex.mul(ex.f("sign", x), ex.c(math.inf)), y)
    return ex.sel(ex.cmp(ex.f("abs", x), ex.c(1.0), "GT"), ex.c(math.nan), y)


def _erf_inv_f32(ex: Ex, x: str) -> str:
    """XLA's f32 erf_inv: w = -log1p(-x^2); x times a degree-8 polynomial in w - 2.5 below
    w = 5, in sqrt(w) - 3 above (both evaluated, one selected); +-inf at |x| = 1, NaN
    beyond (from the log)."""
    w = ex.f("negate", ex.f("log-plus-one", ex.f("negate", ex.mul(x, x))))
    below = ex.cmp(w, ex.c(5.0), "LT")
    t = ex.sel(below, ex.sub(w, ex.c(2.5)), ex.sub(ex.f("sqrt", w), ex.c(3.0)))
    p = ex.sel(below, ex.c(_ERF_INV_W_BELOW_5[0]), ex.c(_ERF_INV_W_ABOVE_5[0]))
    for lo, hi in zip(_ERF_INV_W_BELOW_5[1:], _ERF_INV_W_ABOVE_5[1:], strict=True):
        p = ex.add(ex.sel(below, ex.c(lo), ex.c(hi)), ex.mul(p, t))
    y = ex.mul(p, x)
    one = ex.cmp(ex.f("abs", x), ex.c(1.0), "EQ")
    return ex.sel(one, ex.mul(x, ex.c(math.inf)), y)


@_unary("lgamma")
def _lgamma(ex: Ex, x: str) -> str:
    return ex.lgamma(x)


@_unary("digamma")
def _digamma(ex: Ex, x: str) -> str:
    return ex.digamma(x)


@_unary("bessel_i1e")
def _bessel_i1e(ex: Ex, x: str) -> str:
    ax = ex.f("abs", x)
    # power series: I1(x) = sum (x/2)^(2k+1) / (k! (k+1)!)
    small_x = ex.sel(ex.cmp(ax, ex.c(15.0), "GT"), ex.c(15.0), ax)
    half = ex.mul(small_x, ex.c(0.5))
    q = ex.mul(half, half)
    term = half
    total = term
    for k in range(1, 60):
        term = ex.div(ex.mul(term, q), ex.c(float(k * (k + 1))))
        total = ex.add(total, term)
    series = ex.mul(total, ex.f("exponential", ex.f("negate", small_x)))
    # asymptotic: exp(-x) I1(x) ~ 1/sqrt(2 pi x) sum_k (-1)^k prod (4 - (2j-1)^2) / (k! (8x)^k)
    big_x = ex.sel(ex.cmp(ax, ex.c(15.0), "GT"), ax, ex.c(15.0))
    eight_x = ex.mul(big_x, ex.c(8.0))
    term = ex.c(1.0)
    total = term
    for k in range(1, 25):
        coeff = -(4.0 - (2 * k - 1) ** 2) / k
        term = ex.div(ex.mul(term, ex.c(coeff)), eight_x)
        total = ex.add(total, term)
    asym = ex.div(total, ex.f("sqrt", ex.mul(big_x, ex.c(2 * math.pi))))
    value = ex.sel(ex.cmp(ax, ex.c(15.0), "GT"), asym, series)
    return ex.mul(ex.f("sign", x), value)


@_unary("asin")
def _asin(ex: Ex, x: str) -> str:
    root = ex.f("sqrt", ex.mul(ex.sub(ex.c(1.0), x), ex.add(ex.c(1.0), x)))
    return ex.mul(ex.c(2.0), ex.op("atan2", x, ex.add(ex.c(1.0), root)))


@_unary("acos")
def _acos(ex: Ex, x: str) -> str:
    root = ex.f("sqrt", ex.mul(ex.sub(ex.c(1.0), x), ex.add(ex.c(1.0), x)))
    value = ex.mul(ex.c(2.0), ex.op("atan2", root, ex.add(ex.c(1.0), x)))
    return ex.sel(ex.cmp(x, ex.c(-1.0), "EQ"), ex.c(math.pi), value)


@_unary("atan")
def _atan(ex: Ex, x: str) -> str:
    return ex.op("atan2", x, ex.c(1.0))


@_unary("sinh")
def _sinh(ex: Ex, x: str) -> str:
    ax = ex.f("abs", x)
    e = ex.f("exponential-minus-one", ax)
    small = ex.mul(ex.c(0.5), ex.add(e, ex.div(e, ex.add(e, ex.c(1.0)))))
    half_exp = ex.f("exponential", ex.sub(ax, ex.c(math.log(2.0))))
    large = ex.sub(half_exp, ex.div(ex.c(0.25), half_exp))
    value = ex.sel(ex.cmp(ax, ex.c(1.0), "LT"), small, large)
    return ex.mul(ex.f("sign", x), value)


@_unary("cosh")
def _cosh(ex: Ex, x: str) -> str:
    e = ex.f("exponential", ex.sub(ex.f("abs", x), ex.c(math.log(2.0))))
    return ex.add(e, ex.div(ex.c(0.25), e))


@_unary("asinh")
def _asinh(ex: Ex, x: str) -> str:
    ax = ex.f("abs", x)
    big = ex.cmp(ax, ex.c(1e150), "GT")
    safe = ex.sel(big, ex.c(1.0), ax)
    sq = ex.mul(safe, safe)
    moderate = ex.f(
        "log-plus-one",
        ex.add(safe, ex.div(sq, ex.add(ex.c(1.0), ex.f("sqrt", ex.add(ex.c(1.0), sq))))),
    )
    huge = ex.add(ex.f("log", ax), ex.c(math.log(2.0)))
    return ex.mul(ex.f("sign", x), ex.sel(big, huge, moderate))


@_unary("acosh")
def _acosh(ex: Ex, x: str) -> str:
    big = ex.cmp(x, ex.c(1e150), "GT")
    safe = ex.sel(big, ex.c(1.0), x)
    xm1 = ex.sub(safe, ex.c(1.0))
    moderate = ex.f("log-plus-one", ex.add(xm1, ex.f("sqrt", ex.mul(xm1, ex.add(safe, ex.c(1.0))))))
    huge = ex.add(ex.f("log", x), ex.c(math.log(2.0)))
    value = ex.sel(big, huge, moderate)
    return ex.sel(ex.cmp(x, ex.c(1.0), "LT"), ex.c(math.nan), value)


@_unary("atanh")
def _atanh(ex: Ex, x: str) -> str:
    value = ex.mul(
        ex.c(0.5), ex.f("log-plus-one", ex.div(ex.mul(ex.c(2.0), x), ex.sub(ex.c(1.0), x)))
    )
    return ex.sel(ex.cmp(ex.f("abs", x), ex.c(1.0), "GT"), ex.c(math.nan), value)


@rule("chlo.zeta")
def _zeta(conv: Converter, op: Op, scope: Scope, operands):
    ex = Ex(conv, scope, operands[0][1])
    s, q = (ex.up(name) for name, _ in operands)
    return [ex.down(ex.zeta(s, q))]


@rule("chlo.polygamma")
def _polygamma(conv: Converter, op: Op, scope: Scope, operands):
    ex = Ex(conv, scope, operands[0][1])
    n, x = (ex.up(name) for name, _ in operands)
    # (-1)^(n+1) n! zeta(n+1, x); n! = exp(lgamma(n+1))
    n1 = ex.add(n, ex.c(1.0))
    fact = ex.f("exponential", ex.lgamma(n1))
    parity = ex.sub(n, ex.mul(ex.c(2.0), ex.f("floor", ex.mul(n, ex.c(0.5)))))  # n mod 2
    sign = ex.sub(ex.mul(ex.c(2.0), parity), ex.c(1.0))  # (-1)^(n+1)
    value = ex.mul(ex.mul(sign, fact), ex.zeta(n1, x))
    value = ex.sel(ex.cmp(n, ex.c(0.0), "EQ"), ex.digamma(x), value)
    bad = ex.op(
        "or",
        ex.cmp(n, ex.f("floor", n), "NE"),
        ex.cmp(n, ex.c(0.0), "LT"),
        shape=ex.pred,
    )
    return [ex.down(ex.sel(bad, ex.c(math.nan), value))]


@rule("chlo.next_after")
def _next_after(conv: Converter, op: Op, scope: Scope, operands):
    (x, shape), (y, _) = operands
    et = shape.element_type
    if et.kind.value != "float":
        raise conv.error("next_after needs a float type")
    bits = {16: PrimitiveType.S16, 32: PrimitiveType.S32, 64: PrimitiveType.S64}.get(et.bits)
    if bits is None:
        raise conv.error(f"next_after on {et.text} is not supported")
    ishape = Shape.array(bits, shape.dims)
    pred = Shape.array(PrimitiveType.PRED, shape.dims)

    def add(opcode, s, *xs, attrs=""):
        return conv.add(scope, opcode, s, list(xs), attrs)[0]

    def cmp(a, b, d, s=pred):
        return add("compare", s, a, b, attrs=f", direction={d}")

    xi = add("bitcast-convert", ishape, x)
    yi = add("bitcast-convert", ishape, y)
    zero_f = conv.scalar(scope, 0.0, shape)[0]
    one_i = conv.scalar(scope, 1, ishape)[0]
    sign_mask = conv.scalar(scope, -(1 << (et.bits - 1)), ishape)[0]
    # away from zero when (y > x) == (x > 0): the magnitude bits grow by one
    up = cmp(cmp(y, x, "GT"), cmp(x, zero_f, "GT"), "EQ")
    stepped = add(
        "select", ishape, up, add("add", ishape, xi, one_i), add("subtract", ishape, xi, one_i)
    )
    # from zero: the smallest subnormal with y's sign
    tiny = add("or", ishape, add("and", ishape, yi, sign_mask), one_i)
    result = add("select", ishape, cmp(x, zero_f, "EQ"), tiny, stepped)
    out = add("bitcast-convert", shape, result)
    out = add("select", shape, cmp(x, y, "EQ"), y, out)
    nan = conv.scalar(scope, float("nan"), shape)[0]
    either_nan = add("or", pred, cmp(x, x, "NE"), cmp(y, y, "NE"))
    return [conv.add(scope, "select", shape, [either_nan, nan, out])]


@rule("chlo.mulhi")
def _mulhi(conv: Converter, op: Op, scope: Scope, operands):
    """The high half of the double-width product, through a 64-bit multiply."""
    (a, shape), (b, _) = operands
    et = shape.element_type
    if et.kind.value not in ("signed", "unsigned") or et.bits > 32:
        raise conv.error(f"chlo.mulhi on {et.text} is not supported (integers up to 32 bits)")
    wide_type = PrimitiveType.S64 if et.kind.value == "signed" else PrimitiveType.U64
    wide = Shape.array(wide_type, shape.dims)
    product = conv.add(
        scope,
        "multiply",
        wide,
        [conv.add(scope, "convert", wide, [a])[0], conv.add(scope, "convert", wide, [b])[0]],
    )[0]
    bits = conv.scalar(scope, et.bits, wide)[0]
    high = conv.add(scope, "shift-right-arithmetic", wide, [product, bits])[0]
    return [conv.add(scope, "convert", shape, [high])]


@rule("chlo.top_k")
def _top_k(conv: Converter, op: Op, scope: Scope, operands):
    k = op.attrs.get("k", 1)
    k = k.value if isinstance(k, Typed) else k
    shapes = conv.result_shapes(op)
    value = conv.add(scope, "topk", Shape.tuple(shapes), [operands[0][0]], f", k={k}, largest=true")
    return conv.tuple_parts(scope, value)


@rule("chlo.square")
def _square(conv: Converter, op: Op, scope: Scope, operands):
    x = operands[0][0]
    return [conv.add(scope, "multiply", operands[0][1], [x, x])]
