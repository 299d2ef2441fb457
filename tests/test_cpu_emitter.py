"""The CPU kernel emitter against the interpreter: every supported op as a table, fused
chains (hypothesis), reductions over every axis set with non-default layouts, shape ops with
layouts, the fused computations of the JAX programs, vectorization and parallel chunks."""

from __future__ import annotations

import itertools
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xlapy.backends.cpu import (
    UnsupportedForCodegen,
    compile_computation,
    compile_instruction,
    run_parallel,
    supported,
)
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.interpreter import evaluate
from xlapy.backends.interpreter.evaluator import Interpreter
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))
    # Kernels are checked against NumPy's IEEE arithmetic, subnormals included; flushing
    # them (the default, as XLA:CPU does) is tested in test_cpu_denormals.py.
    monkeypatch.setenv("XLAPY_CPU_DENORMALS", "ieee")


RNG = np.random.default_rng(1234)

FLOAT_EDGES = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 1.0, -1.0, 0.5, 3.0]
INT_EDGE = {
    "s8": [0, 1, -1, -128, 127, 7, 8],
    "s16": [0, 1, -1, -32768, 32767, 15, 16],
    "s32": [0, 1, -1, -(2**31), 2**31 - 1, 31, 32],
    "s64": [0, 1, -1, -(2**63), 2**63 - 1, 63, 64],
    "u8": [0, 1, 255, 7, 8, 128],
    "u16": [0, 1, 65535, 15, 16],
    "u32": [0, 1, 2**32 - 1, 31, 32],
    "u64": [0, 1, 2**64 - 1, 63, 64],
}
DTYPES = {
    "f32": np.float32,
    "f64": np.float64,
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "pred": np.bool_,
    **{t: np.dtype(t.replace("s", "int").replace("u", "uint")) for t in INT_EDGE},
}
TOL = {"f32": 2e-6, "f64": 1e-12, "f16": 2e-3, "bf16": 1e-2}


