"""Reachability within one computation: can data or control flow from A reach B?

Each instruction gets a bit set (a Python int) of the instructions that reach it through
operands and control predecessors, itself included, built in one post-order sweep. A query
is one bit test. Ordering across a flattened schedule (does A run before B) is answered by
`Liveness.executes_before`.
"""

from __future__ import annotations

from xlapy.errors import XlapyError
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction


class Reachability:
    """`reaches(a, b)`: b depends on a (directly or transitively), or a is b."""

    def __init__(self, comp: HloComputation):
        self.computation = comp
        self._bit: dict[HloInstruction, int] = {}
        self._reach: dict[HloInstruction, int] = {}
        for i, instr in enumerate(comp.instructions):
            self._bit[instr] = 1 << i
        for instr in comp.post_order():
            bits = self._bit[instr]
            for dep in (*instr.operands, *instr.control_predecessors):
                bits |= self._reach[dep]
            self._reach[instr] = bits

    def _check(self, instr: HloInstruction) -> None:
        if instr not in self._bit:
            raise XlapyError(
                f"{instr.name} is not an instruction of computation {self.computation.name}"
            )

    def reaches(self, a: HloInstruction, b: HloInstruction) -> bool:
        self._check(a)
        self._check(b)
        return bool(self._reach[b] & self._bit[a])

    def independent(self, a: HloInstruction, b: HloInstruction) -> bool:
        """Neither reaches the other: a schedule may run them in either order."""
        return not self.reaches(a, b) and not self.reaches(b, a)
