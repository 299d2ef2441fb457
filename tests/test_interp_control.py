"""Interpreter control flow (while, conditional, call, map, fusion), tuples and the async,
copy and infeed/outfeed wrappers, as HLO text; a few programs are lowered from JAX."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from xlapy.backends.interpreter import evaluate
from xlapy.backends.interpreter.registry import TOKEN
from xlapy.errors import EvaluationError
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("x64_mode")


def run_hlo(text, *args, **state):
    return evaluate(parse_module(text), list(args), **state)


WHILE_SUM = """HloModule m
cond {
  s = (s32[], f32[3]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(10)
  ROOT lt = pred[] compare(i, n), direction=LT
}
body {
  s = (s32[], f32[3]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  acc = f32[3] get-tuple-element(s), index=1
  one = s32[] constant(1)
  next = s32[] add(i, one)
  fi = f32[] convert(i)
  b = f32[3] broadcast(fi), dimensions={}
  sum = f32[3] add(acc, b)
  ROOT t = (s32[], f32[3]) tuple(next, sum)
}
ENTRY e {
  x = f32[3] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[3]) tuple(zero, x)
  w = (s32[], f32[3]) while(init), condition=cond, body=body
  ROOT r = f32[3] get-tuple-element(w), index=1
}"""


def test_while_counting_loop():
    x = np.random.default_rng(1).standard_normal(3).astype(np.float32)
    np.testing.assert_allclose(run_hlo(WHILE_SUM, x), x + 45, rtol=1e-6)


def test_while_iteration_limit_from_state():
    x = np.ones(3, np.float32)
    with pytest.raises(EvaluationError, match="ran past 4 iterations"):
        run_hlo(WHILE_SUM, x, max_while_iterations=4)


def test_fori_loop_lowered_from_jax():
    def f(x):
        return lax.fori_loop(0, 7, lambda i, v: v * 1.5 + i.astype(v.dtype), x)

    x = np.random.default_rng(2).standard_normal(4).astype(np.float32)
    text = jax.jit(f).lower(x).as_text(dialect="hlo")
    np.testing.assert_allclose(run_hlo(text, x), f(x), rtol=1e-6)


COND_PRED = """HloModule m
on_true {
  a = f32[2] parameter(0)
  ROOT n = f32[2] negate(a)
}
on_false {
  b = s32[] parameter(0)
  c = f32[] convert(b)
  ROOT r = f32[2] broadcast(c), dimensions={}
}
ENTRY e {
  p = pred[] parameter(0)
  x = f32[2] parameter(1)
  k = s32[] parameter(2)
  ROOT c = f32[2] conditional(p, x, k), true_computation=on_true, false_computation=on_false
}"""


def test_conditional_by_pred():
    x = np.array([1.5, -2.0], np.float32)
    k = np.array(7, np.int32)
    np.testing.assert_array_equal(run_hlo(COND_PRED, np.array(True), x, k), -x)
    np.testing.assert_array_equal(run_hlo(COND_PRED, np.array(False), x, k), [7.0, 7.0])


COND_INDEX = """HloModule m
b0 {
  a = f32[] parameter(0)
  ROOT r = f32[] add(a, a)
}
b1 {
  a = f32[] parameter(0)
  ROOT r = f32[] multiply(a, a)
}
b2 {
  a = f32[] parameter(0)
  ROOT r = f32[] negate(a)
}
ENTRY e {
  i = s32[] parameter(0)
  x = f32[] parameter(1)
  ROOT c = f32[] conditional(i, x, x, x), branch_computations={b0, b1, b2}
}"""


@pytest.mark.parametrize(
    "index,expected", [(0, 6.0), (1, 9.0), (2, -3.0), (3, -3.0), (-1, -3.0), (1000, -3.0)]
)
def test_conditional_by_index_out_of_range_takes_last_branch(index, expected):
    ours = run_hlo(COND_INDEX, np.array(index, np.int32), np.array(3.0, np.float32))
    assert ours.shape == () and float(ours) == expected


def test_switch_lowered_from_jax():
    branches = [lambda v: v + 1, lambda v: v * 2, lambda v: jnp.sin(v)]

    def f(i, x):
        return lax.switch(i, branches, x)

    x = np.random.default_rng(3).standard_normal(5).astype(np.float32)
    for i in (0, 1, 2):
        args = (np.array(i, np.int32), x)
        text = jax.jit(f).lower(*args).as_text(dialect="hlo")
        np.testing.assert_allclose(run_hlo(text, *args), f(*args), rtol=1e-6)


CALL_AND_FUSION = """HloModule m
helper {
  a = f32[4] parameter(0)
  b = f32[4] parameter(1)
  ROOT r = f32[4] multiply(a, b)
}
fused {
  p0 = f32[4] parameter(0)
  p1 = f32[4] parameter(1)
  s = f32[4] subtract(p0, p1)
  ROOT e = f32[4] exponential(s)
}
ENTRY e {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  c = f32[4] call(x, y), to_apply=helper
  ROOT f = f32[4] fusion(c, y), kind=kLoop, calls=fused
}"""


def test_call_and_fusion():
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(run_hlo(CALL_AND_FUSION, x, y), np.exp(x * y - y), rtol=1e-6)


MAP_ELEMENTWISE = """HloModule m
fn {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  two = f32[] constant(2)
  m = f32[] multiply(a, two)
  ROOT r = f32[] maximum(m, b)
}
ENTRY e {
  x = f32[3,4] parameter(0)
  y = f32[3,4] parameter(1)
  ROOT r = f32[3,4] map(x, y), dimensions={0,1}, to_apply=fn
}"""

MAP_PER_ELEMENT = """HloModule m
inner {
  a = f32[] parameter(0)
  ROOT r = f32[] sine(a)
}
fn {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  s = f32[] call(a), to_apply=inner
  v = f32[1] broadcast(b), dimensions={}
  w = f32[] reshape(v)
  ROOT r = f32[] add(s, w)
}
ENTRY e {
  x = f32[3,4] parameter(0)
  y = f32[3,4] parameter(1)
  ROOT r = f32[3,4] map(x, y), dimensions={0,1}, to_apply=fn
}"""


def test_map_vectorized_elementwise_computation():
    rng = np.random.default_rng(5)
    x, y = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
    np.testing.assert_array_equal(run_hlo(MAP_ELEMENTWISE, x, y), np.maximum(2 * x, y))


def test_map_element_by_element_computation():
    rng = np.random.default_rng(6)
    x, y = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
    np.testing.assert_allclose(run_hlo(MAP_PER_ELEMENT, x, y), np.sin(x) + y, rtol=1e-6)


def test_map_with_constant_only_computation_fills_the_result():
    text = """HloModule m
fn {
  a = s32[] parameter(0)
  ROOT c = s32[] constant(9)
}
ENTRY e {
  x = s32[5] parameter(0)
  ROOT r = s32[5] map(x), dimensions={0}, to_apply=fn
}"""
    np.testing.assert_array_equal(run_hlo(text, np.arange(5, dtype=np.int32)), [9] * 5)


def test_tuples_copy_opt_barrier_and_dependency():
    text = """HloModule m
ENTRY e {
  x = f32[2] parameter(0)
  y = s32[] parameter(1)
  t = (f32[2], s32[]) tuple(x, y)
  b = (f32[2], s32[]) opt-barrier(t)
  c = (f32[2], s32[]) copy(b)
  tok = token[] after-all()
  d = (f32[2], s32[]) add-dependency(c, tok)
  g = f32[2] get-tuple-element(d), index=0
  h = s32[] get-tuple-element(d), index=1
  ROOT r = ((f32[2], s32[]), f32[2], token[]) tuple(d, g, tok)
}"""
    x, y = np.array([1.0, 2.0], np.float32), np.array(5, np.int32)
    (tx, ty), g, tok = run_hlo(text, x, y)
    np.testing.assert_array_equal(tx, x)
    assert int(ty) == 5 and tok is TOKEN
    np.testing.assert_array_equal(g, x)


def test_async_start_done_and_copy_start_done():
    text = """HloModule m
wrapped {
  a = f32[3] parameter(0)
  ROOT n = f32[3] negate(a)
}
ENTRY e {
  x = f32[3] parameter(0)
  s = ((f32[3]), f32[3], s32[]) async-start(x), calls=wrapped
  u = ((f32[3]), f32[3], s32[]) async-update(s)
  d = f32[3] async-done(u)
  cs = (f32[3], f32[3], u32[]) copy-start(d)
  ROOT cd = f32[3] copy-done(cs)
}"""
    x = np.array([1.0, -2.0, 3.0], np.float32)
    np.testing.assert_array_equal(run_hlo(text, x), -x)


INFEED_OUTFEED = """HloModule m
ENTRY e {
  tok = token[] after-all()
  in = (f32[2], token[]) infeed(tok)
  v = f32[2] get-tuple-element(in), index=0
  t2 = token[] get-tuple-element(in), index=1
  d = f32[2] add(v, v)
  out = token[] outfeed(d, t2)
  ROOT r = f32[2] negate(v)
}"""


def test_infeed_and_outfeed_use_state_queues():
    value = np.array([1.0, 4.0], np.float32)
    infeed, outfeed = [value], []
    ours = run_hlo(INFEED_OUTFEED, infeed=infeed, outfeed=outfeed)
    np.testing.assert_array_equal(ours, -value)
    assert len(outfeed) == 1
    np.testing.assert_array_equal(outfeed[0], 2 * value)


def test_infeed_without_queue_is_a_clear_error():
    with pytest.raises(EvaluationError, match=r"infeed needs state\['infeed'\]"):
        run_hlo(INFEED_OUTFEED)


def test_elided_constant_is_a_clear_error():
    text = """HloModule m
ENTRY e {
  ROOT c = f32[3] constant({...})
}"""
    with pytest.raises(EvaluationError, match="elided"):
        run_hlo(text)