def random_array(ty: str, shape, positive: bool = False) -> np.ndarray:
    """Fresh random values of `ty` with its edge values mixed in."""
    dtype = DTYPES[ty]
    n = int(np.prod(shape))
    if ty == "pred":
        return RNG.random(shape) < 0.5
    if ty in INT_EDGE:
        info = np.iinfo(dtype)
        lo = max(info.min, -100) if not positive else 0
        vals = RNG.integers(lo, min(info.max, 100), n, endpoint=True).astype(dtype)
        edges = np.array(INT_EDGE[ty], dtype=dtype)
        k = min(len(edges), n // 2)
        vals[RNG.choice(n, k, replace=False)] = edges[RNG.choice(len(edges), k, replace=False)]
        return vals.reshape(shape)
    vals = RNG.standard_normal(n) * 3
    if positive:
        vals = np.abs(vals)
    vals = vals.astype(np.float64)
    k = min(len(FLOAT_EDGES), n // 3)
    vals[RNG.choice(n, k, replace=False)] = RNG.choice(FLOAT_EDGES, k, replace=False)
    return vals.astype(dtype).reshape(shape)


def check(text: str, args, ty: str | None = None, exact: bool = False):
    """Compile the entry of `text`, run it on `args`, compare with the interpreter."""
    module = parse_module(text)
    kernel = compile_computation(module.entry)
    got = kernel(*args)
    want = Interpreter().run(module, list(args))
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        if exact or (not np.issubdtype(w.dtype, np.inexact) and w.dtype != ml_dtypes.bfloat16):
            np.testing.assert_array_equal(g, w)
            continue
        tol = TOL.get(ty or "f32", 2e-6)
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        np.testing.assert_array_equal(np.isnan(g64), np.isnan(w64))
        fin = np.isfinite(w64)
        np.testing.assert_array_equal(g64[~fin & ~np.isnan(w64)], w64[~fin & ~np.isnan(w64)])
        np.testing.assert_allclose(g64[fin], w64[fin], rtol=tol, atol=tol)
    return kernel


def unary_text(op: str, ty: str, out: str | None = None, dims="4,33"):
    out = out or ty
    return f"""HloModule m
ENTRY e {{
  x = {ty}[{dims}] parameter(0)
  ROOT r = {out}[{dims}] {op}(x)
}}"""


def binary_text(op: str, ty: str, out: str | None = None, extra: str = ""):
    out = out or ty
    return f"""HloModule m
ENTRY e {{
  x = {ty}[5,37] parameter(0)
  y = {ty}[5,37] parameter(1)
  ROOT r = {out}[5,37] {op}(x, y){extra}
}}"""


# -- elementwise tables ------------------------------------------------------------------------

FLOAT_TYPES = ["f32", "f64", "f16", "bf16"]
INT_TYPES = list(INT_EDGE)
FLOAT_UNARY = [
    "abs", "negate", "sign", "floor", "ceil", "round-nearest-even", "round-nearest-afz",
    "sqrt", "rsqrt", "cbrt", "exponential", "exponential-minus-one", "log", "log-plus-one",
    "tanh", "logistic", "sine", "cosine", "tan", "erf", "copy",
]  # fmt: skip
TRANSCENDENTAL = {"cbrt", "exponential", "exponential-minus-one", "log", "log-plus-one",
                  "tanh", "logistic", "sine", "cosine", "tan", "erf", "rsqrt"}  # fmt: skip


@pytest.mark.parametrize("ty", FLOAT_TYPES)
@pytest.mark.parametrize("op", FLOAT_UNARY)
def test_float_unary(op, ty):
    x = random_array(ty, (4, 33))
    tol_ty = ty if op not in TRANSCENDENTAL or ty != "f32" else "f32"
    module = parse_module(unary_text(op, ty))
    got = compile_computation(module.entry)(x)
    want = evaluate(module, [x])
    g, w = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
    ok = ~np.isnan(w)
    rtol = {"f32": 1e-6 if op in TRANSCENDENTAL else 0, "f64": 1e-14}.get(tol_ty, TOL[tol_ty])
    np.testing.assert_allclose(g[ok], w[ok], rtol=rtol, atol=rtol * 1e-30)


@pytest.mark.parametrize("ty", INT_TYPES)
@pytest.mark.parametrize("op", ["abs", "negate", "sign", "not", "popcnt", "count-leading-zeros"])
def test_int_unary(op, ty):
    check(unary_text(op, ty), [random_array(ty, (4, 33))], exact=True)


@pytest.mark.parametrize("ty", FLOAT_TYPES)
@pytest.mark.parametrize(
    "op",
    [
        "add",
        "subtract",
        "multiply",
        "divide",
        "remainder",
        "maximum",
        "minimum",
        "power",
        "atan2",
    ],
)
def test_float_binary(op, ty):
    x, y = random_array(ty, (5, 37)), random_array(ty, (5, 37))
    tol = {"f32": 2e-6, "f64": 1e-14}.get(ty, TOL[ty])
    module = parse_module(binary_text(op, ty))
    got = compile_computation(module.entry)(x, y).astype(np.float64)
    want = evaluate(module, [x, y]).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=tol, atol=1e-30)


INT_BINARY = [
    "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "and", "or",
    "xor", "power", "shift-left", "shift-right-logical", "shift-right-arithmetic",
]  # fmt: skip


@pytest.mark.parametrize("ty", INT_TYPES)
@pytest.mark.parametrize("op", INT_BINARY)
def test_int_binary(op, ty):
    x = random_array(ty, (5, 37))
    y = random_array(ty, (5, 37), positive=op == "power")
    if op == "power":
        y = (y % 9).astype(y.dtype)
    check(binary_text(op, ty), [x, y], exact=True)


@pytest.mark.parametrize("op", ["and", "or", "xor", "add", "multiply", "maximum", "minimum"])
def test_pred_binary(op):
    check(binary_text(op, "pred"), [random_array("pred", (5, 37)) for _ in range(2)])


@pytest.mark.parametrize("ty", [*FLOAT_TYPES, *INT_TYPES, "pred"])
@pytest.mark.parametrize("direction", ["EQ", "NE", "LT", "LE", "GT", "GE"])
def test_compare(direction, ty):
    x = random_array(ty, (5, 37))
    y = x.copy()
    y[::2] = random_array(ty, (5, 37))[::2]
    check(binary_text("compare", ty, "pred", f", direction={direction}"), [x, y])


@pytest.mark.parametrize("ty", ["f32", "f64", "bf16"])
@pytest.mark.parametrize("direction", ["EQ", "LT", "GE"])
def test_compare_totalorder(direction, ty):
    x = random_array(ty, (5, 37))
    y = np.array(-x)
    check(binary_text("compare", ty, "pred", f", direction={direction}, type=TOTALORDER"), [x, y])


CONVERT_TYPES = ["f32", "f64", "f16", "bf16", "s8", "s32", "s64", "u8", "u32", "u64", "pred"]


@pytest.mark.parametrize(("frm", "to"), list(itertools.permutations(CONVERT_TYPES, 2)))
def test_convert(frm, to):
    x = random_array(frm, (4, 33))
    if frm in FLOAT_TYPES:
        with np.errstate(over="ignore"):
            scale = np.float64(1e9) ** RNG.integers(0, 2, x.shape)
            x = (x.astype(np.float64) * scale).astype(x.dtype)
    check(unary_text("convert", frm, to), [x], ty=to if to in TOL else None)


BITCASTS = [("f32", "s32"), ("s32", "f32"), ("f64", "u64"), ("bf16", "s16"), ("f16", "u16"),
            ("u32", "s32")]  # fmt: skip


@pytest.mark.parametrize(("frm", "to"), BITCASTS)
def test_bitcast_convert(frm, to):
    x = random_array(frm, (4, 33))
    check(unary_text("bitcast-convert", frm, to), [x], exact=True)


@pytest.mark.parametrize("ty", ["f32", "s32", "bf16"])
def test_select_clamp_is_finite(ty):
    x, y = random_array(ty, (5, 37)), random_array(ty, (5, 37))
    p = random_array("pred", (5, 37))
    text = f"""HloModule m
ENTRY e {{
  p = pred[5,37] parameter(0)
  x = {ty}[5,37] parameter(1)
  y = {ty}[5,37] parameter(2)
  lo = {ty}[] constant(-1)
  hi = {ty}[] constant(2)
  s = {ty}[5,37] select(p, x, y)
  ROOT c = {ty}[5,37] clamp(lo, s, hi)
}}"""
    check(text, [p, x, y], ty=ty if ty in TOL else None)
    if ty != "s32":
        check(unary_text("is-finite", ty, "pred", dims="5,37"), [x])


# -- shape ops -----------------------------------------------------------------------------------

SHAPE_CASES = {
    "broadcast": (
        "x = f32[3]{0} parameter(0)\n ROOT r = f32[2,3,4]{0,2,1} broadcast(x), dimensions={1}",
        [(3,)],
    ),
    "transpose_layout": (
        "x = f32[6,5,4]{0,1,2} parameter(0)\n"
        " ROOT r = f32[4,6,5]{2,1,0} transpose(x), dimensions={2,0,1}",
        [(6, 5, 4)],
    ),
    "copy_layout": (
        "x = f32[7,9]{1,0} parameter(0)\n ROOT r = f32[7,9]{0,1} copy(x)",
        [(7, 9)],
    ),
    "reshape": (
        "x = f32[6,10]{0,1} parameter(0)\n ROOT r = f32[3,4,5]{1,2,0} reshape(x)",
        [(6, 10)],
    ),
    "bitcast": (
        "x = f32[6,10]{0,1} parameter(0)\n ROOT r = f32[10,2,3]{0,2,1} bitcast(x)",
        [(6, 10)],
    ),
    "reshape_keeps_dims": (
        "x = f32[4,6,10] parameter(0)\n ROOT r = f32[24,10] reshape(x)",
        [(4, 6, 10)],
    ),
    "reshape_size_one_dims": (
        "x = f32[1,6,1,10] parameter(0)\n ROOT r = f32[6,1,10,1] reshape(x)",
        [(1, 6, 1, 10)],
    ),
    "reshape_split_and_merge": (
        "x = f32[4,6,10] parameter(0)\n ROOT r = f32[2,12,5,2] reshape(x)",
        [(4, 6, 10)],
    ),
    "reshape_size_one_inside_a_run": (
        "x = f32[2,1,3,5] parameter(0)\n ROOT r = f32[3,2,5]{2,0,1} reshape(x)",
        [(2, 1, 3, 5)],
    ),
    "bitcast_runs_in_layout_order": (
        "x = f32[6,4,10]{0,2,1} parameter(0)\n ROOT r = f32[4,60]{1,0} bitcast(x)",
        [(6, 4, 10)],
    ),
    "slice": (
        "x = f32[10,12]{1,0} parameter(0)\n ROOT r = f32[4,3]{1,0} slice(x), "
        "slice={[1:9:2], [2:11:3]}",
        [(10, 12)],
    ),
    "concatenate": (
        "x = f32[3,4]{1,0} parameter(0)\n y = f32[3,2]{0,1} parameter(1)\n"
        " z = f32[3,5] parameter(2)\n ROOT r = f32[3,11] concatenate(x, y, z), dimensions={1}",
        [(3, 4), (3, 2), (3, 5)],
    ),
    "pad": (
        "x = f32[4,5] parameter(0)\n v = f32[] constant(-7)\n"
        " ROOT r = f32[10,10]{0,1} pad(x, v), padding=1_2_1x-1_2_1",
        [(4, 5)],
    ),
    "iota": ("x = f32[3] parameter(0)\n ROOT r = s32[3,4]{0,1} iota(), iota_dimension=1", [(3,)]),
    "reverse": (
        "x = f32[5,6,7]{1,2,0} parameter(0)\n ROOT r = f32[5,6,7] reverse(x), dimensions={0,2}",
        [(5, 6, 7)],
    ),
    "constant_array": (
        "x = f32[2,3] parameter(0)\n c = f32[2,3] constant({{1,2,3},{4,5,6}})\n"
        " ROOT r = f32[2,3]{0,1} multiply(x, c)",
        [(2, 3)],
    ),
}


@pytest.mark.parametrize("case", list(SHAPE_CASES))
def test_shape_ops(case):
    body, shapes = SHAPE_CASES[case]
    text = f"HloModule m\nENTRY e {{\n {body}\n}}"
    check(text, [random_array("f32", s) for s in shapes], exact=True)


@pytest.mark.parametrize("starts", [(0, 0), (2, 3), (-5, 100), (7, -1)])
def test_dynamic_slice_and_update_clamped(starts):
    text = """HloModule m
ENTRY e {
  x = f32[8,9]{0,1} parameter(0)
  i = s32[] parameter(1)
  j = s32[] parameter(2)
  u = f32[3,4] parameter(3)
  d = f32[3,4] dynamic-slice(x, i, j), dynamic_slice_sizes={3,4}
  n = f32[3,4] negate(d)
  ROOT r = f32[8,9] dynamic-update-slice(x, n, j, i)
}"""
    args = [random_array("f32", (8, 9)), np.array(starts[0], np.int32)]
    args += [np.array(starts[1], np.int32), random_array("f32", (3, 4))]
    check(text, args, exact=True)


@pytest.mark.parametrize("t", ["u64", "u32", "u8", "s64", "s8"])
@pytest.mark.parametrize("op", ["dynamic-slice", "dynamic-update-slice"])
def test_dynamic_slice_and_update_clamp_unsigned_starts_to_the_top(op, t):
    # corner fuzz seed 600530: a u64 start of 2**64 - 1 was read as -1 and clamped to 0; it
    # clamps to the top, as XLA and the interpreter do
    root = ("u64[3] dynamic-slice(x, i), dynamic_slice_sizes={3}" if op == "dynamic-slice"
            else "u64[5] dynamic-update-slice(x, u, i)")  # fmt: skip
    text = f"""HloModule m
ENTRY e {{
  x = u64[5] parameter(0)
  i = {t}[] parameter(1)
  u = u64[3] parameter(2)
  ROOT r = {root}
}}"""
    dt = np.dtype({"u64": np.uint64, "u32": np.uint32, "u8": np.uint8, "s64": np.int64,
                   "s8": np.int8}[t])  # fmt: skip
    info = np.iinfo(dt)
    x = np.array([2**64 - 2, 64, 31, 7, 5], np.uint64)
    u = np.array([11, 12, 13], np.uint64)
    for i in (info.max, info.max - 1, info.min, 1):
        args = [x, np.array(i, dt), u]
        want = Interpreter().run(parse_module(text), list(args))
        got = CpuProgram(parse_module(text)).run(list(args))
        np.testing.assert_array_equal(got, want)
        top = i > 2
        if op == "dynamic-slice":
            np.testing.assert_array_equal(want, x[2:] if top else x[min(max(i, 0), 2) :][:3])
        elif top:
            np.testing.assert_array_equal(want, [*x[:2], *u])


# -- fused chains (hypothesis) -------------------------------------------------------------------

UNARY_CHAIN = ["negate", "abs", "exponential", "tanh", "logistic", "sine", "log-plus-one"]
BINARY_CHAIN = ["add", "subtract", "multiply", "maximum", "minimum", "divide"]


@st.composite
def chains(draw):
    rank = draw(st.integers(1, 3))
    dims = tuple(draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank)))
    perm = draw(st.permutations(range(rank)))
    dims_text = ",".join(map(str, dims))
    layouts = [draw(st.permutations(range(rank))) for _ in range(3)]
    lines = [
        f"p{i} = f32[{dims_text}]{{{','.join(map(str, layouts[i]))}}} parameter({i})"
        for i in range(2)
    ]
    values = ["p0", "p1"]
    for k in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            op = draw(st.sampled_from(UNARY_CHAIN))
            a = draw(st.sampled_from(values))
            lines.append(f"v{k} = f32[{dims_text}] {op}({a})")
        else:
            op = draw(st.sampled_from(BINARY_CHAIN))
            a, b = draw(st.sampled_from(values)), draw(st.sampled_from(values))
            lines.append(f"v{k} = f32[{dims_text}] {op}({a}, {b})")
        values.append(f"v{k}")
    out_layout = ",".join(map(str, perm))
    lines.append(f"ROOT r = f32[{dims_text}]{{{out_layout}}} copy({values[-1]})")
    return "HloModule m\nENTRY e {\n  " + "\n  ".join(lines) + "\n}", dims


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_random_fused_chains(case):
    text, dims = case
    args = [RNG.standard_normal(dims).astype(np.float32) for _ in range(2)]
    module = parse_module(text)
    got = compile_computation(module.entry)(*args)
    want = evaluate(module, args)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = np.isfinite(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=3e-5, atol=1e-6)


