"""Gather, scatter, dynamic-slice and dynamic-update-slice in the reference interpreter,
checked against XLA (through JAX) on the same HLO."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from xlapy.backends.interpreter import evaluate
from xlapy.errors import EvaluationError
from xlapy.ir.parser import parse_module

GDN = lax.GatherDimensionNumbers
SDN = lax.ScatterDimensionNumbers
PROMISE = lax.GatherScatterMode.PROMISE_IN_BOUNDS


def run_both(fn, *args):
    """(xlapy's result, XLA's result) of `fn` jitted on `args`, as tuples of arrays."""
    args = [np.asarray(jnp.asarray(a)) for a in args]  # the dtypes JAX really uses
    text = jax.jit(fn, keep_unused=True).lower(*args).as_text(dialect="hlo")
    got = evaluate(parse_module(text), [np.asarray(a) for a in args])
    want = jax.jit(fn)(*args)
    got = got if isinstance(got, tuple) else (got,)
    return got, tuple(np.asarray(w) for w in jax.tree_util.tree_leaves(want))


def assert_same(fn, *args, exact=True):
    got, want = run_both(fn, *args)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        if exact:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# -- dynamic-slice / dynamic-update-slice -------------------------------------------------

DYNAMIC_CASES = [
    # (operand shape, index dtype, starts, slice sizes)
    ((7, 5), np.int32, (2, 1), (3, 2)),
    ((7, 5), np.int32, (6, -3), (3, 2)),  # clamped at both ends
    ((7, 5), np.uint32, (4000000000, 2), (4, 5)),  # huge unsigned start clamps to the end
    ((4, 3, 6), np.int8, (-100, 1, 5), (2, 3, 4)),
    ((9,), np.int64, (8,), (9,)),
    ((9,), np.uint8, (255,), (1,)),
]


@pytest.mark.parametrize("shape,itype,starts,sizes", DYNAMIC_CASES)
def test_dynamic_slice(rng, shape, itype, starts, sizes):
    x = rng.normal(size=shape).astype(np.float32)
    idx = np.array(starts).astype(itype)
    assert_same(
        lambda x, i: lax.dynamic_slice(x, tuple(i[k] for k in range(len(sizes))), sizes), x, idx
    )


@pytest.mark.parametrize("shape,itype,starts,sizes", DYNAMIC_CASES)
def test_dynamic_update_slice(rng, shape, itype, starts, sizes):
    x = rng.normal(size=shape).astype(np.float32)
    u = rng.normal(size=sizes).astype(np.float32)
    idx = np.array(starts).astype(itype)
    assert_same(
        lambda x, u, i: lax.dynamic_update_slice(x, u, tuple(i[k] for k in range(len(sizes)))),
        x,
        u,
        idx,
    )


# -- gather --------------------------------------------------------------------------------

GATHER_CASES = [
    # name, operand shape, indices (shape, high), dimension numbers, slice sizes
    ("rows", (6, 4), ((5, 1), 6), GDN((1,), (0,), (0,)), (1, 4)),
    ("rows_oob_clamped", (6, 4), ((5, 1), 40), GDN((1,), (0,), (0,)), (1, 4)),
    ("windows_2d", (7, 8), ((3, 2), 9), GDN((1, 2), (), (0, 1)), (3, 2)),
    ("batch_2d", (10, 3), ((2, 3, 1), 12), GDN((2,), (0,), (0,)), (1, 3)),
    ("permuted_map", (5, 6, 7), ((4, 2), 7), GDN((1, 2), (2,), (2, 0)), (2, 3, 1)),
    ("offset_dims_first", (5, 6), ((3, 1), 6), GDN((0,), (1,), (1,)), (5, 1)),
    ("single_vector", (5, 6), ((2,), 7), GDN((0, 1), (), (0, 1)), (2, 3)),
    ("batching", (3, 5, 4), ((3, 2, 1), 6), GDN((2,), (1,), (1,), (0,), (0,)), (1, 1, 4)),
    ("batching_middle", (5, 3, 4), ((2, 3, 1), 6), GDN((2, 3), (), (0,), (1,), (1,)), (2, 1, 4)),
]


@pytest.mark.parametrize(
    "name,shape,index_spec,dnums,sizes", GATHER_CASES, ids=[c[0] for c in GATHER_CASES]
)
def test_gather(rng, name, shape, index_spec, dnums, sizes):
    x = rng.normal(size=shape).astype(np.float32)
    ishape, high = index_spec
    idx = rng.integers(-2, high, size=ishape).astype(np.int32)
    assert_same(lambda x, i: lax.gather(x, i, dnums, sizes, mode=PROMISE), x, idx)


def test_gather_index_vector_dim_zero(rng):
    """index_vector_dim other than the last: write the HLO by hand."""
    text = """HloModule g
