"""Evaluation rule for fft: FFT, IFFT, RFFT and IRFFT over the innermost len(fft_length)
dimensions, computed with numpy.fft in double precision and rounded once to the result
element type (c64/c128 for FFT, IFFT and RFFT; f32/f64 for IRFFT)."""

from __future__ import annotations

import numpy as np

from xlapy.backends.interpreter.registry import evaluates
from xlapy.errors import EvaluationError
from xlapy.ir.opcodes import Opcode


def _transform(kind: str, x: np.ndarray, lengths: tuple[int, ...]) -> np.ndarray:
    axes = tuple(range(x.ndim - len(lengths), x.ndim))
    if kind == "FFT":
        return np.fft.fftn(x.astype(np.complex128), s=lengths, axes=axes)
    if kind == "IFFT":
        return np.fft.ifftn(x.astype(np.complex128), s=lengths, axes=axes)
    if kind == "RFFT":
        return np.fft.rfftn(x.astype(np.float64), s=lengths, axes=axes)
    return np.fft.irfftn(x.astype(np.complex128), s=lengths, axes=axes)


@evaluates(Opcode.FFT)
def _fft(instr, operands, ctx):
    (x,) = operands
    kind = str(instr.attrs.get("fft_type", "FFT"))
    lengths = tuple(instr.attrs.get("fft_length") or ())
    if kind not in ("FFT", "IFFT", "RFFT", "IRFFT"):
        raise EvaluationError(f"{instr.name}: unknown fft_type {kind}")
    if not 1 <= len(lengths) <= 3 or len(lengths) > x.ndim:
        raise EvaluationError(
            f"{instr.name}: fft_length {list(lengths)} must name 1 to 3 of the operand's "
            f"{x.ndim} dims"
        )
    inner = x.shape[x.ndim - len(lengths) :]
    expected = (*lengths[:-1], lengths[-1] // 2 + 1) if kind == "IRFFT" else lengths
    if inner != expected:
        raise EvaluationError(
            f"{instr.name}: {kind} with fft_length={list(lengths)} expects the operand's "
            f"inner dims to be {list(expected)}, got {list(inner)}"
        )
    out = np.asarray(_transform(kind, x, lengths)).astype(instr.shape.dtype)
    if out.shape != instr.shape.dims:
        raise EvaluationError(
            f"{instr.name}: computed dims {list(out.shape)}, instruction shape is "
            f"{instr.shape.to_text(with_layout=False)}"
        )
    return out
