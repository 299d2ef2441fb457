# Rule thunks: the interpreter's per-opcode rule for one instruction, evaluated on views of the
# operands' slices, its value stored into the instruction's slices.
#
# A family that has a fast NumPy implementation for some instructions of its opcode (sort
# with a recognized comparator, prefix-scan and pooling reduce-windows, row gathers and
# scatters, convolutions as im2col + matmul, mixed-precision and integer dots; see the
# *_thunk modules) hands it to the thunk as `fast`: the thunk runs that instead, writing
# straight into the result's views, and the rule only when the fast path declines at run
# time (a NaN key under a float compare, say). A rule thunk without a fast path is a
# fallback: the compiler records it with its reason (CompiledModule.fallbacks).

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from xlapy.backends.cpu.runtime.thunk import (
    NS_PER_RULE_ELEMENT,
    ExecutionContext,
    Thunk,
    ValueTree,
    touched_elements,
    tree_leaves,
    tree_lines,
)
from xlapy.backends.interpreter import rules
from xlapy.backends.interpreter.registry import rule_for
from xlapy.errors import EvaluationError
from xlapy.ir.instruction import HloInstruction

rules.register_all()  # a rule thunk may run any rule: custom calls and collectives included

FastPath = Callable[[list, Any, ExecutionContext], bool]
"""fast(operand values, result views, ctx) -> whether it ran (False: declined, run the rule)."""

Planner = Callable[[HloInstruction], FastPath | None]
"""planner(instr) -> the fast path for `instr`, or None where it has none."""


def plan_safely(planner: Planner, instr: HloInstruction) -> FastPath | None:
    """`planner(instr)`, None when it raises: an instruction a planner misreads keeps the
    interpreter's rule."""
    try:
        return planner(instr)
    except Exception:
        return None


def all_arrays(tree: ValueTree) -> bool:
    """Whether every leaf of `tree` is an array slice (no tokens)."""
    return all(leaf is not None for leaf in tree_leaves(tree))


class RuleThunk(Thunk):
    """The interpreter's rule for the instruction on views of the arena, or `fast` where a
    family planned one (see the file comment). `why`: why no kernel or library path runs
    it, shown in the listing for a thunk without a fast path."""

    kind = "library"
    IMAGE_DEFERRED = ()
    IMAGE_DETACHED = ("instr",)
    """It reads its instruction to load or run: a program image keeps a copy of it that
    shares nothing with the module (loadable.detached), so neither reads the module."""

    def __init__(
        self,
        instr: HloInstruction,
        operands: list[ValueTree],
        result: ValueTree,
        why: str,
        fast: FastPath | None = None,
        planner: Planner | None = None,
    ):
        """`planner`: what made `fast` (`planner(instr)`), so that the thunk can pickle
        without it (a closure) and plan it again where it is unpickled."""
        self.instr, self.operands, self.result, self.why = instr, operands, result, why
        self.rule = rule_for(instr.opcode)
        self.fast = fast
        self.planner = planner

    def __getstate__(self) -> dict:
        """The thunk without its fast path, which is planned again when it is unpickled
        (a program image: jit/executable_cache.py); one without its planner cannot pickle."""
        state = dict(self.__dict__)
        if state.pop("fast", None) is not None and self.planner is None:
            raise TypeError(f"{self.instr.name}: a fast path without its planner cannot pickle")
        state["rule"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.rule = rule_for(self.instr.opcode)
        planner = self.planner
        self.fast = None if planner is None else plan_safely(planner, self.instr)

    @property
    def is_fallback(self) -> bool:
        """Whether this thunk runs only the interpreter's rule (no fast path)."""
        return self.fast is None

    def run(self, ctx: ExecutionContext) -> None:
        values = [ctx.read(t) for t in self.operands]
        if self.fast is not None:
            with np.errstate(all="ignore"):
                if self.fast(values, ctx.read(self.result), ctx):
                    return
        try:
            out = self.rule(self.instr, values, ctx.interpreter)
        except EvaluationError as e:
            if self.instr.name in str(e):
                raise
            raise EvaluationError(f"{self.instr.name}: {e}") from e
        ctx.write(self.result, out, self.instr.name)

    def describe(self) -> list[str]:
        if self.fast is not None:
            head = f"library {self.instr.name} = {self.instr.opcode.text} (fast NumPy path)"
        else:
            head = f"library {self.instr.name} = {self.instr.opcode.text} (interpreter rule"
            head += f": {self.why})" if self.why else ")"
        lines = [head]
        for i, t in enumerate(self.operands):
            lines += tree_lines(f"in{i}", t)
        return lines + tree_lines("out", self.result)

    def cost(self) -> float:
        if self.fast is None:
            return 20_000 + touched_elements(self.instr) * NS_PER_RULE_ELEMENT
        return super().cost()
