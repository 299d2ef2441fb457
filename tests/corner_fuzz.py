"""A seeded fuzzer of the corner cases the program fuzzer (tests/program_fuzz.py) avoids.

program_fuzz draws float parameters with magnitudes in [0.25, 4] and keeps discontinuous
operations on exact values, so two correct compilers agree within a bound. This one does the
opposite: each case is one small program (one to three instructions) whose inputs are drawn
from the edge values of their type (NaN, +-0, +-inf, subnormals, the largest finite value,
INT_MIN, -1, shift counts at and past the bit width, out-of-range indices), over all the
element types (s8..s64, u8..u64, f16, bf16, f32, f64, f8e4m3fn, f8e5m2, c64, c128, pred),
with non-default layouts on parameters and results, tuple parameters, nested tuple results
and size-0 dimensions. The families (`FAMILIES`): elementwise unary and binary ops, compare
(FLOAT and TOTALORDER), clamp, select, convert and bitcast-convert between any two types
and widths, integer division by zero and INT_MIN / -1, shifts, reduce (NaN propagation,
size-0 dims, argmax as a two-operand reduce), sort (several operands, TOTALORDER, stable),
dynamic-slice / dynamic-update-slice with out-of-range starts of every index type, gather
and scatter with out-of-range indices, reduce-window with padding and dilations,
select-and-scatter, size-0 shape ops, conditionals with several branches and an
out-of-range branch index, while loops with mixed-dtype tuple carries, and tuple
parameters with nested tuple results.

Most results are exact (no rounding or correctly rounded IEEE operations), so the
interpreter, the CPU backend and XLA:CPU must agree bit for bit, except that any NaN equals
any NaN (payloads are free) and a subnormal equals a zero of either sign (the CPU backend
flushes subnormals, as XLA:CPU does; the interpreter keeps them). Transcendental results are
compared within a relative tolerance, with NaN and infinity positions exact.
`check_case(case, xla_runner)` returns the mismatches; `generate(seed)` one case.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from program_fuzz import NATIVE_OFF, exact_difference

NP = {
    "pred": np.dtype(np.bool_),
    "s8": np.dtype(np.int8),
    "s16": np.dtype(np.int16),
    "s32": np.dtype(np.int32),
    "s64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8),
    "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32),
    "u64": np.dtype(np.uint64),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "f8e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "f8e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "c64": np.dtype(np.complex64),
    "c128": np.dtype(np.complex128),
}
SINTS = ("s8", "s16", "s32", "s64")
UINTS = ("u8", "u16", "u32", "u64")
INTS = SINTS + UINTS
FLOATS = ("f16", "bf16", "f32", "f64")
F8 = ("f8e4m3fn", "f8e5m2")
COMPLEX = ("c64", "c128")
ALL = ("pred", *INTS, *FLOATS, *F8, *COMPLEX)
BITS = {t: NP[t].itemsize * 8 for t in ALL if t != "pred"}
EPS = {"f16": 2.0**-10, "bf16": 2.0**-7, "f32": 2.0**-23, "f64": 2.0**-52, "c64": 2.0**-23,
       "c128": 2.0**-52, "f8e4m3fn": 2.0**-3, "f8e5m2": 2.0**-2}  # fmt: skip


@dataclass
class Case:
    """One program: its family, HLO text, arguments, and how its results compare."""

    family: str
    seed: int
    text: str
    args: list
    rtol: float = 0.0  # 0: exact (NaN == NaN, subnormal == zero)
    xla: bool = True  # XLA:CPU's result is a reference for it
    xla_rtol: float | None = None  # against XLA, when looser than rtol (KNOWN)

    def describe(self) -> str:
        return f"seed {self.seed} ({self.family}):\n{self.text}"


def _braces(xs) -> str:
    return "{" + ",".join(str(x) for x in xs) + "}"


def shape(dtype: str, dims, layout=None) -> str:
    text = f"{dtype}[{','.join(str(d) for d in dims)}]"
    return text + _braces(layout) if layout is not None else text


class _Draw:
    def __init__(self, seed: int):
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def dims(self, rank=None, lo=0, hi=5) -> tuple[int, ...]:
        if rank is None:
            rank = int(self.rng.integers(0, 4))
        dims = [int(self.rng.integers(1, hi + 1)) for _ in range(rank)]
        if rank and lo == 0 and self.chance(0.1):
            dims[int(self.rng.integers(rank))] = 0
        return tuple(dims)

    def layout(self, rank: int):
        """None (the default), or a random minor-to-major order."""
        if rank < 2 or not self.chance(0.4):
            return None
        return tuple(int(i) for i in self.rng.permutation(rank))

    def values(self, dtype: str, dims, special=0.6) -> np.ndarray:
        """An array of `dtype`, its elements edge values with probability `special`."""
        n = math.prod(dims)
        dt = NP[dtype]
        if dtype == "pred":
            return self.rng.integers(0, 2, n).astype(np.bool_).reshape(dims)
        if dtype in COMPLEX:
            part = NP["f32" if dtype == "c64" else "f64"]
            re_ = self._floats(part, n, special)
            im = self._floats(part, n, special)
            return (re_ + 1j * im.astype(np.complex128)).astype(dt).reshape(dims)
        if dtype in INTS:
            info = np.iinfo(dt)
            bits = BITS[dtype]
            edges = [0, 1, -1, 2, -2, info.min, info.max, info.min + 1, info.max - 1, bits - 1,
                     bits, bits + 1, 7, 8, 31, 32, 63, 64]  # fmt: skip
            edges = [e for e in edges if info.min <= e <= info.max]
            out = self.rng.integers(info.min, int(info.max) + 1, n, dtype=dt)
            small = self.rng.integers(-20, 21, n)
            for i in range(n):
                r = self.rng.random()
                if r < special:
                    out[i] = self.pick(edges)
                elif r < special + (1 - special) / 2 and info.min <= int(small[i]):
                    out[i] = small[i]
            return out.reshape(dims)
        return self._floats(dt, n, special).reshape(dims)

    def _floats(self, dt: np.dtype, n: int, special: float) -> np.ndarray:
        finfo = ml_dtypes.finfo(dt)
        big = float(finfo.max)
        tiny = float(finfo.smallest_normal)
        sub = float(finfo.smallest_subnormal)
        edges = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, 1.5, -2.5, 3.0, big, -big, tiny, -tiny,
                 sub, -sub]  # fmt: skip
        if dt not in (NP["f8e4m3fn"],):  # f8e4m3fn has no infinities
            edges += [math.inf, -math.inf]
        edges += [math.nan, -math.nan]
        out = np.empty(n, np.float64)
        for i in range(n):
            if self.rng.random() < special:
                out[i] = self.pick(edges)
            else:
                out[i] = float(self.rng.normal()) * 2.0 ** int(self.rng.integers(-4, 5))
        with np.errstate(over="ignore", invalid="ignore"):
            return out.astype(dt)


# --- families: each draws a Case ------------------------------------------------------------

BINARY = {
    "add": ALL[1:],
    "subtract": ALL[1:],
    "multiply": ALL[1:],
    "divide": (*INTS, *FLOATS, *COMPLEX),
    "remainder": (*INTS, *FLOATS),
    "maximum": ALL,
    "minimum": ALL[:-2],
    "power": (*FLOATS, *COMPLEX),
    "atan2": FLOATS,
    "and": ("pred", *INTS),
    "or": ("pred", *INTS),
    "xor": ("pred", *INTS),
    "shift-left": INTS,
    "shift-right-logical": INTS,
    "shift-right-arithmetic": INTS,
}
INEXACT_BINARY = {"power", "atan2"}
UNARY = {
    "negate": (*INTS, *FLOATS, *COMPLEX),
    "abs": (*SINTS, *FLOATS, *COMPLEX),
    "sign": (*SINTS, *FLOATS),
    "not": ("pred", *INTS),
    "popcnt": INTS,
    "count-leading-zeros": INTS,
    "floor": FLOATS,
    "ceil": FLOATS,
    "round-nearest-afz": FLOATS,
    "round-nearest-even": FLOATS,
    "is-finite": FLOATS,
    "sqrt": (*FLOATS, *COMPLEX),
    "rsqrt": FLOATS,
    "cbrt": FLOATS,
    "exponential": (*FLOATS, *COMPLEX),
    "exponential-minus-one": FLOATS,
    "log": (*FLOATS, *COMPLEX),
    "log-plus-one": FLOATS,
    "tanh": FLOATS,
    "logistic": FLOATS,
    "sine": FLOATS,
    "cosine": FLOATS,
    "tan": FLOATS,
    "real": COMPLEX,
    "imag": COMPLEX,
}
EXACT_UNARY = {"negate", "abs", "sign", "not", "popcnt", "count-leading-zeros", "floor", "ceil",
               "round-nearest-afz", "round-nearest-even", "is-finite", "real", "imag"}  # fmt: skip


def _result_type(op: str, dtype: str) -> str:
    if op == "is-finite":
        return "pred"
    if op in ("real", "imag") or (op == "abs" and dtype in COMPLEX):
        return "f32" if dtype == "c64" else "f64"
    return dtype


def _elementwise(d: _Draw, op: str, dtypes_in: list[str], out: str, extra="") -> tuple:
    dims = d.dims()
    params, args = [], []
    for i, t in enumerate(dtypes_in):
        params.append(f"  p{i} = {shape(t, dims, d.layout(len(dims)))} parameter({i})")
        args.append(d.values(t, dims))
    names = ", ".join(f"p{i}" for i in range(len(dtypes_in)))
    lay = d.layout(len(dims))
    body = "\n".join(params) + f"\n  ROOT r = {shape(out, dims, lay)} {op}({names}){extra}"
    return f"HloModule corner\n\nENTRY e {{\n{body}\n}}\n", args


def fam_binary(d: _Draw) -> Case:
    op = d.pick(sorted(BINARY))
    t = d.pick(BINARY[op])
    text, args = _elementwise(d, op, [t, t], t)
    if op == "power" and t in COMPLEX:  # KNOWN["complex-power-infinities"]: finite operands
        args = [np.where(np.isfinite(a) & (np.abs(a) < 8), a, 1.5).astype(a.dtype) for a in args]
    if t in COMPLEX and op in ("multiply", "divide"):  # KNOWN["complex-overflow"]
        args = [np.where(np.isfinite(a) & (np.abs(a) < 1e30), a, 1.5).astype(a.dtype)
                for a in args]  # fmt: skip
    inexact = op in INEXACT_BINARY or (t in COMPLEX and op in ("multiply", "divide"))
    # XLA:CPU raises integers by squaring over the exponent's low bits (program_fuzz's
    # KNOWN_DIFFERENCES["integer-power"]); the integer power is not drawn
    case = Case("binary", d.seed, text, args, rtol=64 * EPS[t] if inexact else 0.0)
    if (
        t in COMPLEX
        and op in ("maximum", "minimum")
        and np.isnan(args[0]).any() | np.isnan(args[1]).any()
    ):
        case.xla = False  # KNOWN["complex-max-nan"]
    return case


def fam_unary(d: _Draw) -> Case:
    op = d.pick(sorted(UNARY))
    t = d.pick(UNARY[op])
    text, args = _elementwise(d, op, [t], _result_type(op, t))
    exact = op in EXACT_UNARY or (op == "sqrt" and t in FLOATS)
    if op == "abs" and t in COMPLEX:
        exact = False
    case = Case("unary", d.seed, text, args, rtol=0.0 if exact else 64 * EPS[t])
    if t in COMPLEX and op in ("log", "sqrt", "exponential") and not np.all(np.isfinite(args[0])):
        case.xla = False  # KNOWN["complex-log-nonfinite"]
    return case


def fam_compare(d: _Draw) -> Case:
    t = d.pick(ALL)
    direction = d.pick(("EQ", "NE", "LT", "LE", "GT", "GE") if t not in COMPLEX else ("EQ", "NE"))
    kind = {"pred": "UNSIGNED"}.get(t, "SIGNED" if t in SINTS else "UNSIGNED")
    if t in FLOATS or t in F8 or t in COMPLEX:
        kind = d.pick(("FLOAT", "TOTALORDER")) if t not in COMPLEX else "FLOAT"
    text, args = _elementwise(d, "compare", [t, t], "pred", f", direction={direction}, type={kind}")
    if d.chance(0.3):  # the same operand on both sides: NaN != NaN, x == x under TOTALORDER
        args[1] = args[0].copy()
    return Case("compare", d.seed, text, args)


def fam_clamp_select(d: _Draw) -> Case:
    t = d.pick(ALL[1:-2])
    if d.chance(0.5):
        text, args = _elementwise(d, "clamp", [t, t, t], t)
    else:
        text, args = _elementwise(d, "select", ["pred", t, t], t)
    return Case("clamp-select", d.seed, text, args)


def fam_convert(d: _Draw) -> Case:
    a = d.pick(ALL)
    b = d.pick(ALL)
    if a in COMPLEX and b not in COMPLEX:
        b = d.pick(COMPLEX)  # complex -> real is not a convert (real/imag are)
    text, args = _elementwise(d, "convert", [a], b)
    # float -> int of NaN/inf/out of range: XLA saturates and takes NaN to 0
    return Case("convert", d.seed, text, args)


def fam_bitcast(d: _Draw) -> Case:
    a = d.pick(ALL[1:])
    same = [t for t in ALL[1:] if BITS[t] == BITS[a]]
    b = d.pick(same) if d.chance(0.4) else d.pick(ALL[1:])
    if a in COMPLEX or b in COMPLEX:  # complex only to itself (real <-> complex is invalid)
        b = a if a in COMPLEX else d.pick([t for t in same if t not in COMPLEX])
    dims = list(d.dims(hi=4))
    ba, bb = BITS[a], BITS[b]
    if ba > bb:
        out_dims = [*dims, ba // bb]
    elif ba < bb:
        dims = [*dims, bb // ba]
        out_dims = dims[:-1]
    else:
        out_dims = dims
    text = (f"HloModule corner\n\nENTRY e {{\n  p0 = {shape(a, dims)} parameter(0)\n"
            f"  ROOT r = {shape(b, out_dims)} bitcast-convert(p0)\n}}\n")  # fmt: skip
    return Case("bitcast-convert", d.seed, text, [d.values(a, dims)])


def fam_divide_shift(d: _Draw) -> Case:
    """Integer division and remainder by 0 and INT_MIN / -1; shifts past the bit width."""
    t = d.pick(INTS)
    op = d.pick(("divide", "remainder", "shift-left", "shift-right-logical",
                 "shift-right-arithmetic"))  # fmt: skip
    text, args = _elementwise(d, op, [t, t], t)
    info = np.iinfo(NP[t])
    a, b = args[0].reshape(-1), args[1].reshape(-1)
    for i in range(a.size):
        if op in ("divide", "remainder"):
            a[i], b[i] = d.pick(
                (
                    (info.min, -1 if t in SINTS else 0),
                    (a[i], 0),
                    (info.min, 0),
                    (a[i], b[i]),
                    (info.max, info.max),
                    (-1 if t in SINTS else 1, 0),
                )
            )
        else:
            b[i] = d.pick((BITS[t] - 1, BITS[t], BITS[t] + 1, 2 * BITS[t], info.max, b[i],
                           -1 if t in SINTS else info.max))  # fmt: skip
    return Case("divide-shift", d.seed, text, args)


_REDUCERS = {"add": "add", "max": "maximum", "min": "minimum", "mul": "multiply",
             "and": "and", "or": "or"}  # fmt: skip


def _identity(kind: str, t: str):
    if t == "pred":
        return {"and": "true", "or": "false", "max": "false", "min": "true"}[kind]
    if kind == "add" or kind == "or":
        return "0"
    if kind == "mul":
        return "1"
    if kind == "and":
        return "-1" if t in SINTS else str(np.iinfo(NP[t]).max)
    if t in INTS:
        info = np.iinfo(NP[t])
        return str(info.min if kind == "max" else info.max)
    return "-inf" if kind == "max" else "inf"


def _reducer(name: str, kind: str, t: str) -> str:
    return (f"{name} {{\n  a = {t}[] parameter(0)\n  b = {t}[] parameter(1)\n"
            f"  ROOT c = {t}[] {_REDUCERS[kind]}(a, b)\n}}\n")  # fmt: skip


def fam_reduce(d: _Draw) -> Case:
    t = d.pick(("pred", *INTS, *FLOATS))
    kinds = (
        ("and", "or", "max", "min")
        if t == "pred"
        else (("add", "max", "min", "mul", "and", "or") if t in INTS else ("add", "max", "min"))
    )
    kind = d.pick(kinds)
    dims = d.dims(rank=int(d.rng.integers(1, 4)))
    red = sorted(int(i) for i in d.rng.choice(len(dims), int(d.rng.integers(1, len(dims) + 1)),
                                              replace=False))  # fmt: skip
    out = [n for i, n in enumerate(dims) if i not in red]
    text = (f"HloModule corner\n\n{_reducer('r', kind, t)}\nENTRY e {{\n"
            f"  p0 = {shape(t, dims, d.layout(len(dims)))} parameter(0)\n"
            f"  z = {t}[] constant({_identity(kind, t)})\n"
            f"  ROOT o = {shape(t, out, d.layout(len(out)))} reduce(p0, z), "
            f"dimensions={_braces(red)}, to_apply=r\n}}\n")  # fmt: skip
    values = d.values(t, dims, special=0.3)
    if t in FLOATS and kind == "add":
        values = np.nan_to_num(values.astype(np.float64), posinf=5.0, neginf=-3.0).astype(NP[t])
        values = np.where(np.abs(values.astype(np.float64)) > 64, 1.5, values).astype(NP[t])
    rtol = 0.0 if kind != "add" or t not in FLOATS else 64 * EPS[t] * max(1, math.prod(dims))
    return Case("reduce", d.seed, text, [values], rtol=rtol)


def fam_argmax(d: _Draw) -> Case:
    """JAX's argmax: a two-operand reduce whose comparator prefers NaN, then the lower index."""
    t = d.pick((*FLOATS, *INTS))
    dims = d.dims(rank=int(d.rng.integers(1, 3)), lo=1)
    axis = int(d.rng.integers(len(dims)))
    out = [n for i, n in enumerate(dims) if i != axis]
    gt = "GT" if d.chance(0.5) else "LT"
    nan_rule = ""
    pick_a = "pa = pred[] compare(a, b), direction=" + gt
    if t in FLOATS:
        nan_rule = "  na = pred[] compare(a, a), direction=NE\n"
        pick_a = f"gt0 = pred[] compare(a, b), direction={gt}\n  pa = pred[] or(gt0, na)"
    init = "-inf" if gt == "GT" else "inf"
    if t in INTS:
        info = np.iinfo(NP[t])
        init = str(info.min if gt == "GT" else info.max)
    cmp = (f"cmp {{\n  a = {t}[] parameter(0)\n  i = s32[] parameter(1)\n"
           f"  b = {t}[] parameter(2)\n  j = s32[] parameter(3)\n{nan_rule}"
           f"  {pick_a}\n  eq = pred[] compare(a, b), direction=EQ\n"
           f"  lt = pred[] compare(i, j), direction=LT\n  tie = pred[] and(eq, lt)\n"
           f"  ta = pred[] or(pa, tie)\n  v = {t}[] select(ta, a, b)\n"
           f"  k = s32[] select(ta, i, j)\n"
           f"  ROOT o = ({t}[], s32[]) tuple(v, k)\n}}\n")  # fmt: skip
    if t in FLOATS:  # NaN in b and not in a: b wins
        cmp = cmp.replace(
            "  ta = pred[] or(pa, tie)\n",
            "  nb = pred[] compare(b, b), direction=NE\n  nnb = pred[] not(nb)\n"
            "  pa2 = pred[] and(pa, nnb)\n  nab = pred[] and(na, nb)\n"
            "  both = pred[] and(nab, lt)\n  pa3 = pred[] or(pa2, both)\n"
            "  ta = pred[] or(pa3, tie)\n",
        )
    text = (f"HloModule corner\n\n{cmp}\nENTRY e {{\n"
            f"  p0 = {shape(t, dims)} parameter(0)\n"
            f"  io = s32{list(dims)} iota(), iota_dimension={axis}\n"
            f"  z = {t}[] constant({init})\n  zi = s32[] constant(0)\n"
            f"  ROOT o = ({shape(t, out)}, {shape('s32', out)}) reduce(p0, io, z, zi), "
            f"dimensions={{{axis}}}, to_apply=cmp\n}}\n").replace("s32[", "s32[", 1)  # fmt: skip
    text = text.replace(f"s32{list(dims)}", shape("s32", dims))
    values = d.values(t, dims, special=0.5)
    if d.chance(0.5):  # ties
        values = d.rng.choice(values.reshape(-1)[:3], values.size).reshape(dims).astype(NP[t])
    return Case("argmax", d.seed, text, [values])