# -- reductions ---------------------------------------------------------------------------------

AXES = [c for r in range(4) for c in itertools.combinations(range(3), r)]


@pytest.mark.parametrize("layout", [(2, 1, 0), (0, 1, 2), (1, 0, 2)])
@pytest.mark.parametrize("axes", AXES)
def test_reduce_every_axis_set(axes, layout):
    dims = (6, 7, 300)
    kept = [d for d in range(3) if d not in axes]
    out = ",".join(str(dims[d]) for d in kept)
    text = f"""HloModule m
add {{ a = f32[] parameter(0) b = f32[] parameter(1) ROOT c = f32[] add(a, b) }}
ENTRY e {{
  x = f32[6,7,300]{{{",".join(map(str, layout))}}} parameter(0)
  z = f32[] constant(0.5)
  ROOT r = f32[{out}] reduce(x, z), dimensions={{{",".join(map(str, axes))}}}, to_apply=add
}}"""
    x = RNG.standard_normal(dims).astype(np.float32)
    module = parse_module(text)
    got = compile_computation(module.entry)(x)
    exact = np.asarray(x.astype(np.float64).sum(axis=axes) + 0.5)
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("reducer", "ty", "init"),
    [
        ("multiply", "f32", "1"),
        ("maximum", "f32", "-inf"),
        ("minimum", "f64", "inf"),
        ("add", "s32", "3"),
        ("maximum", "u8", "0"),
        ("and", "pred", "true"),
        ("or", "pred", "false"),
        ("add", "bf16", "0"),
        ("minimum", "s64", "0"),
    ],
)
def test_reduce_reducers(reducer, ty, init):
    text = f"""HloModule m
red {{ a = {ty}[] parameter(0) b = {ty}[] parameter(1) ROOT c = {ty}[] {reducer}(a, b) }}
ENTRY e {{
  x = {ty}[9,40]{{0,1}} parameter(0)
  z = {ty}[] constant({init})
  ROOT r = {ty}[9] reduce(x, z), dimensions={{1}}, to_apply=red
}}"""
    x = random_array(ty, (9, 40))
    if reducer == "multiply":
        x = (1 + 0.01 * RNG.standard_normal((9, 40))).astype(np.float32)
    if ty == "bf16":
        # xlapy accumulates bf16 sums in f32 and rounds once; the interpreter rounds each step
        got = compile_computation(parse_module(text).entry)(x).astype(np.float64)
        exact = x.astype(np.float64).sum(axis=1)
        ok = np.isfinite(exact)
        np.testing.assert_array_equal(got[~ok], exact[~ok])
        np.testing.assert_allclose(
            got[ok], exact[ok], rtol=1e-2, atol=1e-2 * np.abs(exact[ok]).max()
        )
        return
    check(text, [x], ty=ty if ty in TOL else None)


