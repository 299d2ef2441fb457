"""Interpreter reductions (reduce, reduce-window, select-and-scatter) on hand-written HLO,
checked against JAX on fresh random inputs. Init values are parameters, so the modules
need only the reduction rules and the elementwise ops of their reducers."""

import itertools

import jax
import numpy as np
import pytest
from jax import lax

from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("x64_mode")

BINARY = {"add": lax.add, "multiply": lax.mul, "maximum": lax.max, "minimum": lax.min}
IDENTITY = {"add": 0, "multiply": 1, "maximum": -np.inf, "minimum": np.inf}


def dims_text(dims):
    return ",".join(map(str, dims))


def reducer(name, op, ty, general=False):
    """A two-parameter reducer region; `general` adds a copy so it is not the one-op form."""
    if not general:
        body = f"  ROOT r = {ty}[] {op}(a, b)"
    else:
        body = f"  s = {ty}[] {op}(a, b)\n  ROOT r = {ty}[] copy(s)"
    return f"{name} {{\n  a = {ty}[] parameter(0)\n  b = {ty}[] parameter(1)\n{body}\n}}\n"


def init_for(op, dtype):
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        value = {"add": 0, "multiply": 1, "maximum": info.min, "minimum": info.max}[op]
    else:
        value = IDENTITY[op]
    return np.asarray(value, dtype)


SUBSETS = [s for r in range(4) for s in itertools.combinations(range(3), r)]


@pytest.mark.parametrize("general", [False, True], ids=["ufunc", "fold"])
@pytest.mark.parametrize("ty", ["f32", "s32"])
@pytest.mark.parametrize("op", ["add", "multiply", "maximum", "minimum"])
def test_reduce_every_subset_of_axes(op, ty, general):
    dtype = np.dtype({"f32": np.float32, "s32": np.int32}[ty])
    rng = np.random.default_rng(hash((op, ty)) % 1000)
    if dtype.kind == "i":
        x = rng.integers(-(2**31), 2**31 - 1, (3, 4, 5)).astype(dtype)  # products wrap
    else:
        x = rng.uniform(0.5, 1.5, (3, 4, 5)).astype(dtype)
    init = init_for(op, dtype)
    for dims in SUBSETS:
        out_dims = [n for d, n in enumerate(x.shape) if d not in dims]
        text = (
            "HloModule m\n" + reducer("red", op, ty, general) + "ENTRY e {\n"
            f"  x = {ty}[3,4,5] parameter(0)\n  i = {ty}[] parameter(1)\n"
            f"  ROOT r = {ty}[{dims_text(out_dims)}] reduce(x, i), "
            f"dimensions={{{dims_text(dims)}}}, to_apply=red\n}}"
        )
        ours = evaluate(parse_module(text), [x, init])
        ref = np.asarray(lax.reduce(x, init, BINARY[op], dims))
        assert ours.dtype == dtype and ours.shape == ref.shape, dims
        if dtype.kind == "i":
            np.testing.assert_array_equal(ours, ref, err_msg=str(dims))
        else:
            np.testing.assert_allclose(ours, ref, rtol=1e-5, err_msg=str(dims))


def test_reduce_nonzero_init_is_combined_once():
    text = (
        "HloModule m\n"
        + reducer("red", "add", "f32")
        + """ENTRY e {
  x = f32[4,6] parameter(0)
  i = f32[] parameter(1)
  ROOT r = f32[4] reduce(x, i), dimensions={1}, to_apply=red
}"""
    )
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    ours = evaluate(parse_module(text), [x, np.float32(10.0)])
    np.testing.assert_allclose(ours, x.sum(1) + 10, rtol=1e-5)


ARGMAX = """HloModule m
argmax {
  av = f32[] parameter(0)
  ai = s32[] parameter(1)
  bv = f32[] parameter(2)
  bi = s32[] parameter(3)
  gt = pred[] compare(av, bv), direction=GT
  eq = pred[] compare(av, bv), direction=EQ
  lt = pred[] compare(ai, bi), direction=LT
  tie = pred[] and(eq, lt)
  pick_a = pred[] or(gt, tie)
  v = f32[] select(pick_a, av, bv)
  i = s32[] select(pick_a, ai, bi)
  ROOT t = (f32[], s32[]) tuple(v, i)
}
ENTRY e {
  x = f32[DIMS] parameter(0)
  idx = s32[DIMS] parameter(1)
  lo = f32[] parameter(2)
  zero = s32[] parameter(3)
  ROOT r = (f32[OUT], s32[OUT]) reduce(x, idx, lo, zero), dimensions={AXIS}, to_apply=argmax
}"""


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_variadic_reduce_argmax_picks_first_of_ties(axis):
    rng = np.random.default_rng(axis)
    shape = (4, 5, 6)
    x = rng.integers(0, 3, shape).astype(np.float32)  # many ties
    idx = np.broadcast_to(
        np.arange(shape[axis], dtype=np.int32).reshape([-1 if d == axis else 1 for d in range(3)]),
        shape,
    ).copy()
    out = [n for d, n in enumerate(shape) if d != axis]
    text = (
        ARGMAX.replace("DIMS", dims_text(shape))
        .replace("OUT", dims_text(out))
        .replace("AXIS", str(axis))
    )
    values, indices = evaluate(parse_module(text), [x, idx, np.float32(-np.inf), np.int32(0)])
    np.testing.assert_array_equal(values, x.max(axis))
    np.testing.assert_array_equal(indices, np.argmax(x, axis).astype(np.int32))
    assert indices.dtype == np.int32


