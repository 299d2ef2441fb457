"""Interpreter contractions (dot, convolution, ragged-dot, scaled-dot) checked against JAX on
the CPU: the HLO comes from lowering the JAX function (or is written by hand), and the
interpreter's result is compared with JAX's numbers on fresh random inputs."""

import itertools

import jax
import ml_dtypes
import numpy as np
import pytest
from jax import lax

from xlapy.backends.interpreter import evaluate
from xlapy.errors import EvaluationError
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("x64_mode")

TOL = {
    np.dtype(np.float32): 2e-5,
    np.dtype(np.float64): 1e-12,
    np.dtype(np.complex64): 2e-5,
    np.dtype(ml_dtypes.bfloat16): 1e-2,
    np.dtype(np.float16): 2e-3,
}


def random(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100), shape, endpoint=True).astype(
            dtype
        )
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def run_jax_lowered(f, *args):
    """Lower `f` to HLO text, evaluate it with the interpreter, and return (ours, jax's)."""
    text = jax.jit(f).lower(*args).as_text(dialect="hlo")
    ours = evaluate(parse_module(text), list(args))
    return ours, np.asarray(jax.jit(f)(*args))


def assert_matches(ours, ref, scale=1.0):
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    if ours.dtype.kind in "iub":
        np.testing.assert_array_equal(ours, ref)
        return
    tol = TOL[ours.dtype] * scale
    np.testing.assert_allclose(
        ours.astype(np.complex128), ref.astype(np.complex128), rtol=tol, atol=tol
    )


# (lhs dims, rhs dims, (lhs_contract, rhs_contract), (lhs_batch, rhs_batch), in, out)
DOTS = [
    ((5,), (5,), ((0,), (0,)), ((), ()), np.float32, None),
    ((4, 7), (7, 3), ((1,), (0,)), ((), ()), np.float32, None),
    ((4, 7), (3, 7), ((1,), (1,)), ((), ()), np.float32, None),
    ((7, 4), (7, 3), ((0,), (0,)), ((), ()), np.float64, None),
    ((2, 4, 6), (2, 6, 3), ((2,), (1,)), ((0,), (0,)), np.float32, None),
    ((4, 2, 6), (6, 3, 2), ((2,), (0,)), ((1,), (2,)), np.float32, None),
    ((2, 3, 4, 5), (3, 2, 5, 4, 6), ((2, 3), (3, 2)), ((0, 1), (1, 0)), np.float32, None),
    ((3, 4), (5, 6), ((), ()), ((), ()), np.float32, None),  # outer product
    ((4, 16), (16, 3), ((1,), (0,)), ((), ()), ml_dtypes.bfloat16, np.float32),
    ((4, 16), (16, 3), ((1,), (0,)), ((), ()), ml_dtypes.bfloat16, None),
    ((4, 16), (16, 3), ((1,), (0,)), ((), ()), np.float16, np.float32),
    ((6, 33), (33, 5), ((1,), (0,)), ((), ()), np.int8, np.int32),
    ((2, 6, 33), (2, 33, 5), ((2,), (1,)), ((0,), (0,)), np.int8, np.int32),
    ((6, 9), (9, 5), ((1,), (0,)), ((), ()), np.int32, None),
    ((6, 9), (9, 5), ((1,), (0,)), ((), ()), np.uint8, np.uint32),
    ((3, 5), (5, 4), ((1,), (0,)), ((), ()), np.complex64, None),
    ((0, 5), (5, 4), ((1,), (0,)), ((), ()), np.float32, None),
    ((3, 0), (0, 4), ((1,), (0,)), ((), ()), np.float32, None),
]


@pytest.mark.parametrize("lshape,rshape,contract,batch,dtype,out", DOTS)
def test_dot_matches_jax(lshape, rshape, contract, batch, dtype, out):
    rng = np.random.default_rng(len(lshape) * 31 + len(rshape))
    a, b = random(rng, lshape, dtype), random(rng, rshape, dtype)

    def f(x, y):
        return lax.dot_general(x, y, (contract, batch), preferred_element_type=out)

    ours, ref = run_jax_lowered(f, a, b)
    k = int(np.prod([lshape[d] for d in contract[0]]))
    assert_matches(ours, ref, scale=max(1.0, np.sqrt(k)))