def test_float32_sum_accuracy_long_rows():
    text = """HloModule m
add { a = f32[] parameter(0) b = f32[] parameter(1) ROOT c = f32[] add(a, b) }
ENTRY e {
  x = f32[4,262144] parameter(0)
  z = f32[] constant(0)
  ROOT r = f32[4] reduce(x, z), dimensions={1}, to_apply=add
}"""
    x = (RNG.random((4, 262144)) + 1.0).astype(np.float32)
    got = compile_computation(parse_module(text).entry)(x)
    exact = x.astype(np.float64).sum(axis=1)
    rel = np.max(np.abs(got - exact) / exact)
    print(f"f32 row sum of 262144 elements: max relative error {rel:.2e}")
    assert rel < 1e-6


# Reductions that keep the input's contiguous dimension (column sums, middle axes) are emitted
# with the reduced dimensions as outer loops and a vectorized loop over a tile of the kept
# minor dimension; the cases cross tile (1024 lanes) and cascade (32, 512 rows) boundaries.
KEPT_MINOR = [
    # (input dims, input layout, reduced dims, output layout, reducer, type, init)
    ((300, 70), (1, 0), (0,), (0,), "add", "f32", "0.25"),
    ((600, 1100), (1, 0), (0,), (0,), "add", "f32", "0"),
    ((5, 33, 40), (2, 1, 0), (1,), (1, 0), "add", "f32", "0"),
    ((5, 33, 40), (2, 1, 0), (1,), (0, 1), "add", "f64", "1"),
    ((9, 4, 7, 50), (3, 2, 1, 0), (0, 2), (1, 0), "add", "f32", "0"),
    ((40, 30, 6), (0, 2, 1), (1, 2), (0,), "add", "f32", "0"),
    ((12, 1, 65), (2, 1, 0), (0, 1), (0,), "maximum", "f32", "-inf"),
    ((70, 130), (1, 0), (0,), (0,), "minimum", "f64", "inf"),
    ((50, 80), (1, 0), (0,), (0,), "multiply", "f32", "1"),
    ((64, 90), (1, 0), (0,), (0,), "add", "s32", "7"),
    ((33, 70), (1, 0), (0,), (0,), "maximum", "u8", "0"),
    ((17, 40), (1, 0), (0,), (0,), "or", "pred", "false"),
    ((17, 40), (1, 0), (0,), (0,), "and", "pred", "true"),
    ((100, 48), (1, 0), (0,), (0,), "add", "f16", "0"),
]


@pytest.mark.parametrize(
    ("dims", "layout", "axes", "out_layout", "reducer", "ty", "init"), KEPT_MINOR
)
def test_reduce_keeping_minor_dimension(dims, layout, axes, out_layout, reducer, ty, init):
    kept = [dims[d] for d in range(len(dims)) if d not in axes]
    lay = ",".join(map(str, layout))
    out_lay = ",".join(map(str, out_layout))
    red = ",".join(map(str, axes))
    text = f"""HloModule m
red {{ a = {ty}[] parameter(0) b = {ty}[] parameter(1) ROOT c = {ty}[] {reducer}(a, b) }}
ENTRY e {{
  x = {ty}[{",".join(map(str, dims))}]{{{lay}}} parameter(0)
  z = {ty}[] constant({init})
  ROOT r = {ty}[{",".join(map(str, kept))}]{{{out_lay}}} reduce(x, z), dimensions={{{red}}},
    to_apply=red
}}"""
    if reducer == "multiply":
        x = (1 + 0.01 * RNG.standard_normal(dims)).astype(np.float32)
    elif ty in ("f32", "f64", "f16"):
        x = RNG.standard_normal(dims).astype(DTYPES[ty])
    else:
        x = random_array(ty, dims)
    kernel = compile_computation(parse_module(text).entry)
    got = kernel(x)
    want = Interpreter().run(parse_module(text), [x])
    assert got.dtype == want.dtype and got.shape == want.shape
    if ty in ("f32", "f64", "f16"):
        exact = np.asarray(
            Interpreter().run(parse_module(text.replace(ty, "f64")), [x.astype(np.float64)])
        )
        tol = {"f32": 2e-5, "f64": 1e-12, "f16": 2e-3}[ty]
        np.testing.assert_allclose(
            got.astype(np.float64), exact, rtol=tol, atol=tol * np.abs(exact).max()
        )
    else:
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run_parallel(kernel, [x], chunks=3), got)


def test_float32_column_sum_accuracy():
    text = """HloModule m
add { a = f32[] parameter(0) b = f32[] parameter(1) ROOT c = f32[] add(a, b) }
ENTRY e {
  x = f32[131072,24] parameter(0)
  z = f32[] constant(0)
  ROOT r = f32[24] reduce(x, z), dimensions={0}, to_apply=add
}"""
    x = (RNG.random((131072, 24)) + 1.0).astype(np.float32)
    got = compile_computation(parse_module(text).entry)(x)
    exact = x.astype(np.float64).sum(axis=0)
    rel = np.max(np.abs(got - exact) / exact)
    print(f"f32 column sum of 131072 rows: max relative error {rel:.2e}")
    assert rel < 5e-7