ENTRY e {
  x = f32[6,5]{1,0} parameter(0)
  i = s32[2,4]{1,0} parameter(1)
  ROOT g = f32[4,2,3]{2,1,0} gather(x, i), offset_dims={1,2}, collapsed_slice_dims={},
    start_index_map={0,1}, index_vector_dim=0, slice_sizes={2,3}
}"""
    x = rng.normal(size=(6, 5)).astype(np.float32)
    idx = rng.integers(-3, 8, size=(2, 4)).astype(np.int32)
    got = evaluate(parse_module(text), [x, idx])
    want = lax.gather(x, idx.T, GDN((1, 2), (), (0, 1)), (2, 3), mode=PROMISE)
    np.testing.assert_array_equal(got, np.asarray(want))


def test_gather_implicit_index_vector_dim(rng):
    """index_vector_dim equal to the indices' rank: each index is a 1-vector."""
    text = """HloModule g
ENTRY e {
  x = f32[10,3]{1,0} parameter(0)
  i = s32[2,3]{1,0} parameter(1)
  ROOT g = f32[2,3,3]{2,1,0} gather(x, i), offset_dims={2}, collapsed_slice_dims={0},
    start_index_map={0}, index_vector_dim=2, slice_sizes={1,3}
}"""
    x = rng.normal(size=(10, 3)).astype(np.float32)
    idx = rng.integers(-3, 13, size=(2, 3)).astype(np.int32)
    got = evaluate(parse_module(text), [x, idx])
    np.testing.assert_array_equal(got, x[np.clip(idx, 0, 9)])


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8, np.bool_, jnp.bfloat16])
def test_jnp_indexing_patterns(rng, dtype):
    x = (rng.normal(size=(6, 7, 5)) * 10).astype(dtype)
    i = rng.integers(-6, 6, size=(4,)).astype(np.int32)
    j = rng.integers(0, 7, size=(4,)).astype(np.int32)
    assert_same(lambda x, i: x[i], x, i)
    assert_same(lambda x, i, j: x[i, j], x, i, j)
    assert_same(lambda x, i, j: x[:, j, 1:4], x, i, j)
    k = rng.integers(0, 5, size=(6, 7, 3)).astype(np.int32)
    assert_same(lambda x, k: jnp.take_along_axis(x, k, axis=2), x, k)


# -- scatter -------------------------------------------------------------------------------

SCATTER_OPS = {
    "set": lambda r, i, u: r.at[i].set(u),
    "add": lambda r, i, u: r.at[i].add(u),
    "mul": lambda r, i, u: r.at[i].multiply(u),
    "max": lambda r, i, u: r.at[i].max(u),
    "min": lambda r, i, u: r.at[i].min(u),
}


@pytest.mark.parametrize("op", list(SCATTER_OPS))
@pytest.mark.parametrize("dtype", [np.float32, np.int32, jnp.bfloat16])
def test_at_ops_with_duplicates(rng, op, dtype):
    x = (rng.normal(size=(8, 3)) * 4).astype(dtype)
    i = np.array([1, 5, 1, 7, 1, 0, 5], np.int32)
    u = (rng.normal(size=(7, 3)) * 4).astype(dtype)
    assert_same(SCATTER_OPS[op], x, i, u)


def test_scatter_set_keeps_last_duplicate(rng):
    x = rng.normal(size=(5,)).astype(np.float32)
    i = np.array([2, 2, 2, 4, 4], np.int32)
    u = rng.normal(size=(5,)).astype(np.float32)
    got, _ = run_both(lambda x, i, u: x.at[i].set(u, mode=PROMISE), x, i, u)
    assert got[0][2] == u[2] and got[0][4] == u[4]


SCATTER_CASES = [
    # name, operand, indices (shape, low, high), updates shape, dimension numbers
    ("rows_oob_skipped", (6, 4), ((5, 1), -3, 9), (5, 4), SDN((1,), (0,), (0,))),
    ("windows_partly_oob", (7, 8), ((6, 2), -1, 8), (6, 3, 2), SDN((1, 2), (), (0, 1))),
    ("batch_2d", (10, 3), ((2, 3, 1), 0, 12), (2, 3, 3), SDN((2,), (0,), (0,))),
    ("permuted_map", (5, 6, 7), ((4, 2), 0, 7), (4, 2, 3), SDN((1, 2), (2,), (2, 0))),
    ("window_dims_first", (5, 6), ((3, 1), 0, 6), (5, 3), SDN((0,), (1,), (1,))),
    ("batching", (3, 5, 4), ((3, 2, 1), -1, 6), (3, 2, 4), SDN((2,), (1,), (1,), (0,), (0,))),
]