def test_integer_dot_wraps_in_result_type():
    rng = np.random.default_rng(1)
    a = rng.integers(-(2**31), 2**31 - 1, (4, 8), dtype=np.int64).astype(np.int32)
    b = rng.integers(-(2**31), 2**31 - 1, (8, 3), dtype=np.int64).astype(np.int32)
    ours, ref = run_jax_lowered(lambda x, y: x @ y, a, b)
    np.testing.assert_array_equal(ours, ref)
    wrapped = (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)
    np.testing.assert_array_equal(ours, wrapped)


def test_dot_dimension_mismatch_is_an_evaluation_error():
    text = """HloModule m
ENTRY e {
  a = f32[2,3] parameter(0)
  b = f32[4,5] parameter(1)
  ROOT d = f32[2,5] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}"""
    with pytest.raises(EvaluationError, match="contracting dimension sizes differ"):
        evaluate(parse_module(text), [np.ones((2, 3), np.float32), np.ones((4, 5), np.float32)])


# (lhs dims, rhs dims, layouts, strides, padding, lhs_dil, rhs_dil, feature groups,
#  batch groups, dtype)
CONVS = [
    ((2, 3, 9), (4, 3, 3), ("NCH", "OIH", "NCH"), (1,), [(0, 0)], (1,), (1,), 1, 1, "f32"),
    ((2, 9, 3), (3, 3, 4), ("NHC", "HIO", "NHC"), (2,), [(1, 2)], (1,), (1,), 1, 1, "f32"),
    ((1, 4, 10), (6, 2, 3), ("NCH", "OIH", "NCH"), (1,), [(2, 2)], (1,), (2,), 2, 1, "f32"),
    ((2, 3, 7), (5, 3, 2), ("NCH", "OIH", "NCH"), (3,), [(-1, 2)], (2,), (1,), 1, 1, "f32"),
    (
        (2, 3, 8, 8),
        (4, 3, 3, 3),
        ("NCHW", "OIHW", "NCHW"),
        (1, 1),
        [(1, 1), (1, 1)],
        (1, 1),
        (1, 1),
        1,
        1,
        "f32",
    ),
    (
        (2, 8, 8, 3),
        (3, 3, 3, 4),
        ("NHWC", "HWIO", "NHWC"),
        (2, 2),
        [(0, 1), (0, 1)],
        (1, 1),
        (1, 1),
        1,
        1,
        "f32",
    ),
    (
        (2, 7, 9, 3),
        (2, 3, 3, 5),
        ("NHWC", "HWIO", "NCHW"),
        (1, 2),
        [(1, 0), (2, 1)],
        (1, 1),
        (2, 1),
        1,
        1,
        "f32",
    ),
    (
        (1, 6, 9, 8),
        (4, 3, 3, 2),
        ("NCHW", "OIHW", "NCHW"),
        (2, 1),
        [(1, -1), (2, 0)],
        (1, 2),
        (2, 1),
        2,
        1,
        "f32",
    ),
    (
        (2, 6, 6, 6),
        (6, 1, 3, 3),
        ("NCHW", "OIHW", "NCHW"),
        (1, 1),
        [(1, 1), (1, 1)],
        (1, 1),
        (1, 1),
        6,
        1,
        "f32",
    ),  # depthwise
    (
        (2, 5, 5, 4),
        (3, 3, 2, 6),
        ("NHWC", "HWIO", "NHWC"),
        (1, 1),
        [(0, 0), (0, 0)],
        (1, 1),
        (1, 1),
        2,
        1,
        "f32",
    ),
    (
        (4, 3, 6, 6),
        (6, 3, 3, 3),
        ("NCHW", "OIHW", "NCHW"),
        (1, 1),
        [(0, 0), (0, 0)],
        (1, 1),
        (1, 1),
        1,
        2,
        "f32",
    ),  # batch groups (weight-gradient style)
    (
        (6, 5, 5, 2),
        (2, 2, 2, 9),
        ("NHWC", "HWIO", "NHWC"),
        (1, 1),
        [(1, 0), (0, 1)],
        (1, 1),
        (1, 1),
        1,
        3,
        "f32",
    ),
    (
        (2, 3, 5, 5),
        (4, 3, 2, 2),
        ("NCHW", "OIHW", "NCHW"),
        (1, 1),
        [(1, 1), (1, 1)],
        (2, 2),
        (1, 1),
        1,
        1,
        "f32",
    ),  # transposed-conv style
    (
        (2, 3, 5, 5),
        (4, 3, 3, 3),
        ("NCHW", "OIHW", "NCHW"),
        (2, 1),
        [(-1, -1), (0, -2)],
        (1, 1),
        (1, 1),
        1,
        1,
        "f32",
    ),  # negative padding on both sides
    (
        (2, 3, 4, 4),
        (4, 3, 3, 3),
        ("NCHW", "OIHW", "NCHW"),
        (1, 1),
        [(0, 0), (0, 0)],
        (1, 1),
        (2, 2),
        1,
        1,
        "f32",
    ),  # dilated window bigger than the input: empty output
    (
        (1, 2, 5, 4, 6),
        (3, 2, 2, 3, 2),
        ("NCDHW", "OIDHW", "NCDHW"),
        (1, 2, 1),
        [(0, 1), (1, 1), (0, 0)],
        (1, 1, 1),
        (1, 1, 2),
        1,
        1,
        "f32",
    ),  # 3-D
    (
        (2, 5, 4, 6, 2),
        (2, 2, 3, 2, 4),
        ("NDHWC", "DHWIO", "NDHWC"),
        (2, 1, 1),
        [(1, 0), (0, 0), (2, 1)],
        (1, 2, 1),
        (1, 1, 1),
        1,
        1,
        "f32",
    ),
    ((3, 2, 7), (3, 2, 3), ("CNH", "IOH", "HNC"), (1,), [(1, 1)], (1,), (1,), 1, 1, "f32"),
    (
        (2, 3, 6, 6),
        (4, 3, 3, 3),
        ("NCHW", "OIHW", "NCHW"),
        (1, 1),
        [(1, 1), (1, 1)],
        (1, 1),
        (1, 1),
        1,
        1,
        "f64",
    ),
    (
        (2, 3, 6, 6),
        (4, 3, 3, 3),
        ("NCHW", "OIHW", "NCHW"),
        (1, 1),
        [(1, 1), (1, 1)],
        (1, 1),
        (1, 1),
        1,
        1,
        "bf16",
    ),
    (
        (2, 3, 6, 6),
        (4, 3, 3, 3),
        ("NCHW", "OIHW", "NCHW"),
        (2, 1),
        [(1, 1), (0, 0)],
        (1, 1),
        (1, 1),
        1,
        1,
        "s32",
    ),
    ((2, 4, 6), (4, 2, 3), ("NCH", "OIH", "NCH"), (1,), [(2, 0)], (3,), (2,), 2, 1, "f32"),
]
DTYPES = {"f32": np.float32, "f64": np.float64, "bf16": ml_dtypes.bfloat16, "s32": np.int32}


