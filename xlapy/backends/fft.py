"""HLO's fft: FFT, IFFT, RFFT and IRFFT over the innermost len(fft_length) (1 to 3)
dimensions, through scipy.fft (pocketfft, C++).

Precision as XLA:CPU's (which calls ducc, pocketfft's successor): f32 / c64 are transformed in
single precision and f64 / c128 in double, never through a wider type (numpy.fft before 2.0
computed everything in double; the round trip through c128 cost more than the transform).
IFFT and IRFFT scale by 1/N (numpy's "backward" normalization, as XLA does); IRFFT ignores
the imaginary parts of the zero and Nyquist bins, as every c2r transform does.

Threads: scipy.fft splits the batch (and, for several axes, each axis pass) over `workers`
threads of its own pool; a transform of at least `THREADED_MIN_ELEMENTS` elements uses
every core the process may use (`available_cores`), a smaller one the calling thread only
(handing a few microseconds of work to a pool costs more than it saves).

`check(...)` is the shape contract both the interpreter's rule and the CPU backend's thunk
enforce before anything runs.
"""

from __future__ import annotations

import math

import numpy as np

from xlapy.backends.host import available_cores
from xlapy.errors import EvaluationError

KINDS = ("FFT", "IFFT", "RFFT", "IRFFT")
THREADED_MIN_ELEMENTS = 1 << 15
"""Transforms with fewer elements (input or output, the larger) run on one thread."""

_INPUT_KIND = {"FFT": "c", "IFFT": "c", "RFFT": "f", "IRFFT": "c"}
_RESULT = {
    ("FFT", "complex64"): np.complex64,
    ("FFT", "complex128"): np.complex128,
    ("IFFT", "complex64"): np.complex64,
    ("IFFT", "complex128"): np.complex128,
    ("RFFT", "float32"): np.complex64,
    ("RFFT", "float64"): np.complex128,
    ("IRFFT", "complex64"): np.float32,
    ("IRFFT", "complex128"): np.float64,
}


def result_shape(kind: str, dims: tuple[int, ...], lengths: tuple[int, ...]) -> tuple[int, ...]:
    """The result dims of `kind` over operand dims `dims` with fft_length `lengths`."""
    batch = dims[: len(dims) - len(lengths)]
    if kind == "RFFT":
        return (*batch, *lengths[:-1], lengths[-1] // 2 + 1)
    return (*batch, *lengths)


def check(
    what: str, kind: str, dims: tuple[int, ...], dtype: np.dtype, lengths: tuple[int, ...]
) -> np.dtype:
    """The result element type of a `kind` transform of a `dtype` operand with dims `dims`,
    or EvaluationError naming `what` and the mismatch."""
    if kind not in KINDS:
        raise EvaluationError(f"{what}: unknown fft_type {kind} (expected one of {KINDS})")
    if not 1 <= len(lengths) <= 3 or len(lengths) > len(dims):
        raise EvaluationError(
            f"{what}: fft_length {list(lengths)} must name 1 to 3 of the operand's {len(dims)} dims"
        )
    if any(n < 0 for n in lengths):
        raise EvaluationError(f"{what}: fft_length {list(lengths)} has a negative length")
    inner = tuple(dims[len(dims) - len(lengths) :])
    expected = (*lengths[:-1], lengths[-1] // 2 + 1) if kind == "IRFFT" else tuple(lengths)
    if inner != expected:
        raise EvaluationError(
            f"{what}: {kind} with fft_length={list(lengths)} expects the operand's inner "
            f"dims to be {list(expected)}, got {list(inner)}"
        )
    result = _RESULT.get((kind, np.dtype(dtype).name))
    if result is None:
        want = "c64 or c128" if _INPUT_KIND[kind] == "c" else "f32 or f64"
        raise EvaluationError(f"{what}: {kind} takes {want}, got {np.dtype(dtype).name}")
    return np.dtype(result)


def transform(kind: str, x: np.ndarray, lengths: tuple[int, ...], what: str = "fft"):
    """The `kind` transform of `x` over its innermost len(lengths) dims (checked first)."""
    lengths = tuple(int(n) for n in lengths)
    dtype = check(what, kind, x.shape, x.dtype, lengths)
    out_dims = result_shape(kind, x.shape, lengths)
    if x.size == 0 or 0 in out_dims:
        return np.zeros(out_dims, dtype)
    import scipy.fft

    axes = tuple(range(x.ndim - len(lengths), x.ndim))
    big = max(x.size, math.prod(out_dims)) >= THREADED_MIN_ELEMENTS
    workers = available_cores() if big else 1
    if kind == "FFT":
        out = scipy.fft.fftn(x, axes=axes, workers=workers)
    elif kind == "IFFT":
        out = scipy.fft.ifftn(x, axes=axes, workers=workers)
    elif kind == "RFFT":
        out = scipy.fft.rfftn(x, axes=axes, workers=workers)
    else:
        out = scipy.fft.irfftn(x, s=lengths, axes=axes, workers=workers)
    if out.dtype != dtype or out.shape != out_dims:  # scipy keeps the precision; say so if not
        raise EvaluationError(
            f"{what}: scipy.fft gave {out.dtype}{list(out.shape)}, expected {dtype}{list(out_dims)}"
        )
    return out
