"""Evaluation rules of the reference interpreter, one per opcode, keyed by opcode.

A rule is `rule(instr, operands, ctx) -> value`, where `operands` are the operand values and
a value is a NumPy array (logical row-major order, dtype of the shape's element type), a
tuple of values, or TOKEN. `ctx` is an EvalContext: it evaluates called computations and
holds per-run state (custom-call registry, RNG state, replica id). Rules depend on `xlapy.ir`
alone, so constant folding can run them too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from xlapy.errors import EvaluationError
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode

Value = Any  # np.ndarray | tuple[Value, ...] | Token


class Token:
    """The value of a token-typed instruction (after-all, infeed's token, ...)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "TOKEN"


TOKEN = Token()


class EvalContext(Protocol):
    """What a rule may ask of the interpreter running it."""

    def call(self, computation: HloComputation, args: Sequence[Value]) -> Value:
        """Evaluate `computation` on `args` and return its root value."""
        ...

    @property
    def state(self) -> dict[str, Any]:
        """Per-run mutable state shared by rules (rng state, custom-call registry, ...)."""
        ...


Rule = Callable[[HloInstruction, list[Value], EvalContext], Value]

EVAL_RULES: dict[Opcode, Rule] = {}


def evaluates(*opcodes: Opcode):
    """Register the decorated function as the evaluation rule of `opcodes`."""

    def register(fn: Rule) -> Rule:
        for op in opcodes:
            if op in EVAL_RULES:
                raise RuntimeError(f"two evaluation rules for {op.text}")
            EVAL_RULES[op] = fn
        return fn

    return register


def rule_for(opcode: Opcode) -> Rule:
    try:
        return EVAL_RULES[opcode]
    except KeyError:
        raise EvaluationError(
            f"the interpreter cannot evaluate '{opcode.text}' (no evaluation rule)"
        ) from None
