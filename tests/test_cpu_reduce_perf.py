"""The fast reduction paths of the CPU emitter against the interpreter: float max/min rows
(compare-and-select with NaN and signed-zero fix-ups), reductions that also return the
array they reduce (multi-output fusion roots), and selection reducers (argmax) folded as
side-by-side chunks."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from xlapy.backends.cpu import compile_computation, run_parallel
from xlapy.backends.interpreter.evaluator import Interpreter
from xlapy.ir.parser import parse_module

RNG = np.random.default_rng(77)
DTYPES = {"f32": np.float32, "f64": np.float64, "bf16": ml_dtypes.bfloat16, "f16": np.float16}


def _extremum_reference(x: np.ndarray, op: str, init: float) -> np.ndarray:
    """llvm.maximum / minimum folded along axis 1: NaN wins, +0 is above -0."""
    wide = x.astype(np.float64)
    best = wide.max(axis=1) if op == "maximum" else wide.min(axis=1)
    best = np.maximum(best, init) if op == "maximum" else np.minimum(best, init)
    for r in range(x.shape[0]):
        row = wide[r]
        if np.isnan(row).any():
            best[r] = np.nan
        elif best[r] == 0:
            zeros = row[row == 0]
            signs = np.signbit(np.append(zeros, init) if init == 0 else zeros)
            negative = signs.all() if op == "maximum" else signs.any()
            best[r] = -0.0 if negative else 0.0
    return best


@pytest.mark.parametrize("op", ["maximum", "minimum"])
@pytest.mark.parametrize("ty", ["f32", "f64", "bf16", "f16"])
def test_float_extremum_rows_edge_values(op, ty):
    cols = 300
    init = "-inf" if op == "maximum" else "inf"
    text = f"""HloModule m
red {{ a = {ty}[] parameter(0) b = {ty}[] parameter(1) ROOT c = {ty}[] {op}(a, b) }}
ENTRY e {{
  x = {ty}[12,{cols}] parameter(0)
  z = {ty}[] constant({init})
  ROOT r = {ty}[12] reduce(x, z), dimensions={{1}}, to_apply=red
}}"""
    x = RNG.standard_normal((12, cols))
    x[0, 7] = np.nan
    x[1, 299] = -np.nan
    x[2, :] = -np.abs(x[2])
    x[2, 5], x[2, 200] = -0.0, 0.0
    x[3, :] = -np.abs(x[3])
    x[3, 17] = -0.0
    x[4, :] = np.abs(x[4])
    x[4, 3], x[4, 150] = 0.0, -0.0
    x[5, :] = 0.0
    x[5, ::2] = -0.0
    x[6, :] = -0.0
    x[7, 100] = np.inf
    x[8, 100] = -np.inf
    x[9, :] = np.nan
    x = x.astype(DTYPES[ty])
    kernel = compile_computation(parse_module(text).entry)
    got = np.asarray(kernel(x)).astype(np.float64)
    want = _extremum_reference(x, op, float(init))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok], want[ok])
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))
    np.testing.assert_array_equal(
        np.asarray(run_parallel(kernel, [x], chunks=3)).astype(np.float64)[ok], got[ok]
    )


def test_float_extremum_with_finite_init_and_middle_axis():
    text = """HloModule m