def fam_sort(d: _Draw) -> Case:
    t = d.pick((*FLOATS, *INTS, "pred"))
    dims = d.dims(rank=int(d.rng.integers(1, 3)), lo=1, hi=7)
    axis = int(d.rng.integers(len(dims)))
    k = int(d.rng.integers(1, 4))
    types = [t] + [d.pick(("s32", "f32", "u8", "bf16")) for _ in range(k - 1)]
    direction = d.pick(("LT", "GT"))
    kind = ", type=TOTALORDER" if t in FLOATS else ""
    params = "".join(f"  a{i} = {u}[] parameter({2 * i})\n  b{i} = {u}[] parameter({2 * i + 1})\n"
                     for i, u in enumerate(types))  # fmt: skip
    if t in FLOATS and not kind:
        pass
    cmp = f"cmp {{\n{params}  ROOT c = pred[] compare(a0, b0), direction={direction}{kind}\n}}\n"
    stable = ", is_stable=true" if d.chance(0.6) else ""
    ps = "".join(f"  p{i} = {shape(u, dims, d.layout(len(dims)))} parameter({i})\n"
                 for i, u in enumerate(types))  # fmt: skip
    names = ", ".join(f"p{i}" for i in range(k))
    result = shape(t, dims) if k == 1 else "(" + ", ".join(shape(u, dims) for u in types) + ")"
    text = (
        f"HloModule corner\n\n{cmp}\nENTRY e {{\n{ps}"
        f"  ROOT s = {result} sort({names}), dimensions={{{axis}}}{stable}, to_apply=cmp\n}}\n"
    )
    args = [d.values(u, dims, special=0.5) for u in types]
    if not stable and k > 1:  # an unstable sort's order of equal keys is free: distinct keys
        if t in INTS and np.unique(args[0]).size < args[0].size:
            args[0] = d.rng.permutation(np.arange(args[0].size)).astype(NP[t]).reshape(dims)
        elif t == "pred" or t in FLOATS:
            stable = ", is_stable=true"
            text = text.replace(f"dimensions={{{axis}}}, to_apply", f"dimensions={{{axis}}}"
                                f"{stable}, to_apply")  # fmt: skip
    return Case("sort", d.seed, text, args)


