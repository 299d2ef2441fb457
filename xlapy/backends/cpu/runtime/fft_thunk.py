# FFT thunks: HLO's fft (FFT, IFFT, RFFT, IRFFT over 1 to 3 inner dims) through
# xlapy/backends/fft.py (scipy.fft's pocketfft in the operand's precision, the batch split
# over the process's cores for large transforms), on a view of the operand's slice in any
# layout; the result is stored into the instruction's slice.

from __future__ import annotations

import math

import numpy as np

from xlapy.backends.cpu.runtime.thunk import (
    NS_PER_LIBRARY_ELEMENT,
    BufferSlice,
    ExecutionContext,
    Thunk,
)
from xlapy.backends.fft import THREADED_MIN_ELEMENTS, check, transform
from xlapy.ir.instruction import HloInstruction


class FftThunk(Thunk):
    """One fft instruction on the arena (see the file comment). The shape contract is
    checked when the thunk is built (EvaluationError naming the instruction)."""

    kind = "library"
    IMAGE_DEFERRED = ()
    IMAGE_DETACHED = ("instr",)
    """It reads its instruction to load or run: a program image keeps a copy of it that
    shares nothing with the module (loadable.detached), so neither reads the module."""

    def __init__(self, instr: HloInstruction, operand: BufferSlice, result: BufferSlice):
        self.instr, self.operand, self.result = instr, operand, result
        self.fft_type = instr.fft_type
        self.lengths = instr.fft_length
        shape = operand.shape
        check(instr.name, self.fft_type, shape.dims, shape.dtype, self.lengths)

    def run(self, ctx: ExecutionContext) -> None:
        out = transform(self.fft_type, ctx.view(self.operand), self.lengths, self.instr.name)
        np.copyto(ctx.view(self.result), out, casting="no")

    def describe(self) -> list[str]:
        lengths = ",".join(map(str, self.lengths))
        return [
            f"library {self.instr.name} = fft {self.fft_type} fft_length={{{lengths}}} (scipy.fft)",
            f"in0: {self.operand}",
            f"out: {self.result}",
        ]

    def _elements(self) -> int:
        return max(self.operand.shape.num_elements, self.result.shape.num_elements)

    def cost(self) -> float:
        n = max(2, math.prod(self.lengths))
        return 5_000 + self._elements() * math.log2(n) * NS_PER_LIBRARY_ELEMENT

    def runs_alone(self) -> bool:
        return self._elements() < THREADED_MIN_ELEMENTS
