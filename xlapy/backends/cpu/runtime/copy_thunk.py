# Copy thunks: a byte copy between two slices of the same shape and layout (memmove on the
# execution's addresses).

from __future__ import annotations

from collections.abc import Callable

from xlapy.backends.cpu.runtime.thunk import (
    NS_PER_COPIED_BYTE,
    BufferSlice,
    ExecutionContext,
    Thunk,
    bind_copies,
    raw_copies,
    run_copies,
)
from xlapy.ir.instruction import HloInstruction


class CopyThunk(Thunk):
    """A byte copy between two slices of the same shape and layout."""

    kind = "copy"

    def __init__(self, instr: HloInstruction, src: BufferSlice, dst: BufferSlice):
        self.instr, self.src, self.dst = instr, src, dst
        self._copies = raw_copies([(src, dst)])

    def run(self, ctx: ExecutionContext) -> None:
        run_copies(ctx.bases, self._copies)

    def bind(self, ctx: ExecutionContext) -> Callable[[], object] | None:
        bound = bind_copies(ctx.bases, self._copies)
        return bound[0] if bound else None

    def describe(self) -> list[str]:
        return [*super().describe(), f"from {self.src}", f"to {self.dst}"]

    def cost(self) -> float:
        return 500 + self.src.size * NS_PER_COPIED_BYTE
