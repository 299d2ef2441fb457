"""Constant folding: an instruction whose operands are all constants becomes a constant.

The value comes from the reference interpreter's rule for the opcode (the rules depend on
`ir` alone), so folding computes exactly what running the program would. Skipped: ops with
side effects or results that differ per run or per device (rng, collectives, replica-id),
ops without operands (iota and friends: folding them only makes the module bigger),
broadcasts (XLA's reason: they multiply a constant's size for nothing), tuples and tuple
results, tokens, control flow and calls (a while loop may not terminate), elided constants,
dynamic shapes, and anything whose result or operands exceed `max_elements`. Reducers,
comparators and scatter combiners are scalar computations the fold evaluates with the same
rules. An evaluation error leaves the instruction as it is: it will fail at run time, where
the user can see it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import xlapy.backends.interpreter.rules  # noqa: F401  (registers the evaluation rules)
from xlapy.backends.interpreter.registry import EVAL_RULES, rule_for
from xlapy.errors import XlapyError
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.literal import Literal
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Category, Opcode
from xlapy.passes.hlo_edit import Editor, has_side_effect_deep, reachable_computations
from xlapy.passes.pass_base import HloPass, register_pass

_NEVER_FOLDED = frozenset(
    {
        Opcode.BROADCAST,
        Opcode.IOTA,
        Opcode.TUPLE,
        Opcode.GET_TUPLE_ELEMENT,
        Opcode.WHILE,
        Opcode.CONDITIONAL,
        Opcode.CALL,
        Opcode.FUSION,
        Opcode.CUSTOM_CALL,
        Opcode.RNG_BIT_GENERATOR,
        Opcode.OPTIMIZATION_BARRIER,
        Opcode.ADD_DEPENDENCY,
        Opcode.DOMAIN,
        Opcode.GET_DIMENSION_SIZE,
        Opcode.SET_DIMENSION_SIZE,
        Opcode.DYNAMIC_RESHAPE,
    }
)
_NEVER_FOLDED_CATEGORIES = frozenset(
    {Category.COLLECTIVE, Category.IO, Category.ASYNC, Category.RNG, Category.CONSTANT}
)


class _FoldContext:
    """The EvalContext of a fold: evaluates called scalar computations with the rules."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"replica_id": 0, "partition_id": 0}

    def call(self, computation: HloComputation, args: Sequence[Any]):
        values: dict[int, Any] = {}
        for instr in computation.post_order():
            if instr.parameter_number is not None:
                values[id(instr)] = args[instr.parameter_number]
                continue
            operands = [values[id(o)] for o in instr.operands]
            values[id(instr)] = rule_for(instr.opcode)(instr, operands, self)
        return values[id(computation.root)]


@register_pass
class ConstantFolding(HloPass):
    """Replaces instructions of constant operands by the constant they compute."""

    name = "constant-folding"

    def __init__(self, max_elements: int = 1 << 16):
        self.max_elements = max_elements

    def foldable(self, instr: HloInstruction, memo: dict) -> bool:
        op = instr.opcode
        if op in _NEVER_FOLDED or op.category in _NEVER_FOLDED_CATEGORIES:
            return False
        if not instr.operands or op not in EVAL_RULES:
            return False
        if not all(o.opcode is Opcode.CONSTANT and o.literal is not None for o in instr.operands):
            return False
        shapes = [instr.shape, *(o.shape for o in instr.operands)]
        if any(not s.is_array or s.is_dynamic for s in shapes):
            return False
        if any(s.num_elements > self.max_elements for s in shapes):
            return False
        return not (instr.control_predecessors or has_side_effect_deep(instr, memo))

    def run(self, module: HloModule) -> bool:
        namer = NameUniquer(module)
        memo: dict = {}
        ctx = _FoldContext()
        changed = False
        for comp in reachable_computations(module):
            editor = Editor(comp, namer)
            for instr in comp.post_order():
                if instr.parent is not comp or not self.foldable(instr, memo):
                    continue
                literal = _evaluate(instr, ctx)
                if literal is None:
                    continue
                const = editor.add(
                    Opcode.CONSTANT, instr.shape, before=instr, literal=literal, name=instr.name
                )
                editor.replace(instr, const)
                editor.remove_dead([instr])
                changed = True
        return changed


def _evaluate(instr: HloInstruction, ctx: _FoldContext) -> Literal | None:
    operands = []
    for operand in instr.operands:
        if operand.literal is None:
            return None
        operands.append(operand.literal.to_value())
    try:
        with np.errstate(all="ignore"):
            value = rule_for(instr.opcode)(instr, operands, ctx)
    except (XlapyError, ArithmeticError, ValueError, TypeError, IndexError):
        return None
    if not isinstance(value, np.ndarray):
        return None
    shape = instr.shape
    if value.shape != shape.dims or value.dtype != shape.dtype:
        return None
    return Literal(shape, np.array(value, copy=True))