def window_text(size, stride, pad, lhs, rhs):
    return (
        f"size={'x'.join(map(str, size))} stride={'x'.join(map(str, stride))} "
        f"pad={'x'.join(f'{lo}_{hi}' for lo, hi in pad)} lhs_dilate={'x'.join(map(str, lhs))} "
        f"rhs_dilate={'x'.join(map(str, rhs))}"
    )


# (op, input dims, window, strides, padding, base dilation, window dilation, init)
WINDOWS = [
    ("maximum", (8, 9), (2, 2), (2, 2), ((0, 0), (0, 1)), (1, 1), (1, 1), None),  # max-pool
    (
        "maximum",
        (2, 7, 7, 3),
        (1, 3, 3, 1),
        (1, 2, 2, 1),
        ((0, 0), (1, 1), (1, 1), (0, 0)),
        (1, 1, 1, 1),
        (1, 1, 1, 1),
        None,
    ),
    ("add", (6, 7), (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), (1, 1), None),  # avg-pool sum
    ("add", (6, 7), (3, 2), (2, 1), ((2, 0), (-1, 3)), (1, 1), (1, 1), None),
    ("add", (5, 6), (2, 3), (1, 2), ((1, 1), (0, 2)), (2, 1), (1, 2), None),  # dilations
    (
        "minimum",
        (5, 4, 3),
        (2, 2, 2),
        (1, 1, 2),
        ((0, 1), (1, 0), (1, 1)),
        (1, 2, 1),
        (2, 1, 1),
        None,
    ),
    ("add", (6, 7), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), (1, 1), 1.5),  # init counted once
    ("multiply", (4, 6), (2, 3), (1, 1), ((0, 0), (1, 1)), (1, 2), (1, 1), None),
]


@pytest.mark.parametrize("general", [False, True], ids=["ufunc", "fold"])
@pytest.mark.parametrize("op,shape,size,stride,pad,lhs,rhs,init", WINDOWS)
def test_reduce_window_matches_jax(op, shape, size, stride, pad, lhs, rhs, init, general):
    rng = np.random.default_rng(sum(shape) + len(op))
    x = rng.uniform(0.5, 1.5, shape).astype(np.float32)
    init = np.float32(IDENTITY[op] if init is None else init)
    ref = np.asarray(lax.reduce_window(x, init, BINARY[op], size, stride, pad, lhs, rhs))
    text = (
        "HloModule m\n" + reducer("red", op, "f32", general) + "ENTRY e {\n"
        f"  x = f32[{dims_text(shape)}] parameter(0)\n  i = f32[] parameter(1)\n"
        f"  ROOT r = f32[{dims_text(ref.shape)}] reduce-window(x, i), "
        f"window={{{window_text(size, stride, pad, lhs, rhs)}}}, to_apply=red\n}}"
    )
    ours = evaluate(parse_module(text), [x, init])
    assert ours.shape == ref.shape and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, rtol=1e-5)


def test_variadic_reduce_window_tracks_max_and_its_position():
    text = """HloModule m
red {
  av = f32[] parameter(0)
  ai = s32[] parameter(1)
  bv = f32[] parameter(2)
  bi = s32[] parameter(3)
  ge = pred[] compare(av, bv), direction=GE
  v = f32[] select(ge, av, bv)
  i = s32[] select(ge, ai, bi)
  ROOT t = (f32[], s32[]) tuple(v, i)
}
ENTRY e {
  x = f32[6,8] parameter(0)
  p = s32[6,8] parameter(1)
  lo = f32[] parameter(2)
  none = s32[] parameter(3)
  ROOT r = (f32[3,4], s32[3,4]) reduce-window(x, p, lo, none), window={size=2x2 stride=2x2},
    to_apply=red
}"""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    p = np.arange(48, dtype=np.int32).reshape(6, 8)
    values, where = evaluate(parse_module(text), [x, p, np.float32(-np.inf), np.int32(-1)])
    blocks = x.reshape(3, 2, 4, 2).transpose(0, 2, 1, 3).reshape(3, 4, 4)
    np.testing.assert_array_equal(values, blocks.max(-1))
    np.testing.assert_array_equal(x.ravel()[where], values)