SCATTER_KINDS = {
    "set": lax.scatter,
    "add": lax.scatter_add,
    "mul": lax.scatter_mul,
    "max": lax.scatter_max,  # f32 max is not a ufunc fast path (NaN rule): the general path
}


@pytest.mark.parametrize(
    "name,shape,index_spec,ushape,dnums", SCATTER_CASES, ids=[c[0] for c in SCATTER_CASES]
)
@pytest.mark.parametrize("kind", list(SCATTER_KINDS))
def test_scatter(rng, name, shape, index_spec, ushape, dnums, kind):
    x = rng.normal(size=shape).astype(np.float32)
    ishape, low, high = index_spec
    idx = rng.integers(low, high, size=ishape).astype(np.int32)
    u = rng.normal(size=ushape).astype(np.float32)
    op = SCATTER_KINDS[kind]
    assert_same(
        lambda x, i, u: op(x, i, u, dnums, mode=PROMISE),
        x,
        idx,
        u,
        exact=kind not in ("add", "mul"),
    )


def test_scatter_non_commutative_combiner_order(rng):
    """combiner(old, new) = 2*old - new, with duplicate targets: order matters."""
    text = """HloModule s
comb {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  two = f32[] constant(2)
  t = f32[] multiply(a, two)
  ROOT r = f32[] subtract(t, b)
}
ENTRY e {
  x = f32[4]{0} parameter(0)
  i = s32[6,1]{1,0} parameter(1)
  u = f32[6]{0} parameter(2)
  ROOT s = f32[4]{0} scatter(x, i, u), update_window_dims={}, inserted_window_dims={0},
    scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=comb
}"""
    x = rng.normal(size=4).astype(np.float32)
    i = np.array([[1], [3], [1], [9], [1], [3]], np.int32)
    u = rng.normal(size=6).astype(np.float32)
    got = evaluate(parse_module(text), [x, i, u])
    want = x.copy()
    for k, t in enumerate(i[:, 0]):
        if t < 4:
            want[t] = np.float32(2) * want[t] - u[k]
    np.testing.assert_array_equal(got, want)


def test_variadic_scatter(rng):
    """Two operands scattered together with a combiner over 4 scalars (argmax-like)."""
    text = """HloModule s
comb {
  v0 = f32[] parameter(0)
  i0 = s32[] parameter(1)
  v1 = f32[] parameter(2)
  i1 = s32[] parameter(3)
  gt = pred[] compare(v1, v0), direction=GT
  v = f32[] select(gt, v1, v0)
  i = s32[] select(gt, i1, i0)
  ROOT t = (f32[], s32[]) tuple(v, i)
}
ENTRY e {
  x = f32[5]{0} parameter(0)
  xi = s32[5]{0} parameter(1)
  idx = s32[8,1]{1,0} parameter(2)
  u = f32[8]{0} parameter(3)
  ui = s32[8]{0} parameter(4)
  ROOT s = (f32[5]{0}, s32[5]{0}) scatter(x, xi, idx, u, ui), update_window_dims={},
    inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1,
    to_apply=comb
}"""
    x = rng.normal(size=5).astype(np.float32)
    xi = np.full(5, -1, np.int32)
    idx = rng.integers(0, 5, size=(8, 1)).astype(np.int32)
    u = rng.normal(size=8).astype(np.float32)
    ui = np.arange(8, dtype=np.int32)
    vals, ids = evaluate(parse_module(text), [x, xi, idx, u, ui])
    want_v, want_i = x.copy(), xi.copy()
    for k, t in enumerate(idx[:, 0]):
        if u[k] > want_v[t]:
            want_v[t], want_i[t] = u[k], ui[k]
    np.testing.assert_array_equal(vals, want_v)
    np.testing.assert_array_equal(ids, want_i)


def test_gather_bad_index_vector_is_an_evaluation_error(rng):
    text = """HloModule g
ENTRY e {
  x = f32[6,5]{1,0} parameter(0)
  i = s32[4,3]{1,0} parameter(1)
  ROOT g = f32[4,2,3]{2,1,0} gather(x, i), offset_dims={1,2}, collapsed_slice_dims={},
    start_index_map={0,1}, index_vector_dim=1, slice_sizes={2,3}
}"""
    x = rng.normal(size=(6, 5)).astype(np.float32)
    with pytest.raises(EvaluationError, match="start_index_map"):
        evaluate(parse_module(text), [x, np.ones((4, 3), np.int32)])
