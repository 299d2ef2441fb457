"""Interpreter fft, cholesky, triangular-solve and batch-norm ops on hand-written HLO,
checked against JAX (and JAX's autodiff for batch-norm-grad) on fresh random inputs."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from xlapy.backends.interpreter import evaluate
from xlapy.errors import EvaluationError
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("x64_mode")

TEXT = {
    np.dtype(t): n
    for t, n in [
        (np.float32, "f32"),
        (np.float64, "f64"),
        (np.complex64, "c64"),
        (np.complex128, "c128"),
    ]
}
TOL = {"f32": 2e-4, "c64": 2e-4, "f64": 1e-10, "c128": 1e-10}


def shape_text(dtype, dims):
    return f"{TEXT[np.dtype(dtype)]}[{','.join(map(str, dims))}]"


def random(rng, shape, dtype):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def single_op(params, result, op, attrs):
    lines = [
        f"  p{i} = {shape_text(a.dtype, a.shape)} parameter({i})" for i, a in enumerate(params)
    ]
    operands = ", ".join(f"p{i}" for i in range(len(params)))
    lines.append(f"  ROOT r = {result} {op}({operands}), {attrs}")
    return "HloModule m\nENTRY e {\n" + "\n".join(lines) + "\n}"


# (fft_type, input dims, fft_length, input dtype)
FFTS = [
    ("FFT", (4, 8), (8,), np.complex64),
    ("FFT", (3, 4, 6), (4, 6), np.complex64),
    ("FFT", (2, 3, 4, 5), (3, 4, 5), np.complex128),
    ("IFFT", (5, 8), (8,), np.complex64),
    ("IFFT", (2, 6, 4), (6, 4), np.complex128),
    ("RFFT", (3, 10), (10,), np.float32),
    ("RFFT", (2, 4, 7), (4, 7), np.float32),
    ("RFFT", (2, 3, 4, 6), (3, 4, 6), np.float64),
    ("IRFFT", (3, 6), (10,), np.complex64),
    ("IRFFT", (2, 4, 4), (4, 7), np.complex64),
    ("IRFFT", (2, 5, 4), (5, 6), np.complex128),
]


@pytest.mark.parametrize("kind,shape,lengths,dtype", FFTS)
def test_fft_matches_jax(kind, shape, lengths, dtype):
    rng = np.random.default_rng(len(shape) * 10 + len(lengths))
    x = random(rng, shape, dtype)
    ref = np.asarray(lax.fft(x, kind, lengths))
    text = single_op(
        [x],
        shape_text(ref.dtype, ref.shape),
        "fft",
        f"fft_type={kind}, fft_length={{{','.join(map(str, lengths))}}}",
    )
    ours = evaluate(parse_module(text), [x])
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    tol = TOL[TEXT[ref.dtype]]
    np.testing.assert_allclose(ours, ref, rtol=tol, atol=tol * 10)


def test_fft_length_mismatch_is_an_evaluation_error():
    x = np.ones((3, 8), np.complex64)
    text = single_op([x], "c64[3,8]", "fft", "fft_type=FFT, fft_length={6}")
    with pytest.raises(EvaluationError, match="fft_length"):
        evaluate(parse_module(text), [x])


def spd(rng, batch, n, dtype):
    a = random(rng, (*batch, n, n), dtype)
    h = a @ np.conj(np.swapaxes(a, -1, -2)) + n * np.eye(n)
    return h.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_cholesky_matches_jax(dtype, lower, batch):
    rng = np.random.default_rng(len(batch) + 3 * lower)
    a = spd(rng, batch, 5, dtype)
    garbage = random(rng, a.shape, dtype)
    other = np.triu(garbage, 1) if lower else np.tril(garbage, -1)
    a_in = (np.tril(a) if lower else np.triu(a)) + other  # the other triangle is ignored
    text = single_op(
        [a_in], shape_text(dtype, a.shape), "cholesky", f"lower={'true' if lower else 'false'}"
    )
    ours = evaluate(parse_module(text), [a_in])
    low = np.asarray(lax.linalg.cholesky(a, symmetrize_input=False))
    ref = low if lower else np.conj(np.swapaxes(low, -1, -2))
    tol = TOL[TEXT[np.dtype(dtype)]]
    assert ours.dtype == np.dtype(dtype)
    np.testing.assert_allclose(ours, ref, rtol=tol, atol=tol)


def test_cholesky_of_a_non_positive_definite_matrix_is_nan():
    a = np.array([[1.0, 2.0], [2.0, 1.0]], np.float32)
    text = single_op([a], "f32[2,2]", "cholesky", "lower=true")
    assert np.isnan(evaluate(parse_module(text), [a])).all()


TRIANGULAR = list(
    itertools.product(
        [True, False], [True, False], [True, False], ["NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"]
    )
)


@pytest.mark.parametrize("dtype", [np.float32, np.complex128])
@pytest.mark.parametrize("left,lower,unit,transpose", TRIANGULAR)
def test_triangular_solve_matches_jax(left, lower, unit, transpose, dtype):
    rng = np.random.default_rng(sum((left, lower, unit)) + len(transpose))
    m, n = 4, 3
    a = random(rng, (2, m, m), dtype) + (4 * np.eye(m)).astype(dtype)
    b = random(rng, (2, m, n) if left else (2, n, m), dtype)
    text = single_op(
        [a, b],
        shape_text(dtype, b.shape),
        "triangular-solve",
        f"left_side={str(left).lower()}, lower={str(lower).lower()}, "
        f"unit_diagonal={str(unit).lower()}, transpose_a={transpose}",
    )
    ours = evaluate(parse_module(text), [a, b])
    ref = np.asarray(
        lax.linalg.triangular_solve(
            a,
            b,
            left_side=left,
            lower=lower,
            transpose_a=transpose != "NO_TRANSPOSE",
            conjugate_a=transpose == "ADJOINT",
            unit_diagonal=unit,
        )
    )
    tol = TOL[TEXT[np.dtype(dtype)]]
    assert ours.dtype == np.dtype(dtype)
    np.testing.assert_allclose(ours, ref, rtol=tol, atol=tol)


def jax_batch_norm(x, scale, offset, eps, f):
    axes = tuple(d for d in range(x.ndim) if d != f)
    shape = [1] * x.ndim
    shape[f] = x.shape[f]
    mean = jnp.mean(x, axes)
    var = jnp.mean((x - mean.reshape(shape)) ** 2, axes)
    y = (x - mean.reshape(shape)) / jnp.sqrt(var.reshape(shape) + eps)
    return y * scale.reshape(shape) + offset.reshape(shape), mean, var


@pytest.mark.parametrize("shape,f", [((4, 5, 3), 2), ((2, 3, 4, 4), 1), ((6, 2), 0)])
def test_batch_norm_training_inference_and_grad(shape, f):
    rng = np.random.default_rng(sum(shape))
    eps = 1e-3
    c = shape[f]
    x = (rng.standard_normal(shape) * 2 + 1).astype(np.float32)
    scale, offset = random(rng, (c,), np.float32), random(rng, (c,), np.float32)
    grad = random(rng, shape, np.float32)
    feat = f"f32[{c}]"
    common = f"epsilon={eps}, feature_index={f}"
    data = shape_text(np.float32, shape)

    text = single_op([x, scale, offset], f"({data}, {feat}, {feat})", "batch-norm-training", common)
    y, mean, var = evaluate(parse_module(text), [x, scale, offset])
    ry, rmean, rvar = jax.jit(jax_batch_norm, static_argnums=(3, 4))(
        x.astype(np.float64), scale, offset, eps, f
    )
    for ours, ref in ((y, ry), (mean, rmean), (var, rvar)):
        assert ours.dtype == np.float32
        np.testing.assert_allclose(ours, np.asarray(ref), rtol=1e-5, atol=1e-5)

    text = single_op([x, scale, offset, mean, var], data, "batch-norm-inference", common)
    np.testing.assert_allclose(
        evaluate(parse_module(text), [x, scale, offset, mean, var]), y, rtol=1e-5, atol=1e-5
    )

    text = single_op(
        [x, scale, mean, var, grad], f"({data}, {feat}, {feat})", "batch-norm-grad", common
    )
    gx, gs, go = evaluate(parse_module(text), [x, scale, mean, var, grad])

    @jax.jit
    def reference_grad(x, scale, offset, g):
        return jax.vjp(lambda *a: jax_batch_norm(*a, eps, f)[0], x, scale, offset)[1](g)

    wide = [v.astype(np.float64) for v in (x, scale, offset, grad)]
    for ours, ref in zip((gx, gs, go), reference_grad(*wide), strict=True):
        assert ours.dtype == np.float32
        np.testing.assert_allclose(ours, np.asarray(ref), rtol=1e-4, atol=1e-4)