def test_column_reduce_vectorizes_and_splits():
    text = """HloModule m
add { a = f32[] parameter(0) b = f32[] parameter(1) ROOT c = f32[] add(a, b) }
ENTRY e {
  x = f32[3,200,2500] parameter(0)
  z = f32[] constant(0)
  sq = f32[3,200,2500] multiply(x, x)
  s1 = f32[3,2500]{0,1} reduce(x, z), dimensions={1}, to_apply=add
  s2 = f32[3,2500]{0,1} reduce(sq, z), dimensions={1}, to_apply=add
  ROOT t = (f32[3,2500]{0,1}, f32[3,2500]{0,1}) tuple(s1, s2)
}"""
    kernel = compile_computation(parse_module(text).entry)
    assert kernel.outer_extent == 2500
    assert any(v.endswith("x float>") for v in kernel.vector_types())
    x = RNG.standard_normal((3, 200, 2500)).astype(np.float32)
    s1, s2 = run_parallel(kernel, [x], chunks=7)
    np.testing.assert_allclose(s1, x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(s2, (x.astype(np.float64) ** 2).sum(axis=1), rtol=1e-5, atol=1e-4)


def test_variadic_argmax_over_columns():
    text = """HloModule m
argmax {
  a = f32[] parameter(0)
  ai = s32[] parameter(1)
  b = f32[] parameter(2)
  bi = s32[] parameter(3)
  gt = pred[] compare(a, b), direction=GT
  eq = pred[] compare(a, b), direction=EQ
  lt = pred[] compare(ai, bi), direction=LT
  tie = pred[] and(eq, lt)
  keep = pred[] or(gt, tie)
  v = f32[] select(keep, a, b)
  i = s32[] select(keep, ai, bi)
  ROOT t = (f32[], s32[]) tuple(v, i)
}
ENTRY e {
  x = f32[90,37] parameter(0)
  io = s32[90,37] iota(), iota_dimension=0
  ninf = f32[] constant(-inf)
  zero = s32[] constant(0)
  ROOT r = (f32[37], s32[37]) reduce(x, io, ninf, zero), dimensions={0}, to_apply=argmax
}"""
    x = RNG.integers(-5, 5, (90, 37)).astype(np.float32)
    check(text, [x], exact=True)


def test_variadic_argmax_reduce():
    text = """HloModule m
argmax {
  a = f32[] parameter(0)
  ai = s32[] parameter(1)
  b = f32[] parameter(2)
  bi = s32[] parameter(3)
  gt = pred[] compare(a, b), direction=GT
  eq = pred[] compare(a, b), direction=EQ
  lt = pred[] compare(ai, bi), direction=LT
  tie = pred[] and(eq, lt)
  keep = pred[] or(gt, tie)
  v = f32[] select(keep, a, b)
  i = s32[] select(keep, ai, bi)
  ROOT t = (f32[], s32[]) tuple(v, i)
}
ENTRY e {
  x = f32[7,50] parameter(0)
  io = s32[7,50] iota(), iota_dimension=1
  ninf = f32[] constant(-inf)
  zero = s32[] constant(0)
  ROOT r = (f32[7], s32[7]) reduce(x, io, ninf, zero), dimensions={1}, to_apply=argmax
}"""
    check(text, [RNG.standard_normal((7, 50)).astype(np.float32)], exact=True)


def test_multi_output_fusion_root():
    text = """HloModule m
add { a = f32[] parameter(0) b = f32[] parameter(1) ROOT c = f32[] add(a, b) }
ENTRY e {
  x = f32[16,33] parameter(0)
  z = f32[] constant(0)
  sq = f32[16,33] multiply(x, x)
  s1 = f32[16] reduce(x, z), dimensions={1}, to_apply=add
  s2 = f32[16] reduce(sq, z), dimensions={1}, to_apply=add
  ROOT t = (f32[16], f32[16]) tuple(s1, s2)
}"""
    check(text, [RNG.standard_normal((16, 33)).astype(np.float32)], ty="f32")


# -- single instructions, errors, vectorization, parallel --------------------------------------


def test_compile_single_instruction_from_a_module():
    module = parse_module(binary_text("multiply", "f32"))
    kernel = compile_instruction(module.entry.root)
    x, y = random_array("f32", (5, 37)), random_array("f32", (5, 37))
    np.testing.assert_array_equal(kernel(x, y), evaluate(module, [x, y]))


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (
            "x = f32[4,4] parameter(0)\n ROOT r = f32[4,4] dot(x, x), lhs_contracting_dims={1}, "
            "rhs_contracting_dims={0}",
            "no rule for 'dot'",
        ),
        ("x = c64[4] parameter(0)\n ROOT r = c64[4] tanh(x)", "no complex rule for 'tanh'"),
        (
            "x = f8e8m0fnu[4] parameter(0)\n ROOT r = f8e8m0fnu[4] negate(x)",
            "element type f8e8m0fnu",
        ),
    ],
)
def test_unsupported_raises(body, fragment):
    module = parse_module(f"HloModule m\nENTRY e {{\n {body}\n}}")
    assert fragment in supported(module.entry)
    with pytest.raises(UnsupportedForCodegen, match=fragment):
        compile_computation(module.entry)


def test_inner_loops_vectorize():
    text = """HloModule m
ENTRY e {
  x = f32[64,1024] parameter(0)
  y = f32[64,1024] parameter(1)
  e = f32[64,1024] exponential(x)
  t = f32[64,1024] tanh(y)
  ROOT r = f32[64,1024] add(e, t)
}"""
    kernel = compile_computation(parse_module(text).entry)
    vectors = kernel.vector_types()
    assert any(v.endswith("x float>") for v in vectors), vectors
    calls = re.findall(r"call [^@]*@([\w.]+)", kernel.optimized_ir)
    assert all(c.startswith("llvm.") for c in calls), calls
    assert "ymm" in kernel.asm or "xmm" in kernel.asm


def test_run_parallel_chunks_match_serial():
    text = """HloModule m
ENTRY e {
  x = f32[97,130]{0,1} parameter(0)
  ROOT r = f32[97,130] sine(x)
}"""
    kernel = compile_computation(parse_module(text).entry)
    x = random_array("f32", (97, 130))
    serial = kernel(x)
    np.testing.assert_array_equal(run_parallel(kernel, [x], chunks=7), serial)


# -- fused computations of the JAX programs -----------------------------------------------------


def _fusion_computations(module):
    for instr in module.instructions():
        if instr.opcode is Opcode.FUSION:
            yield instr, instr.attrs["calls"]


def _random_input(shape):
    ty = shape.element_type.text
    if ty in DTYPES and shape.is_array:
        if ty in INT_EDGE:
            return RNG.integers(0, 4, shape.dims).astype(DTYPES[ty])
        return random_array(ty, shape.dims) if ty != "pred" else RNG.random(shape.dims) < 0.5
    return None


def test_jax_program_fusions():
    from tests.jax_programs import PROGRAMS, hlo_texts

    total = compiled = 0
    reasons: dict[str, int] = {}
    for prog in list(PROGRAMS.values()):
        try:
            module = parse_module(hlo_texts(prog).optimized)
        except Exception:
            continue
        for instr, comp in _fusion_computations(module):
            total += 1
            reason = supported(comp)
            if reason is not None:
                key = reason.split(": ", 1)[-1][:60]
                reasons[key] = reasons.get(key, 0) + 1
                continue
            args = [_random_input(p.shape) for p in comp.parameters]
            if any(a is None for a in args):
                reasons["tuple or unusual parameter"] = reasons.get("tuple parameter", 0) + 1
                continue
            kernel = compile_computation(comp, instr.name)
            got = kernel(*args)
            want = Interpreter().call(comp, args)
            got = got if isinstance(got, tuple) else (got,)
            want = want if isinstance(want, tuple) else (want,)
            for g, w in zip(got, want, strict=True):
                if np.issubdtype(w.dtype, np.integer) or w.dtype == np.bool_:
                    np.testing.assert_array_equal(g, w, err_msg=f"{prog.name}/{instr.name}")
                    continue
                g64, w64 = g.astype(np.float64), w.astype(np.float64)
                ok = np.isfinite(w64)
                tol = 2e-2 if w.dtype in (np.float16, ml_dtypes.bfloat16) else 2e-4
                scale = np.max(np.abs(w64[ok]), initial=1.0)
                np.testing.assert_allclose(
                    g64[ok],
                    w64[ok],
                    rtol=tol,
                    atol=tol * scale,
                    err_msg=f"{prog.name}/{instr.name}",
                )
            compiled += 1
    print(f"\nJAX program fusions: {compiled} of {total} compiled and checked")
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {n:4d} unsupported: {reason}")
    assert total > 50 and compiled > total // 2