@pytest.mark.parametrize(
    "lshape,rshape,layouts,strides,padding,lhs_dil,rhs_dil,fgc,bgc,dtype", CONVS
)
def test_convolution_matches_jax(
    lshape, rshape, layouts, strides, padding, lhs_dil, rhs_dil, fgc, bgc, dtype
):
    rng = np.random.default_rng(sum(lshape) + 7 * sum(rshape))
    dt = DTYPES[dtype]
    x, k = random(rng, lshape, dt), random(rng, rshape, dt)
    dn = lax.conv_dimension_numbers(lshape, rshape, layouts)

    def f(x, k):
        return lax.conv_general_dilated(
            x,
            k,
            strides,
            padding,
            lhs_dilation=lhs_dil,
            rhs_dilation=rhs_dil,
            dimension_numbers=dn,
            feature_group_count=fgc,
            batch_group_count=bgc,
        )

    ours, ref = run_jax_lowered(f, x, k)
    assert_matches(ours, ref, scale=8.0 if dtype == "bf16" else 4.0)


def test_convolution_window_reversal_flips_the_kernel():
    text = """HloModule m
ENTRY e {
  x = f32[2,3,7,6] parameter(0)
  k = f32[4,3,3,2] parameter(1)
  ROOT c = f32[2,4,5,6] convolution(x, k), window={size=3x2 pad=0_0x0_1 rhs_reversal=1x1},
    dim_labels=bf01_oi01->bf01
}"""
    rng = np.random.default_rng(5)
    x, k = random(rng, (2, 3, 7, 6), np.float32), random(rng, (4, 3, 3, 2), np.float32)
    ours = evaluate(parse_module(text), [x, k])
    ref = lax.conv_general_dilated(x, np.flip(k, (2, 3)), (1, 1), [(0, 0), (0, 1)])
    assert_matches(ours, np.asarray(ref))


