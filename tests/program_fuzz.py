"""A seeded generator of random, valid HLO programs and a differential oracle over them.

`generate(seed)` draws a random DAG of HLO instructions (elementwise unary/binary/compare/
select/clamp/convert/bitcast-convert, broadcast, reshape, transpose, slice, dynamic slices
and updates, concatenate, pad, reverse, iota, reduce (variadic too), reduce-window, dot,
convolution, gather, scatter, sort, while loops carrying a buffer updated in place,
conditionals, tuples) over f32/f16/bf16/f64/s32/s8/u8/u32/pred/c64, with shapes that have
dims of 1 and 0 and some non-default layouts; and (second round) rng-bit-generator with each
algorithm and rng-get-and-update-state, Threefry written out as JAX emits it, fft of all four
types, the LAPACK custom calls jax.numpy.linalg emits (potrf, trsm, getrf, geqrf + orgqr,
syevd, gesdd; for c64/c128 the c/z ones jaxlib names, ungqr and heevd among them), custom
calls (JAX's Sharding marker, a Python target of the fuzzer's own with
output_to_operand_aliasing), while loops nesting tuples, a conditional and an inner loop
with an in-place dynamic-update-slice, gather and scatter with any dimension numbers,
select-and-scatter with padding, sorts of several operands with lexicographic comparators,
bf16/f16/f8 arithmetic chains, copies and parameters in {0,1} and 3-D permuted layouts, and
input/output aliases (into tuple parameters' leaves too). Each operation family has a
weight in FAMILIES (whole-program features in FEATURES) and can be turned off or
reweighted (`generate(families=...)`, or the XLAPY_FUZZ_FAMILIES variable: "-linalg,fft=3",
or "gather_general,scatter_general" for only those).

`check(program)` runs it through the interpreter (the oracle), the CPU backend (default
options and with its native paths off), the runtime with and without donating the aliased
parameters (equal results, untouched inputs when not donated, donated buffers dead and
refused afterwards, a buffer donated and passed twice refused), optionally XLA (through
jaxlib, in this process or an XlaChild process; KNOWN_DIFFERENCES lists where xlapy
deliberately differs), and optionally the program as StableHLO (XLA's translation) imported
by xlapy and run through its PJRT plugin as JAX drives it (donation checked), and returns
the mismatches; `shrink` cuts a failing program down (the same seed drawn again with smaller
dimensions, outputs dropped, instructions replaced by parameters or bypassed) while it still
fails, and `Program.text()` is the reproducer.

Floats are compared against an error bound the generator carries with every value: `mag`
bounds the value's magnitude and `err` its absolute rounding error (0 for values computed
without rounding: parameters, shape ops, max/min/abs/negate/select of exact values, ...).
Operations that are discontinuous (compare, floor, convert to an integer, remainder,
sort keys, argmax) or that amplify an error without bound (divisor, sqrt, log, power) only
take exact operands, so two correct implementations can differ only within the bound, and
exact values must agree exactly. Float parameters are drawn with magnitudes in [0.25, 4]
(no values near zero), integers over ranges that exercise wrap-around, and the undefined
corner cases are XLA's defined ones (division by zero, shift counts, saturating converts).
"""

from __future__ import annotations

import math
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import ml_dtypes
import numpy as np

FLOATS = ("f32", "f16", "bf16", "f64")
INTS = ("s32", "s8", "u8", "u32")
ALL = (*FLOATS, *INTS, "pred", "c64")
EPS = {"f32": 2.0**-23, "f16": 2.0**-10, "bf16": 2.0**-7, "f64": 2.0**-52, "c64": 2.0**-23,
       "c128": 2.0**-52, "f8e4m3fn": 2.0**-3, "f8e5m2": 2.0**-2}  # fmt: skip
NP = {
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f64": np.dtype(np.float64),
    "s32": np.dtype(np.int32),
    "s8": np.dtype(np.int8),
    "u8": np.dtype(np.uint8),
    "u32": np.dtype(np.uint32),
    "pred": np.dtype(np.bool_),
    "c64": np.dtype(np.complex64),
    "c128": np.dtype(np.complex128),  # complex LAPACK calls only (their values are leaves)
    "s64": np.dtype(np.int64),
    "u64": np.dtype(np.uint64),
    "u16": np.dtype(np.uint16),
    "f8e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "f8e5m2": np.dtype(ml_dtypes.float8_e5m2),
}
BITS = {"f32": 32, "f16": 16, "bf16": 16, "f64": 64, "s32": 32, "s8": 8, "u8": 8, "u32": 32}
MAX_ELEMENTS = 2048
LARGEST = {"f16": 65504.0, "bf16": 3.3e38, "f32": 3.4e38, "c64": 3.4e38, "f64": 1.7e308,
           "c128": 1.7e308,
           "f8e4m3fn": 448.0, "f8e5m2": 57344.0}  # fmt: skip


@dataclass
class Instr:
    """One entry instruction: `%name = shape opcode(%args...), attrs`. A parameter keeps how
    its argument is drawn in `draw` ("float:<mag>", "int:<lo>:<hi>", "pred")."""

    name: str
    shape: str
    opcode: str
    args: list[str]
    attrs: str = ""
    draw: str = ""
    # error bound of the value (arrays only): magnitude bound and absolute error bound
    mag: float = 0.0
    err: float = 0.0
    dtype: str = ""
    dims: tuple[int, ...] = ()
    hidden: bool = False  # not an operand for later instructions (a raw bit pattern)
    elements: tuple = ()  # a tuple parameter's (dtype, dims, draw) per element
    xla_skip: str = ""  # why XLA's value of this output is not compared (KNOWN_DIFFERENCES)
    leaf: bool = False  # an output only, no operand for later instructions


@dataclass
class Program:
    """A generated module: entry instructions in order, computations it calls, outputs."""

    seed: int
    instrs: list[Instr]
    computations: dict[str, str]
    outputs: list[str]
    # (output name, parameter name[, leaf index of a tuple parameter]): input_output_alias
    # entries (may-alias unless the parameter is in must_alias)
    aliases: list[tuple] = field(default_factory=list)
    must_alias: set[str] = field(default_factory=set)  # parameters aliased as must-alias
    xla_ok: bool = True  # False: calls targets only xlapy has (the fuzzer's own)
    cap: int | None = None  # the largest dimension the generator drew (shape shrinking)
    families: dict[str, float] | None = None

    def by_name(self) -> dict[str, Instr]:
        return {i.name: i for i in self.instrs}

    def text(self) -> str:
        """The module as HLO text (parameters numbered in order of appearance)."""
        live = self._live()
        lines, number = [], 0
        used_comps: set[str] = set()
        for ins in self.instrs:
            if ins.name not in live:
                continue
            if ins.opcode == "parameter":
                lines.append(f"  %{ins.name} = {ins.shape} parameter({number})")
                number += 1
                continue
            if ins.opcode == "constant":
                lines.append(f"  %{ins.name} = {ins.shape} constant({ins.attrs})")
                continue
            args = ", ".join(f"%{a}" for a in ins.args)
            attrs = f", {ins.attrs}" if ins.attrs else ""
            lines.append(f"  %{ins.name} = {ins.shape} {ins.opcode}({args}){attrs}")
            used_comps |= {c for c in self.computations if f"%{c}" in ins.attrs}
        by = self.by_name()
        shapes = ", ".join(by[o].shape for o in self.outputs)
        outs = ", ".join(f"%{o}" for o in self.outputs)
        lines.append(f"  ROOT %root = ({shapes}) tuple({outs})")
        # computations call others (a while body its reducer): close over the references
        todo = list(used_comps)
        while todo:
            body = self.computations[todo.pop()]
            for c in self.computations:
                if c not in used_comps and f"%{c}" in body:
                    used_comps.add(c)
                    todo.append(c)
        comps = [
            _unique_names(self.computations[c], k)
            for k, c in enumerate(self.computations)
            if c in used_comps
        ]
        head = f"HloModule fuzz_{self.seed}{self._alias_text()}\n\n"
        return (
            head
            + "".join(c + "\n\n" for c in comps)
            + "ENTRY %main {\n"
            + "\n".join(lines)
            + "\n}\n"
        )

    def live_aliases(self) -> list[tuple[int, int]]:
        """The (output index, parameter number) pairs of the aliases still in the program."""
        return [(o, p) for o, p, _ in self.live_alias_leaves()]

    def live_alias_leaves(self) -> list[tuple[int, int, tuple[int, ...]]]:
        """(output index, parameter number, index in the parameter) of the live aliases."""
        numbers = {p.name: k for k, p in enumerate(self.parameters())}
        out = []
        for o, p, *leaf in self.aliases:
            if o in self.outputs and p in numbers:
                out.append((self.outputs.index(o), numbers[p], tuple(leaf[0]) if leaf else ()))
        return out

    def has_tuple_parameters(self) -> bool:
        return any(p.draw == "tuple" for p in self.parameters())

    def flat_aliased(self) -> set[int]:
        """The aliased parameters as the module translated to StableHLO has them (none when
        it has tuple parameters: see _for_xla)."""
        if self.has_tuple_parameters():
            return set()
        return {p for _, p in self.live_aliases()}

    def must_numbers(self) -> set[int]:
        """The parameter numbers aliased as must-alias (donation required)."""
        return {k for k, p in enumerate(self.parameters()) if p.name in self.must_alias}

    def _alias_text(self, keep: bool = True) -> str:
        triples = self.live_alias_leaves() if keep else []
        if not triples:
            return ""
        must = self.must_numbers()
        entries = ", ".join(f"{{{o}}}: ({p}, {{{','.join(map(str, leaf))}}}, "
                            f"{'must' if p in must else 'may'}-alias)"
                            for o, p, leaf in triples)  # fmt: skip
        return ", input_output_alias={ " + entries + " }"

    def _live(self) -> set[str]:
        by = self.by_name()
        live, todo = set(), list(self.outputs)
        while todo:
            n = todo.pop()
            if n in live:
                continue
            live.add(n)
            todo.extend(by[n].args)
        return live

    def parameters(self) -> list[Instr]:
        live = self._live()
        return [i for i in self.instrs if i.opcode == "parameter" and i.name in live]

    def arguments(self, seed: int | None = None) -> list[np.ndarray]:
        """Fresh arguments for the parameters, drawn from `seed` (the program's by default)."""
        rng = np.random.default_rng([self.seed if seed is None else seed, 7])
        return [
            tuple(draw(rng, how, dt, dims) for dt, dims, how in p.elements)
            if p.draw == "tuple"
            else draw(rng, p.draw, p.dtype, p.dims)
            for p in self.parameters()
        ]


def draw(rng: np.random.Generator, how: str, dtype: str, dims: tuple[int, ...]) -> np.ndarray:
    """An argument drawn as `how` says (see Instr)."""
    kind, *rest = how.split(":")
    if kind == "pred":
        return rng.random(dims) < 0.5
    if kind == "bits":  # any 64-bit pattern (an rng state)
        return rng.integers(0, 2**64, size=dims, dtype=np.uint64, endpoint=False)
    if kind == "small":  # a float array of few distinct integer values (sort keys with ties)
        lo, hi = int(rest[0]), int(rest[1])
        return rng.integers(lo, hi, size=dims, endpoint=True).astype(NP[dtype])
    if kind == "int":
        lo, hi = int(rest[0]), int(rest[1])
        return rng.integers(lo, hi, size=dims, endpoint=True, dtype=np.int64).astype(NP[dtype])
    mag = float(rest[0])
    lo = min(0.25, mag)

    def part():
        return rng.uniform(lo, mag, size=dims) * rng.choice([-1.0, 1.0], size=dims)

    if dtype in ("c64", "c128"):
        return (part() + 1j * part()).astype(NP[dtype])
    return part().astype(NP[dtype])


def _braces(xs) -> str:
    """An HLO integer list attribute or layout: {1,0,2}."""
    return "{" + ",".join(map(str, xs)) + "}"


def shape_text(dtype: str, dims: tuple[int, ...], layout: tuple[int, ...] | None = None) -> str:
    text = f"{dtype}[{','.join(map(str, dims))}]"
    if layout is not None:
        text += _braces(layout)
    return text


def _size(dims) -> int:
    return math.prod(dims)


# ---------------------------------------------------------------------------------------
# The generator


# The operation families the generator draws from, with their weights. A family is a method
# of _Gen of that name; `generate(seed, families=...)` (or XLAPY_FUZZ_FAMILIES, see
# `families_from_text`) turns families on and off or reweights them.
FAMILIES: dict[str, float] = {
    "unary": 10, "binary": 12, "compare": 4, "select": 3, "clamp": 1, "convert": 4,
    "bitcast": 2, "broadcast": 4, "reshape": 3, "transpose": 3, "slice": 3,
    "dynamic_slice": 2, "dus": 2, "concat": 2, "pad": 2, "reverse": 2, "iota": 1,
    "reduce": 5, "variadic_reduce": 2, "reduce_window": 3, "dot": 6, "conv": 3,
    "gather": 2, "scatter": 2, "sort": 2, "while_loop": 2, "conditional": 2, "tuple_gte": 1,
    # second round
    "rng_bits": 1.5, "threefry": 0.3, "fft": 1.5, "linalg": 2.5, "custom_call": 1,
    "nested_control": 1.5, "gather_general": 2, "scatter_general": 2,
    "select_and_scatter": 1.5, "sort_general": 1.5, "low_float_chain": 2, "layouts": 1.5,
}  # fmt: skip
# whole-program features, drawn once per program with these probabilities
FEATURES: dict[str, float] = {"alias": 0.25}


def families_from_text(text: str) -> dict[str, float]:
    """FAMILIES changed by `text`: comma-separated `name` (only the named families, at their
    weights), `-name` (all but it), `name=w` (reweighted); `all` is every family."""
    out = dict(FAMILIES, **FEATURES)
    items = [t.strip() for t in text.split(",") if t.strip()]
    only = [t for t in items if not t.startswith("-") and "=" not in t and t != "all"]
    if only:
        out = {n: (w if n in only else 0.0) for n, w in out.items()}
    for t in items:
        name = t.lstrip("-").split("=")[0]
        if name != "all" and name not in out:
            raise ValueError(f"unknown fuzzer family {name!r}; known: {sorted(out)}")
        if t.startswith("-"):
            out[name] = 0.0
        elif "=" in t:
            out[name] = float(t.split("=")[1])
    return out