# -- in-place variants ----------------------------------------------------------------------------

IN_PLACE_OK = {
    # name: (computation body over p0 = f32[64,48] and p1, (output, parameter) pairs)
    "add": ("ROOT r = f32[64,48] add(p0, p1)", ((0, 0),)),
    "tanh_chain_second": (
        "t = f32[64,48] tanh(p1)\n ROOT r = f32[64,48] multiply(t, p0)",
        ((0, 1),),
    ),
    "scalar_broadcast_other": (
        "c = f32[] constant(0.5)\n b = f32[64,48] broadcast(c), dimensions={}\n"
        " s = f32[64,48] subtract(p0, b)\n ROOT r = f32[64,48] multiply(s, p1)",
        ((0, 0),),
    ),
    "multi_output": (
        "a = f32[64,48] add(p0, p1)\n m = f32[64,48] multiply(p0, p1)\n"
        " ROOT r = (f32[64,48], f32[64,48]) tuple(a, m)",
        ((0, 0), (1, 1)),
    ),
}


def _in_place_comp(body: str):
    text = (
        "HloModule m\nENTRY e {\n p0 = f32[64,48] parameter(0)\n"
        f" p1 = f32[64,48] parameter(1)\n {body}\n}}"
    )
    return parse_module(text).entry


@pytest.mark.parametrize("name", list(IN_PLACE_OK))
def test_in_place_variant_matches_out_of_place(name):
    from xlapy.backends.cpu.codegen.emitter import in_place_reason

    body, pairs = IN_PLACE_OK[name]
    comp = _in_place_comp(body)
    for out, param in pairs:
        assert in_place_reason(comp, out, param) is None
    plain = compile_computation(comp, f"{name}_plain")
    fused = compile_computation(comp, f"{name}_in_place", in_place=pairs)
    assert fused.in_place == tuple(sorted(pairs)) and not plain.in_place
    args = [RNG.standard_normal((64, 48)).astype(np.float32) for _ in range(2)]
    want = plain(*args)
    want = want if isinstance(want, tuple) else (want,)
    buffers = [a.copy() for a in args]
    outs = [buffers[param] for _, param in sorted(pairs)]
    if len(outs) < len(want):  # a pair list naming one output: the other gets a fresh buffer
        outs += [np.empty((64, 48), np.float32) for _ in range(len(want) - len(outs))]
    fused.run_raw([o.ctypes.data for o in outs] + [b.ctypes.data for b in buffers])
    for got, w in zip(outs, want, strict=True):
        np.testing.assert_allclose(got, w, rtol=2e-6, atol=1e-6)
    assert any("float" in t for t in fused.vector_types()), name
    assert "noalias" in fused.llvm_ir