def ragged_text(lhs, rhs, out, attrs):
    return f"""HloModule m
ENTRY e {{
  a = f32[{",".join(map(str, lhs))}] parameter(0)
  b = f32[{",".join(map(str, rhs))}] parameter(1)
  g = s32[3] parameter(2)
  ROOT r = f32[{",".join(map(str, out))}] ragged-dot(a, b, g), {attrs}
}}"""


@pytest.mark.parametrize("sizes", [(3, 0, 4), (2, 2, 2), (0, 7, 1), (1, 1, 1)])
def test_ragged_dot_ragged_rows_match_jax(sizes):
    rng = np.random.default_rng(sum(sizes))
    a, b = random(rng, (8, 5), np.float32), random(rng, (3, 5, 4), np.float32)
    gs = np.array(sizes, np.int32)
    text = ragged_text(
        (8, 5),
        (3, 5, 4),
        (8, 4),
        "lhs_contracting_dims={1}, rhs_contracting_dims={1}, lhs_ragged_dims={0}, "
        "rhs_group_dims={0}",
    )
    ours = evaluate(parse_module(text), [a, b, gs])
    assert_matches(ours, np.asarray(lax.ragged_dot(a, b, gs)))


def test_ragged_dot_ragged_contracting_dim_gives_one_result_per_group():
    rng = np.random.default_rng(3)
    a, b = random(rng, (4, 9), np.float32), random(rng, (9, 5), np.float32)
    gs = np.array([2, 4, 2], np.int32)
    text = ragged_text(
        (4, 9),
        (9, 5),
        (3, 4, 5),
        "lhs_contracting_dims={1}, rhs_contracting_dims={0}, lhs_ragged_dims={1}",
    )
    ours = evaluate(parse_module(text), [a, b, gs])
    bounds = np.r_[0, np.cumsum(gs)]
    ref = np.stack([a[:, s:e] @ b[s:e] for s, e in itertools.pairwise(bounds)])
    assert_matches(ours, ref.astype(np.float32))


def test_ragged_dot_ragged_batch_dim_zeroes_rows_past_the_groups():
    rng = np.random.default_rng(4)
    a, b = random(rng, (6, 2, 3), np.float32), random(rng, (6, 3, 4), np.float32)
    gs = np.array([1, 2, 1], np.int32)
    text = ragged_text(
        (6, 2, 3),
        (6, 3, 4),
        (6, 2, 4),
        "lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, "
        "rhs_contracting_dims={1}, lhs_ragged_dims={0}",
    )
    ours = evaluate(parse_module(text), [a, b, gs])
    ref = np.einsum("bmk,bkn->bmn", a, b)
    ref[4:] = 0
    assert_matches(ours, ref)


def test_scaled_dot_scales_blocks_before_contracting():
    text = """HloModule m
ENTRY e {
  a = f32[4,8] parameter(0)
  b = f32[8,3] parameter(1)
  sa = f32[4,2] parameter(2)
  sb = f32[2,3] parameter(3)
  ROOT d = f32[4,3] scaled-dot(a, b, sa, sb), lhs_contracting_dims={1},
    rhs_contracting_dims={0}
}"""
    rng = np.random.default_rng(6)
    a, b = random(rng, (4, 8), np.float32), random(rng, (8, 3), np.float32)
    sa, sb = random(rng, (4, 2), np.float32), random(rng, (2, 3), np.float32)
    ours = evaluate(parse_module(text), [a, b, sa, sb])
    ref = (a * np.repeat(sa, 4, axis=1)) @ (b * np.repeat(sb, 4, axis=0))
    assert_matches(ours, ref)