SELECT_SCATTER = """HloModule m
ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=GE
}
SCATTER
ENTRY e {
  x = f32[DIMS] parameter(0)
  s = f32[OUT] parameter(1)
  z = f32[] parameter(2)
  ROOT r = f32[DIMS] select-and-scatter(x, s, z), window={WINDOW}, select=ge, scatter=add
}"""

# (input dims, window, strides, padding)
POOLS = [
    ((6, 8), (2, 2), (2, 2), ((0, 0), (0, 0))),
    ((7, 7), (3, 3), (2, 2), ((1, 1), (1, 1))),  # overlapping windows with padding
    ((2, 6, 5, 3), (1, 3, 2, 1), (1, 1, 2, 1), ((0, 0), (1, 1), (0, 1), (0, 0))),
    ((9,), (4,), (3,), ((2, 2),)),
]


@pytest.mark.parametrize("general", [False, True], ids=["ufunc", "fold"])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("shape,size,stride,pad", POOLS)
def test_select_and_scatter_is_the_max_pool_gradient(shape, size, stride, pad, ties, general):
    rng = np.random.default_rng(sum(shape) + ties)
    if ties:
        x = rng.integers(0, 3, shape).astype(np.float32)
    else:
        x = rng.standard_normal(shape).astype(np.float32)

    def pool(v):
        return lax.reduce_window(v, -np.inf, lax.max, size, stride, pad)

    out, vjp = jax.vjp(pool, x)
    s = rng.standard_normal(out.shape).astype(np.float32)
    (ref,) = vjp(s)
    ones = tuple(1 for _ in shape)
    text = (
        SELECT_SCATTER.replace("SCATTER", reducer("add", "add", "f32", general))
        .replace("WINDOW", window_text(size, stride, pad, ones, ones))
        .replace("OUT", dims_text(out.shape))
        .replace("DIMS", dims_text(shape))
    )
    ours = evaluate(parse_module(text), [x, s, np.float32(0)])
    np.testing.assert_allclose(ours, np.asarray(ref), rtol=1e-6, atol=1e-6)


def test_reduce_with_a_non_elementwise_reducer_folds_one_element_at_a_time():
    text = """HloModule m
red {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ra = f32[1] reshape(a)
  rb = f32[1] reshape(b)
  s = f32[1] subtract(ra, rb)
  ROOT r = f32[] reshape(s)
}
ENTRY e {
  x = f32[3,4] parameter(0)
  i = f32[] parameter(1)
  ROOT r = f32[3] reduce(x, i), dimensions={1}, to_apply=red
}"""
    x = np.random.default_rng(11).standard_normal((3, 4)).astype(np.float32)
    ours = evaluate(parse_module(text), [x, np.float32(2.0)])
    expected = np.full(3, 2.0, np.float32)
    for j in range(4):  # init first, then the elements in order: ((i - x0) - x1) - ...
        expected = expected - x[:, j]
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize("op", ["maximum", "minimum"])
@pytest.mark.parametrize("t", ["f32", "bf16"])
def test_max_min_reductions_order_signed_zeros(op, t):
    # corner fuzz seed 601727: np.maximum.reduce keeps whichever zero comes last; XLA's
    # reduce and reduce-window give +0 for a max over {-0, +0} and -0 for a min
    init = "-inf" if op == "maximum" else "inf"
    text = f"""HloModule m
r {{
  a = {t}[] parameter(0)
  b = {t}[] parameter(1)
  ROOT c = {t}[] {op}(a, b)
}}
ENTRY e {{
  x = {t}[4,2] parameter(0)
  z = {t}[] constant({init})
  o = {t}[4] reduce(x, z), dimensions={{1}}, to_apply=r
  w = {t}[4,1] reduce-window(x, z), window={{size=1x2}}, to_apply=r
  ow = {t}[4] reshape(w)
  ROOT t = ({t}[4], {t}[4]) tuple(o, ow)
}}"""
    import ml_dtypes

    dtype = np.float32 if t == "f32" else ml_dtypes.bfloat16
    x = np.array([[-0.0, 0.0], [0.0, -0.0], [-0.0, -0.0], [0.0, 0.0]], dtype)
    want = [False, False, True, False] if op == "maximum" else [True, True, True, False]
    for out in evaluate(parse_module(text), [x]):
        assert list(np.signbit(np.asarray(out, np.float32))) == want