IN_PLACE_REJECTED = {
    "transpose": ("t = f32[48,64] transpose(p0), dimensions={1,0}\n"
                  " ROOT r = f32[64,48] transpose(t), dimensions={1,0}", "other indices"),
    "reverse": ("ROOT r = f32[64,48] reverse(p0), dimensions={1}", "other indices"),
    "reduce_then_broadcast": (
        "z = f32[] constant(0)\n s = f32[64] reduce(p0, z), dimensions={1}, to_apply=add\n"
        " b = f32[64,48] broadcast(s), dimensions={0}\n ROOT r = f32[64,48] add(b, p1)",
        "other indices",
    ),
    "layout": ("ROOT r = f32[64,48]{0,1} copy(p0)", "not laid out like"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(IN_PLACE_REJECTED))
def test_in_place_rejected_where_unsafe(name):
    from xlapy.backends.cpu.codegen.emitter import emit_kernel, in_place_reason

    body, fragment = IN_PLACE_REJECTED[name]
    text = (
        "HloModule m\nadd { a = f32[] parameter(0) b = f32[] parameter(1) "
        "ROOT c = f32[] add(a, b) }\nENTRY e {\n p0 = f32[64,48] parameter(0)\n"
        f" p1 = f32[64,48] parameter(1)\n {body}\n}}"
    )
    comp = parse_module(text).entry
    assert fragment in (in_place_reason(comp, 0, 0) or "")
    with pytest.raises(UnsupportedForCodegen, match=fragment):
        emit_kernel(comp, "k", ((0, 0),))


def test_equal_computations_share_one_object(tmp_path, monkeypatch):
    from xlapy.backends.cpu.jit.kernel import clear_loaded_objects

    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    clear_loaded_objects()
    body = "{n} = f32[64,48] exponential(p0)\n ROOT r = f32[64,48] add({n}, p1)"
    a = compile_computation(_in_place_comp(body.format(n="e")), "first")
    b = compile_computation(_in_place_comp(body.format(n="renamed.7")), "other")
    assert not a.from_cache and b.from_cache
    assert len(list(tmp_path.glob("*.o"))) == 1
    assert '@"first"' in a.llvm_ir and '@"other"' in b.llvm_ir and "other" in b.asm
    args = [RNG.standard_normal((64, 48)).astype(np.float32) for _ in range(2)]
    np.testing.assert_array_equal(a(*args), b(*args))


def test_shifts_by_amounts_read_from_memory_stay_one_loop_nest():
    """JAX's rolled threefry loop reads its rotation amounts from the loop state, so every
    shift keeps its `amount >= bits` select on a loop-invariant value. LLVM's non-trivial
    unswitching used to copy the loop nest once per such condition (2^6 vectorized and
    unrolled copies: 1.5 MB of IR, 14 s of LLVM time for this kernel); it is off
    (jit.engine.LLVM_OPTIONS). Results stay exact for amounts in and out of range."""
    rotations = []
    for k in range(3):
        rotations.append(
            f"""
  s{k} = u32[1] slice(r), slice={{[{k}:{k + 1}]}}
  a{k} = u32[] reshape(s{k})
  b{k} = u32[2,16,16] broadcast(a{k}), dimensions={{}}
  c{k} = u32[] subtract(w, a{k})
  d{k} = u32[2,16,16] broadcast(c{k}), dimensions={{}}
  l{k} = u32[2,16,16] shift-left(x{k}, b{k})
  h{k} = u32[2,16,16] shift-right-logical(x{k}, d{k})
  o{k} = u32[2,16,16] or(l{k}, h{k})
  x{k + 1} = u32[2,16,16] xor(o{k}, y)"""
        )
    text = (
        "HloModule rotations\nENTRY e {\n  x0 = u32[2,16,16] parameter(0)\n"
        "  y = u32[2,16,16] parameter(1)\n  r = u32[4] parameter(2)\n"
        "  w = u32[] constant(32)"
        + "".join(rotations)
        + "\n  ROOT out = u32[2,16,16] add(x3, y)\n}"
    )
    x = RNG.integers(0, 2**32, (2, 16, 16), dtype=np.uint32)
    y = RNG.integers(0, 2**32, (2, 16, 16), dtype=np.uint32)
    for amounts in ([13, 15, 26, 6], [0, 32, 40, 1]):
        kernel = check(text, [x, y, np.array(amounts, np.uint32)])
    assert len(kernel.optimized_ir) < 100_000, len(kernel.optimized_ir)


@pytest.mark.parametrize(
    ("a", "b", "runs"),
    [
        ([1, 16, 96], [16, 96], [((0,), ()), ((1,), (0,)), ((2,), (1,))]),
        ([4, 6], [2, 12], [((0, 1), (0, 1))]),
        ([2, 3, 4], [6, 4], [((0, 1), (0,)), ((2,), (1,))]),
        ([24], [2, 3, 4], [((0,), (0, 1, 2))]),
        ([2, 1, 3], [3, 2], [((0, 1, 2), (0, 1))]),
        ([], [1, 1], [((), (0,)), ((), (1,))]),
    ],
)
def test_reshape_groups(a, b, runs):
    from xlapy.backends.cpu.codegen.elemental import reshape_groups

    got = [(tuple(ra), tuple(rb)) for ra, rb in reshape_groups(a, b)]
    assert got == runs


def test_reshape_keeping_dimensions_divides_nothing():
    """A reshape that only adds or drops dimensions of size 1 (or merges major ones) indexes
    the dimensions it keeps directly: no division per element (LLVM widens each into a long
    multiply-high sequence, and the unroller copies it)."""
    text = """HloModule m
ENTRY e {
  x = f32[1,16,96] parameter(0)
  r = f32[16,96] reshape(x)
  ROOT n = f32[16,96] negate(r)
}"""
    kernel = check(text, [random_array("f32", (1, 16, 96))], exact=True)
    assert "udiv" not in kernel.llvm_ir and "urem" not in kernel.llvm_ir


def test_loops_holding_loops_are_not_unrolled(monkeypatch):
    """An outer loop of constant trip count is marked llvm.loop.unroll.disable, the
    innermost loop is left to LLVM: fully unrolled, the outer loop of this concatenation
    copied its vectorized inner loop 16 times (ten times the optimized IR)."""
    from xlapy.backends.cpu.codegen.emitter import KernelEmitter

    def text(name: str) -> str:
        return f"""HloModule m
ENTRY e {{
  {name} = f32[4,16,64] parameter(0)
  b = f32[4,16,96] parameter(1)
  ROOT c = f32[4,16,160] concatenate({name}, b), dimensions={{2}}
}}"""

    args = [random_array("f32", (4, 16, 64)), random_array("f32", (4, 16, 96))]
    kept = check(text("a"), args, exact=True)
    latches = [ln for ln in kept.llvm_ir.splitlines() if ln.strip().startswith("br label")]
    marked = [ln for ln in latches if "!llvm.loop" in ln]
    assert marked and len(marked) < len(latches)
    assert "llvm.loop.unroll.disable" in kept.llvm_ir
    monkeypatch.setattr(KernelEmitter, "unroll_outer_loops", True)
    unrolled = check(text("a2"), args, exact=True)
    assert "llvm.loop.unroll.disable" not in unrolled.llvm_ir
    assert 3 * len(kept.optimized_ir) < len(unrolled.optimized_ir)


CONCAT_CASES = {
    # (entry body, argument shapes, nonempty operands): root concatenates computed operands
    "inner_dim_computed_parts": (
        "a = f32[5,7]{1,0} parameter(0)\n b = f32[5,3] parameter(1)\n"
        " ea = f32[5,7] exponential(a)\n nb = f32[5,3] negate(b)\n"
        " s = f32[5,3] sine(b)\n"
        " ROOT r = f32[5,13] concatenate(ea, nb, s), dimensions={1}",
        [(5, 7), (5, 3)],
        3,
    ),
    "outer_dim_split_over_rows": (
        "a = f32[6,4] parameter(0)\n b = f32[3,4] parameter(1)\n c = f32[5,4] parameter(2)\n"
        " t = f32[3,4] tanh(b)\n"
        " ROOT r = f32[14,4] concatenate(a, t, c), dimensions={0}",
        [(6, 4), (3, 4), (5, 4)],
        3,
    ),
    "column_major_output_and_empty_operand": (
        "a = f32[4,2] parameter(0)\n z = f32[4,0] parameter(1)\n b = f32[4,5] parameter(2)\n"
        " m = f32[4,5] multiply(b, b)\n"
        " ROOT r = f32[4,7]{0,1} concatenate(a, z, m), dimensions={1}",
        [(4, 2), (4, 0), (4, 5)],
        2,
    ),
    "dynamic_slices_by_a_shared_index": (
        "x = f32[8,3,6] parameter(0)\n y = f32[8,3,6] parameter(1)\n i = s32[] parameter(2)\n"
        " k = s32[] constant(0)\n"
        " dx = f32[1,3,6] dynamic-slice(x, i, k, k), dynamic_slice_sizes={1,3,6}\n"
        " dy = f32[1,3,6] dynamic-slice(y, i, k, k), dynamic_slice_sizes={1,3,6}\n"
        " rx = f32[3,6] reshape(dx)\n ry = f32[3,6] reshape(dy)\n"
        " p = f32[3,6] multiply(rx, ry)\n q = f32[3,6] add(p, rx)\n"
        " ROOT r = f32[3,24] concatenate(p, q, rx, ry), dimensions={1}",
        [(8, 3, 6), (8, 3, 6), ()],
        4,
    ),
}


@pytest.mark.parametrize("case", list(CONCAT_CASES))
def test_root_concatenate_loops_per_operand(case):
    """A root concatenate is stored operand by operand (one loop per operand over its own
    range), also when the outer range is run in chunks as the runtime splits it."""
    body, shapes, nonempty = CONCAT_CASES[case]
    text = f"HloModule m\nENTRY e {{\n {body}\n}}"
    args = [np.asarray(3, np.int32) if s == () else random_array("f32", s) for s in shapes]
    kernel = check(text, args)
    # one loop per nonempty operand along the concatenated dimension
    parts = {m.group(1) for m in re.finditer(r"(c\d\.\d+)\.header:", kernel.llvm_ir)}
    assert len(parts) == nonempty
    module = parse_module(text)
    want = Interpreter().run(module, list(args))
    outputs, inputs = kernel.prepare(args)
    pointers = kernel.pointers(outputs, inputs)
    extent = kernel.outer_extent
    for cut in range(extent + 1):  # [0, cut) then [cut, extent)
        outputs[0].fill(np.nan)
        kernel.run_raw(pointers, 0, cut)
        kernel.run_raw(pointers, cut, extent)
        got = kernel.finish(outputs)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, equal_nan=True)


def vector_shape_lanes() -> int:
    """Floats per vector register of the target (4 at SSE4_2, 8 with AVX, 16 with AVX-512;
    jit/engine.py max_isa)."""
    from xlapy.backends.cpu.codegen.emit_conv import vector_shape
    from xlapy.backends.cpu.jit.engine import host_target

    return vector_shape(host_target().features)[0]


def _full_vectors(kernel) -> set[str]:
    """The float vector types of `kernel` of 8 floats or the target's register width."""
    wide = {f"<{n} x float>" for n in (vector_shape_lanes(), 8)}
    return {v for v in kernel.vector_types() if v in wide}


