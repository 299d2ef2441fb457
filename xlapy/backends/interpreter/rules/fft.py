"""Evaluation rule for fft: FFT, IFFT, RFFT and IRFFT over the innermost len(fft_length)
dimensions, in the operand's own precision (see xlapy/backends/fft.py, which the CPU
backend calls too)."""

from __future__ import annotations

from xlapy.backends.fft import transform
from xlapy.backends.interpreter.registry import evaluates
from xlapy.errors import EvaluationError
from xlapy.ir.opcodes import Opcode


@evaluates(Opcode.FFT)
def _fft(instr, operands, ctx):
    (x,) = operands
    kind = instr.fft_type
    lengths = instr.fft_length
    out = transform(kind, x, lengths, what=instr.name)
    if out.shape != instr.shape.dims or out.dtype != instr.shape.dtype:
        raise EvaluationError(
            f"{instr.name}: computed {out.dtype}{list(out.shape)}, instruction shape is "
            f"{instr.shape.to_text(with_layout=False)}"
        )
    return out