INDEX_TYPES = ("s32", "s64", "u32", "u8", "s8", "u64", "s16")


def fam_dynamic(d: _Draw) -> Case:
    t = d.pick(ALL)
    dims = d.dims(rank=int(d.rng.integers(1, 4)), hi=6)
    sizes = [int(d.rng.integers(0, n + 1)) for n in dims]
    it = d.pick(INDEX_TYPES)
    info = np.iinfo(NP[it])
    starts = [d.pick([v for v in (-1, -5, 0, 1, 3, 7, 100, int(info.min), int(info.max))
                      if info.min <= v <= info.max]) for _ in dims]  # fmt: skip
    idx = "".join(f"  i{k} = {it}[] parameter({k + 1})\n" for k in range(len(dims)))
    names = ", ".join(f"i{k}" for k in range(len(dims)))
    args = [d.values(t, dims)] + [np.asarray(s, NP[it]) for s in starts]
    if d.chance(0.5):
        text = (f"HloModule corner\n\nENTRY e {{\n  p0 = {shape(t, dims, d.layout(len(dims)))} "
                f"parameter(0)\n{idx}  ROOT r = {shape(t, sizes)} dynamic-slice(p0, {names}), "
                f"dynamic_slice_sizes={_braces(sizes)}\n}}\n")  # fmt: skip
    else:
        n = len(dims) + 1
        text = (f"HloModule corner\n\nENTRY e {{\n  p0 = {shape(t, dims)} parameter(0)\n{idx}"
                f"  u = {shape(t, sizes, d.layout(len(dims)))} parameter({n})\n"
                f"  ROOT r = {shape(t, dims, d.layout(len(dims)))} "
                f"dynamic-update-slice(p0, u, {names})\n}}\n")  # fmt: skip
        args.append(d.values(t, sizes))
    return Case("dynamic-slice", d.seed, text, args)