def test_short_minor_dimension_stays_a_vectorized_loop(monkeypatch):
    """A nest's innermost dimension of 8-64 elements (the features of an NHWC tensor) is
    marked llvm.loop.unroll.disable: unrolled fully, LLVM vectorized the loop around it
    with a gather per element (avgpool_grad's scaled pad, as here at 16x64x64x16: 49 KB of
    optimized IR, 180 ms of LLVM). The nest is the one over an outermost dim that is not
    merged with the next (MERGE_EXTENT 0 here): merged, the loop around the minor one
    divides its index apart and LLVM leaves it alone either way."""
    from xlapy.backends.cpu.codegen import emitter

    monkeypatch.setattr(emitter, "MERGE_EXTENT", 0)

    def text(name: str) -> str:
        return f"""HloModule m
ENTRY e {{
  {name} = f32[2,32,32,16] parameter(0)
  c4 = f32[] constant(4)
  b4 = f32[2,32,32,16] broadcast(c4), dimensions={{}}
  d = f32[2,32,32,16] divide({name}, b4)
  c2 = f32[] constant(2)
  b2 = f32[2,32,32,16] broadcast(c2), dimensions={{}}
  m = f32[2,32,32,16] multiply(d, b2)
  d2 = f32[2,32,32,16] divide(m, b4)
  z = f32[] constant(0)
  ROOT p = f32[2,65,65,16] pad(d2, z), padding=0_0_0x1_1_1x1_1_1x0_0_0
}}"""

    args = [random_array("f32", (2, 32, 32, 16))]
    kept = check(text("a"), args, exact=True)
    inner = [ln for ln in kept.llvm_ir.splitlines() if 'br label %"d3.header"' in ln]
    assert any("!llvm.loop" in ln for ln in inner)
    assert _full_vectors(kept)
    monkeypatch.setattr(emitter, "SHORT_MINOR", (1, 0))
    monkeypatch.setattr(emitter, "SLP_MINOR", 1 << 62)  # the loops around left vectorizable
    unrolled = check(text("a2"), args, exact=True)
    # the gathers' cost grows with the vector width: 3x the IR with 8 or 16 floats, about
    # 1.2x with SSE's 4 (max_isa SSE4_2)
    wide = vector_shape_lanes() >= 8
    assert (3 if wide else 1) * len(kept.optimized_ir) < len(unrolled.optimized_ir)


def test_loops_around_a_short_minor_run_are_not_loop_vectorized(monkeypatch):
    """A nest whose minor dimension runs 37 elements (a ViT's attention rows divided by
    their sums): the loops around the minor loop carry llvm.loop.vectorize.width 1, so the
    fully unrolled row is made vectors of by the SLP vectorizer. Left vectorizable, LLVM
    vectorized the loop around it four rows at a time with a gather and a scatter per
    element: 41 KB of optimized IR, 0.4 s of LLVM (loop-load elimination over 148 loads).
    Merged with the outer dims (4 x 6 x 37 steps), the loop around the row divides its
    index apart and LLVM leaves it alone either way: the contrast is made on the nest
    over the outermost dim alone (MERGE_EXTENT 0)."""
    from xlapy.backends.cpu.codegen import emitter

    def text(name: str) -> str:
        return f"""HloModule m
ENTRY e {{
  {name} = f32[4,6,37,37] parameter(0)
  s = f32[4,6,37] parameter(1)
  b = f32[4,6,37,37] broadcast(s), dimensions={{0,1,2}}
  ROOT d = f32[4,6,37,37] divide({name}, b)
}}"""

    args = [random_array("f32", (4, 6, 37, 37)), random_array("f32", (4, 6, 37)) + 3]
    merged = check(text("a0"), args, exact=True)
    assert "llvm.loop.vectorize.width" in merged.llvm_ir
    assert _full_vectors(merged)
    monkeypatch.setattr(emitter, "MERGE_EXTENT", 0)
    rows = check(text("a"), args, exact=True)
    assert "llvm.loop.vectorize.width" in rows.llvm_ir
    assert _full_vectors(rows)
    monkeypatch.setattr(emitter, "SLP_MINOR", 1 << 62)
    across = check(text("a2"), args, exact=True)
    assert "llvm.loop.vectorize.width" not in across.llvm_ir
    assert 3 * len(rows.optimized_ir) < len(across.optimized_ir)


def test_column_reduce_cascade_and_lane_loops():
    """The cascade level whose span covers the whole column runs once, so it is not emitted
    (1024 rows: partials of 32 and 512 rows, no third level); the lane loops other than the
    accumulating one are vectorized without interleaving. Sums match float64 closely."""
    text = """HloModule m
add { a = f32[] parameter(0) b = f32[] parameter(1) ROOT c = f32[] add(a, b) }
ENTRY e {
  x = f32[1024,40] parameter(0)
  z = f32[] constant(0)
  ROOT r = f32[40] reduce(x, z), dimensions={0}, to_apply=add
}"""
    kernel = compile_computation(parse_module(text).entry)
    assert "acc.l1" in kernel.llvm_ir and "acc.l2" not in kernel.llvm_ir
    assert kernel.llvm_ir.count("llvm.loop.interleave.count") == 1  # one shared node
    branches = [ln for ln in kernel.llvm_ir.splitlines() if 'br label %"lane.header' in ln]
    loops = {ln.split('"')[1] for ln in branches}  # each loop: entered once, one latch
    assert len(loops) == 7  # totals set, 2 levels cleared and flushed, accumulate, store
    assert sum("!llvm.loop" in ln for ln in branches) == len(loops) - 1
    x = (RNG.random((1024, 40)) + 1.0).astype(np.float32)
    got = run_parallel(kernel, [x], chunks=3)
    exact = x.astype(np.float64).sum(axis=0)
    assert np.max(np.abs(got - exact) / exact) < 5e-7


ONE_ROW = """HloModule m
ENTRY e {
  x = u32[2] parameter(0)
  s = u32[1] slice(x), slice={[1:2]}
  c = u32[1] constant({880020029})
  ROOT r = u32[1] add(c, s)
}"""

MANY_ROWS = """HloModule m
ENTRY e {
  x = f32[64] parameter(0)
  ROOT r = f32[64] negate(x)
}"""


def test_a_kernel_of_one_row_bounds_its_range():
    """A kernel whose outer extent is 1 clamps [start, end) to [0, 1]: LLVM knows its loop
    runs once at most (no vector loop for it), and a caller passing more rows writes only
    the one. A kernel of more rows keeps its range as given."""
    one = compile_computation(parse_module(ONE_ROW).entry)
    assert one.outer_extent == 1 and "end.in" in one.llvm_ir
    assert "<16 x i32>" not in one.optimized_ir and "<8 x i32>" not in one.optimized_ir
    x = np.array([5, 7], np.uint32)
    out = np.full(4, 3, np.uint32)  # the row, then three a wrong caller would reach
    one.run_raw([out.ctypes.data, x.ctypes.data], 0, 4)
    np.testing.assert_array_equal(out, [880020036, 3, 3, 3])
    many = compile_computation(parse_module(MANY_ROWS).entry)
    assert many.outer_extent > 1 and "end.in" not in many.llvm_ir