red { a = f32[] parameter(0) b = f32[] parameter(1) ROOT c = f32[] maximum(a, b) }
ENTRY e {
  x = f32[3,70,200]{2,1,0} parameter(0)
  z = f32[] constant(0.25)
  ROOT r = f32[3] reduce(x, z), dimensions={1,2}, to_apply=red
}"""
    x = RNG.standard_normal((3, 70, 200)).astype(np.float32)
    x[1] = -np.abs(x[1])
    x[2, 5, 9] = np.nan
    got = compile_computation(parse_module(text).entry)(x)
    want = Interpreter().run(parse_module(text), [x])
    np.testing.assert_array_equal(got, want)


MULTI_OUTPUT = {
    # softmax's exp returned beside its row sum (reduction loop stores the exp)
    "row": ("f32[64,300]{1,0}", "f32[64]", "dimensions={1}", (64, 300)),
    # the same over the kept-minor (column) path
    "column": ("f32[300,64]{1,0}", "f32[64]", "dimensions={0}", (300, 64)),
}


@pytest.mark.parametrize("case", sorted(MULTI_OUTPUT))
@pytest.mark.parametrize("first", ["reduce", "array"])
def test_reduce_returning_its_input(case, first):
    full, out, dims, shape = MULTI_OUTPUT[case]
    leaves = "s, ex" if first == "reduce" else "ex, s"
    tuple_shape = f"({out}, {full})" if first == "reduce" else f"({full}, {out})"
    text = f"""HloModule m
add {{ a = f32[] parameter(0) b = f32[] parameter(1) ROOT c = f32[] add(a, b) }}
ENTRY e {{
  x = {full} parameter(0)
  z = f32[] constant(0)
  ex = {full} exponential(x)
  s = {out} reduce(ex, z), {dims}, to_apply=add
  ROOT t = {tuple_shape} tuple({leaves})
}}"""
    x = RNG.standard_normal(shape).astype(np.float32)
    kernel = compile_computation(parse_module(text).entry)
    got = kernel(x)
    got = got[::-1] if first == "array" else got
    want_exp = np.exp(x.astype(np.float64))
    np.testing.assert_allclose(got[1], want_exp, rtol=2e-6)
    np.testing.assert_allclose(got[0], want_exp.sum(axis=1 if case == "row" else 0), rtol=2e-5)
    par = run_parallel(kernel, [x], chunks=3)
    par = par[::-1] if first == "array" else par
    np.testing.assert_array_equal(par[0], got[0])
    np.testing.assert_array_equal(par[1], got[1])


ARGMAX = """HloModule m
argmax {
  a = f32[] parameter(0)
  ai = s32[] parameter(1)
  b = f32[] parameter(2)
  bi = s32[] parameter(3)
  gt = pred[] compare(a, b), direction=GT
  ne = pred[] compare(a, a), direction=NE
  pick = pred[] or(gt, ne)
  v = f32[] select(pick, a, b)
  eq = pred[] compare(a, b), direction=EQ
  lt = pred[] compare(ai, bi), direction=LT
  tie = pred[] and(eq, lt)
  keep = pred[] or(pick, tie)
  i = s32[] select(keep, ai, bi)
  ROOT t = (f32[], s32[]) tuple(v, i)
}
ENTRY e {
  x = f32[ROWS,COLS] parameter(0)
  io = s32[ROWS,COLS] iota(), iota_dimension=1
  ninf = f32[] constant(-inf)
  zero = s32[] constant(0)
  ROOT r = (f32[ROWS], s32[ROWS]) reduce(x, io, ninf, zero), dimensions={1}, to_apply=argmax
}"""


@pytest.mark.parametrize("cols", [128, 1000, 1027])
def test_argmax_chunked_fold_matches_serial_fold(cols):
    rows = 9
    text = ARGMAX.replace("ROWS", str(rows)).replace("COLS", str(cols))
    x = RNG.integers(-3, 4, (rows, cols)).astype(np.float32)  # many ties
    x[1, 700 % cols] = np.nan
    x[1, 5] = np.nan  # the first NaN wins, in whichever chunk
    x[2, cols - 1] = np.nan
    x[3, :] = -np.inf
    x[4] = RNG.standard_normal(cols).astype(np.float32)
    x[5, :] = np.nan
    kernel = compile_computation(parse_module(text).entry)
    got = kernel(x)
    want = Interpreter().run(parse_module(text), [x])
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    par = run_parallel(kernel, [x], chunks=4)
    np.testing.assert_array_equal(par[1], got[1])