def fam_gather_scatter(d: _Draw) -> Case:
    """Row gathers and scatters with out-of-range indices (gather clamps the start, scatter
    drops an update whose window leaves the operand)."""
    t = d.pick(("f32", "s32", "bf16", "u8", "f64", "s64"))
    rows, cols = int(d.rng.integers(1, 6)), int(d.rng.integers(1, 5))
    n = int(d.rng.integers(0, 6))
    it = d.pick(("s32", "s64", "u32", "s8"))
    info = np.iinfo(NP[it])
    idx = np.array([d.pick([v for v in (-1, 0, 1, rows - 1, rows, rows + 3, -100,
                                       int(info.max), int(info.min)) if info.min <= v <= info.max])
                    for _ in range(n)], NP[it]).reshape(n, 1)  # fmt: skip
    width = int(d.rng.integers(1, cols + 1))
    operand = d.values(t, (rows, cols), special=0.2)
    if d.chance(0.5):
        text = (f"HloModule corner\n\nENTRY e {{\n  p0 = {shape(t, (rows, cols))} parameter(0)\n"
                f"  p1 = {shape(it, (n, 1))} parameter(1)\n"
                f"  ROOT g = {shape(t, (n, width))} gather(p0, p1), offset_dims={{1}}, "
                f"collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, "
                f"slice_sizes={{1,{width}}}\n}}\n")  # fmt: skip
        return Case("gather-scatter", d.seed, text, [operand, idx])
    kind = d.pick(("add", "max", "min")) if t not in ("u8",) else "add"
    if d.chance(0.3):
        kind = "assign"
        idx = np.unique(idx).reshape(-1, 1).astype(NP[it])  # distinct: the order is free
        n = idx.shape[0]
    comb = ("upd {\n  a = T[] parameter(0)\n  ROOT b = T[] parameter(1)\n}\n" if kind == "assign"
            else _reducer("upd", kind, "T")).replace("T[]", f"{t}[]")  # fmt: skip
    unique = ", unique_indices=true" if kind == "assign" and d.chance(0.5) else ""
    text = (f"HloModule corner\n\n{comb}\nENTRY e {{\n  p0 = {shape(t, (rows, cols))} "
            f"parameter(0)\n  p1 = {shape(it, (n, 1))} parameter(1)\n"
            f"  p2 = {shape(t, (n, width))} parameter(2)\n"
            f"  ROOT s = {shape(t, (rows, cols))} scatter(p0, p1, p2), update_window_dims={{1}}, "
            f"inserted_window_dims={{0}}, scatter_dims_to_operand_dims={{0}}, "
            f"index_vector_dim=1{unique}, to_apply=upd\n}}\n")  # fmt: skip
    updates = d.values(t, (n, width), special=0.2)
    if t in ("f32", "bf16", "f64") and kind == "add":
        operand = np.nan_to_num(operand.astype(np.float64), posinf=1, neginf=-1).astype(NP[t])
        updates = np.nan_to_num(updates.astype(np.float64), posinf=1, neginf=-1).astype(NP[t])
        operand = np.clip(operand.astype(np.float64), -8, 8).astype(NP[t])
        updates = np.clip(updates.astype(np.float64), -8, 8).astype(NP[t])
    rtol = 64 * EPS[t] if t in FLOATS and kind == "add" else 0.0
    return Case("gather-scatter", d.seed, text, [operand, idx, updates], rtol=rtol)


