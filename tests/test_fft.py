"""HLO fft (FFT, IFFT, RFFT, IRFFT over 1 to 3 inner dims) on the interpreter and the CPU
backend against JAX/XLA: every type, odd and even lengths, batch dims, a column-major
operand, single precision as accurate as XLA's, and clear errors for bad shapes."""

import jax
import numpy as np
import pytest
from jax import lax

from xlapy.backends import execute, fft
from xlapy.backends.cpu import CpuBackend
from xlapy.backends.fft import transform
from xlapy.errors import EvaluationError
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("x64_mode")

TEXT = {
    np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64",
    np.dtype(np.complex64): "c64",
    np.dtype(np.complex128): "c128",
}
# relative to the largest magnitude of the reference
TOL = {"f32": 2e-6, "c64": 2e-6, "f64": 1e-13, "c128": 1e-13}
BACKENDS = ["interpreter", "cpu"]


def random(rng, shape, dtype):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def fft_module(kind, x_dims, x_dtype, lengths, out_dims, out_dtype, layout=""):
    dims = ",".join(map(str, x_dims))
    out = ",".join(map(str, out_dims))
    return f"""HloModule m
ENTRY e {{
  p = {TEXT[np.dtype(x_dtype)]}[{dims}]{layout} parameter(0)
  ROOT r = {TEXT[np.dtype(out_dtype)]}[{out}] fft(p), fft_type={kind}, fft_length={{{",".join(map(str, lengths))}}}
}}"""  # noqa: E501


# (kind, operand dims, fft_length): odd and even lengths, 1-3 axes, 0-2 batch dims
CASES = [
    ("FFT", (16,), (16,)),
    ("FFT", (3, 1001), (1001,)),
    ("FFT", (2, 3, 12, 9), (12, 9)),
    ("FFT", (2, 5, 6, 7), (5, 6, 7)),
    ("IFFT", (4, 97), (97,)),
    ("IFFT", (2, 8, 15), (8, 15)),
    ("IFFT", (3, 4, 6, 5), (4, 6, 5)),
    ("RFFT", (5, 64), (64,)),
    ("RFFT", (3, 99), (99,)),
    ("RFFT", (2, 10, 11), (10, 11)),
    ("RFFT", (2, 3, 4, 9), (3, 4, 9)),
    ("IRFFT", (4, 33), (64,)),
    ("IRFFT", (3, 50), (99,)),
    ("IRFFT", (2, 10, 6), (10, 11)),
    ("IRFFT", (2, 3, 4, 5), (3, 4, 8)),
]
REAL_IN = {"RFFT"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("double", [False, True], ids=["single", "double"])
@pytest.mark.parametrize("kind,dims,lengths", CASES)
def test_fft_matches_jax(kind, dims, lengths, double, backend):
    rng = np.random.default_rng(sum(dims) + len(lengths))
    if kind in REAL_IN:
        dtype = np.float64 if double else np.float32
    else:
        dtype = np.complex128 if double else np.complex64
    x = random(rng, dims, dtype)
    ref = np.asarray(jax.jit(lambda v: lax.fft(v, kind, lengths))(x))
    text = fft_module(kind, dims, dtype, lengths, ref.shape, ref.dtype)
    ours = execute(parse_module(text), [x], backend)
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    tol = TOL[TEXT[ref.dtype]] * float(np.max(np.abs(ref)))
    np.testing.assert_allclose(ours, ref, rtol=0, atol=tol)


def test_a_column_major_operand_on_the_cpu_backend():
    rng = np.random.default_rng(1)
    x = random(rng, (6, 10), np.complex64)
    text = fft_module("FFT", (6, 10), np.complex64, (10,), (6, 10), np.complex64, "{0,1}")
    module = parse_module(text)
    program = CpuBackend().compile(module, {})
    assert not program.fallbacks
    assert "fft FFT fft_length={10} (ducc0)" in program.thunk_listing()
    np.testing.assert_allclose(program.run([x]), np.fft.fft(x), rtol=0, atol=1e-5)


def relative_error(a, ref):
    return float(np.linalg.norm((a - ref).ravel()) / np.linalg.norm(ref.ravel()))


@pytest.mark.parametrize(
    "kind,dims,lengths",
    [("FFT", (4, 4096), (4096,)), ("FFT", (2, 6007), (6007,)), ("RFFT", (4, 4095), (4095,)),
     ("IRFFT", (4, 1025), (2048,)), ("FFT", (2, 64, 96), (64, 96)),
     ("FFT", (2, 1 << 15), (1 << 15,))],
)  # fmt: skip
def test_single_precision_is_as_accurate_as_xla(kind, dims, lengths):
    """f32 / c64 computed in single precision (not through c128), no less accurate than
    XLA's f32 FFT against a double-precision reference; the largest case runs threaded."""
    rng = np.random.default_rng(len(dims) + dims[-1])
    dtype = np.float32 if kind in REAL_IN else np.complex64
    x = random(rng, dims, dtype)
    wide = x.astype(np.float64 if kind in REAL_IN else np.complex128)
    ref = transform(kind, wide, lengths)
    ours = transform(kind, x, lengths)
    xla = np.asarray(jax.jit(lambda v: lax.fft(v, kind, lengths))(x))
    assert ours.dtype == xla.dtype
    assert relative_error(ours, ref) <= 1.1 * relative_error(xla, ref) + 1e-9
    assert relative_error(ours, ref) < 5e-7


@pytest.mark.parametrize("kind,lengths", [("FFT", (30,)), ("RFFT", (6, 10)), ("IRFFT", (4, 5, 8))])
def test_threaded_transforms_equal_one_thread(monkeypatch, kind, lengths):
    rng = np.random.default_rng(2)
    inner = (*lengths[:-1], lengths[-1] // 2 + 1) if kind == "IRFFT" else lengths
    x = random(rng, (7, *inner), np.float32 if kind in REAL_IN else np.complex64)
    alone = transform(kind, x, lengths)
    assert x.size < fft.THREADED_MIN_ELEMENTS
    monkeypatch.setattr(fft, "THREADED_MIN_ELEMENTS", 1)
    monkeypatch.setattr(fft, "available_cores", lambda: 3)
    np.testing.assert_array_equal(transform(kind, x, lengths), alone)


@pytest.mark.parametrize(
    "kind,dims,dtype,lengths,message",
    [
        ("FFT", (4, 8), np.complex64, (6,), "inner dims to be \\[6\\]"),
        ("IRFFT", (4, 8), np.complex64, (8,), "inner dims to be \\[5\\]"),
        ("RFFT", (4, 8), np.complex64, (8,), "RFFT takes f32 or f64, got complex64"),
        ("FFT", (4, 8), np.float32, (8,), "FFT takes c64 or c128, got float32"),
        ("FFT", (2, 2, 2, 2), np.complex64, (2, 2, 2, 2), "1 to 3"),
        ("DCT", (4, 8), np.complex64, (8,), "unknown fft_type"),
    ],
)
def test_bad_transforms_are_evaluation_errors(kind, dims, dtype, lengths, message):
    with pytest.raises(EvaluationError, match=message):
        transform(kind, np.ones(dims, dtype), lengths, what="fft.1")


def test_empty_batches():
    out = transform("RFFT", np.ones((0, 8), np.float32), (8,))
    assert out.shape == (0, 5) and out.dtype == np.complex64
