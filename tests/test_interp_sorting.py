"""Sort and topk in the reference interpreter, checked against XLA (through JAX)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from xlapy.backends.interpreter import evaluate
from xlapy.errors import EvaluationError
from xlapy.ir.attributes import Enum
from xlapy.ir.parser import parse_module


def assert_same(fn, *args):
    args = [np.asarray(jnp.asarray(a)) for a in args]
    text = jax.jit(fn, keep_unused=True).lower(*args).as_text(dialect="hlo")
    got = evaluate(parse_module(text), args)
    got = got if isinstance(got, tuple) else (got,)
    want = [np.asarray(w) for w in jax.tree_util.tree_leaves(jax.jit(fn)(*args))]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        bits = np.dtype(f"u{g.dtype.itemsize}")  # bit-exact, NaNs included
        np.testing.assert_array_equal(g.view(bits), w.view(bits))


@pytest.fixture
def rng():
    return np.random.default_rng(77)


def with_specials(rng, shape, dtype):
    """Random values with ties, NaNs of both signs, infinities and signed zeros (floats)."""
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -6), min(info.max, 6), size=shape).astype(dtype)
    x = np.round(rng.normal(size=shape) * 3).astype(np.float32)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, size=min(6, flat.size), replace=False)
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)
    flat[picks] = specials[: len(picks)]
    return x.astype(dtype)


SHAPES = [(1,), (2,), (7,), (33,), (4, 9), (3, 5, 6)]
DTYPES = [np.float32, np.int32, np.uint8, jnp.bfloat16, np.float16]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_jnp_sort_and_stable_argsort(rng, shape, dtype):
    x = with_specials(rng, shape, dtype)
    assert_same(lambda x: jnp.sort(x, axis=-1), x)
    assert_same(lambda x: jnp.argsort(x, axis=0, stable=True), x)
    assert_same(lambda x: jnp.argsort(x, axis=-1, descending=True, stable=True), x)


@pytest.mark.parametrize("num_keys", [1, 2])
def test_lax_sort_multi_operand(rng, num_keys):
    a = rng.integers(0, 3, size=(5, 40)).astype(np.int32)
    b = with_specials(rng, (5, 40), np.float32)
    c = rng.normal(size=(5, 40)).astype(np.float32)
    assert_same(lambda a, b, c: lax.sort((a, b, c), dimension=1, num_keys=num_keys), a, b, c)
    assert_same(
        lambda a, b, c: lax.sort((a, b, c), dimension=0, num_keys=num_keys, is_stable=False),
        a,
        b,
        c,
    )


def test_sort_custom_comparator_descending_by_abs(rng):
    """A hand-written comparator (|a| > |b|) through the HLO text, stable."""
    text = """HloModule s
cmp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  i = s32[] parameter(2)
  j = s32[] parameter(3)
  aa = f32[] abs(a)
  ab = f32[] abs(b)
  ROOT gt = pred[] compare(aa, ab), direction=GT
}
ENTRY e {
  x = f32[3,17]{1,0} parameter(0)
  i = s32[3,17]{1,0} parameter(1)
  ROOT s = (f32[3,17]{1,0}, s32[3,17]{1,0}) sort(x, i), dimensions={1}, is_stable=true,
    to_apply=cmp
}"""
    x = np.round(rng.normal(size=(3, 17)) * 2).astype(np.float32)
    idx = np.broadcast_to(np.arange(17, dtype=np.int32), (3, 17)).copy()
    values, order = evaluate(parse_module(text), [x, idx])
    want = np.argsort(-np.abs(x), axis=1, kind="stable").astype(np.int32)
    np.testing.assert_array_equal(order, want)
    np.testing.assert_array_equal(values, np.take_along_axis(x, want, axis=1))


@pytest.mark.parametrize("shape,k", [((10,), 3), ((4, 9), 9), ((2, 3, 16), 5), ((5, 1), 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, jnp.bfloat16])
def test_top_k(rng, shape, k, dtype):
    x = with_specials(rng, shape, dtype)
    assert_same(lambda x: lax.top_k(x, k), x)


def test_topk_smallest(rng):
    text = """HloModule t
ENTRY e {
  x = f32[2,8]{1,0} parameter(0)
  ROOT t = (f32[2,3]{1,0}, s32[2,3]{1,0}) topk(x), k=3, largest=false
}"""
    x = np.round(rng.normal(size=(2, 8)) * 2).astype(np.float32)
    values, idx = evaluate(parse_module(text), [x])
    want = np.argsort(x, axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(idx, want)
    np.testing.assert_array_equal(values, np.take_along_axis(x, want, axis=1))


def test_sort_comparator_arity_mismatch_is_an_evaluation_error(rng):
    text = """HloModule s
cmp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT lt = pred[] compare(a, b), direction=LT
}
ENTRY e {
  x = f32[4]{0} parameter(0)
  y = f32[4]{0} parameter(1)
  ROOT s = (f32[4]{0}, f32[4]{0}) sort(x, y), dimensions={0}, to_apply=cmp
}"""
    x = rng.normal(size=4).astype(np.float32)
    with pytest.raises(EvaluationError, match="comparator takes 2 parameters"):
        evaluate(parse_module(text), [x, x])


def test_editing_a_comparator_in_place_is_seen_by_the_next_sort():
    module = parse_module(
        """HloModule m

less {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=LT
}

ENTRY main {
  x = f32[6] parameter(0)
  ROOT s = f32[6] sort(x), dimensions={0}, to_apply=less
}
"""
    )
    x = np.random.default_rng(7).standard_normal(6).astype(np.float32)
    np.testing.assert_array_equal(evaluate(module, [x]), np.sort(x))
    module.get_computation("less").root.attrs["direction"] = Enum("GT")  # as a pass might
    np.testing.assert_array_equal(evaluate(module, [x]), np.sort(x)[::-1])