def fam_reduce_window(d: _Draw) -> Case:
    t = d.pick(("f32", "s32", "bf16", "f64", "u8", "f16"))
    kind = d.pick(("max", "min", "add"))
    rank = int(d.rng.integers(1, 3))
    dims = d.dims(rank=rank, lo=1, hi=6)
    win, stride, pad, wdil, bdil = [], [], [], [], []
    out = []
    for n in dims:
        w, s = int(d.rng.integers(1, 4)), int(d.rng.integers(1, 3))
        lo, hi = int(d.rng.integers(0, 3)), int(d.rng.integers(0, 3))
        wd, bd = d.pick((1, 1, 2)), d.pick((1, 1, 2))
        base = (n - 1) * bd + 1 + lo + hi
        span = (w - 1) * wd + 1
        if base < span:
            hi += span - base
            base = span
        win.append(w), stride.append(s), pad.append(f"{lo}_{hi}"), wdil.append(wd)
        bdil.append(bd)
        out.append((base - span) // s + 1)
    window = (f"size={'x'.join(map(str, win))} stride={'x'.join(map(str, stride))} "
              f"pad={'x'.join(pad)} lhs_dilate={'x'.join(map(str, bdil))} "
              f"rhs_dilate={'x'.join(map(str, wdil))}")  # fmt: skip
    text = (f"HloModule corner\n\n{_reducer('r', kind, t)}\nENTRY e {{\n"
            f"  p0 = {shape(t, dims, d.layout(rank))} parameter(0)\n"
            f"  z = {t}[] constant({_identity(kind, t)})\n"
            f"  ROOT o = {shape(t, out)} reduce-window(p0, z), window={{{window}}}, "
            f"to_apply=r\n}}\n")  # fmt: skip
    values = d.values(t, dims, special=0.3)
    rtol = 0.0
    if kind == "add" and t not in INTS:
        values = np.clip(np.nan_to_num(values.astype(np.float64), posinf=2, neginf=-2), -8, 8)
        values = values.astype(NP[t])
        rtol = 64 * EPS[t] * 16
    return Case("reduce-window", d.seed, text, [values], rtol=rtol)


def fam_select_and_scatter(d: _Draw) -> Case:
    t = d.pick(("f32", "s32", "f64"))
    n = int(d.rng.integers(2, 9))
    w, s = int(d.rng.integers(1, 4)), int(d.rng.integers(1, 3))
    lo, hi = int(d.rng.integers(0, 2)), int(d.rng.integers(0, 2))
    base = n + lo + hi
    if base < w:
        hi += w - base
        base = w
    out = (base - w) // s + 1
    direction = d.pick(("GE", "LE"))
    # distinct values (ties are XLA's choice: program_fuzz's "select-and-scatter-ties")
    operand = (d.rng.permutation(np.arange(n)) * 3 - 7).astype(NP[t])
    source = d.values(t, (out,), special=0.0)
    if t in INTS:
        source = d.rng.integers(-50, 50, out).astype(NP[t])
    text = (f"HloModule corner\n\nsel {{\n  a = {t}[] parameter(0)\n  b = {t}[] parameter(1)\n"
            f"  ROOT c = pred[] compare(a, b), direction={direction}\n}}\n\n"
            f"{_reducer('sc', 'add', t)}\nENTRY e {{\n  p0 = {t}[{n}] parameter(0)\n"
            f"  p1 = {t}[{out}] parameter(1)\n  z = {t}[] constant(0)\n"
            f"  ROOT o = {t}[{n}] select-and-scatter(p0, p1, z), window={{size={w} stride={s} "
            f"pad={lo}_{hi}}}, select=sel, scatter=sc\n}}\n")  # fmt: skip
    return Case("select-and-scatter", d.seed, text, [operand, source],
                rtol=0.0 if t in INTS else 16 * EPS[t])  # fmt: skip


def fam_size_zero(d: _Draw) -> Case:
    """iota, broadcast, reshape, transpose, concatenate, pad and reverse with size-0 dims."""
    t = d.pick(ALL)
    dims = list(d.dims(rank=int(d.rng.integers(1, 4)), lo=1, hi=4))
    dims[int(d.rng.integers(len(dims)))] = 0
    rank = len(dims)
    ops = []
    kind = d.pick(("iota", "broadcast", "reshape", "transpose", "concatenate", "pad", "reverse"))
    if kind == "iota":
        ops.append(f"  ROOT r = {shape(t if t not in ('pred',) else 's32', dims)} iota(), "
                   f"iota_dimension={int(d.rng.integers(rank))}")  # fmt: skip
    elif kind == "broadcast":
        ops.append(f"  ROOT r = {shape(t, [*dims, 3])} broadcast(p0), "
                   f"dimensions={_braces(range(rank))}")  # fmt: skip
    elif kind == "reshape":
        out = [0, int(d.rng.integers(1, 4))] if d.chance(0.5) else [0]
        ops.append(f"  ROOT r = {shape(t, out, d.layout(len(out)))} reshape(p0)")
    elif kind == "transpose":
        perm = [int(i) for i in d.rng.permutation(rank)]
        ops.append(f"  ROOT r = {shape(t, [dims[i] for i in perm])} transpose(p0), "
                   f"dimensions={_braces(perm)}")  # fmt: skip
    elif kind == "concatenate":
        ax = int(d.rng.integers(rank))
        out = list(dims)
        out[ax] *= 2
        ops.append(f"  ROOT r = {shape(t, out)} concatenate(p0, p0), dimensions={{{ax}}}")
    elif kind == "pad":
        cfg, out = [], []
        for n in dims:
            lo, hi, it = int(d.rng.integers(-1, 3)), int(d.rng.integers(-1, 3)), 0
            if n > 1:
                it = int(d.rng.integers(0, 2))
            size = lo + hi + n + max(n - 1, 0) * it
            if size < 0:
                hi -= size
                size = 0
            cfg.append(f"{lo}_{hi}_{it}" if it else f"{lo}_{hi}")
            out.append(size)
        one = {"pred": "true", "c64": "(1, 0)", "c128": "(1, 0)"}.get(t, "1")
        ops.append(f"  c = {t}[] constant({one})")
        ops.append(f"  ROOT r = {shape(t, out)} pad(p0, c), padding={'x'.join(cfg)}")
    else:
        ops.append(f"  ROOT r = {shape(t, dims)} reverse(p0), dimensions={{0}}")
    head = "" if kind == "iota" else f"  p0 = {shape(t, dims, d.layout(rank))} parameter(0)\n"
    text = f"HloModule corner\n\nENTRY e {{\n{head}" + "\n".join(ops) + "\n}\n"
    args = [] if kind == "iota" else [d.values(t, dims)]
    return Case("size-zero", d.seed, text, args)


def fam_conditional(d: _Draw) -> Case:
    """A conditional of 1..4 branches over a tuple operand; the index may be out of range
    (then the last branch runs), or a pred."""
    k = int(d.rng.integers(1, 5))
    t, u = d.pick(("f32", "s32", "bf16", "f64")), d.pick(("s8", "u32", "f16", "pred"))
    dims = d.dims(rank=int(d.rng.integers(0, 3)), lo=1)
    use_pred = k == 2 and d.chance(0.4)
    ops = {"f32": ["add", "multiply", "maximum", "subtract"], "s32": ["add", "multiply", "xor",
           "minimum"], "bf16": ["add", "maximum", "minimum", "multiply"],
           "f64": ["add", "subtract", "minimum", "maximum"]}[t]  # fmt: skip
    comps = []
    tup = f"({shape(t, dims)}, {shape(u, dims)})"
    for b in range(k):
        comps.append(
            f"br{b} {{\n  p = {tup} parameter(0)\n  x = {shape(t, dims)} get-tuple-element(p), "
            f"index=0\n  y = {shape(u, dims)} get-tuple-element(p), index=1\n"
            f"  z = {shape(t, dims)} {ops[b]}(x, x)\n  c = {shape(u, dims)} convert(x)\n"
            f"  in = ({shape(u, dims)}, {shape(t, dims)}) tuple({'y' if b % 2 else 'c'}, z)\n"
            f"  ROOT o = (({shape(u, dims)}, {shape(t, dims)}), {shape(t, dims)}) "
            f"tuple(in, x)\n}}\n"
        )
    branches = ", ".join(f"br{b}" for b in range(k))
    it = "pred" if use_pred else d.pick(("s32",))
    attr = ("true_computation=br0, false_computation=br1" if use_pred
            else f"branch_computations={{{branches}}}")  # fmt: skip
    out = f"(({shape(u, dims)}, {shape(t, dims)}), {shape(t, dims)})"
    operands = ", ".join(["p"] * (2 if use_pred else k))
    text = ("HloModule corner\n\n" + "\n".join(comps) + f"\nENTRY e {{\n  i = {it}[] "
            f"parameter(0)\n  p = {tup} parameter(1)\n"
            f"  ROOT c = {out} conditional(i, {operands}), {attr}\n}}\n")  # fmt: skip
    if use_pred:
        index = np.asarray(d.chance(0.5))
    else:
        index = np.asarray(d.pick((-1, 0, k - 1, k, 7, -(2**31), 2**31 - 1)), np.int32)
    x = d.values(t, dims, special=0.2)
    if t in ("f32", "bf16", "f64"):
        x = np.clip(np.nan_to_num(x.astype(np.float64)), -100, 100).astype(NP[t])
    return Case("conditional", d.seed, text, [index, (x, d.values(u, dims))])


def fam_while(d: _Draw) -> Case:
    """A while loop carrying (s32 counter, f32/bf16/u8/pred arrays, a nested tuple)."""
    n = int(d.rng.integers(0, 5))
    t = d.pick(("f32", "bf16", "f64", "f16"))
    u = d.pick(("u8", "s8", "u64", "s16"))
    dims = d.dims(rank=int(d.rng.integers(0, 3)), lo=1)
    s = shape
    carry = f"(s32[], {s(t, dims)}, ({s(u, dims)}, pred[]))"
    text = f"""HloModule corner

cond {{
  p = {carry} parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant({n})
  ROOT lt = pred[] compare(i, n), direction=LT
}}

body {{
  p = {carry} parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = {s(t, dims)} get-tuple-element(p), index=1
  q = ({s(u, dims)}, pred[]) get-tuple-element(p), index=2
  y = {s(u, dims)} get-tuple-element(q), index=0
  b = pred[] get-tuple-element(q), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  h = {t}[] constant(0.5)
  hb = {s(t, dims)} broadcast(h), dimensions={{}}
  x1 = {s(t, dims)} multiply(x, hb)
  c = {s(u, dims)} convert(x1)
  y1 = {s(u, dims)} add(y, c)
  b1 = pred[] not(b)
  q1 = ({s(u, dims)}, pred[]) tuple(y1, b1)
  ROOT o = {carry} tuple(i1, x1, q1)
}}

ENTRY e {{
  x = {s(t, dims, d.layout(len(dims)))} parameter(0)
  y = {s(u, dims)} parameter(1)
  b = pred[] parameter(2)
  z = s32[] constant(0)
  q = ({s(u, dims)}, pred[]) tuple(y, b)
  t0 = {carry} tuple(z, x, q)
  ROOT w = {carry} while(t0), condition=cond, body=body
}}
"""
    x = np.clip(np.nan_to_num(d.values(t, dims, special=0.3).astype(np.float64)), -300, 300)
    return Case("while", d.seed, text, [x.astype(NP[t]), d.values(u, dims), np.asarray(True)])


def fam_tuples(d: _Draw) -> Case:
    """A tuple parameter (nested) with layouts, its leaves rearranged into nested results."""
    a, b, c = (d.pick(ALL) for _ in range(3))
    da, db, dc = d.dims(), d.dims(rank=2, lo=1), d.dims()
    la, lb = d.layout(len(da)), d.layout(len(db))
    inner = f"({shape(b, db, lb)}, {shape(c, dc)})"
    ptype = f"({shape(a, da, la)}, {inner})"
    lbo = d.layout(2)
    text = f"""HloModule corner

ENTRY e {{
  p = {ptype} parameter(0)
  q = {shape(b, db)} parameter(1)
  x = {shape(a, da, la)} get-tuple-element(p), index=0
  i = {inner} get-tuple-element(p), index=1
  y = {shape(b, db, lb)} get-tuple-element(i), index=0
  z = {shape(c, dc)} get-tuple-element(i), index=1
  yt = {shape(b, db[::-1])} transpose(y), dimensions={{1,0}}
  yq = {shape(b, db, lbo)} copy(q)
  n = ({shape(c, dc)}, ({shape(b, db[::-1])}, {shape(b, db, lbo)})) tuple(z, yt2)
  ROOT r = ({shape(a, da)}, ({shape(c, dc)}, ({shape(b, db[::-1])}, {shape(b, db, lbo)})), {shape(b, db, lb)}) tuple(x, n, y)
}}
"""  # noqa: E501
    text = text.replace("tuple(z, yt2)", "tuple(z, pair)").replace(
        "  n = ", f"  pair = ({shape(b, db[::-1])}, {shape(b, db, lbo)}) tuple(yt, yq)\n  n = "
    )
    args = [(d.values(a, da), (d.values(b, db), d.values(c, dc))), d.values(b, db)]
    return Case("tuples", d.seed, text, args, xla=False)


# Identities a simplifier may be tempted by, most of them wrong for NaN, infinities, -0 or
# INT_MIN: each line is instructions over the parameter x (and y), and constants named k<v>
# (a broadcast scalar), the last one the root; "T" is the element type.
IDENTITIES = (
    "add(x, k0)",  # -0 + 0 = +0, not x
    "add(k0, x)",
    "subtract(x, k0)",  # exact: x
    "subtract(k0, x)",  # 0 - x != -x for x = 0
    "subtract(x, x)",  # inf - inf = NaN
    "multiply(x, k0)",  # NaN, inf * 0 = NaN; -1 * 0 = -0
    "multiply(x, k1)",
    "multiply(x, k-1)",
    "divide(x, k1)",
    "divide(x, x)",  # 0/0, inf/inf
    "divide(x, k-1)",  # INT_MIN / -1
    "divide(k0, x)",
    "remainder(x, k1)",
    "remainder(x, x)",
    "maximum(x, x)",
    "minimum(x, k0)",
    "maximum(x, k-inf)",
    "minimum(x, kinf)",
    "compare(x, x), direction=EQ",  # NaN != NaN
    "compare(x, x), direction=NE",
    "compare(x, x), direction=LE",
    "compare(x, x), direction=GE",
    "compare(x, x), direction=LT",
    "negate(x) ; negate(r0)",
    "abs(x) ; abs(r0)",
    "negate(x) ; abs(r0)",
    "abs(x) ; negate(r0) ; compare(r1, k0), direction=LE",
    "power(x, k0)",  # pow(NaN, 0) = 1
    "power(x, k1)",
    "power(x, k2)",
    "power(x, k0.5)",  # pow(-0, 0.5) = +0, pow(-inf, 0.5) = +inf: not sqrt
    "power(x, k-0.5)",
    "power(x, k-1)",
    "power(x, k-2)",
    "power(x, k3)",
    "log(x) ; exponential(r0)",
    "exponential(x) ; log(r0)",
    "sqrt(x) ; multiply(r0, r0)",
    "multiply(x, x) ; sqrt(r0)",
    "floor(x) ; floor(r0)",
    "ceil(x) ; floor(r0)",
    "multiply(x, k3) ; multiply(r0, k0.5)",  # no reassociation
    "add(x, k1) ; subtract(r0, k1)",
    "add(x, y) ; subtract(r0, y)",
    "select(p, x, x)",
    "compare(x, y), direction=LT ; not(r0)",  # not(x < y) is not x >= y for NaN
    "compare(x, y), direction=GT ; select(r0, x, y)",  # not max for NaN, -0
    "compare(x, y), direction=LT ; select(r0, x, y)",
    "maximum(x, y) ; minimum(r0, y)",
    "negate(x) ; negate(y) ; maximum(r0, r1) ; negate(r2)",  # min(x, y) by negation: -0
    "convert(x):f64 ; convert(r0):T",
    "convert(x):f32 ; convert(r0):T",
    "convert(x):f16 ; convert(r0):T",
    "convert(x):s32 ; convert(r0):T",
    "convert(x):u8 ; convert(r0):T",
    "convert(x):pred ; convert(r0):T",
    "add(x, x) ; divide(r0, k2)",
    "multiply(x, k-1) ; negate(r0)",
    "shift-left(x, k1) ; shift-right-arithmetic(r0, k1)",
    "shift-right-logical(x, k1) ; shift-left(r0, k1)",
    "and(x, x)",
    "xor(x, x)",
    "or(x, k0)",
    "not(x) ; not(r0)",
    "clamp(k-1, x, k1)",
    "clamp(k1, x, k-1)",  # lo > hi
    "sign(x) ; multiply(r0, x)",
    "abs(x) ; sign(r0)",
    "round-nearest-even(x) ; round-nearest-afz(r0)",
)
_FLOAT_ONLY = ("power", "log", "exponential", "sqrt", "floor", "ceil", "round")
_INT_ONLY = ("shift", "and(", "xor(", "or(", "not(")


def fam_identity(d: _Draw) -> Case:
    """A short chain built around an identity (IDENTITIES) on edge values, through the
    simplifier and fusion: the interpreter evaluates the module as written."""
    t = d.pick((*FLOATS, *INTS, "f8e5m2"))
    ok = [e for e in IDENTITIES if not (t in INTS and any(w in e for w in _FLOAT_ONLY))
          and not (t not in INTS and any(w in e for w in _INT_ONLY))
          and not (t in UINTS and ("k-" in e or "negate" in e or "abs" in e or "sign" in e))
          and not (t in INTS and "0.5" in e)]  # fmt: skip
    expr = d.pick(ok)
    if t in INTS:
        expr = expr.replace("k-inf", f"k{np.iinfo(NP[t]).min}").replace(
            "kinf", f"k{np.iinfo(NP[t]).max}"
        )
    dims = d.dims(rank=int(d.rng.integers(0, 3)), lo=1)
    sh = shape(t, dims)
    lines = [f"  x = {shape(t, dims, d.layout(len(dims)))} parameter(0)",
             f"  y = {sh} parameter(1)", f"  p = {shape('pred', dims)} parameter(2)"]  # fmt: skip
    consts: dict[str, str] = {}
    out_type = t
    steps = [s.strip() for s in expr.split(";")]
    for i, step in enumerate(steps):
        to = t
        if "):" in step:
            step, to = step.rsplit(":", 1)
            to = t if to == "T" else to
        for k in sorted(set(re.findall(r"\bk(-?[\w.]+)", step)), key=len, reverse=True):
            name = "kc" + str(len(consts))
            value = "true" if t == "pred" else k
            consts.setdefault(k, name)
            if not any(line.startswith(f"  {consts[k]}s ") for line in lines):
                lines.append(f"  {consts[k]}s = {t}[] constant({value})")
                lines.append(f"  {consts[k]} = {sh} broadcast({consts[k]}s), dimensions={{}}")
            step = re.sub(rf"\bk{re.escape(k)}(?![\w.])", consts[k], step)
        result = "pred" if step.startswith("compare") else to
        if step.startswith("not(") and out_type == "pred":
            result = "pred"
        root = "ROOT " if i == len(steps) - 1 else ""
        lines.append(f"  {root}r{i} = {shape(result, dims)} {step}")
        out_type = result
    text = "HloModule corner\n\nENTRY e {\n" + "\n".join(lines) + "\n}\n"
    x = d.values(t, dims, special=0.6)
    y = d.values(t, dims, special=0.6)
    if d.chance(0.3):
        y = x.copy()
    p = d.values("pred", dims)
    inexact = any(w in expr for w in ("power", "log", "exponential", "sqrt(x) ;", "divide(x, y"))
    case = Case("identity", d.seed, text, [x, y, p], rtol=64 * EPS[t] if inexact else 0.0)
    if t in ("f16", "bf16", "f8e5m2") and len(steps) > 1:
        case.xla_rtol = 2 * EPS[t]  # KNOWN["excess-precision"]
    case.xla = expr != "multiply(x, x) ; sqrt(r0)"  # KNOWN["sqrt-of-square"]
    return case


FAMILIES: dict[str, Callable[[_Draw], Case]] = {
    "identity": fam_identity,
    "binary": fam_binary,
    "unary": fam_unary,
    "compare": fam_compare,
    "clamp-select": fam_clamp_select,
    "convert": fam_convert,
    "bitcast-convert": fam_bitcast,
    "divide-shift": fam_divide_shift,
    "reduce": fam_reduce,
    "argmax": fam_argmax,
    "sort": fam_sort,
    "dynamic-slice": fam_dynamic,
    "gather-scatter": fam_gather_scatter,
    "reduce-window": fam_reduce_window,
    "select-and-scatter": fam_select_and_scatter,
    "size-zero": fam_size_zero,
    "conditional": fam_conditional,
    "while": fam_while,
    "tuples": fam_tuples,
}


def unique_names(text: str) -> str:
    """`text` with each non-entry computation's instruction names suffixed by the
    computation's number (HLO names are module-wide; the families write short local ones)."""
    blocks = text.split("\n\n")
    for k, block in enumerate(blocks):
        if block.startswith(("HloModule", "ENTRY")):
            continue
        for name in set(re.findall(r"^  (?:ROOT )?([\w.]+) = ", block, re.M)):
            block = re.sub(rf"(?<![\w.%-]){re.escape(name)}(?![\w.-])", f"{name}.{k}", block)
        blocks[k] = block
    return "\n\n".join(blocks)


def generate(seed: int, families: list[str] | None = None) -> Case:
    """The case drawn for `seed` (from `families`, all by default)."""
    d = _Draw(seed)
    names = sorted(families or FAMILIES)
    case = FAMILIES[d.pick(names)](d)
    case.text = unique_names(case.text)
    return case


KNOWN = {
    "excess-precision": "XLA:CPU evaluates an f16/bf16/f8 chain in f32 and rounds once at "
    "the end (xla_allow_excess_precision): (x + 1) - 1 of f16 0.2365 gave 0.2365 there, "
    "0.2363 with each step rounded as HLO says (interpreter and xlapy's CPU backend). "
    "Chains of low-precision types are compared with XLA within 2 ulp.",
    "sqrt-of-square": "XLA's simplifier rewrites sqrt(x * x) to |x|: f64 -2.2e-308 gave "
    "2.2e-308 there, where x * x underflows to 0 (xlapy: 0). Not compared with XLA.",
    "complex-log-nonfinite": "XLA:CPU's complex log of (NaN, -inf) is (NaN, NaN); C99's clog, "
    "NumPy and xlapy give (inf, NaN). Not compared with XLA where an input is not finite.",
    "complex-overflow": "complex multiply and divide whose products overflow: XLA:CPU's "
    "fused multiply-add gave (inf, ...) for (-max + max i) * (2 - 10.2i) where the textbook "
    "formula (NumPy, xlapy's CPU kernel) gives NaN; drawn with finite |parts| < 1e30.",
    "complex-max-nan": "XLA:CPU's complex maximum of (NaN, 1) and (-0.86, -max) picks the "
    "second (a lexicographic compare that is false on NaN); xlapy propagates the NaN, as "
    "for real types. Not compared with XLA where an operand holds a NaN.",
    "subnormal-transcendentals": "With subnormal inputs, XLA:CPU flushes some operations' "
    "inputs and not others (power(1e-45, -0.59) gave 6.6e26 there, inf with the input "
    "flushed): the CPU backend's flushed run is not compared for inexact operations on "
    "subnormal inputs; its run with denormals='ieee' is, against the interpreter.",
    "complex-power-infinities": "complex power whose result overflows has an ill-conditioned "
    "sign (cos of a huge angle): XLA and xlapy differ there; drawn with |operands| < 8.",
}


# --- the oracle --------------------------------------------------------------------------------


def _leaves(value) -> list:
    if isinstance(value, tuple | list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def _copy(args):
    return [tuple(_copy(a)) if isinstance(a, tuple) else np.array(a, copy=True) for a in args]


def same(got, want, rtol: float = 0.0) -> str | None:
    """None when `got` equals `want`: bit for bit for integers and pred, for floats equal
    values (NaN == NaN, a subnormal == a zero of either sign), within `rtol` if given."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype or want.dtype.kind in "biu":
        return exact_difference(got, want)
    if want.dtype.kind == "c":
        parts = (np.real, np.imag)
        for part in parts:
            msg = same(part(got).copy(), part(want).copy(), rtol)
            if msg:
                return f"{part.__name__}: {msg}"
        return None
    a, e = got.astype(np.float64).reshape(-1), want.astype(np.float64).reshape(-1)
    tiny = float(ml_dtypes.finfo(want.dtype).smallest_normal)
    a = np.where(np.abs(a) < tiny, np.copysign(0.0, a), a)  # flushed, its sign kept
    e = np.where(np.abs(e) < tiny, np.copysign(0.0, e), e)
    with np.errstate(invalid="ignore"):
        if rtol:
            close = np.abs(a - e) <= rtol * np.maximum(np.abs(e), tiny)
            ok = (a == e) | (np.isnan(a) & np.isnan(e)) | (np.isfinite(e) & close)
        else:
            # signed zeros must agree, unless one of them is a flushed subnormal
            flushed = (got.astype(np.float64).reshape(-1) != 0) | (
                want.astype(np.float64).reshape(-1) != 0
            )
            ok = ((a == e) & ((np.signbit(a) == np.signbit(e)) | (a != 0) | flushed)) | (
                np.isnan(a) & np.isnan(e)
            )
    bad = np.flatnonzero(~ok)
    if bad.size:
        i = bad[0]
        return (f"{bad.size}/{want.size} differ, first at {i}: got {got.reshape(-1)[i]!r}, "
                f"want {want.reshape(-1)[i]!r}")  # fmt: skip
    return None


def _has_subnormals(args) -> bool:
    for a in _leaves(args):
        a = np.asarray(a)
        if a.dtype.kind not in "fc" and a.dtype not in (NP["bf16"], *(NP[t] for t in F8)):
            continue
        parts = (a.real, a.imag) if a.dtype.kind == "c" else (a,)
        for part in parts:
            x = np.abs(part.astype(np.float64))
            if np.any((x > 0) & (x < float(ml_dtypes.finfo(part.dtype).smallest_normal))):
                return True
    return False


def check_case(case: Case, xla: Callable | None = None) -> list[str]:
    """The mismatches of `case`. The interpreter (IEEE subnormals) is the oracle of the CPU
    backend with `denormals="ieee"`; the CPU backend as it runs by default (subnormals
    flushed, as XLA:CPU does) is compared with the interpreter where no input is subnormal,
    and with XLA:CPU (`xla(text, args)`, when given) always, bit for bit where exact."""
    from xlapy.backends.cpu.backend import CpuProgram
    from xlapy.backends.interpreter import evaluate
    from xlapy.ir.parser import parse_module
    from xlapy.ir.verifier import verify

    try:
        module = parse_module(case.text)
        verify(module)
        want = [np.asarray(x) for x in _leaves(evaluate(module, _copy(case.args)))]
    except Exception as exc:
        return [f"interpreter: {type(exc).__name__}: {exc}"]

    def cpu(opts):
        return lambda: _leaves(CpuProgram(parse_module(case.text), opts).run(_copy(case.args)))

    subnormal = _has_subnormals(case.args)
    sides: dict[str, tuple[Callable, str]] = {"cpu-ieee": (cpu({"denormals": "ieee"}), "interp")}
    against = "xla" if xla is not None and case.xla else ("interp" if not subnormal else "")
    if subnormal and case.rtol:
        against = ""  # KNOWN["subnormal-transcendentals"]
    if against:
        sides["cpu"] = (cpu({}), against)
        sides["cpu-native-off"] = (cpu(NATIVE_OFF), against)
    if against == "xla":
        sides = {
            "xla": (lambda: xla(case.text, case.args), "interp" if not subnormal else ""),
            **sides,
        }
    found: list[str] = []
    results: dict[str, list] = {"interp": want}
    for side, (run, reference) in sides.items():
        try:
            got = [np.asarray(g) for g in run()]
        except Exception as exc:
            if side == "xla":
                if "UNIMPLEMENTED" not in str(exc):
                    found.append(f"xla: {type(exc).__name__}: {str(exc)[:300]}")
                for other in ("cpu", "cpu-native-off"):  # compare those with the interpreter
                    if other in sides:
                        sides[other] = (sides[other][0], "interp" if not subnormal else "")
                continue
            found.append(f"{side}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        results[side] = got
        ref = results.get(reference)
        if ref is None:
            continue
        if len(got) != len(ref):
            found.append(f"{side}: {len(got)} outputs, want {len(ref)} ({reference})")
            continue
        rtol = case.rtol
        if "xla" in (side, reference) and case.xla_rtol is not None:
            rtol = max(rtol, case.xla_rtol)
        for k, (g, w) in enumerate(zip(got, ref, strict=True)):
            msg = same(g, w, rtol)
            if msg:
                found.append(f"{side} vs {reference}: output {k}: {msg}")
    return found


# --- StableHLO text mutants ----------------------------------------------------------------------


def stablehlo_corpus() -> list[str]:
    """StableHLO modules as JAX writes them (a few programs lowered here, covering while,
    case, sort, scatter, gather, reduce-window, convolution, custom calls, bf16 and complex)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    f32 = jnp.float32
    x, m, v = jnp.ones((4, 6), f32), jnp.ones((6, 3), f32), jnp.arange(5, dtype=jnp.int32)

    def loop(a):
        return lax.fori_loop(0, 3, lambda i, c: c * 2 + i, a)

    def switch(i, a):
        return lax.switch(i, [jnp.sin, jnp.cos, lambda y: -y], a)

    def pool(a):
        return lax.reduce_window(a, -jnp.inf, lax.max, (2, 2), (1, 2), "SAME")

    def conv(a):
        k = jnp.ones((3, 3, 1, 2), f32)
        return lax.conv_general_dilated(a[None, :, :, None], k, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))  # fmt: skip

    programs = [
        (lambda a, b: jnp.tanh(a @ b).sum(0), (x, m)),
        (loop, (x,)),
        (switch, (jnp.int32(1), x)),
        (lambda a, i: (jnp.sort(a, axis=1), jnp.argsort(a[0]), a[i]), (x, v[:2])),
        (lambda a, i: a.at[i % 4].add(1.0), (x, v)),
        (pool, (x,)),
        (conv, (x,)),
        (lambda a: jnp.linalg.cholesky(a @ a.T + 4 * jnp.eye(4)), (x,)),
        (lambda a: (a.astype(jnp.bfloat16) * 3).astype(jnp.complex64) ** 2, (x,)),
        (lambda a: jnp.cumsum(a, 0) / jnp.max(a), (x,)),
    ]
    return [jax.jit(f).lower(*args).as_text() for f, args in programs]


_MLIR_TOKENS = ("%", "%0", "(", ")", "<", ">", "{", "}", "[", "]", ":", ",", "x", "?", '"',
                "tensor<", "f32", "i1", "ui8", "bf16", "complex<f32>", "->", "=", "dense<",
                "stablehlo.add", "stablehlo.return", "^bb0", "@main", "#", "0x", "-",
                "1e40", "-1", "99999999999999999999", "nan", "\n", " ")  # fmt: skip
_MLIR_NUMBER = re.compile(r"(?<![\w%#@])-?\d+(\.\d+)?(e[+-]?\d+)?")


def mutate(text: str, rng: np.random.Generator) -> str:
    """`text` with one to three random edits: delete, double or move a span, insert a token
    of the syntax, replace a number by an edge value, or swap two lines."""
    for _ in range(int(rng.integers(1, 4))):
        n = len(text)
        if n < 2:
            break
        i = int(rng.integers(n))
        j = min(n, i + int(rng.integers(1, 12)))
        kind = int(rng.integers(6))
        if kind == 0:
            text = text[:i] + text[j:]
        elif kind == 1:
            text = text[:j] + text[i:j] + text[j:]
        elif kind == 2:
            tok = _MLIR_TOKENS[int(rng.integers(len(_MLIR_TOKENS)))]
            text = text[:i] + tok + text[i:]
        elif kind == 3:
            numbers = list(_MLIR_NUMBER.finditer(text))
            if numbers:
                hit = numbers[int(rng.integers(len(numbers)))]
                new = str(rng.choice(["0", "-1", "1", "65536", "2147483648", "-9223372036854775809",
                                      "1e39", "0.5", "18446744073709551616", "007"]))  # fmt: skip
                text = text[: hit.start()] + new + text[hit.end() :]
        elif kind == 4:
            lines = text.split("\n")
            a, b = (int(k) for k in rng.integers(len(lines), size=2))
            lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
        else:
            k = int(rng.integers(n))
            text = (
                text[:k] + text[i:j] + text[k:]
                if k < i
                else text[:i] + text[j:k] + text[i:j] + text[k:]
            )
    return text


_WHERE = re.compile(r":\d+:\d+: error: ")


def check_mutant(text: str, timeout: float = 10.0) -> str | None:
    """None when `text` imports (and the module verifies) or fails with an XlapyError that
    names a line and column (or an instruction); otherwise what went wrong."""
    import signal

    from xlapy.errors import XlapyError
    from xlapy.ir.verifier import verify
    from xlapy.stablehlo import import_text

    def alarm(signum, frame):
        raise TimeoutError(f"import did not finish in {timeout:.0f} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        verify(import_text(text))
        return None
    except XlapyError as exc:
        message = str(exc)
        if _WHERE.search(message) or type(exc).__name__ in ("VerifierError", "ShapeError"):
            return None
        if "^" in message or ":" in message.split("\n")[0]:
            return None
        return f"{type(exc).__name__} without a place: {message[:200]}"
    except Exception as exc:  # not one of xlapy's errors: a crash
        import traceback

        return f"{type(exc).__name__}: {str(exc)[:200]}\n{traceback.format_exc(limit=-2)}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