class _Gen:
    def __init__(self, seed: int, families: dict[str, float] | None = None, cap=None):
        self.seed = seed
        self.rng = np.random.default_rng([seed, 1])
        self.families = {n: w for n, w in (families or FAMILIES).items() if n in FAMILIES}
        self.cap = cap
        self.xla_ok = True
        self.threefried = False
        self.instrs: list[Instr] = []
        self.comps: dict[str, str] = {}
        self.count = 0
        self.used: set[str] = set()

    # -- helpers ------------------------------------------------------------------------
    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}.{self.count}"

    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def emit(self, stem, dtype, dims, opcode, args, attrs="", *, mag=0.0, err=0.0, layout=None,
             shape=None, draw_how="") -> Instr:  # fmt: skip
        if shape is None:
            if layout is None and len(dims) >= 2 and self.chance(0.12):
                layout = tuple(int(d) for d in self.rng.permutation(len(dims)))
            shape = shape_text(dtype, dims, layout)
        ins = Instr(self.name(stem), shape, opcode, list(args), attrs, draw_how, mag, err, dtype,
                    tuple(dims))  # fmt: skip
        self.instrs.append(ins)
        self.used.update(args)
        if not mag <= LARGEST.get(dtype, math.inf) / 4:
            ins.hidden = True  # may overflow: two correct sides may disagree on infinities
        return ins

    def param(self, dtype: str, dims: tuple[int, ...], how: str | None = None) -> Instr:
        if how is None:
            how = default_draw(dtype, self.rng)
        mag = float(how.split(":")[1]) if how.startswith("float") else 0.0
        return self.emit("p", dtype, dims, "parameter", [], mag=mag, draw_how=how)

    def const(self, dtype: str, value) -> Instr:
        if dtype == "pred":
            text = "true" if value else "false"
        elif dtype == "c64":
            text = f"({float(value.real)!r}, {float(value.imag)!r})"
        elif dtype in FLOATS:
            text = repr(float(value))
        else:
            text = str(int(value))
        mag = abs(complex(value)) if dtype in (*FLOATS, "c64") else 0.0
        return self.emit("c", dtype, (), "constant", [], text, mag=mag, shape=f"{dtype}[]")

    def dims(self, rank: int | None = None, big: int = 6) -> tuple[int, ...]:
        if rank is None:
            rank = int(self.pick([0, 1, 1, 2, 2, 2, 3, 3, 4]))
        out = []
        for _ in range(rank):
            r = self.rng.random()
            if r > 0.95 and rank <= 2 and big >= 6:  # past a vector's width and its remainder
                out.append(self.size(7, 41))
                continue
            out.append(0 if r < 0.03 else 1 if r < 0.2 else self.size(2, big + 1))
        return tuple(out)

    def size(self, lo: int, hi: int) -> int:
        """A dimension drawn from [lo, hi), at most the cap (shape shrinking) and at least lo.
        The draw is made whatever the cap, so a capped program makes the same choices."""
        d = int(self.rng.integers(lo, hi))
        return d if self.cap is None else max(min(d, self.cap), min(lo, 1))

    def values(self, pred: Callable[[Instr], bool] = lambda i: True, leaves=False) -> list[Instr]:
        return [i for i in self.instrs if i.opcode != "constant" and i.dims is not None
                and not i.hidden and (leaves or not i.leaf) and pred(i)]  # fmt: skip

    def operand(self, pred: Callable[[Instr], bool] = lambda i: True, make=None) -> Instr | None:
        """A value of the pool that `pred` accepts, recent ones preferred; else `make()`."""
        pool = self.values(pred)
        if pool and (make is None or self.chance(0.75)):
            k = len(pool)
            idx = k - 1 - min(k - 1, int(self.rng.geometric(0.25)) - 1)
            return pool[idx]
        return make() if make is not None else None

    def any_array(self, dtypes=ALL, exact=False) -> Instr:
        def ok(i):
            return i.dtype in dtypes and (not exact or i.err == 0.0)

        def make():
            return self.param(self.pick(dtypes), self.dims())

        v = self.operand(ok, make)
        assert v is not None
        return v

    def like(self, v: Instr, exact=False, dtype=None) -> Instr:
        """A value of v's dims (and dtype unless given): from the pool or a new parameter."""
        dtype = dtype or v.dtype

        def ok(i):
            return i.dims == v.dims and i.dtype == dtype and (not exact or i.err == 0.0)

        got = self.operand(ok, lambda: self.param(dtype, v.dims))
        assert got is not None
        return got

    def scalar_index(self, lo=-2, hi=8) -> Instr:
        if self.chance(0.5):
            return self.const("s32", int(self.rng.integers(lo, hi)))
        return self.param("s32", (), f"int:{lo}:{hi}")

    def reducer(self, kind: str, dtype: str) -> str:
        name = f"{kind}_{dtype}"
        if name not in self.comps:
            s = f"{dtype}[]"
            self.comps[name] = (
                f"%{name} (a: {s}, b: {s}) -> {s} {{\n  %a = {s} parameter(0)\n"
                f"  %b = {s} parameter(1)\n  ROOT %r = {s} {kind}(%a, %b)\n}}"
            )
        return name

    # -- operations -----------------------------------------------------------------------
    def step(self) -> None:
        names = [n for n, w in self.families.items() if w > 0]
        weights = np.array([self.families[n] for n in names], dtype=float)
        name = names[int(self.rng.choice(len(names), p=weights / weights.sum()))]
        getattr(self, name)()

    def unary(self) -> None:
        v = self.any_array()
        dt = v.dtype
        if dt == "pred":
            self.emit("not", dt, v.dims, "not", [v.name])
            return
        if dt in INTS:
            ops = ["negate", "abs", "not", "popcnt", "count-leading-zeros", "sign"]
            if dt.startswith("u"):
                ops = [o for o in ops if o not in ("abs", "sign")]  # signed only in StableHLO
            self.emit("u", dt, v.dims, self.pick(ops), [v.name])
            return
        if dt == "c64":
            op = self.pick(["negate", "exponential", "abs", "real", "imag", "sqrt"])
            if op == "exponential" and v.mag > 6:
                op = "negate"
            if op == "sqrt" and v.err:
                op = "negate"
            if op in ("abs", "real", "imag"):
                self.emit("u", "f32", v.dims, op, [v.name], mag=v.mag,
                          err=v.err + EPS["f32"] * v.mag * 4)  # fmt: skip
            elif op == "exponential":
                m = math.exp(v.mag)
                self.emit("u", dt, v.dims, op, [v.name], mag=m,
                          err=m * v.err * 2 + 16 * EPS["c64"] * m)  # fmt: skip
            elif op == "sqrt":
                m = math.sqrt(v.mag)
                self.emit("u", dt, v.dims, op, [v.name], mag=m, err=16 * EPS["c64"] * m)
            else:
                self.emit("u", dt, v.dims, op, [v.name], mag=v.mag, err=v.err)
            return
        eps = EPS[dt]
        exact_only = ["floor", "ceil", "round-nearest-even", "round-nearest-afz", "sign",
                      "sqrt", "rsqrt", "log", "cbrt", "log-plus-one", "is-finite"]  # fmt: skip
        lipschitz = ["tanh", "logistic", "sine", "cosine"]
        ops = ["negate", "abs", *lipschitz, "exponential", "exponential-minus-one"]
        if v.err == 0.0:
            ops += exact_only
        op = self.pick(ops)
        m = v.mag
        if op in ("exponential", "exponential-minus-one") and m > 6:
            op = "tanh"
        if op in ("negate", "abs"):
            self.emit("u", dt, v.dims, op, [v.name], mag=m, err=v.err)
        elif op in ("floor", "ceil", "round-nearest-even", "round-nearest-afz"):
            self.emit("u", dt, v.dims, op, [v.name], mag=m + 1)
        elif op == "sign":
            self.emit("u", dt, v.dims, op, [v.name], mag=1.0)
        elif op == "is-finite":
            self.emit("u", "pred", v.dims, op, [v.name])
        elif op in lipschitz:
            self.emit("u", dt, v.dims, op, [v.name], mag=1.0, err=v.err + 8 * eps * max(1.0, m))
        elif op in ("exponential", "exponential-minus-one"):
            e = math.exp(m)
            self.emit("u", dt, v.dims, op, [v.name], mag=e, err=e * v.err * 1.01 + 8 * eps * e)
        else:  # exact-input functions: sqrt rsqrt log cbrt log1p
            bound = {"sqrt": math.sqrt(m), "rsqrt": 2.0, "cbrt": m ** (1 / 3) + 1,
                     "log": abs(math.log(max(m, 1e-30))) + 1.5,
                     "log-plus-one": abs(math.log1p(m)) + 1.5}[op]  # fmt: skip
            self.emit("u", dt, v.dims, op, [v.name], mag=bound, err=8 * eps * bound)

    def binary(self) -> None:
        a = self.any_array()
        dt = a.dtype
        if dt == "pred":
            b = self.like(a)
            self.emit("b", dt, a.dims, self.pick(["and", "or", "xor"]), [a.name, b.name])
            return
        if dt in INTS:
            op = self.pick(["add", "subtract", "multiply", "divide", "remainder", "maximum",
                            "minimum", "and", "or", "xor", "shift-left", "shift-right-logical",
                            "shift-right-arithmetic", "power"])  # fmt: skip
            b = self.like(a)
            if op == "power":
                # exponents below 64: XLA:CPU squares for the exponent's low 6 bits only (a
                # larger one "overflows anyway"), so u32 79^79 is 79^15 there, while the
                # interpreter and the CPU backend give the exact wrapped power
                b = self.param(dt, a.dims, "int:-2:63" if dt[0] == "s" else "int:0:63")
            self.emit("b", dt, a.dims, op, [a.name, b.name])
            return
        eps = EPS[dt]
        ops = ["add", "subtract", "multiply", "maximum", "minimum"]
        if dt != "c64":
            ops += ["divide", "remainder", "power", "atan2"]
        else:
            ops += ["divide"]
        op = self.pick(ops)
        if op in ("remainder", "power", "atan2") and a.err:
            op = "add"
        exact = op in ("divide", "remainder", "power", "atan2")
        b = self.like(a, exact=exact)
        ma, mb, ea, eb = a.mag, b.mag, a.err, b.err
        if op in ("add", "subtract"):
            m = ma + mb
            self.emit("b", dt, a.dims, op, [a.name, b.name], mag=m, err=ea + eb + eps * m)
        elif op == "multiply":
            m = ma * mb
            self.emit("b", dt, a.dims, op, [a.name, b.name], mag=m,
                      err=ea * mb + eb * ma + ea * eb + 2 * eps * m)  # fmt: skip
        elif op in ("maximum", "minimum"):
            self.emit("b", dt, a.dims, op, [a.name, b.name], mag=max(ma, mb), err=max(ea, eb))
        elif op == "divide":
            # exact divisors are 0 or at least 0.25 in magnitude (see module docstring)
            m = ma * 4 * (2 if dt == "c64" else 1)
            self.emit("b", dt, a.dims, op, [a.name, b.name], mag=m, err=ea * 8 + 4 * eps * m)
        elif op == "remainder":
            self.emit("b", dt, a.dims, op, [a.name, b.name], mag=max(ma, mb), err=0.0)
        elif op == "atan2":
            self.emit("b", dt, a.dims, op, [a.name, b.name], mag=3.2, err=16 * eps * 3.2)
        else:  # power of exact values: at most 16^4
            if ma > 4 or mb > 4:
                self.emit("b", dt, a.dims, "maximum", [a.name, b.name], mag=max(ma, mb))
                return
            m = max(ma, 4.0) ** mb
            self.emit("b", dt, a.dims, op, [a.name, b.name], mag=m, err=64 * eps * m)

    def compare(self) -> None:
        a = self.any_array(exact=True)
        b = self.like(a, exact=True)
        dirs = ["EQ", "NE"] if a.dtype in ("c64", "pred") else ["EQ", "NE", "LT", "LE", "GT", "GE"]
        attrs = f"direction={self.pick(dirs)}"
        if a.dtype in FLOATS and self.chance(0.3):
            attrs += ", type=TOTALORDER"
        self.emit("cmp", "pred", a.dims, "compare", [a.name, b.name], attrs)

    def select(self) -> None:
        a = self.any_array()
        b = self.like(a)
        if self.chance(0.2):
            p = self.const("pred", self.chance(0.5))
        else:
            p = self.like(a, dtype="pred")
        self.emit("sel", a.dtype, a.dims, "select", [p.name, a.name, b.name],
                  mag=max(a.mag, b.mag), err=max(a.err, b.err))  # fmt: skip

    def clamp(self) -> None:
        x = self.any_array(dtypes=(*FLOATS, *INTS))
        if self.chance(0.5):
            lo = self.const(x.dtype, -1 if x.dtype[0] != "u" else 1)
            hi = self.const(x.dtype, 2)
        else:
            lo, hi = self.like(x), self.like(x)
        self.emit("clamp", x.dtype, x.dims, "clamp", [lo.name, x.name, hi.name],
                  mag=max(x.mag, lo.mag, hi.mag), err=max(x.err, lo.err, hi.err))  # fmt: skip

    def convert(self) -> None:
        v = self.any_array()
        to = self.pick([t for t in ALL if t != v.dtype])
        if v.dtype == "c64" and to != "c64":
            to = "c64"  # complex -> real convert is not allowed in HLO; keep it complex
            return
        if v.dtype in FLOATS and to in (*INTS, "pred") and v.err:
            to = "f64"
        if to == v.dtype:
            return
        if to in (*FLOATS, "c64"):
            if v.dtype in (*FLOATS, "c64"):
                m = v.mag
            elif v.dtype == "pred":
                m = 1.0
            else:
                m = float(2 ** BITS[v.dtype])
            err = v.err + EPS[to] * m if (v.err or _narrower(to, v.dtype)) else 0.0
            self.emit("cvt", to, v.dims, "convert", [v.name], mag=m, err=err)
        else:
            self.emit("cvt", to, v.dims, "convert", [v.name])

    def bitcast(self) -> None:
        v = self.any_array(dtypes=(*FLOATS, *INTS), exact=True)
        bits = BITS[v.dtype]
        same = [t for t in (*FLOATS, *INTS) if BITS[t] == bits and t != v.dtype]
        other = [t for t in (*FLOATS, *INTS) if BITS[t] != bits and t != "f64"]
        if same and (self.chance(0.6) or not v.dims):
            to, dims = self.pick(same), v.dims
        else:
            to = self.pick(other)
            ratio = BITS[to] / bits
            if ratio < 1:
                dims = (*v.dims, round(1 / ratio))
            else:
                if not v.dims or v.dims[-1] != int(ratio):
                    return
                dims = v.dims[:-1]
        if _size(dims) > MAX_ELEMENTS:
            return
        raw = self.emit("bc", to, dims, "bitcast-convert", [v.name])
        if to not in FLOATS:
            return
        raw.hidden = True
        # keep the float bit patterns that are normal and moderate (no subnormals, whose
        # flushing XLA:CPU and the interpreter treat differently; no NaN/inf; |x| in [2^-6, 2^6])
        s = f"{to}[]"
        lo = self.emit("c", to, (), "constant", [], repr(2.0**-6), shape=s)
        hi = self.emit("c", to, (), "constant", [], repr(2.0**6), shape=s)
        one = self.emit("c", to, (), "constant", [], "1", shape=s)
        b_lo = self.emit("bc", to, dims, "broadcast", [lo.name], "dimensions={}")
        b_hi = self.emit("bc", to, dims, "broadcast", [hi.name], "dimensions={}")
        b_one = self.emit("bc", to, dims, "broadcast", [one.name], "dimensions={}")
        mag = self.emit("abs", to, dims, "abs", [raw.name])
        mag.hidden = True
        ge = self.emit("cmp", "pred", dims, "compare", [mag.name, b_lo.name], "direction=GE")
        le = self.emit("cmp", "pred", dims, "compare", [mag.name, b_hi.name], "direction=LE")
        ok = self.emit("and", "pred", dims, "and", [ge.name, le.name])
        self.emit("bcs", to, dims, "select", [ok.name, raw.name, b_one.name], mag=64.0)

    def broadcast(self) -> None:
        v = self.any_array()
        extra = self.dims(int(self.rng.integers(0, 3)), big=4)
        rank = len(v.dims) + len(extra)
        if rank > 5 or _size(v.dims) * _size(extra) > MAX_ELEMENTS:
            return
        where = sorted(int(x) for x in self.rng.choice(rank, size=len(v.dims), replace=False))
        dims, it_v, it_e = [], iter(v.dims), iter(extra)
        for d in range(rank):
            dims.append(next(it_v) if d in where else next(it_e))
        attrs = "dimensions={" + ",".join(map(str, where)) + "}"
        self.emit("bcast", v.dtype, tuple(dims), "broadcast", [v.name], attrs, mag=v.mag,
                  err=v.err)  # fmt: skip

    def reshape(self) -> None:
        v = self.any_array()
        n = _size(v.dims)
        if n == 0:
            dims = list(self.dims(int(self.rng.integers(1, 4))))
            dims[int(self.rng.integers(len(dims)))] = 0
        else:
            factors = _factors(n)
            self.rng.shuffle(factors)
            rank = int(self.rng.integers(0 if n == 1 else 1, 5))
            dims = [1] * max(rank, 1) if rank else []
            for f in factors:
                dims[int(self.rng.integers(len(dims)))] *= f
            if self.chance(0.3):
                dims.insert(int(self.rng.integers(len(dims) + 1)), 1)
        self.emit("rs", v.dtype, tuple(dims), "reshape", [v.name], mag=v.mag, err=v.err)

    def transpose(self) -> None:
        v = self.any_array()
        if len(v.dims) < 2:
            return
        perm = [int(x) for x in self.rng.permutation(len(v.dims))]
        dims = tuple(v.dims[p] for p in perm)
        attrs = "dimensions={" + ",".join(map(str, perm)) + "}"
        self.emit("tr", v.dtype, dims, "transpose", [v.name], attrs, mag=v.mag, err=v.err)

    def slice(self) -> None:
        v = self.any_array()
        if not v.dims:
            return
        parts, dims = [], []
        for d in v.dims:
            start = int(self.rng.integers(0, d + 1))
            limit = int(self.rng.integers(start, d + 1))
            stride = int(self.pick([1, 1, 2, 3]))
            parts.append(f"[{start}:{limit}:{stride}]")
            dims.append(-(-(limit - start) // stride))
        attrs = "slice={" + ", ".join(parts) + "}"
        self.emit("sl", v.dtype, tuple(dims), "slice", [v.name], attrs, mag=v.mag, err=v.err)

    def dynamic_slice(self) -> None:
        v = self.any_array()
        if not v.dims:
            return
        sizes = tuple(int(self.rng.integers(0 if d == 0 else 1, d + 1)) for d in v.dims)
        idx = [self.scalar_index(-3, d + 3).name for d in v.dims]
        attrs = "dynamic_slice_sizes={" + ",".join(map(str, sizes)) + "}"
        self.emit("ds", v.dtype, sizes, "dynamic-slice", [v.name, *idx], attrs, mag=v.mag,
                  err=v.err)  # fmt: skip

    def dus(self) -> None:
        v = self.any_array()
        if not v.dims:
            return
        sizes = tuple(int(self.rng.integers(0, d + 1)) for d in v.dims)
        upd = self.operand(lambda i: i.dims == sizes and i.dtype == v.dtype,
                           lambda: self.param(v.dtype, sizes))  # fmt: skip
        assert upd is not None
        idx = [self.scalar_index(-3, d + 3).name for d in v.dims]
        self.emit("dus", v.dtype, v.dims, "dynamic-update-slice", [v.name, upd.name, *idx],
                  mag=max(v.mag, upd.mag), err=max(v.err, upd.err))  # fmt: skip

    def concat(self) -> None:
        v = self.any_array()
        if not v.dims:
            return
        axis = int(self.rng.integers(len(v.dims)))
        parts = [v]
        for _ in range(int(self.rng.integers(1, 3))):
            want = list(v.dims)
            want[axis] = int(self.rng.integers(0, 5))

            def ok(i, axis=axis):
                return (i.dtype == v.dtype and len(i.dims) == len(v.dims)
                        and all(a == b for k, (a, b) in enumerate(zip(i.dims, v.dims))
                                if k != axis))  # fmt: skip

            got = self.operand(ok, lambda want=want: self.param(v.dtype, tuple(want)))
            assert got is not None
            parts.append(got)
        dims = list(v.dims)
        dims[axis] = sum(p.dims[axis] for p in parts)
        if _size(dims) > MAX_ELEMENTS:
            return
        self.emit("cat", v.dtype, tuple(dims), "concatenate", [p.name for p in parts],
                  f"dimensions={{{axis}}}", mag=max(p.mag for p in parts),
                  err=max(p.err for p in parts))  # fmt: skip

    def pad(self) -> None:
        v = self.any_array()
        if not v.dims:
            return
        pv = self.const(v.dtype, 0 if v.dtype == "pred" else 1 if v.dtype == "c64" else 2)
        parts, dims = [], []
        for d in v.dims:
            interior = int(self.pick([0, 0, 1, 2]))
            lo = int(self.rng.integers(-2, 3))
            hi = int(self.rng.integers(-2, 3))
            full = d + max(d - 1, 0) * interior
            out = lo + hi + full
            if out < 0:
                lo, hi, out = 0, 0, full
            parts.append(f"{lo}_{hi}" + (f"_{interior}" if interior else ""))
            dims.append(out)
        if _size(dims) > MAX_ELEMENTS:
            return
        self.emit("pad", v.dtype, tuple(dims), "pad", [v.name, pv.name],
                  "padding=" + "x".join(parts), mag=max(v.mag, pv.mag), err=v.err)  # fmt: skip

    def reverse(self) -> None:
        v = self.any_array()
        if not v.dims:
            return
        k = int(self.rng.integers(1, len(v.dims) + 1))
        axes = sorted(int(x) for x in self.rng.choice(len(v.dims), size=k, replace=False))
        attrs = "dimensions={" + ",".join(map(str, axes)) + "}"
        self.emit("rev", v.dtype, v.dims, "reverse", [v.name], attrs, mag=v.mag, err=v.err)

    def iota(self) -> None:
        dims = self.dims(int(self.rng.integers(1, 4)))
        dt = self.pick(["s32", "f32", "u8", "f16", "s8", "bf16", "f64", "u32"])
        axis = int(self.rng.integers(len(dims)))
        m = float(dims[axis])
        self.emit("iota", dt, dims, "iota", [], f"iota_dimension={axis}", mag=m)

    def reduce(self) -> None:
        v = self.any_array()
        if not v.dims:
            return
        k = int(self.rng.integers(1, len(v.dims) + 1))
        axes = sorted(int(x) for x in self.rng.choice(len(v.dims), size=k, replace=False))
        dims = tuple(d for i, d in enumerate(v.dims) if i not in axes)
        n = max(1, _size([v.dims[a] for a in axes]))
        dt = v.dtype
        if dt == "pred":
            kind, init = self.pick([("and", True), ("or", False)])
        elif dt == "c64":
            kind, init = "add", 0
        else:
            kind = self.pick(["add", "maximum", "minimum", "add", "multiply"] if dt in INTS
                             else ["add", "maximum", "minimum", "add"])  # fmt: skip
            init = _identity(kind, dt)
        c = self.const(dt, init)
        comp = self.reducer(kind, dt)
        attrs = "dimensions={" + ",".join(map(str, axes)) + "}, to_apply=%" + comp
        if kind == "add" and dt in (*FLOATS, "c64"):
            m = n * v.mag
            self.emit("red", dt, dims, "reduce", [v.name, c.name], attrs, mag=m,
                      err=n * v.err + n * EPS[dt] * m)  # fmt: skip
        else:
            self.emit("red", dt, dims, "reduce", [v.name, c.name], attrs,
                      mag=max(v.mag, 100.0) if dt in FLOATS else 0.0, err=v.err)  # fmt: skip

    def variadic_reduce(self) -> None:
        v = self.any_array(dtypes=("f32", "s32", "f64", "bf16", "u8"), exact=True)
        if not v.dims:
            return
        axis = int(self.rng.integers(len(v.dims)))
        dims = tuple(d for i, d in enumerate(v.dims) if i != axis)
        idx = self.emit("iota", "s32", v.dims, "iota", [], f"iota_dimension={axis}")
        dt = v.dtype
        name = f"argmax_{dt}"
        s = f"{dt}[]"
        self.comps[name] = (
            f"%{name} (a0: {s}, a1: s32[], b0: {s}, b1: s32[]) -> ({s}, s32[]) {{\n"
            f"  %a0 = {s} parameter(0)\n  %a1 = s32[] parameter(1)\n"
            f"  %b0 = {s} parameter(2)\n  %b1 = s32[] parameter(3)\n"
            f"  %gt = pred[] compare(%a0, %b0), direction=GT\n"
            f"  %eq = pred[] compare(%a0, %b0), direction=EQ\n"
            f"  %lt = pred[] compare(%a1, %b1), direction=LT\n"
            f"  %tie = pred[] and(%eq, %lt)\n  %pick = pred[] or(%gt, %tie)\n"
            f"  %v = {s} select(%pick, %a0, %b0)\n  %i = s32[] select(%pick, %a1, %b1)\n"
            f"  ROOT %t = ({s}, s32[]) tuple(%v, %i)\n}}"
        )
        init = self.const(dt, _identity("maximum", dt))
        zero = self.const("s32", 0)
        tshape = f"({shape_text(dt, dims)}, {shape_text('s32', dims)})"
        r = self.emit("argmax", dt, dims, "reduce", [v.name, idx.name, init.name, zero.name],
                      f"dimensions={{{axis}}}, to_apply=%{name}", shape=tshape)  # fmt: skip
        r.dims = None  # type: ignore[assignment]  # a tuple: not an array operand
        self.emit("gte", dt, dims, "get-tuple-element", [r.name], "index=0",
                  shape=shape_text(dt, dims), mag=max(v.mag, 1.0))  # fmt: skip
        self.emit("gte", "s32", dims, "get-tuple-element", [r.name], "index=1",
                  shape=shape_text("s32", dims))  # fmt: skip

    def reduce_window(self) -> None:
        v = self.any_array(dtypes=(*FLOATS, "s32", "u8"))
        if not v.dims:
            return
        if self.chance(0.3):
            self.prefix_scan(v)
            return
        sizes, strides, pads, out, base, win = [], [], [], [], [], []
        for d in v.dims:
            s = int(self.rng.integers(1, min(d, 3) + 1)) if d else 1
            st = int(self.pick([1, 1, 2]))
            lo, hi = int(self.pick([0, 0, 1])), int(self.pick([0, 0, 1]))
            bd = int(self.pick([1, 1, 1, 2]))
            wd = int(self.pick([1, 1, 1, 2]))
            dil_in = (d - 1) * bd + 1 if d else 0
            eff = (s - 1) * wd + 1
            span = dil_in + lo + hi
            o = (span - eff) // st + 1 if span >= eff else 0
            sizes.append(s), strides.append(st), pads.append(f"{lo}_{hi}")
            base.append(bd), win.append(wd), out.append(o)
        kind = self.pick(["add", "maximum", "minimum"])
        c = self.const(v.dtype, _identity(kind, v.dtype))
        j = "x".join
        window = f"size={j(map(str, sizes))} stride={j(map(str, strides))} pad={j(pads)}"
        if any(b > 1 for b in base):
            window += f" lhs_dilate={j(map(str, base))}"
        if any(w > 1 for w in win):
            window += f" rhs_dilate={j(map(str, win))}"
        n = _size(sizes)
        comp = self.reducer(kind, v.dtype)
        m = n * v.mag if kind == "add" else max(v.mag, 100.0)
        err = (n * v.err + n * EPS.get(v.dtype, 0) * m) if kind == "add" else v.err
        self.emit("rw", v.dtype, tuple(out), "reduce-window", [v.name, c.name],
                  f"window={{{window}}}, to_apply=%{comp}", mag=m, err=err)  # fmt: skip

    def prefix_scan(self, v: Instr) -> None:
        """A cumulative sum/max/min along one axis, either direction, written as JAX writes
        it: a reduce-window whose window spans the axis, padded by its length less one (the
        CPU backend's scan rewrite and native scan kernel)."""
        axis = int(self.rng.integers(len(v.dims)))
        n = v.dims[axis]
        if n == 0:
            return
        kind = self.pick(["add", "add", "maximum", "minimum"])
        sizes = [n if k == axis else 1 for k in range(len(v.dims))]
        pad = f"{n - 1}_0" if self.chance(0.5) else f"0_{n - 1}"
        pads = [pad if k == axis else "0_0" for k in range(len(v.dims))]
        c = self.const(v.dtype, _identity(kind, v.dtype))
        window = f"size={'x'.join(map(str, sizes))} pad={'x'.join(pads)}"
        m = n * v.mag if kind == "add" else max(v.mag, 100.0)
        err = (n * v.err + n * EPS.get(v.dtype, 0) * m) if kind == "add" else v.err
        comp = self.reducer(kind, v.dtype)
        self.emit("scan", v.dtype, v.dims, "reduce-window", [v.name, c.name],
                  f"window={{{window}}}, to_apply=%{comp}", mag=m, err=err)  # fmt: skip

    def dot(self) -> None:
        dt = self.pick(["f32", "f32", "f32", "f64", "f16", "bf16", "s32", "s8", "c64"])
        nb = int(self.pick([0, 0, 1, 1, 2]))
        nk = int(self.pick([0, 1, 1, 1, 2]))
        nm, nn = int(self.pick([0, 1, 1, 2])), int(self.pick([0, 1, 1, 2]))
        big = self.chance(0.15)

        def side(k):
            return [self.size(1, 40 if big else 17) for _ in range(k)]

        batch = [self.size(1, 4) for _ in range(nb)]
        contract = [self.size(1, 48 if big else 20) for _ in range(nk)]
        m, n = side(nm), side(nn)
        if _size(batch) * max(_size(m), _size(n)) * _size(contract) > 40000:
            return
        if _size(batch) * _size(m) * _size(n) > MAX_ELEMENTS * 2:
            return

        def arrange(free):
            kinds = ["b"] * nb + ["k"] * nk + ["f"] * len(free)
            self.rng.shuffle(kinds)
            dims, bpos, kpos = [], [], []
            bi, ki, fi = iter(batch), iter(contract), iter(free)
            for pos, kd in enumerate(kinds):
                if kd == "b":
                    dims.append(next(bi)), bpos.append(pos)
                elif kd == "k":
                    dims.append(next(ki)), kpos.append(pos)
                else:
                    dims.append(next(fi))
            return tuple(dims), bpos, kpos

        ldims, lb, lk = arrange(m)
        rdims, rb, rk = arrange(n)
        how = "int:-20:20" if dt in ("s32", "s8") else None
        lhs = self.operand(lambda i: i.dims == ldims and i.dtype == dt,
                           lambda: self.param(dt, ldims, how))  # fmt: skip
        rhs = self.operand(lambda i: i.dims == rdims and i.dtype == dt,
                           lambda: self.param(dt, rdims, how))  # fmt: skip
        assert lhs is not None and rhs is not None
        out_dt = dt
        if dt in ("f16", "bf16") and self.chance(0.4):
            out_dt = "f32"
        if dt == "s8":
            out_dt = "s32"

        attrs = (f"lhs_batch_dims={_braces(lb)}, lhs_contracting_dims={_braces(lk)}, "
                 f"rhs_batch_dims={_braces(rb)}, rhs_contracting_dims={_braces(rk)}")  # fmt: skip
        k = max(1, _size(contract))
        dims = (*batch, *m, *n)
        if out_dt in INTS:
            self.emit("dot", out_dt, dims, "dot", [lhs.name, rhs.name], attrs)
            return
        mag = k * lhs.mag * rhs.mag
        err = k * (lhs.err * rhs.mag + rhs.err * lhs.mag + lhs.err * rhs.err)
        err += (k + 2) * EPS[out_dt] * mag
        self.emit("dot", out_dt, dims, "dot", [lhs.name, rhs.name], attrs, mag=mag, err=err)

    def conv(self) -> None:
        dt = self.pick(["f32", "f32", "f32", "f64", "f16", "bf16"])
        nd = int(self.pick([1, 2, 2]))
        groups = int(self.pick([1, 1, 1, 2, 3]))
        b = int(self.pick([1, 1, 2, 3]))
        cin = groups * self.size(1, 4)
        cout = groups * self.size(1, 4)
        spatial = [self.size(1, 9) for _ in range(nd)]
        ksize = [int(self.rng.integers(1, 4)) for _ in range(nd)]
        stride = [int(self.pick([1, 1, 2])) for _ in range(nd)]
        rdil = [int(self.pick([1, 1, 1, 2])) for _ in range(nd)]
        ldil = [int(self.pick([1, 1, 1, 1, 2])) for _ in range(nd)]
        pads = [(int(self.pick([0, 0, 1, 2, -1])), int(self.pick([0, 0, 1, 2]))) for _ in range(nd)]
        out = []
        for s, k, st, rd, ld, (lo, hi) in zip(
            spatial, ksize, stride, rdil, ldil, pads, strict=True
        ):
            span = (s - 1) * ld + 1 + lo + hi
            eff = (k - 1) * rd + 1
            if span < eff:
                return
            out.append((span - eff) // st + 1)
        sp = "".join("0123"[:nd])
        layout = self.pick(["b{s}f_{s}io->b{s}f", "bf{s}_oi{s}->bf{s}", "f{s}b_i{s}o->{s}bf"])
        labels = layout.format(s=sp)
        lhs_part, rest = labels.split("_")
        rhs_part, out_part = rest.split("->")
        sizes_l = {"b": b, "f": cin, **{sp[i]: spatial[i] for i in range(nd)}}
        sizes_r = {"i": cin // groups, "o": cout, **{sp[i]: ksize[i] for i in range(nd)}}
        sizes_o = {"b": b, "f": cout, **{sp[i]: out[i] for i in range(nd)}}
        ldims = tuple(sizes_l[c] for c in lhs_part)
        rdims = tuple(sizes_r[c] for c in rhs_part)
        odims = tuple(sizes_o[c] for c in out_part)
        if _size(odims) > MAX_ELEMENTS * 2:
            return
        lhs = self.operand(lambda i: i.dims == ldims and i.dtype == dt,
                           lambda: self.param(dt, ldims))  # fmt: skip
        rhs = self.operand(lambda i: i.dims == rdims and i.dtype == dt,
                           lambda: self.param(dt, rdims))  # fmt: skip
        assert lhs is not None and rhs is not None
        j = "x".join
        window = f"size={j(map(str, ksize))}"
        if any(s > 1 for s in stride):
            window += f" stride={j(map(str, stride))}"
        if any(p != (0, 0) for p in pads):
            window += " pad=" + j(f"{lo}_{hi}" for lo, hi in pads)
        if any(d > 1 for d in ldil):
            window += f" lhs_dilate={j(map(str, ldil))}"
        if any(d > 1 for d in rdil):
            window += f" rhs_dilate={j(map(str, rdil))}"
        attrs = f"window={{{window}}}, dim_labels={labels}"
        if groups > 1:
            attrs += f", feature_group_count={groups}"
        k = (cin // groups) * _size(ksize)
        mag = k * lhs.mag * rhs.mag
        err = k * (lhs.err * rhs.mag + rhs.err * lhs.mag + lhs.err * rhs.err)
        err += (k + 2) * EPS[dt] * mag
        self.emit("conv", dt, odims, "convolution", [lhs.name, rhs.name], attrs, mag=mag, err=err)

    def gather(self) -> None:
        v = self.any_array(dtypes=(*FLOATS, *INTS, "pred"))
        if not v.dims or v.dims[0] == 0:
            return
        k = int(self.rng.integers(1, 6))
        idx = self.param("s32", (k, 1), f"int:-1:{v.dims[0]}")
        rest = v.dims[1:]
        rank = len(v.dims)
        if self.chance(0.6):
            offs = ",".join(str(i) for i in range(1, rank))
            attrs = (
                f"offset_dims={{{offs}}}, collapsed_slice_dims={{0}}, start_index_map={{0}}, "
                f"index_vector_dim=1, slice_sizes={{1{''.join(f',{d}' for d in rest)}}}"
            )
            dims = (k, *rest)
        else:
            w = int(self.rng.integers(1, v.dims[0] + 1))
            offs = ",".join(str(i) for i in range(1, rank + 1))
            attrs = (
                f"offset_dims={{{offs}}}, collapsed_slice_dims={{}}, start_index_map={{0}}, "
                f"index_vector_dim=1, slice_sizes={{{w}{''.join(f',{d}' for d in rest)}}}"
            )
            dims = (k, w, *rest)
        if _size(dims) > MAX_ELEMENTS:
            return
        self.emit("gather", v.dtype, dims, "gather", [v.name, idx.name], attrs, mag=v.mag,
                  err=v.err)  # fmt: skip

    def scatter(self) -> None:
        v = self.any_array(dtypes=("f32", "f64", "s32", "f16", "u8"))
        if not v.dims or v.dims[0] == 0:
            return
        k = int(self.rng.integers(1, 6))
        idx = self.param("s32", (k, 1), f"int:-1:{v.dims[0]}")
        rest = v.dims[1:]
        upd_dims = (k, *rest)
        upd = self.operand(lambda i: i.dims == upd_dims and i.dtype == v.dtype,
                           lambda: self.param(v.dtype, upd_dims))  # fmt: skip
        assert upd is not None
        kind = self.pick(["add", "maximum", "minimum"])
        comp = self.reducer(kind, v.dtype)
        uwd = ",".join(str(i) for i in range(1, len(v.dims)))
        attrs = (
            f"update_window_dims={{{uwd}}}, inserted_window_dims={{0}}, "
            f"scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply=%{comp}"
        )
        if kind == "add":
            m = v.mag + k * upd.mag
            err = v.err + k * upd.err + (k + 1) * EPS.get(v.dtype, 0) * m
        else:
            m, err = max(v.mag, upd.mag), max(v.err, upd.err)
        self.emit("scatter", v.dtype, v.dims, "scatter", [v.name, idx.name, upd.name], attrs,
                  mag=m, err=err)  # fmt: skip

    def sort(self) -> None:
        keys = self.any_array(dtypes=(*FLOATS, "s32", "u8", "s8", "u32"), exact=True)
        if not keys.dims:
            return
        axis = int(self.rng.integers(len(keys.dims)))
        two = self.chance(0.5)
        dt = keys.dtype
        s = f"{dt}[]"
        direction = self.pick(["LT", "GT"])
        order = ", type=TOTALORDER" if dt in FLOATS else ""
        ops = [keys]
        params = [f"%a = {s} parameter(0)", f"%b = {s} parameter(1)"]
        if two:
            other = self.like(keys, dtype=self.pick(["f32", "s32"]))
            ops.append(other)
            t = f"{other.dtype}[]"
            params += [f"%c = {t} parameter(2)", f"%d = {t} parameter(3)"]
        name = f"cmp_{'_'.join(o.dtype for o in ops)}_{direction}"
        sig = ", ".join(p.split(" = ")[0][1:] + ": " + p.split(" = ")[1].split(" ")[0]
                        for p in params)  # fmt: skip
        self.comps[name] = (
            f"%{name} ({sig}) -> pred[] {{\n"
            + "".join(f"  {p}\n" for p in params)
            + f"  ROOT %r = pred[] compare(%a, %b), direction={direction}{order}\n}}"
        )
        attrs = f"dimensions={{{axis}}}, is_stable=true, to_apply=%{name}"
        if not two:
            self.emit("sort", dt, keys.dims, "sort", [keys.name], attrs, mag=keys.mag)
            return
        o = ops[1]
        tshape = f"({shape_text(dt, keys.dims)}, {shape_text(o.dtype, o.dims)})"
        r = self.emit("sort", dt, keys.dims, "sort", [keys.name, o.name], attrs, shape=tshape)
        r.dims = None  # type: ignore[assignment]
        self.emit("gte", dt, keys.dims, "get-tuple-element", [r.name], "index=0",
                  shape=shape_text(dt, keys.dims), mag=keys.mag)  # fmt: skip
        self.emit("gte", o.dtype, o.dims, "get-tuple-element", [r.name], "index=1",
                  shape=shape_text(o.dtype, o.dims), mag=o.mag, err=o.err)  # fmt: skip

    def while_loop(self) -> None:
        """i from a start, while i < n: buf[i] = f(src[i]) (+ an accumulator)."""
        dt = self.pick(["f32", "f32", "f64", "s32", "f16", "bf16"])
        rows = self.size(1, 7)
        width = self.size(1, 9)
        bshape = shape_text(dt, (rows, width))
        rshape = shape_text(dt, (1, width))
        buf = self.operand(lambda i: i.dims == (rows, width) and i.dtype == dt,
                           lambda: self.param(dt, (rows, width)))  # fmt: skip
        src = self.operand(lambda i: i.dims == (rows, width) and i.dtype == dt,
                           lambda: self.param(dt, (rows, width)))  # fmt: skip
        assert buf is not None and src is not None
        n = int(self.rng.integers(0, rows + 2))
        op = self.pick(["add", "multiply", "maximum"])
        tag = self.name("loop")
        st = f"(s32[], {bshape}, {bshape}, {rshape})"
        self.comps[f"body.{tag}"] = (
            f"%body.{tag} (s: {st}) -> {st} {{\n  %s = {st} parameter(0)\n"
            f"  %i = s32[] get-tuple-element(%s), index=0\n"
            f"  %buf = {bshape} get-tuple-element(%s), index=1\n"
            f"  %src = {bshape} get-tuple-element(%s), index=2\n"
            f"  %acc = {rshape} get-tuple-element(%s), index=3\n"
            f"  %z = s32[] constant(0)\n"
            f"  %row = {rshape} dynamic-slice(%src, %i, %z), dynamic_slice_sizes={{1,{width}}}\n"
            f"  %old = {rshape} dynamic-slice(%buf, %i, %z), dynamic_slice_sizes={{1,{width}}}\n"
            f"  %new = {rshape} {op}(%row, %old)\n"
            f"  %buf2 = {bshape} dynamic-update-slice(%buf, %new, %i, %z)\n"
            f"  %acc2 = {rshape} add(%acc, %row)\n"
            f"  %one = s32[] constant(1)\n  %i2 = s32[] add(%i, %one)\n"
            f"  ROOT %t = {st} tuple(%i2, %buf2, %src, %acc2)\n}}"
        )
        self.comps[f"cond.{tag}"] = (
            f"%cond.{tag} (s: {st}) -> pred[] {{\n  %s = {st} parameter(0)\n"
            f"  %i = s32[] get-tuple-element(%s), index=0\n  %n = s32[] constant({n})\n"
            f"  ROOT %lt = pred[] compare(%i, %n), direction=LT\n}}"
        )
        start = self.const("s32", int(self.pick([0, 0, 1, -1])))
        zero = self.const(dt, 0)
        acc0 = self.emit("bcast", dt, (1, width), "broadcast", [zero.name], "dimensions={}",
                         shape=rshape)  # fmt: skip
        t = self.emit("init", dt, (), "tuple", [start.name, buf.name, src.name, acc0.name],
                      shape=st)  # fmt: skip
        t.dims = None  # type: ignore[assignment]
        w = self.emit("while", dt, (), "while", [t.name],
                      f"condition=%cond.{tag}, body=%body.{tag}", shape=st)  # fmt: skip
        w.dims = None  # type: ignore[assignment]
        it = n + 2
        eps = EPS.get(dt, 0.0)
        if op == "multiply":
            m = buf.mag * src.mag**1 if it else buf.mag
            m = buf.mag * src.mag
            err = buf.err * src.mag + src.err * buf.mag + 2 * eps * m
        elif op == "add":
            m = buf.mag + src.mag
            err = buf.err + src.err + eps * m
        else:
            m, err = max(buf.mag, src.mag), max(buf.err, src.err)
        self.emit("gte", dt, (rows, width), "get-tuple-element", [w.name], "index=1",
                  shape=bshape, mag=m, err=err)  # fmt: skip
        am = it * src.mag
        self.emit("gte", dt, (1, width), "get-tuple-element", [w.name], "index=3",
                  shape=rshape, mag=am, err=it * src.err + it * eps * am)  # fmt: skip

    def conditional(self) -> None:
        v = self.any_array(dtypes=(*FLOATS, "s32", "u8"))
        s = v.shape
        tag = self.name("branch")
        bodies = [("negate", 1.0), ("abs" if v.dtype[0] != "u" else "not", 1.0), ("add", 2.0)]
        names = []
        for k, (op, _) in enumerate(bodies):
            nm = f"{tag}.{k}"
            names.append(nm)
            expr = f"{op}(%x, %x)" if op == "add" else f"{op}(%x)"
            self.comps[nm] = (
                f"%{nm} (x: {s}) -> {s} {{\n  %x = {s} parameter(0)\n  ROOT %r = {s} {expr}\n}}"
            )
        eps = EPS.get(v.dtype, 0.0)
        m, err = 2 * v.mag, 2 * v.err + eps * 2 * v.mag
        if self.chance(0.5):
            idx = self.scalar_index(-1, 5)
            attrs = "branch_computations={" + ", ".join(f"%{n}" for n in names) + "}"
            self.emit("cond", v.dtype, v.dims, "conditional", [idx.name, v.name, v.name, v.name],
                      attrs, shape=s, mag=m, err=err)  # fmt: skip
        else:
            p = self.param("pred", ())
            attrs = f"true_computation=%{names[0]}, false_computation=%{names[2]}"
            self.emit("cond", v.dtype, v.dims, "conditional", [p.name, v.name, v.name], attrs,
                      shape=s, mag=m, err=err)  # fmt: skip

    def relayout(self, v_shape: str, dtype: str, dims) -> str:
        """`v_shape`, or (sometimes, rank >= 2) the same dims in another layout: HLO whose
        layouts disagree where buffers are shared is valid (XLA's layout assignment adds
        copies), and the CPU backend must not read such bytes in the wrong order."""
        if len(dims) < 2 or not self.chance(0.3):
            return v_shape
        return shape_text(dtype, dims, tuple(int(d) for d in self.rng.permutation(len(dims))))

    def tuple_gte(self) -> None:
        if self.chance(0.35):
            self.tuple_parameter()
            return
        a = self.any_array()
        b = self.any_array()
        sa, sb = self.relayout(a.shape, a.dtype, a.dims), self.relayout(b.shape, b.dtype, b.dims)
        t = self.emit("tup", a.dtype, (), "tuple", [a.name, b.name], shape=f"({sa}, {sb})")
        t.dims = None  # type: ignore[assignment]
        k, v = self.pick([(0, a), (1, b)])
        self.emit("gte", v.dtype, v.dims, "get-tuple-element", [t.name], f"index={k}",
                  shape=self.relayout(v.shape, v.dtype, v.dims), mag=v.mag,
                  err=v.err)  # fmt: skip

    def tuple_parameter(self) -> None:
        """A parameter of tuple shape (its elements in any layouts) read by
        get-tuple-elements that may declare other layouts."""
        elements = []
        for _ in range(int(self.rng.integers(1, 4))):
            dt, dims = self.pick(ALL), self.dims()
            elements.append((dt, dims, default_draw(dt, self.rng)))
        shapes = [self.relayout(shape_text(dt, dims), dt, dims) for dt, dims, _ in elements]
        p = self.emit("p", "", (), "parameter", [], shape="(" + ", ".join(shapes) + ")",
                      draw_how="tuple")  # fmt: skip
        p.dims = None  # type: ignore[assignment]
        p.elements = tuple(elements)
        for k, (dt, dims, how) in enumerate(elements):
            mag = float(how.split(":")[1]) if how.startswith("float") else 0.0
            self.emit("gte", dt, dims, "get-tuple-element", [p.name], f"index={k}",
                      shape=self.relayout(shapes[k], dt, dims), mag=mag)  # fmt: skip

    # -- second round: rng, fft, linalg, custom calls, nesting, general gather/scatter, ... --
    def rng_bits(self) -> None:
        """rng-bit-generator with each algorithm (bit-exact with XLA), over a fresh u64
        state, results of 8-64 bits; sometimes rng-get-and-update-state (once a program: two
        of them have no order between them)."""
        if self.chance(0.15) and not any(i.opcode == "rng-get-and-update-state"
                                         for i in self.instrs):  # fmt: skip
            delta = int(self.pick([1, 4, 256, 1 << 20]))
            self.emit("rngst", "u64", (2,), "rng-get-and-update-state", [], f"delta={delta}",
                      shape="u64[2]")  # fmt: skip
            self.instrs[-1].xla_skip = "rng-state"
            return
        algo = self.pick(["rng_three_fry", "rng_philox", "rng_default"])
        words = 3 if algo != "rng_three_fry" and self.chance(0.4) else 2
        state = self.param("u64", (words,), "bits")
        dt = self.pick(["u32", "u32", "u64", "u8", "s32", "u16", "s64"])
        dims = self.dims(int(self.pick([0, 1, 1, 2, 2, 3])))
        if _size(dims) > MAX_ELEMENTS:
            return
        s = f"u64[{words}]"
        r = self.emit("rbg", dt, dims, "rng-bit-generator", [state.name], f"algorithm={algo}",
                      shape=f"({s}, {shape_text(dt, dims)})")  # fmt: skip
        r.dims = None  # type: ignore[assignment]
        self.emit("gte", "u64", (words,), "get-tuple-element", [r.name], "index=0", shape=s)
        bits = self.emit("gte", dt, dims, "get-tuple-element", [r.name], "index=1",
                         shape=shape_text(dt, dims))  # fmt: skip
        bits.leaf = dt.startswith("s")  # KNOWN_DIFFERENCES["rng-signed"]
        if dt == "u32" and self.chance(0.5):
            # uniform floats in [1, 2) as jax.random makes them: (bits >> 9) | 0x3f800000
            nine = self.emit("c", "u32", (), "constant", [], "9", shape="u32[]")
            one = self.emit("c", "u32", (), "constant", [], str(0x3F800000), shape="u32[]")
            b9 = self.emit("bc", "u32", dims, "broadcast", [nine.name], "dimensions={}")
            b1 = self.emit("bc", "u32", dims, "broadcast", [one.name], "dimensions={}")
            sh = self.emit("shr", "u32", dims, "shift-right-logical", [bits.name, b9.name])
            o = self.emit("or", "u32", dims, "or", [sh.name, b1.name])
            self.emit("unif", "f32", dims, "bitcast-convert", [o.name], mag=2.0)

    def threefry(self) -> None:
        """Threefry-2x32 over u32 arrays written out as JAX emits jax.random's hash: 20
        rounds of add, rotate (shift-left | shift-right-logical) and xor, a key injection
        every 4 rounds (the key words and their parity 0x1BD11BDA). One a program: ~130
        instructions in one fusion, a second of LLVM."""
        if self.threefried:
            return
        self.threefried = True
        u = "u32"
        k0, k1 = self.param(u, (), "int:0:4294967295"), self.param(u, (), "int:0:4294967295")
        x0 = self.any_array(dtypes=("u32",))
        dims = x0.dims
        x1 = self.like(x0)

        def const(v: int) -> Instr:
            c = self.emit("c", u, (), "constant", [], str(v), shape="u32[]")
            return self.emit("bc", u, dims, "broadcast", [c.name], "dimensions={}")

        def bk(k: Instr) -> Instr:
            return self.emit("bk", u, dims, "broadcast", [k.name], "dimensions={}")

        def op(name: str, a: Instr, b: Instr) -> Instr:
            return self.emit("tf", u, dims, name, [a.name, b.name])

        parity = self.emit("c", u, (), "constant", [], str(0x1BD11BDA), shape="u32[]")
        kx = self.emit("kx", u, (), "xor", [k0.name, k1.name], shape="u32[]")
        ks = [k0, k1, self.emit("kx", u, (), "xor", [kx.name, parity.name], shape="u32[]")]
        rot = ((13, 15, 26, 6), (17, 29, 16, 24))
        a, b = op("add", x0, bk(ks[0])), op("add", x1, bk(ks[1]))
        for group in range(5):
            for r in rot[group % 2]:
                a = op("add", a, b)
                left = op("shift-left", b, const(r))
                right = op("shift-right-logical", b, const(32 - r))
                b = op("xor", op("or", left, right), a)
            a = op("add", a, bk(ks[(group + 1) % 3]))
            b = op("add", op("add", b, bk(ks[(group + 2) % 3])), const(group + 1))

    def fft(self) -> None:
        """fft of each type over the trailing 1-3 dimensions (IRFFT of an RFFT's result, so
        its input is a real signal's spectrum)."""
        kind = self.pick(["FFT", "IFFT", "RFFT", "IRFFT"])
        nd = int(self.pick([1, 1, 2, 3]))
        batch = self.dims(int(self.pick([0, 1, 1, 2])), big=3)
        lengths = tuple(self.size(1, 9) for _ in range(nd))
        dims = (*batch, *lengths)
        if _size(dims) > MAX_ELEMENTS or 0 in dims:
            return
        n = _size(lengths)

        def attrs(kind: str) -> str:
            return f"fft_type={kind}, fft_length={{{','.join(map(str, lengths))}}}"

        log = math.log2(n) + 1
        if kind in ("FFT", "IFFT"):
            v = self.operand(lambda i: i.dims == dims and i.dtype == "c64",
                             lambda: self.param("c64", dims))  # fmt: skip
            assert v is not None
            m = v.mag * n * 2 / (n if kind == "IFFT" else 1)
            err = v.err * n / (n if kind == "IFFT" else 1) + 8 * log * EPS["c64"] * v.mag * n
            self.emit("fft", "c64", dims, "fft", [v.name], attrs(kind), mag=m, err=err)
            return
        v = self.operand(lambda i: i.dims == dims and i.dtype == "f32",
                         lambda: self.param("f32", dims))  # fmt: skip
        assert v is not None
        half = (*batch, *lengths[:-1], lengths[-1] // 2 + 1)
        m = v.mag * n * 2
        err = v.err * n + 8 * log * EPS["f32"] * v.mag * n
        spec = self.emit("rfft", "c64", half, "fft", [v.name], attrs("RFFT"), mag=m,
                         err=err)  # fmt: skip
        if kind == "IRFFT":
            self.emit("irfft", "f32", dims, "fft", [spec.name], attrs("IRFFT"),
                      mag=m, err=err + 8 * log * EPS["f32"] * m)  # fmt: skip

    def linalg(self) -> None:
        """LAPACK custom calls as jax.numpy.linalg emits them on the CPU (typed FFI, the
        operand aliased to the first result, column-major {1,0}/{1,2,0} layouts, LAPACK's
        character options as ui8 attributes): potrf, trsm, getrf, geqrf + orgqr, syevd,
        gesdd. Factorizations whose results depend discontinuously on their input (pivots,
        eigenvector signs) take exactly computed operands; potrf and trsm get a diagonally
        dominant matrix built in the program."""
        dt = self.pick(["f32", "f32", "f64", "c64", "c128"])
        p = {"f32": "s", "f64": "d", "c64": "c", "c128": "z"}[dt]
        rdt = {"c64": "f32", "c128": "f64"}.get(dt, dt)  # eigenvalues, singular values
        first = len(self.instrs)
        routine = self.pick(["potrf", "trsm", "getrf", "geqrf", "syevd", "gesdd"])
        self.lapack(dt, p, rdt, routine)
        if dt == "c128":  # no other family takes c128 operands: its values are outputs only
            for ins in self.instrs[first:]:
                ins.leaf = ins.leaf or ins.dtype == "c128"

    def lapack(self, dt: str, p: str, rdt: str, routine: str) -> None:
        """One LAPACK call of `linalg` (dt's prefix p; rdt the real type of its eigenvalues
        and singular values): complex ones as jaxlib names them (c/z, heevd for syevd, ungqr
        for orgqr), with Hermitian matrices built in the program, eigenvectors and singular
        vectors of complex matrices not compared (each column's phase is arbitrary)."""
        cplx = dt != rdt
        batch = self.dims(int(self.pick([0, 0, 1, 1, 2])), big=3)
        if 0 in batch:
            return
        n = self.size(1, 7)
        m = n if routine in ("potrf", "trsm", "syevd") or self.chance(0.5) else self.size(1, 7)
        nb = len(batch)
        # JAX's column-major matrices: batch dimensions major, in order ({1,2,0}, {2,3,1,0});
        # jaxlib's kernels read batches in that physical order (KNOWN_DIFFERENCES)
        col = _braces([nb, nb + 1, *reversed(range(nb))])
        vec = _braces(reversed(range(nb + 1)))
        bat = _braces(reversed(range(nb))) if nb else ""  # XLA: no s32[]{}

        def sh(dtype: str, dims: tuple[int, ...], layout: str) -> str:
            return f"{dtype}[{','.join(map(str, dims))}]{layout}"

        mat = (*batch, m, n)
        common = ("api_version=API_VERSION_TYPED_FFI, "
                  f'frontend_attributes={{num_batch_dims="{nb}"}}')  # fmt: skip
        eps = EPS[dt]
        if routine in ("potrf", "trsm"):
            a = self.spd(dt, batch, n, rdt)
            uplo = self.pick([76, 85])  # 'L', 'U'
            if routine == "potrf":
                t = f"({sh(dt, mat, col)}, {sh('s32', batch, bat)})"
                attrs = (f'custom_call_target="lapack_{p}potrf_ffi", operand_layout_constraints='
                         f"{{{sh(dt, mat, col)}}}, output_to_operand_aliasing={{{{0}}: (0, {{}})}},"
                         f" {common}, backend_config={{uplo = {uplo} : ui8}}")  # fmt: skip
                r = self.emit("chol", dt, (), "custom-call", [a.name], attrs, shape=t)
                r.dims = None  # type: ignore[assignment]
                bound = math.sqrt(6 * n)
                self.emit("gte", dt, mat, "get-tuple-element", [r.name], "index=0",
                          shape=sh(dt, mat, col), mag=max(bound, a.mag),
                          err=a.err + 16 * n * eps * max(bound, a.mag))  # fmt: skip
                self.emit("gte", "s32", batch, "get-tuple-element", [r.name], "index=1",
                          shape=sh("s32", batch, bat))  # fmt: skip
                return
            k = self.size(1, 5)
            left = self.chance(0.5)
            bdims = (*batch, n, k) if left else (*batch, k, n)
            b = self.operand(lambda i: i.dims == bdims and i.dtype == dt,
                             lambda: self.param(dt, bdims, "float:2"))  # fmt: skip
            assert b is not None
            # non-unit diagonal ('N'): with the unit one, entries up to 2 grow the solution 3^n
            trans = self.pick([78, 84, 67] if cplx else [78, 84])  # 'N', 'T', 'C'
            side, diag = 76 if left else 82, 78
            attrs = (f'custom_call_target="lapack_{p}trsm_ffi", operand_layout_constraints='
                     f"{{{sh(dt, mat, col)}, {sh(dt, bdims, col)}}}, "
                     f"output_to_operand_aliasing={{{{}}: (1, {{}})}}, {common}, backend_config="
                     f"{{diag = {diag} : ui8, side = {side} : ui8, trans_x = {trans} : ui8, "
                     f"uplo = {uplo} : ui8}}")  # fmt: skip
            # the triangle's diagonal is at least 2n, its other entries at most 2 + err
            mag = b.mag / n * 2
            self.emit("trsm", dt, bdims, "custom-call", [a.name, b.name], attrs,
                      shape=sh(dt, bdims, col), mag=mag,
                      err=(b.err + a.err * mag) / n + 16 * n * eps * b.mag)  # fmt: skip
            return
        a = self.operand(lambda i: i.dims == mat and i.dtype == dt and i.err == 0.0,
                         lambda: self.param(dt, mat, "float:2"))  # fmt: skip
        assert a is not None
        mn = min(m, n)
        mode = 0
        big = 2 * max(m, n) * max(a.mag, 1.0)
        err = 64 * max(m, n) ** 2 * eps * big
        if routine == "syevd":
            if a.dims[-1] != a.dims[-2]:
                return
            mode, uplo = self.pick([86, 86, 78]), self.pick([76, 85])
            if cplx:  # a Hermitian operand (heevd reads one triangle: no matter which)
                a = self.hermitian(a, rdt)
            t = f"({sh(dt, mat, col)}, {sh(rdt, (*batch, n), vec)}, {sh('s32', batch, bat)})"
            name = "heevd" if cplx else "syevd"
            attrs = (f'custom_call_target="lapack_{p}{name}_ffi", operand_layout_constraints='
                     f"{{{sh(dt, mat, col)}}}, output_to_operand_aliasing={{{{0}}: (0, {{}})}}, "
                     f"{common}, backend_config={{mode = {mode} : ui8, "
                     f"uplo = {uplo} : ui8}}")  # fmt: skip
            vectors = 2.0 if mode == 86 and not cplx else -1.0
            outs = [(dt, mat, col, vectors), (rdt, (*batch, n), vec, big),
                    ("s32", batch, bat, 0.0)]  # fmt: skip
        elif routine == "getrf":
            t = f"({sh(dt, mat, col)}, {sh('s32', (*batch, mn), vec)}, {sh('s32', batch, bat)})"
            attrs = (f'custom_call_target="lapack_{p}getrf_ffi", operand_layout_constraints='
                     f"{{{sh(dt, mat, col)}}}, output_to_operand_aliasing={{{{0}}: (0, {{}})}}, "
                     f"{common}, backend_config={{}}")  # fmt: skip
            outs = [(dt, mat, col, big * 2.0**mn), ("s32", (*batch, mn), vec, 0.0),
                    ("s32", batch, bat, 0.0)]  # fmt: skip
        elif routine == "geqrf":
            t = f"({sh(dt, mat, col)}, {sh(dt, (*batch, mn), vec)})"
            attrs = (f'custom_call_target="lapack_{p}geqrf_ffi", operand_layout_constraints='
                     f"{{{sh(dt, mat, col)}}}, output_to_operand_aliasing={{{{0}}: (0, {{}})}}, "
                     f"{common}, backend_config={{}}")  # fmt: skip
            outs = [(dt, mat, col, big), (dt, (*batch, mn), vec, 2.0)]
        else:  # gesdd, full matrices
            t = (f"({sh(dt, mat, col)}, {sh(rdt, (*batch, mn), vec)}, "
                 f"{sh(dt, (*batch, m, m), col)}, {sh(dt, (*batch, n, n), col)}, "
                 f"{sh('s32', batch, bat)})")  # fmt: skip
            attrs = (f'custom_call_target="lapack_{p}gesdd_ffi", operand_layout_constraints='
                     f"{{{sh(dt, mat, col)}}}, output_to_operand_aliasing={{{{0}}: (0, {{}})}}, "
                     f"{common}, backend_config={{mode = 65 : ui8}}")  # fmt: skip
            vectors = -1.0 if cplx else 2.0
            outs = [(dt, mat, col, -1.0), (rdt, (*batch, mn), vec, big),
                    (dt, (*batch, m, m), col, vectors), (dt, (*batch, n, n), col, vectors),
                    ("s32", batch, bat, 0.0)]  # fmt: skip
        r = self.emit(routine, dt, (), "custom-call", [a.name], attrs, shape=t)
        r.dims = None  # type: ignore[assignment]
        gtes = []
        for k, (odt, odims, lay, omag) in enumerate(outs):
            g = self.emit("gte", odt, odims, "get-tuple-element", [r.name], f"index={k}",
                          shape=sh(odt, odims, lay), mag=max(omag, 0.0),
                          err=err * max(omag, 1.0) if odt != "s32" else 0.0)  # fmt: skip
            g.hidden = omag < 0  # gesdd's overwritten input: LAPACK leaves it unspecified
            gtes.append(g)
        vectors_at = {"syevd": [0] if mode == 86 else [], "gesdd": [2, 3]}.get(routine, [])
        for k in vectors_at if cplx else []:  # |entries|: free of each column's phase
            g = gtes[k]
            g.leaf = True  # the complex vectors stay out of the program (their phase is free)
            self.emit("absv", rdt, g.dims, "abs", [g.name], mag=1.0, err=2 * err)
        if routine == "geqrf" and m >= n:  # Q from the reflectors, as jnp.linalg.qr does
            qr, tau = gtes
            qname = "ungqr" if cplx else "orgqr"
            attrs = (f'custom_call_target="lapack_{p}{qname}_ffi", operand_layout_constraints='
                     f"{{{sh(dt, mat, col)}, {sh(dt, (*batch, mn), vec)}}}, "
                     f"output_to_operand_aliasing={{{{}}: (0, {{}})}}, {common}, "
                     f"backend_config={{}}")  # fmt: skip
            self.emit("orgqr", dt, mat, "custom-call", [qr.name, tau.name], attrs,
                      shape=sh(dt, mat, col), mag=2.0, err=err)  # fmt: skip

    def hermitian(self, a: Instr, rdt: str) -> Instr:
        """a + a^H (a + a^T for a real a), of a matrix batch `a`."""
        dt, dims, nb = a.dtype, a.dims, len(a.dims) - 2
        perm = [*range(nb), nb + 1, nb]
        at = self.emit("tr", dt, dims, "transpose", [a.name],
                       "dimensions={" + ",".join(map(str, perm)) + "}", mag=a.mag,
                       err=a.err)  # fmt: skip
        if dt != rdt:  # conjugate: complex(real, -imag), as JAX writes it
            re_ = self.emit("re", rdt, dims, "real", [at.name], mag=a.mag, err=a.err)
            im = self.emit("im", rdt, dims, "imag", [at.name], mag=a.mag, err=a.err)
            neg = self.emit("neg", rdt, dims, "negate", [im.name], mag=a.mag, err=a.err)
            at = self.emit("conj", dt, dims, "complex", [re_.name, neg.name], mag=a.mag,
                           err=a.err)  # fmt: skip
        m = 2 * a.mag * (math.sqrt(2) if dt != rdt else 1.0)  # |re + i im| <= sqrt 2 max
        return self.emit("sym", dt, dims, "add", [a.name, at.name], mag=m,
                         err=2 * a.err + 2 * EPS[dt] * m)  # fmt: skip

    def spd(self, dt: str, batch: tuple[int, ...], n: int, rdt: str | None = None) -> Instr:
        """A symmetric (Hermitian when complex), diagonally dominant matrix: a + a^H + 4n I
        (eigenvalues in [(4 - 2 sqrt 2) n, (4 + 2 sqrt 2) n] for entries of a with real and
        imaginary parts at most 1)."""
        dims = (*batch, n, n)
        a = self.param(dt, dims, "float:1")
        nb = len(batch)
        s = self.hermitian(a, rdt or dt)
        i0 = self.emit("iota", "s32", dims, "iota", [], f"iota_dimension={nb}")
        i1 = self.emit("iota", "s32", dims, "iota", [], f"iota_dimension={nb + 1}")
        eq = self.emit("cmp", "pred", dims, "compare", [i0.name, i1.name], "direction=EQ")
        real = dt == (rdt or dt)
        four = repr(4.0 * n) if real else f"({4.0 * n!r}, 0)"
        c = self.emit("c", dt, (), "constant", [], four, shape=f"{dt}[]")
        big = self.emit("bc", dt, dims, "broadcast", [c.name], "dimensions={}", mag=4.0 * n)
        zero = self.emit("c", dt, (), "constant", [], "0" if real else "(0, 0)",
                         shape=f"{dt}[]")  # fmt: skip
        zeros = self.emit("bc", dt, dims, "broadcast", [zero.name], "dimensions={}")
        diag = self.emit("sel", dt, dims, "select", [eq.name, big.name, zeros.name],
                         mag=4.0 * n)  # fmt: skip
        m = 4.0 * n + s.mag
        return self.emit("spd", dt, dims, "add", [s.name, diag.name], mag=m,
                         err=s.err + EPS[dt] * m)  # fmt: skip

    def custom_call(self) -> None:
        """Custom calls: the identity markers JAX emits (Sharding, which XLA knows too), and
        the fuzzer's own Python target `xlapy_fuzz.axpby` (a * x + y into the result aliased
        with y, output_to_operand_aliasing), which only xlapy runs."""
        v = self.any_array(dtypes=("f32", "f64", "s32", "bf16", "f16", "u8"))
        if self.chance(0.5):
            self.emit("shard", v.dtype, v.dims, "custom-call", [v.name],
                      'custom_call_target="Sharding", sharding={replicated}', mag=v.mag,
                      err=v.err)  # fmt: skip
            return
        register_fuzz_targets()
        y = self.like(v)
        scale = int(self.pick([-2, -1, 1, 2, 3]))
        attrs = (f'custom_call_target="xlapy_fuzz.axpby", output_to_operand_aliasing='
                 f'{{{{}}: (1, {{}})}}, backend_config="{scale}"')  # fmt: skip
        if v.dtype in FLOATS:
            m = abs(scale) * v.mag + y.mag
            err = abs(scale) * v.err + y.err + 4 * EPS[v.dtype] * m
        else:
            m, err = 0.0, 0.0
        self.xla_ok = False
        self.emit("axpby", v.dtype, v.dims, "custom-call", [v.name, y.name], attrs, mag=m,
                  err=err)  # fmt: skip

    def nested_control(self) -> None:
        """A while loop whose state nests tuples ((i, (buf, acc)), src), whose body runs a
        conditional returning a tuple and updates buf in place (dynamic-update-slice of a
        row picked by the conditional's branch), and whose body holds an inner counted
        while; exact operations only (max, min, negate, select), so any order agrees."""
        dt = self.pick(["f32", "s32", "f64", "bf16", "u8", "f16"])
        rows, width = self.size(1, 6), self.size(1, 7)
        bs, rs = shape_text(dt, (rows, width)), shape_text(dt, (1, width))
        buf = self.operand(lambda i: i.dims == (rows, width) and i.dtype == dt,
                           lambda: self.param(dt, (rows, width)))  # fmt: skip
        src = self.operand(lambda i: i.dims == (rows, width) and i.dtype == dt,
                           lambda: self.param(dt, (rows, width)))  # fmt: skip
        assert buf is not None and src is not None
        n = self.size(0, 2 * rows + 2)
        tag = self.name("nest")
        inner = f"({bs}, {rs})"
        st = f"((s32[], {inner}), {bs})"
        br = f"(s32[], {rs})"
        neg = "negate" if dt[0] != "u" else "not"
        self.comps[f"br0.{tag}"] = (
            f"%br0.{tag} (x: {br}) -> {br} {{\n  %x = {br} parameter(0)\n"
            f"  %r = {rs} get-tuple-element(%x), index=1\n  %k = s32[] get-tuple-element(%x), "
            f"index=0\n  %n = {rs} {neg}(%r)\n  ROOT %t = {br} tuple(%k, %n)\n}}"
        )
        self.comps[f"br1.{tag}"] = (
            f"%br1.{tag} (x: {br}) -> {br} {{\n  %x = {br} parameter(0)\n"
            f"  %r = {rs} get-tuple-element(%x), index=1\n  %k = s32[] get-tuple-element(%x), "
            f"index=0\n  %one = s32[] constant(1)\n  %k2 = s32[] add(%k, %one)\n"
            f"  ROOT %t = {br} tuple(%k2, %r)\n}}"
        )
        ist = f"(s32[], {rs})"
        self.comps[f"ib.{tag}"] = (
            f"%ib.{tag} (s: {ist}) -> {ist} {{\n  %s = {ist} parameter(0)\n"
            f"  %j = s32[] get-tuple-element(%s), index=0\n"
            f"  %r = {rs} get-tuple-element(%s), index=1\n  %n = {rs} {neg}(%r)\n"
            f"  %one = s32[] constant(1)\n  %j2 = s32[] add(%j, %one)\n"
            f"  ROOT %t = {ist} tuple(%j2, %n)\n}}"
        )
        inner_n = self.size(0, 4)
        self.comps[f"ic.{tag}"] = (
            f"%ic.{tag} (s: {ist}) -> pred[] {{\n  %s = {ist} parameter(0)\n"
            f"  %j = s32[] get-tuple-element(%s), index=0\n  %n = s32[] constant({inner_n})\n"
            f"  ROOT %lt = pred[] compare(%j, %n), direction=LT\n}}"
        )
        self.comps[f"body.{tag}"] = (
            f"%body.{tag} (s: {st}) -> {st} {{\n  %s = {st} parameter(0)\n"
            f"  %h = (s32[], {inner}) get-tuple-element(%s), index=0\n"
            f"  %src = {bs} get-tuple-element(%s), index=1\n"
            f"  %i = s32[] get-tuple-element(%h), index=0\n"
            f"  %ba = {inner} get-tuple-element(%h), index=1\n"
            f"  %buf = {bs} get-tuple-element(%ba), index=0\n"
            f"  %acc = {rs} get-tuple-element(%ba), index=1\n"
            f"  %z = s32[] constant(0)\n  %two = s32[] constant(2)\n"
            f"  %row = {rs} dynamic-slice(%src, %i, %z), dynamic_slice_sizes={{1,{width}}}\n"
            f"  %par = s32[] remainder(%i, %two)\n"
            f"  %bt = {br} tuple(%i, %row)\n"
            f"  %c = {br} conditional(%par, %bt, %bt), branch_computations={{%br0.{tag}, "
            f"%br1.{tag}}}\n"
            f"  %at = s32[] get-tuple-element(%c), index=0\n"
            f"  %val = {rs} get-tuple-element(%c), index=1\n"
            f"  %it = {ist} tuple(%z, %val)\n"
            f"  %iw = {ist} while(%it), condition=%ic.{tag}, body=%ib.{tag}\n"
            f"  %val2 = {rs} get-tuple-element(%iw), index=1\n"
            f"  %old = {rs} dynamic-slice(%buf, %at, %z), dynamic_slice_sizes={{1,{width}}}\n"
            f"  %new = {rs} maximum(%old, %val2)\n"
            f"  %buf2 = {bs} dynamic-update-slice(%buf, %new, %at, %z)\n"
            f"  %acc2 = {rs} minimum(%acc, %val2)\n"
            f"  %one = s32[] constant(1)\n  %i2 = s32[] add(%i, %one)\n"
            f"  %ba2 = {inner} tuple(%buf2, %acc2)\n  %h2 = (s32[], {inner}) tuple(%i2, %ba2)\n"
            f"  ROOT %t = {st} tuple(%h2, %src)\n}}"
        )
        self.comps[f"cond.{tag}"] = (
            f"%cond.{tag} (s: {st}) -> pred[] {{\n  %s = {st} parameter(0)\n"
            f"  %h = (s32[], {inner}) get-tuple-element(%s), index=0\n"
            f"  %i = s32[] get-tuple-element(%h), index=0\n  %n = s32[] constant({n})\n"
            f"  ROOT %lt = pred[] compare(%i, %n), direction=LT\n}}"
        )
        start = self.const("s32", int(self.pick([0, 0, 1, -1])))
        acc0 = self.emit("sl", dt, (1, width), "slice", [buf.name],
                         f"slice={{[0:1], [0:{width}]}}", mag=buf.mag, err=buf.err)  # fmt: skip
        ba = self.emit("t", dt, (), "tuple", [buf.name, acc0.name], shape=inner)
        ba.dims = None  # type: ignore[assignment]
        h = self.emit("t", dt, (), "tuple", [start.name, ba.name], shape=f"(s32[], {inner})")
        h.dims = None  # type: ignore[assignment]
        t = self.emit("t", dt, (), "tuple", [h.name, src.name], shape=st)
        t.dims = None  # type: ignore[assignment]
        w = self.emit("while", dt, (), "while", [t.name],
                      f"condition=%cond.{tag}, body=%body.{tag}", shape=st)  # fmt: skip
        w.dims = None  # type: ignore[assignment]
        hw = self.emit("gte", dt, (), "get-tuple-element", [w.name], "index=0",
                       shape=f"(s32[], {inner})")  # fmt: skip
        hw.dims = None  # type: ignore[assignment]
        bw = self.emit("gte", dt, (), "get-tuple-element", [hw.name], "index=1", shape=inner)
        bw.dims = None  # type: ignore[assignment]
        m, err = max(buf.mag, src.mag), max(buf.err, src.err)
        self.emit("gte", dt, (rows, width), "get-tuple-element", [bw.name], "index=0",
                  shape=bs, mag=m, err=err)  # fmt: skip
        self.emit("gte", dt, (1, width), "get-tuple-element", [bw.name], "index=1",
                  shape=rs, mag=m, err=err)  # fmt: skip
        self.emit("gte", "s32", (), "get-tuple-element", [hw.name], "index=0", shape="s32[]")

    def gather_general(self) -> None:
        """gather with any dimension numbers: start_index_map a random subset of the
        operand's dimensions in any order, some of them collapsed, slices narrower than the
        operand, the index vector dimension anywhere in the indices, the offset dimensions
        anywhere in the result, indices out of range (clamped); sometimes batching dimensions
        (operand_batching_dims / start_indices_batching_dims, as vmapped gathers have)."""
        v = self.any_array(dtypes=(*FLOATS, *INTS, "pred"))
        r = len(v.dims)
        if not r or 0 in v.dims:
            return
        perm = [int(x) for x in self.rng.permutation(r)]
        nob = int(self.rng.integers(1, r)) if r >= 2 and self.chance(0.3) else 0
        obd = sorted(perm[:nob])  # operand batching dimensions
        k = int(self.rng.integers(1, r - nob + 1))
        sim = perm[nob : nob + k]
        collapsed = sorted(d for d in sim if self.chance(0.5))
        sizes = []
        for d in range(r):
            if d in collapsed or d in obd:
                sizes.append(1)
            else:
                sizes.append(int(self.rng.integers(0 if self.chance(0.1) else 1, v.dims[d] + 1)))
        batch, ivd, idims, sibd = self._indices_dims(v, obd, k)
        hi = max(v.dims) + 1
        idx = self.param(self.pick(["s32", "s32", "u32", "s8"]), idims,
                         f"int:{0 if self.chance(0.3) else -2}:{hi}")  # fmt: skip
        if idx.dtype == "u32":
            idx.draw = f"int:0:{hi}"
        offsets = [sizes[d] for d in range(r) if d not in collapsed and d not in obd]
        out_rank = len(batch) + len(offsets)
        odims_pos = sorted(int(x) for x in self.rng.choice(out_rank, len(offsets), replace=False))
        out, bi, oi = [], iter(batch), iter(offsets)
        for pos in range(out_rank):
            out.append(next(oi) if pos in odims_pos else next(bi))
        if _size(out) > MAX_ELEMENTS:
            return

        attrs = (f"offset_dims={_braces(odims_pos)}, collapsed_slice_dims={_braces(collapsed)}, "
                 f"start_index_map={_braces(sim)}, index_vector_dim={ivd}, "
                 f"slice_sizes={_braces(sizes)}")  # fmt: skip
        if obd:
            attrs += (f", operand_batching_dims={_braces(obd)}, "
                      f"start_indices_batching_dims={_braces(sibd)}")  # fmt: skip
        if self.chance(0.3):
            attrs += ", indices_are_sorted=false"
        self.emit("gather", v.dtype, tuple(out), "gather", [v.name, idx.name], attrs,
                  mag=v.mag, err=v.err)  # fmt: skip

    def _indices_dims(self, v, batching: list[int], k: int):
        """The indices array of a gather/scatter of `v` with index vectors of `k` entries:
        its batch dimensions (drawn, with one of each operand batching dimension's size
        inserted: each pairs with an indices dimension), the index vector dimension, the
        indices' dimensions and their batching dimensions."""
        batch = list(self.dims(int(self.pick([0, 1, 1, 2])), big=4))
        where: list[int] = []
        for d in batching:
            pos = int(self.rng.integers(0, len(batch) + 1))
            batch.insert(pos, v.dims[d])
            where = [w + (w >= pos) for w in where] + [pos]
        ivd = int(self.rng.integers(0, len(batch) + 1))
        idims = (*batch[:ivd], k, *batch[ivd:])
        return tuple(batch), ivd, idims, [w + (w >= ivd) for w in where]

    def scatter_general(self) -> None:
        """scatter with any dimension numbers (the inverse of gather_general's), a window
        that may not fit (then that update is skipped), and add/max/min or a combiner that
        keeps the update where the indices are unique (a permutation of rows); sometimes
        batching dimensions (input_batching_dims / scatter_indices_batching_dims)."""
        v = self.any_array(dtypes=("f32", "f64", "s32", "f16", "u8", "bf16", "s8"))
        r = len(v.dims)
        if not r or 0 in v.dims:
            return
        perm = [int(x) for x in self.rng.permutation(r)]
        nib = int(self.rng.integers(1, r)) if r >= 2 and self.chance(0.3) else 0
        ibd = sorted(perm[:nib])
        k = int(self.rng.integers(1, r - nib + 1))
        sdod = perm[nib : nib + k]
        inserted = sorted(d for d in sdod if self.chance(0.5))
        win = [1 if d in inserted or d in ibd else int(self.rng.integers(1, v.dims[d] + 1))
               for d in range(r)]  # fmt: skip
        batch, ivd, idims, sibd = self._indices_dims(v, ibd, k)
        hi = max(v.dims) + 1
        idx = self.param("s32", idims, f"int:{0 if self.chance(0.3) else -2}:{hi}")
        window = [win[d] for d in range(r) if d not in inserted and d not in ibd]
        urank = len(batch) + len(window)
        uwd = sorted(int(x) for x in self.rng.choice(urank, len(window), replace=False))
        udims, bi, wi = [], iter(batch), iter(window)
        for pos in range(urank):
            udims.append(next(wi) if pos in uwd else next(bi))
        if _size(udims) > MAX_ELEMENTS:
            return
        upd = self.operand(lambda i: i.dims == tuple(udims) and i.dtype == v.dtype,
                           lambda: self.param(v.dtype, tuple(udims)))  # fmt: skip
        assert upd is not None
        kind = self.pick(["add", "maximum", "minimum", "add"])
        comp = self.reducer(kind, v.dtype)

        attrs = (f"update_window_dims={_braces(uwd)}, inserted_window_dims={_braces(inserted)}, "
                 f"scatter_dims_to_operand_dims={_braces(sdod)}, index_vector_dim={ivd}, "
                 f"to_apply=%{comp}")  # fmt: skip
        if ibd:
            attrs += (f", input_batching_dims={_braces(ibd)}, "
                      f"scatter_indices_batching_dims={_braces(sibd)}")  # fmt: skip
        n = max(1, _size(batch))
        if kind == "add":
            m = v.mag + n * upd.mag
            err = v.err + n * upd.err + (n + 1) * EPS.get(v.dtype, 0) * m
            if v.dtype in INTS:
                m = err = 0.0
        else:
            m, err = max(v.mag, upd.mag), max(v.err, upd.err)
        self.emit("scatter", v.dtype, v.dims, "scatter", [v.name, idx.name, upd.name], attrs,
                  mag=m, err=err)  # fmt: skip

    def select_and_scatter(self) -> None:
        """select-and-scatter (max pooling's gradient) with padding and strides: select GE
        or LE over a fresh operand of distinct values (KNOWN_DIFFERENCES: ties), scatter
        add."""
        dt = self.pick(["f32", "f64", "s32", "f32"])
        dims = self.dims(int(self.pick([1, 2, 2, 3, 4])))
        if not dims or 0 in dims:
            return
        v = self.param(dt, dims, "int:-2147483648:2147483647" if dt == "s32" else "float:4")
        sizes, strides, pads, out = [], [], [], []
        for d in v.dims:
            s = int(self.rng.integers(1, min(d, 3) + 1))
            st = int(self.pick([1, 1, 2, 3]))
            lo, hi = int(self.pick([0, 0, 1, 2])), int(self.pick([0, 0, 1]))
            span = d + lo + hi
            o = (span - s) // st + 1 if span >= s else 0
            sizes.append(s), strides.append(st), pads.append(f"{lo}_{hi}"), out.append(o)
        if 0 in out:
            return
        src = self.operand(lambda i: i.dims == tuple(out) and i.dtype == v.dtype,
                           lambda: self.param(v.dtype, tuple(out)))  # fmt: skip
        assert src is not None
        direction = self.pick(["GE", "LE"])
        sel = f"select_{direction}_{v.dtype}"
        s = f"{v.dtype}[]"
        self.comps[sel] = (
            f"%{sel} (a: {s}, b: {s}) -> pred[] {{\n  %a = {s} parameter(0)\n"
            f"  %b = {s} parameter(1)\n  ROOT %r = pred[] compare(%a, %b), "
            f"direction={direction}\n}}"
        )
        add = self.reducer("add", v.dtype)
        init = self.const(v.dtype, 0)
        j = "x".join
        window = f"size={j(map(str, sizes))} stride={j(map(str, strides))} pad={j(pads)}"
        n = _size([-(-s // st) for s, st in zip(sizes, strides, strict=True)])
        m = n * src.mag
        err = n * src.err + n * EPS.get(v.dtype, 0) * m
        self.emit("sas", v.dtype, v.dims, "select-and-scatter", [v.name, src.name, init.name],
                  f"window={{{window}}}, select=%{sel}, scatter=%{add}", mag=m,
                  err=err)  # fmt: skip

    def sort_general(self) -> None:
        """sort of 2-4 operands with a comparator over several of them: lexicographic
        (key, then a second key in either direction), keys of few distinct values (ties),
        TOTALORDER or not; unstable only where the comparator orders every operand."""
        dims = self.dims(int(self.pick([1, 1, 2, 3])))
        if not dims or (0 in dims and self.chance(0.5)):
            return
        axis = int(self.rng.integers(len(dims)))
        nops = int(self.rng.integers(2, 5))
        ops = []
        for k in range(nops):
            dt = self.pick(["s32", "f32", "u8", "bf16", "s8", "f64", "pred"])
            how = "int:-2:2" if dt in ("s32", "s8") else "int:0:3" if dt == "u8" else None
            if k < 2 and dt in FLOATS and self.chance(0.5):
                how = "int:-2:2"  # few distinct float keys: a float param drawn from ints
            if how and dt in FLOATS:
                p = self.param(dt, dims, "float:4")
                p.draw = "small:" + how.split(":", 1)[1]
                ops.append(p)
                continue
            if how:
                ops.append(self.param(dt, dims, how))
                continue

            def ok(i, dt=dt):
                return i.dims == dims and i.dtype == dt and i.err == 0.0

            got = self.operand(ok, lambda dt=dt: self.param(dt, dims))
            assert got is not None
            ops.append(got)
        nkeys = int(self.rng.integers(1, min(nops, 3) + 1))
        keys = [int(x) for x in self.rng.permutation(nops)[:nkeys]]
        params, body = [], []
        for k, o in enumerate(ops):
            t = f"{o.dtype}[]"
            params.append((f"x{k}", t))
            params.append((f"y{k}", t))
        expr = None
        for key in reversed(keys):
            dt = ops[key].dtype
            d = self.pick(["LT", "GT"])
            fresh = ops[key].opcode == "parameter"  # no NaN: TOTALORDER or not agree
            order = ", type=TOTALORDER" if dt in FLOATS and (not fresh or self.chance(0.5)) else ""
            if dt == "pred":
                # x > y as x and not y (true after false, as in a TOTALORDER sort of 0/1)
                body.append(f"  %ny{key} = pred[] not(%y{key})")
                body.append(f"  %lt{key} = pred[] and(%x{key}, %ny{key})")
                body.append(f"  %eq{key} = pred[] compare(%x{key}, %y{key}), direction=EQ")
            else:
                body.append(f"  %lt{key} = pred[] compare(%x{key}, %y{key}), direction={d}{order}")
                body.append(f"  %eq{key} = pred[] compare(%x{key}, %y{key}), direction=EQ"
                            + (order if order else ""))  # fmt: skip
            if expr is None:
                expr = f"%lt{key}"
            else:
                body.append(f"  %tie{key} = pred[] and(%eq{key}, {expr})")
                body.append(f"  %or{key} = pred[] or(%lt{key}, %tie{key})")
                expr = f"%or{key}"
        total = set(keys) == set(range(nops))
        stable = "true" if not total or self.chance(0.5) else "false"
        name = self.name("lexcmp")
        sig = ", ".join(f"{n}: {t}" for n, t in params)
        lines = [f"  %{n} = {t} parameter({k})" for k, (n, t) in enumerate(params)]
        self.comps[name] = (
            f"%{name} ({sig}) -> pred[] {{\n"
            + "\n".join(lines + body)
            + f"\n  ROOT %r = pred[] and({expr}, {expr})\n}}"
        )
        shapes = ", ".join(shape_text(o.dtype, dims) for o in ops)
        attrs = f"dimensions={{{axis}}}, is_stable={stable}, to_apply=%{name}"
        r = self.emit("sort", ops[0].dtype, dims, "sort", [o.name for o in ops], attrs,
                      shape=f"({shapes})")  # fmt: skip
        r.dims = None  # type: ignore[assignment]
        for k, o in enumerate(ops):
            self.emit("gte", o.dtype, dims, "get-tuple-element", [r.name], f"index={k}",
                      shape=shape_text(o.dtype, dims), mag=o.mag)  # fmt: skip

    def low_float_chain(self) -> None:
        """A run of 3-10 elementwise operations in bf16, f16 or an 8-bit float (f8e4m3fn,
        f8e5m2), from a converted operand: each result rounds to the narrow type (XLA
        computes them in f32 and rounds after every operation), so a kernel that fuses
        the run must round each step (or stay within a step's rounding error)."""
        dt = self.pick(["bf16", "f16", "f8e4m3fn", "f8e5m2", "bf16"])
        v = self.any_array(dtypes=("f32", "bf16", "f16", "f64"))
        limit = 100.0 if dt.startswith("f8") else 1e4
        if v.mag > limit:
            return
        eps = EPS[dt]
        cur = self.emit("cvt", dt, v.dims, "convert", [v.name], mag=v.mag,
                        err=v.err + eps * v.mag)  # fmt: skip
        for _ in range(int(self.rng.integers(3, 11))):
            op = self.pick(["add", "subtract", "multiply", "maximum", "negate", "abs",
                            "tanh", "exponential", "minimum"])  # fmt: skip
            m, e = cur.mag, cur.err
            if op in ("negate", "abs"):
                cur = self.emit("lf", dt, cur.dims, op, [cur.name], mag=m, err=e)
                continue
            if op == "tanh" or (op == "exponential" and m > 3):
                cur = self.emit("lf", dt, cur.dims, "tanh", [cur.name], mag=1.0,
                                err=e + 8 * eps)  # fmt: skip
                continue
            if op == "exponential":
                x = math.exp(m)
                cur = self.emit("lf", dt, cur.dims, op, [cur.name], mag=x,
                                err=x * e * 1.01 + 8 * eps * x)  # fmt: skip
                continue
            other = self.like(cur) if self.chance(0.5) else cur
            mo, eo = other.mag, other.err
            if op == "multiply":
                if m * mo > limit:
                    continue
                mm = m * mo
                cur = self.emit("lf", dt, cur.dims, op, [cur.name, other.name], mag=mm,
                                err=e * mo + eo * m + e * eo + 2 * eps * mm)  # fmt: skip
            elif op in ("add", "subtract"):
                if m + mo > limit:
                    continue
                cur = self.emit("lf", dt, cur.dims, op, [cur.name, other.name], mag=m + mo,
                                err=e + eo + eps * (m + mo))  # fmt: skip
            else:
                cur = self.emit("lf", dt, cur.dims, op, [cur.name, other.name],
                                mag=max(m, mo), err=max(e, eo))  # fmt: skip
        back = self.pick(["f32", "f64", dt])
        if back != dt:
            self.emit("cvt", back, cur.dims, "convert", [cur.name], mag=cur.mag, err=cur.err)

    def layouts(self) -> None:
        """A copy into another layout (2-D {0,1}, 3-D permutations), or a parameter declared
        in one; the program's results then carry those layouts too."""
        v = self.any_array()
        if len(v.dims) < 2:
            v = self.param(self.pick(ALL), self.dims(int(self.pick([2, 3, 3, 4]))))
            if len(v.dims) < 2:
                return
        layout = tuple(int(d) for d in self.rng.permutation(len(v.dims)))
        if self.chance(0.5):
            p = self.emit("p", v.dtype, v.dims, "parameter", [], mag=4.0 if v.dtype in
                          (*FLOATS, "c64") else 0.0, layout=layout,
                          draw_how=default_draw(v.dtype, self.rng))  # fmt: skip
            v = p
        layout = tuple(int(d) for d in self.rng.permutation(len(v.dims)))
        self.emit("copy", v.dtype, v.dims, "copy", [v.name], mag=v.mag, err=v.err,
                  layout=layout)  # fmt: skip


def _identity(kind: str, dtype: str):
    """The identity of reducer `kind` on `dtype`: XLA may apply a reduction's init value any
    number of times (a one-element reduce returned the element, not min(init, element)), so
    only identities have one meaning."""
    if kind == "add":
        return 0
    if kind == "multiply":
        return 1
    if dtype in FLOATS:
        return float("-inf") if kind == "maximum" else float("inf")
    info = np.iinfo(NP[dtype])
    return int(info.min) if kind == "maximum" else int(info.max)


def _unique_names(body: str, k: int) -> str:
    """`body` with its instruction names suffixed by `k` (names are module-wide in HLO)."""
    names = re.findall(r"^\s*(?:ROOT )?%([\w.-]+) =", body, flags=re.M)
    for n in sorted(set(names), key=len, reverse=True):
        body = re.sub(rf"%{re.escape(n)}(?![\w.-])", f"%{n}.c{k}", body)
    return body


def _narrower(to: str, frm: str) -> bool:
    if frm in INTS:
        return BITS[frm] >= {"f16": 11, "bf16": 8, "f32": 24, "f64": 53, "c64": 24}[to]
    return EPS.get(to, 0) > EPS.get(frm, 0)


def _factors(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


def default_draw(dtype: str, rng: np.random.Generator) -> str:
    if dtype in (*FLOATS, "c64"):
        return "float:4"
    if dtype == "pred":
        return "pred"
    if dtype == "s32":
        return rng.choice(["int:-100:100", "int:-2147483648:2147483647", "int:-40:40"])
    if dtype == "s8":
        return "int:-128:127"
    if dtype == "u8":
        return "int:0:255"
    return rng.choice(["int:0:4294967295", "int:0:100"])


def generate(seed: int, steps: int | None = None, families: dict[str, float] | None = None,
             cap: int | None = None) -> Program:  # fmt: skip
    """A random valid program from `seed`, drawing the operation `families` (FAMILIES and
    FEATURES by default, or XLAPY_FUZZ_FAMILIES's choice) with dimensions at most `cap`."""
    if families is None:
        families = default_families()
    g = _Gen(seed, families, cap)
    if steps is None:
        steps = int(g.rng.integers(3, 16 if g.chance(0.8) else 30))
    for _ in range(int(g.rng.integers(1, 4))):
        g.param(g.pick(ALL), g.dims())
    for _ in range(steps):
        g.step()
    arrays = g.values(leaves=True)
    sinks = [i.name for i in arrays if i.name not in g.used]
    outs = sinks[-6:] if sinks else [arrays[-1].name]
    program = Program(seed, g.instrs, g.comps, outs, xla_ok=g.xla_ok, cap=cap,
                      families=families)  # fmt: skip
    if g.rng.random() < families.get("alias", 0.0):
        program.aliases = _draw_aliases(g, program)
        program.must_alias = {a[1] for a in program.aliases if g.rng.random() < 0.3}
    return program


def default_families() -> dict[str, float]:
    """FAMILIES and FEATURES as XLAPY_FUZZ_FAMILIES (families_from_text) changes them."""
    import os

    return families_from_text(os.environ.get("XLAPY_FUZZ_FAMILIES", ""))


def _draw_aliases(g: _Gen, program: Program) -> list[tuple]:
    """Outputs aliased with array parameters, or array leaves of tuple parameters, of the
    same dims and element type (layouts may differ: XLA accepts that), each parameter leaf
    and each output at most once."""
    by = program.by_name()
    leaves = []  # (parameter, leaf index or None, dtype, dims)
    for p in program.parameters():
        if p.draw == "tuple":
            leaves += [(p, (k,), dt, dims) for k, (dt, dims, _) in enumerate(p.elements)]
        else:
            leaves.append((p, None, p.dtype, p.dims))
    out, taken = [], set()
    for o in program.outputs:
        same = [(p, k) for p, k, dt, dims in leaves if dims == by[o].dims and dt == by[o].dtype
                and (p.name, k) not in taken]  # fmt: skip
        if same and g.rng.random() < 0.7:
            p, k = same[int(g.rng.integers(len(same)))]
            taken.add((p.name, k))
            out.append((o, p.name) if k is None else (o, p.name, k))
    return out


# ---------------------------------------------------------------------------------------
# The oracle

# Where XLA:CPU and xlapy deliberately differ, and the generator avoids the case or the
# oracle skips XLA's value (an Instr's `xla_skip` names the entry). The interpreter's
# answer is the one these programs hold xlapy to.
KNOWN_DIFFERENCES = {
    "integer-power": "XLA:CPU raises integers to a power by squaring over the exponent's "
    "low 6 bits only (u32 79^79 gives 79^15 there); xlapy gives the exact wrapped power. "
    "The generator draws integer exponents below 64.",
    "reduce-init": "XLA may apply a reduction's init value any number of times (a "
    "one-element reduce returned the element, not min(init, element)); only identities have "
    "one meaning, so the generator's init values are identities.",
    "select-and-scatter-ties": "Where two elements of a window tie under select, XLA:CPU "
    "may scatter to the later one (GE over a window holding 5 twice picked the second); "
    "the interpreter and the CPU backend keep the first in window order, as select(current, "
    "next) = true means. The generator draws distinct operand values.",
    "custom-call-layouts": "A custom call sees its operands in the layouts it is given: "
    "jaxlib's LAPACK kernels take batches in row-major order ({1,2,0}, {2,3,1,0}), and XLA "
    "hands them other layouts' bytes as they are, while xlapy's handlers see logical arrays. "
    "The generator uses JAX's layouts.",
    "xla-unimplemented": "XLA:CPU refuses some valid programs (UNIMPLEMENTED: 'Unsupported "
    "element type for DotThunk::Execute: BF16 x BF16 = F32' for a bf16[8,8] x bf16[1,8,8] "
    "dot into f32, seed 600510); xlapy runs them, and the XLA side is skipped.",
    "rng-signed": "XLA:CPU treats an rng-bit-generator's s32/s64 result as u32/u64: it "
    "hands the bits back as unsigned arrays, and a convert of them to f64 gave 2436022400 "
    "where the s32 bits mean -1858944896 (seed 400236). xlapy keeps the declared signed "
    "type. The oracle compares such results as bits, and the generator uses them nowhere "
    "else.",
    "abs-of-square": "XLA:CPU drops abs over x * x for integers too, where the square "
    "wrapped negative: abs(multiply(p, p)) of s32 60000 gave -694967296 there (seed 1012880 "
    "of the tenth session, through a one-trip while loop); xlapy gives the wrapped square's "
    "absolute value, 694967296, as HLO's abs means. The oracle keeps the interpreter's value; "
    "such a program is reported as an XLA mismatch and decided here (rare: 1 in ~3,000).",
    "conv-negative-padding": "XLA:CPU reads past the input of a 1-D convolution padded "
    "-1 low and +1 high with 3 input features: all-ones f32[2,3,4] (bf0) x f32[1,3,3] (oi0), "
    "window={size=3 pad=-1_1}, gave [9, 8] per row where the zero padding makes it [9, 6] "
    "(random operands gave values up to 5e24; seed 2611200 of the eleventh session, "
    "f32[3,3,4] x f32[1,3,3]); 1 or 2 features, or pads -1_0, 0_1 and -1_2, were right. "
    "xlapy and the interpreter give the padded sum. Reported as an XLA mismatch and decided "
    "here (1 in ~3,000).",
    "stablehlo-translation": "The StableHLO sides feed xlapy what XLA's own HLO -> "
    "StableHLO translation writes: an HLO copy becomes mhlo.copy (the importer takes it as a "
    "copy, but jaxlib's compile path refuses it before the plugin sees it: such programs skip "
    "the plugin side), and rng-get-and-update-state an MHLO op with no StableHLO form (such "
    "programs skip both sides). JAX itself emits neither. The translation also makes a tuple "
    "parameter one argument per leaf but keeps the aliases' parameter numbers and indices "
    "as they were (parameter 3 at {2} of a u8[4]; parameter 2 after a tuple parameter "
    "names another argument), which XLA:CPU's own compile then refuses (RET_CHECK "
    "ShapeUtil::IndexIsValid, 'Expected aliased input 2 ... to have the same size'): a "
    "program with tuple parameters goes to XLA and the StableHLO sides without its aliases; "
    "the runtime's donated side covers them.",
    "rng-state": "rng-get-and-update-state reads a per-module counter whose start XLA leaves "
    "unspecified (XLA:CPU starts at 0x7012395 = 117515157, xlapy at 0); its values are "
    "compared between xlapy's sides only.",
}

NATIVE_OFF = {
    "native_loops": False,
    "native_runs": False,
    "direct_convolutions": False,
    "native_gemv": False,
    "native_small_gemm": False,
    "thunk_concurrency": "off",
}
CONFIGS: dict[str, dict] = {"cpu": {}, "cpu-native-off": NATIVE_OFF}


@dataclass
class Mismatch:
    """One disagreement: which side, which output (or None for an exception), what."""

    side: str
    output: str | None
    message: str

    def key(self) -> tuple[str, str | None, str]:
        return (self.side, self.output, self.message.split(":")[0])


def _leaves(value) -> list:
    if isinstance(value, tuple | list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def exact_difference(got: np.ndarray, want: np.ndarray) -> str | None:
    """None when `got` has `want`'s shape, dtype and (compared exactly) values; else what
    differs first. (Also the integer check of corner_fuzz.same.)"""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype: got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
    bad = np.flatnonzero(got != want)
    if bad.size:
        i = bad[0]
        return (f"values: {bad.size}/{want.size} differ, first at {i}: "
                f"got {got.reshape(-1)[i]!r}, want {want.reshape(-1)[i]!r}")  # fmt: skip
    return None


def compare_leaf(got, want: np.ndarray, ins: Instr) -> str | None:
    """None when `got` matches `want` within the bound the generator carried for `ins`."""
    got = np.asarray(got)
    if got.shape != want.shape or got.dtype != want.dtype or want.dtype.kind in "biu":
        return exact_difference(got, want)
    wide = np.complex128 if want.dtype.kind == "c" else np.float64
    a, e = got.astype(wide), want.astype(wide)
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    if not np.array_equal(nan_a, nan_e):
        i = np.flatnonzero(nan_a != nan_e)[0]
        got_i, want_i = a.reshape(-1)[i], e.reshape(-1)[i]
        return f"values: NaN at different places, first {i}: got {got_i}, want {want_i}"
    fin = np.isfinite(e) & np.isfinite(a)
    both_inf = ~nan_e & ~np.isfinite(e)
    if np.any(both_inf & (a != e)):
        i = np.flatnonzero(both_inf & (a != e))[0]
        return f"values: infinities differ at {i}: got {a.reshape(-1)[i]}, want {e.reshape(-1)[i]}"
    if np.any(~nan_a & ~np.isfinite(a) & np.isfinite(e)):
        i = np.flatnonzero(~nan_a & ~np.isfinite(a) & np.isfinite(e))[0]
        return f"values: infinities differ at {i}: got {a.reshape(-1)[i]}, want {e.reshape(-1)[i]}"
    eps = EPS[{"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
               "complex64": "c64", "complex128": "c128", "float8_e4m3fn": "f8e4m3fn",
               "float8_e5m2": "f8e5m2"}[want.dtype.name]]  # fmt: skip
    limit = 4 * ins.err + 2 * eps * np.abs(np.where(fin, e, 0)) + 1e-300
    with np.errstate(invalid="ignore"):
        diff = np.where(fin, np.abs(a - e), 0.0)
    bad = np.flatnonzero(~(diff <= limit))
    if bad.size:
        i = bad[np.argmax(diff.reshape(-1)[bad])]
        return (f"values: {bad.size}/{want.size} out of bound (err bound {ins.err:.3g}), worst at "
                f"{i}: got {a.reshape(-1)[i]}, want {e.reshape(-1)[i]}")  # fmt: skip
    return None


def _run_cpu(text: str, args, options):
    from xlapy.backends.cpu.backend import CpuProgram
    from xlapy.ir.parser import parse_module

    return CpuProgram(parse_module(text), options).run(_copy(args))


def _copy(args):
    return [tuple(_copy(a)) if isinstance(a, tuple) else np.array(a, copy=True) for a in args]


def xla_run(text: str, args):
    """XLA:CPU's outputs (through jaxlib, as benchmarks/hlo_vs_xla.py compiles HLO text)."""
    import jax
    import jax.extend as je
    from jax._src.lib import _jax, hlo
    from jax._src.lib import xla_client as xc

    backend = je.backend.get_backend("cpu")
    device = backend.local_devices()[0]
    module = hlo.hlo_module_from_text(text)
    stablehlo = _jax.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    options = je.backend.get_compile_options(1, 1)
    exe = backend.compile_and_load(stablehlo, xc.DeviceList((device,)), options)
    with jax.enable_x64(True):  # f64/u32 arguments as they are
        outs = exe.execute([jax.device_put(np.asarray(a), device) for a in _leaves(args)])
    return [np.asarray(o) for o in outs]


def to_stablehlo(text: str) -> bytes:
    """The module as StableHLO bytecode, through XLA's own HLO -> StableHLO translation (for
    the sides that feed xlapy StableHLO: the importer, the PJRT plugin)."""
    from jax._src.lib import _jax, hlo

    proto = hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()
    return _jax.mlir.hlo_to_stablehlo(proto)


def stablehlo_run(text: str, args):
    """xlapy's outputs for the module translated to StableHLO and imported back
    (xlapy.load), compiled by the CPU backend with default options. The translation makes
    tuple parameters one parameter per leaf."""
    import xlapy
    from xlapy.backends.cpu.backend import CpuProgram

    return CpuProgram(xlapy.load(to_stablehlo(text)), {}).run(_copy(_leaves(args)))


def plugin_run(program: Program, text: str, args, found: list) -> list[np.ndarray]:
    """The module's outputs through xlapy's PJRT plugin as JAX drives it: StableHLO bytes
    compiled by JAX's `xlapy` backend, arguments put on the xlapy device, executed by the
    PJRT C API. A parameter the program aliases is donated there (JAX's executables donate
    what the module aliases): its buffer must be deleted afterwards, the others kept, and
    the arguments on the host untouched. `xlapy.pjrt.initialize()` must have run before
    JAX started its backends."""
    import jax
    import jax.extend as je
    from jax._src.lib import xla_client as xc

    try:
        backend = je.backend.get_backend("xlapy")
    except RuntimeError as exc:
        raise RuntimeError("no xlapy platform in JAX: call xlapy.pjrt.initialize() before "
                           f"JAX starts its backends ({exc})") from None  # fmt: skip
    device = backend.local_devices()[0]
    options = je.backend.get_compile_options(1, 1)
    exe = backend.compile_and_load(to_stablehlo(text), xc.DeviceList((device,)), options)
    host = _copy(_leaves(args))
    with jax.enable_x64(True):  # f64/u32 arguments as they are
        buffers = [jax.device_put(np.asarray(a), device) for a in host]
        outs = [np.asarray(o) for o in exe.execute(buffers)]
    aliased = program.flat_aliased()
    for k, b in enumerate(buffers):
        if b.is_deleted() != (k in aliased):
            state = "deleted" if b.is_deleted() else "alive"
            found.append(Mismatch("plugin", None, f"argument buffer {k} is {state} after the "
                                  f"run (aliased parameters: {sorted(aliased)})"))  # fmt: skip
    for k, (h, a) in enumerate(zip(host, _leaves(args), strict=True)):
        if not np.array_equal(h, np.asarray(a), equal_nan=True):
            found.append(Mismatch("plugin", None, f"host argument {k} changed by the run"))
    return outs


class XlaCrashed(RuntimeError):
    """XLA:CPU's child process died (a signal in XLA's compile or execute) or did not answer
    in time: XLA's failure, not a finding about xlapy."""


def _xla_child_main(conn, runner) -> None:
    """The child's loop: (text, args) in, ("ok", runner(text, args)) or ("error", message)
    out."""
    import faulthandler

    faulthandler.enable()  # a signal prints where it happened, on the child's stderr
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        text, args = job
        try:
            conn.send(("ok", runner(text, args)))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class XlaChild:
    """XLA:CPU run in a child process (spawned, JAX_PLATFORMS=cpu), so a crash inside XLA
    (the SIGFPE at seed 600605) or a hang ends only the child: `run` raises XlaCrashed
    naming the signal or the timeout, and the next call starts a fresh child."""

    def __init__(self, timeout: float = 300.0, runner: Callable = xla_run):
        self.timeout = timeout
        self.runner = runner  # a module-level function (the child imports it by name)
        self.process = None
        self.conn = None

    def _start(self) -> None:
        import multiprocessing
        import os

        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        saved = os.environ.get("JAX_PLATFORMS")
        os.environ["JAX_PLATFORMS"] = "cpu"  # the child needs only XLA:CPU
        try:
            self.process = ctx.Process(
                target=_xla_child_main, args=(child, self.runner), daemon=True
            )
            self.process.start()
        finally:
            if saved is None:
                del os.environ["JAX_PLATFORMS"]
            else:
                os.environ["JAX_PLATFORMS"] = saved
        child.close()
        self.conn = parent

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join(timeout=30)  # the killed child's exit
        self.process = self.conn = None

    def run(self, text: str, args) -> list[np.ndarray]:
        if self.process is None or not self.process.is_alive():
            self._start()
        assert self.conn is not None and self.process is not None
        try:
            self.conn.send((text, args))
            if not self.conn.poll(self.timeout):
                self.close()
                raise XlaCrashed(f"XLA:CPU's child did not answer in {self.timeout:.0f} s")
            kind, value = self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self.process.join(timeout=30)  # the dead child's exit status
            code = self.process.exitcode
            self.close()
            raise XlaCrashed(f"XLA:CPU's child process died (exit code {code}: "
                             f"{'signal ' + str(-code) if code and code < 0 else 'no signal'})"
                             ) from None  # fmt: skip
        if kind == "error":
            raise RuntimeError(value)
        return value


def die_of_sigfpe(text: str, args) -> list[np.ndarray]:
    """A runner for XlaChild that dies as XLA:CPU did at seed 600605 (for the tests)."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGFPE)
    raise AssertionError("unreachable")


# How `check` runs XLA: in this process (xla_run), or an XlaChild's run (`use_xla_child`).
_XLA_RUNNER: list[Callable] = [lambda text, args: xla_run(text, args)]


def use_xla_child(timeout: float = 300.0) -> XlaChild:
    """Run XLA in a child process from now on (long campaigns); the child is returned."""
    child = XlaChild(timeout)
    _XLA_RUNNER[0] = child.run
    return child


def check(
    program: Program,
    *,
    xla: bool = False,
    configs=None,
    args=None,
    donation=None,
    stablehlo: bool = False,
    plugin: bool = False,
) -> list[Mismatch]:
    """Run `program` through the interpreter and the other sides; the mismatches. A program
    with input/output aliases also runs through the runtime with and without donation
    (`donation`, by default when it has aliases and `configs` is not given). `stablehlo`:
    also through XLA's HLO -> StableHLO translation and xlapy's importer; `plugin`: that
    StableHLO through xlapy's PJRT plugin as JAX drives it (donation included)."""
    from xlapy.backends.interpreter import evaluate
    from xlapy.ir.parser import parse_module
    from xlapy.ir.verifier import verify

    text = program.text()
    if args is None:
        args = program.arguments()
    try:
        module = parse_module(text)
        verify(module)
        expected = _leaves(evaluate(module, _copy(args)))
    except Exception as exc:  # every failure is a finding
        return [Mismatch("interpreter", None, f"{type(exc).__name__}: {exc}")]
    by = program.by_name()
    outs = [by[o] for o in program.outputs]
    sides: dict[str, Callable] = {}
    for name, opts in (CONFIGS if configs is None else configs).items():
        sides[name] = lambda opts=opts: _leaves(_run_cpu(text, args, opts))
    if donation is None:
        donation = bool(program.live_aliases()) and configs is None
    found: list[Mismatch] = []
    if donation:
        sides["donated"] = lambda: _run_donating(program, text, args, found)
    # rng-get-and-update-state has no StableHLO op (the translation writes an MHLO one
    # that JAX never emits): such programs stay off the StableHLO sides
    via_stablehlo = program.xla_ok and "rng-get-and-update-state" not in text
    if stablehlo and via_stablehlo:
        sides["stablehlo"] = lambda: _leaves(stablehlo_run(_for_xla(program, text), args))
    if plugin and via_stablehlo:
        sides["plugin"] = lambda: plugin_run(program, _for_xla(program, text), args, found)
    if xla and program.xla_ok:
        # XLA refuses a must-alias parameter that is not donated (so does xlapy: checked by
        # the donated side); its results are the same under may-alias
        sides["xla"] = lambda: _XLA_RUNNER[0](_for_xla(program, text), args)
    for side, run in sides.items():
        try:
            got = run()
        except XlaCrashed as exc:  # XLA's crash, reported but no finding about xlapy
            found.append(Mismatch("xla-crash", None, f"XlaCrashed: {exc}"))
            continue
        except Exception as exc:
            if side == "xla" and "UNIMPLEMENTED" in str(exc):
                continue  # KNOWN_DIFFERENCES["xla-unimplemented"]
            if side == "plugin" and "failed to legalize operation 'mhlo." in str(exc):
                continue  # KNOWN_DIFFERENCES["stablehlo-translation"]: jaxlib refused it
            tb = traceback.format_exc(limit=-3)
            found.append(Mismatch(side, None, f"{type(exc).__name__}: {exc}\n{tb}"))
            continue
        if len(got) != len(expected):
            found.append(Mismatch(side, None, f"{len(got)} outputs, want {len(expected)}"))
            continue
        for ins, g, e in zip(outs, got, expected, strict=True):
            if side == "xla" and ins.xla_skip:
                continue  # KNOWN_DIFFERENCES[ins.xla_skip]
            via = side in ("xla", "stablehlo", "plugin")
            if via and ins.opcode == "get-tuple-element" and _signed_bits(g, e):
                g = np.asarray(g).view(np.asarray(e).dtype)  # KNOWN_DIFFERENCES["rng-signed"]
            msg = compare_leaf(g, np.asarray(e), ins)
            if msg:
                found.append(Mismatch(side, ins.name, msg))
    return found


def _for_xla(program: Program, text: str) -> str:
    """`text` as jaxlib's HLO -> StableHLO path takes it: may-alias for must-alias, and a
    one-output program's alias at index {} (that path unwraps a one-element result tuple,
    and an alias at {0} then fails a RET_CHECK)."""
    if program.has_tuple_parameters() and program.live_aliases():
        # XLA's translation makes a tuple parameter one argument per leaf but keeps the
        # aliases' parameter numbers and indices as they were, which then fail XLA's own
        # verifier (KNOWN_DIFFERENCES["stablehlo-translation"]): the aliases are left out
        # (the values are the same)
        head, rest = text.split("\n", 1)
        assert head.startswith("HloModule fuzz_"), head
        text = f"HloModule fuzz_{program.seed}\n{rest}"
    text = text.replace("must-alias", "may-alias")
    if len(program.outputs) == 1:
        text = text.replace("input_output_alias={ {0}:", "input_output_alias={ {}:")
    return text


def _signed_bits(got, want) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    return (got.dtype.kind == "u" and want.dtype.kind == "i"
            and got.dtype.itemsize == want.dtype.itemsize)  # fmt: skip


_CLIENT: list = []


def _client():
    if not _CLIENT:
        from xlapy.runtime import Client

        _CLIENT.append(Client("cpu"))
    return _CLIENT[0]


def _run_donating(program: Program, text: str, args, found: list[Mismatch]) -> list:
    """The program through the runtime (input_output_alias honoured): run once without
    donating (the inputs must come back untouched), once donating every aliased parameter
    (the results must equal the first run's bit for bit, the donated buffers must be dead
    and refused when read or passed again), and donating one buffer twice must be refused.
    Misbehaviour is appended to `found`; the donated run's results are returned."""
    from xlapy.runtime import BufferDonatedError, DonationError

    client = _client()
    device = client.devices()[0]
    exe = client.compile(text)
    donated = sorted({p for _, p in program.live_aliases()})

    def put(a):
        if isinstance(a, tuple):  # a tuple parameter: a tuple of buffers
            return tuple(put(x) for x in a)
        return client.buffer_from_pyval(np.array(a, copy=True))

    def buffers():
        return [put(a) for a in args]

    def host(outs):
        return [np.asarray(o.to_numpy()) for o in outs]

    def leaves_of(b) -> list:
        return list(b) if isinstance(b, tuple) else [b]

    def problem(message: str) -> None:
        found.append(Mismatch("donated", None, message))

    kept = buffers()
    if program.must_numbers() & set(donated):
        try:
            exe.execute_portable(kept, device)
            problem("a must-alias parameter that was not donated was not refused")
        except DonationError:
            pass
        kept = buffers()
        first = host(exe.execute_portable(kept, device, donate=donated))
        kept = buffers()
    else:
        first = host(exe.execute_portable(kept, device))
    for k, (b, a) in enumerate(zip(kept, args, strict=True)):
        for bl, al in zip(leaves_of(b), _leaves(a), strict=True):
            if not np.array_equal(np.asarray(bl.to_numpy()), np.asarray(al), equal_nan=True):
                problem(f"parameter {k} was changed by a run that did not donate it")
    given = buffers()
    second = host(exe.execute_portable(given, device, donate=donated))
    for k, (a, b) in enumerate(zip(first, second, strict=True)):
        if a.shape != b.shape or a.tobytes() != b.tobytes():
            problem(f"output {k} differs between the donated and the undonated run")
    for p in donated:  # a parameter with an aliased leaf is donated whole
        for b in leaves_of(given[p]):
            if not b.is_deleted:
                problem(f"donated parameter {p}'s buffer is still alive after the run")
            try:
                b.to_numpy()
                problem(f"donated parameter {p}'s buffer could still be read")
            except BufferDonatedError:
                pass
    try:
        exe.execute_portable(given, device)
        problem("a run over a donated buffer was not refused")
    except BufferDonatedError:
        pass
    twice = buffers()
    p = donated[0]
    same = [k for k, a in enumerate(args) if not isinstance(a, tuple) and k != p
            and not isinstance(args[p], tuple) and np.shape(a) == np.shape(args[p])
            and np.asarray(a).dtype == np.asarray(args[p]).dtype]  # fmt: skip
    if same:
        twice[same[0]] = twice[p]
        try:
            exe.execute_portable(twice, device, donate=donated)
            problem(f"parameter {p}'s buffer donated and passed again was not refused")
        except DonationError:
            pass
    return second


# ---------------------------------------------------------------------------------------
# Shrinking


def _drop_dead(p: Program) -> Program:
    live = p._live()
    return replace(p, instrs=[i for i in p.instrs if i.name in live])


def _as_param(ins: Instr) -> Instr:
    if ins.dtype in (*FLOATS, "c64", "c128", "f8e4m3fn", "f8e5m2"):
        how = f"float:{max(min(ins.mag, 1e6, LARGEST.get(ins.dtype, 1e6) / 4), 0.25):.6g}"
    elif ins.dtype == "pred":
        how = "pred"
    elif ins.dtype in ("u64", "s64"):
        how = "bits" if ins.dtype == "u64" else "int:-100000:100000"
    else:
        how = {"s32": "int:-100:100", "s8": "int:-128:127", "u8": "int:0:255",
               "u32": "int:0:1000", "u16": "int:0:65535"}[ins.dtype]  # fmt: skip
    return replace(ins, opcode="parameter", args=[], attrs="", draw=how,
                   shape=shape_text(ins.dtype, ins.dims), err=0.0)  # fmt: skip


def _largest_dim(p: Program) -> int:
    live = p._live()
    dims = [d for i in p.instrs if i.name in live and i.dims for d in i.dims]
    return max(dims, default=0)


def shrink(program: Program, fails: Callable[[Program], bool], budget: int = 200) -> Program:
    """A smaller program that still `fails`: first smaller shapes (a generated program is
    drawn again from its seed with every dimension capped at 1, 2, 3, ...: the same choices
    over smaller arrays, the smallest cap that still fails kept), then outputs dropped or
    replaced by one of their operands, then instructions replaced by parameters of their
    shape or bypassed by an operand of the same shape, to a fixed point (at most `budget`
    checks)."""
    best = _drop_dead(program)
    tries = 0

    def attempt(candidate: Program) -> bool:
        nonlocal best, tries
        tries += 1
        candidate = _drop_dead(candidate)
        try:
            ok = fails(candidate)
        except Exception:  # a candidate that breaks the harness is no good
            ok = False
        if ok:
            best = candidate
        return ok

    if program.families is not None:
        largest = _largest_dim(best)
        for cap in (1, 2, 3, 4, 6, 8):
            if cap >= largest or tries >= budget // 4:
                break
            regenerated = generate(program.seed, families=program.families, cap=cap)
            if attempt(regenerated):
                break
    for o in list(best.outputs):
        if len(best.outputs) > 1 and tries < budget:
            attempt(replace(best, outputs=[o]))
    changed = True
    while changed and tries < budget:
        changed = False
        # re-root: an output replaced by one of its array operands
        for o in list(best.outputs):
            by = best.by_name()
            for a in by[o].args if o in by else []:
                if tries >= budget or by[a].dims is None or by[a].opcode == "constant":
                    continue
                outs = list(dict.fromkeys(a if x == o else x for x in best.outputs))
                if attempt(replace(best, outputs=outs)):
                    changed = True
                    break
        for ins in reversed(list(best.instrs)):
            if tries >= budget:
                break
            if ins.opcode == "parameter" or ins.dims is None or ins.name not in best.by_name():
                continue
            users = [u for u in best.instrs if ins.name in u.args]
            # bypass: users read an operand of the same shape instead
            for a in ins.args:
                src = best.by_name().get(a)
                if src is None or src.dims != ins.dims or src.dtype != ins.dtype:
                    continue
                cand = [replace(u, args=[a if x == ins.name else x for x in u.args])
                        if u in users else u for u in best.instrs]  # fmt: skip
                outs = [a if o == ins.name else o for o in best.outputs]
                if attempt(replace(best, instrs=cand, outputs=outs)):
                    changed = True
                    break
            else:
                cand = [_as_param(i) if i.name == ins.name else i for i in best.instrs]
                if ins.opcode not in ("constant", "iota") and attempt(replace(best, instrs=cand)):
                    changed = True
    return best


# ---------------------------------------------------------------------------------------
# Running many


@dataclass
class Report:
    programs: int = 0
    failures: list[tuple[int, list[Mismatch], Program]] = field(default_factory=list)


def run_seeds(
    seeds,
    *,
    xla_every: int = 0,
    stablehlo_every: int = 0,
    plugin_every: int = 0,
    shrink_failures: bool = True,
    log=None,
    progress=None,
) -> Report:
    """Check the programs of `seeds` (XLA on every `xla_every`-th, the StableHLO importer
    and the PJRT plugin on every `stablehlo_every`-th and `plugin_every`-th); failures
    shrunk and passed to `log(seed, mismatches, program)`; `progress(k, seed)` before each."""
    report = Report()

    def every(n: int, k: int) -> bool:
        return bool(n) and k % n == 0

    for k, seed in enumerate(seeds):
        if progress:
            progress(k, seed)
        program = generate(seed)
        found = check(program, xla=every(xla_every, k), stablehlo=every(stablehlo_every, k),
                      plugin=every(plugin_every, k))  # fmt: skip
        report.programs += 1
        if not found:
            continue
        if shrink_failures and any(m.side != "xla-crash" for m in found):
            first = next(m for m in found if m.side != "xla-crash")
            sides = {first.side: CONFIGS.get(first.side, {})}
            want_xla = first.side == "xla"
            via = {"stablehlo": first.side == "stablehlo", "plugin": first.side == "plugin"}
            alone = want_xla or any(via.values())

            def fails(p: Program, first=first, sides=sides, want_xla=want_xla, via=via,
                      alone=alone) -> bool:  # fmt: skip
                got = check(p, xla=want_xla, configs={} if alone else sides, **via)
                return any(m.side == first.side and (m.output is None) == (first.output is None)
                           and m.message.split(":")[0] == first.message.split(":")[0]
                           for m in got)  # fmt: skip

            program = shrink(program, fails)
            found = check(program, xla=want_xla, **via) or found
        report.failures.append((seed, found, program))
        if log:
            log(seed, found, program)
    return report


def module_arguments(text: str, seed: int = 0) -> list[np.ndarray]:
    """Arguments for any module's parameters (of the types the generator uses), drawn as the
    generator draws them: for reproducers kept as text."""
    from xlapy.ir.parser import parse_module

    module = parse_module(text)
    rng = np.random.default_rng([seed, 7])

    def arg(shape):
        if shape.is_tuple:
            return tuple(arg(s) for s in shape.tuple_shapes)
        dtype, dims = shape.element_type.text, tuple(shape.dims)
        return draw(rng, default_draw(dtype, rng), dtype, dims)

    return [arg(p.shape) for p in module.entry_computation().parameters]


def differences(text: str, args, options_list) -> list[str]:
    """Each CPU configuration's mismatches against the interpreter on `text` (exact for
    integers, 1e-5 relative for floats): for reproducers."""
    from xlapy.backends.interpreter import evaluate
    from xlapy.ir.parser import parse_module

    want = _leaves(evaluate(parse_module(text), _copy(args)))
    found = []
    for options in options_list:
        got = _leaves(_run_cpu(text, args, options))
        for k, (g, e) in enumerate(zip(got, want, strict=True)):
            g, e = np.asarray(g), np.asarray(e)
            same = g.shape == e.shape and g.dtype == e.dtype
            if same and e.dtype.kind in "fc":
                same = bool(np.allclose(g.astype(np.complex128), e.astype(np.complex128),
                                        rtol=1e-5, atol=1e-6, equal_nan=True))  # fmt: skip
            elif same:
                same = bool(np.array_equal(g, e))
            if not same:
                found.append(f"options {options}, output {k}: got {g!r}, want {e!r}")
    return found


# ---------------------------------------------------------------------------------------
# The fuzzer's own custom-call target

_REGISTERED: list[bool] = []


def _axpby(ins, opaque, outs):
    """outs[0] (a copy of y, output_to_operand_aliasing) = a * x + y, a from the opaque."""
    x, _ = ins
    (out,) = outs
    a = int(opaque)
    if out.dtype.kind in "iu":
        total = x.astype(np.int64) * a + out.astype(np.int64)
        out[...] = total.astype(out.dtype)  # wraps, as the integer ops of HLO do
    else:
        out[...] = (x.astype(np.float64) * a + out.astype(np.float64)).astype(out.dtype)


def register_fuzz_targets() -> None:
    """Register `xlapy_fuzz.axpby` (Host, Python API) once per process."""
    if _REGISTERED:
        return
    from xlapy.backends.custom_calls import register

    register("xlapy_fuzz.axpby", _axpby, "Host")
    _REGISTERED.append(True)
