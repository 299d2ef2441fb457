"""The interpreter run inside a buffer assignment: a check that the assignment is right.

Every allocation of the assignment becomes a real byte array (entry parameters hold the
inputs, output allocations, constants and one array per temp arena). Instructions run in the
assignment's schedule with the interpreter's own rules; each array value is stored in its
slice right after it is computed, and every operand is read back from its slice before use.
Nothing is passed from one instruction to the next through Python objects, so two values
that the assignment wrongly lets overlap corrupt each other and the result differs from the
plain interpreter's.

Control flow moves no data: a while loop's state, a conditional's branch results and a
call's arguments live in the buffers the alias analysis made them share, so the loop just
runs its condition and body over and over on the same bytes. Forwarding instructions
(tuple, get-tuple-element, bitcast, ...) are reconstructed on read from the values they
forward. Fusion bodies, reducers, comparators and other thread-local computations run in
the plain interpreter inside their caller's rule.

An output aliased to a parameter is computed in that parameter's bytes: the run donates
every aliased parameter (the caller's arrays are never touched; the parameter allocation is
a fresh copy of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xlapy.backends.interpreter.evaluator import Interpreter, check_value
from xlapy.backends.interpreter.registry import TOKEN, Value, rule_for
from xlapy.errors import EvaluationError
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import ShapeIndex
from xlapy.memory.buffer_assignment import BufferAssignment

_GARBAGE = 0xA5  # fill byte of fresh allocations: reading unwritten memory shows


@dataclass
class ArenaRun:
    """The result of an arena run: the program's result and the final allocation bytes."""

    result: Value
    memory: list[np.ndarray]


class _ArenaInterpreter:
    def __init__(self, assignment: BufferAssignment, state: dict):
        self.assignment = assignment
        self.dataflow = assignment.dataflow
        self.plain = Interpreter(**state)
        self.memory = [np.full(a.size, _GARBAGE, np.uint8) for a in assignment.allocations]

    # -- bytes -----------------------------------------------------------------------------
    def store(self, instr: HloInstruction, index: ShapeIndex, array: np.ndarray) -> None:
        value = self.dataflow.value_at(instr, index)
        piece = self.assignment.slices[value]
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        if array.dtype != value.shape.dtype:
            raise EvaluationError(
                f"{instr.name}: value of dtype {array.dtype} for {value.shape.to_text()}"
            )
        if data.size != piece.size:
            raise EvaluationError(
                f"{instr.name}: value of {data.size} bytes for a slice of {piece.size}"
            )
        self.memory[piece.allocation][piece.offset : piece.offset + piece.size] = data

    def load(self, instr: HloInstruction, index: ShapeIndex) -> np.ndarray:
        value = self.dataflow.value_at(instr, index)
        piece = self.assignment.slices[value]
        raw = self.memory[piece.allocation][piece.offset : piece.offset + piece.size]
        shape = value.shape
        return raw.copy().view(shape.dtype).reshape(shape.dims)

    def store_value(self, instr: HloInstruction, index: ShapeIndex, value: Value) -> None:
        shape = instr.shape.subshape(index)
        if shape.is_tuple:
            for i, element in enumerate(value):
                self.store_value(instr, (*index, i), element)
        elif shape.is_array:
            self.store(instr, index, value)

    def read(self, instr: HloInstruction, index: ShapeIndex = ()) -> Value:
        """The value at a position, rebuilt from the allocations' bytes."""
        op = instr.opcode
        shape = instr.shape.subshape(index)
        if op is Opcode.GET_TUPLE_ELEMENT:
            return self.read(instr.operands[0], (instr.tuple_index, *index))
        if op is Opcode.TUPLE and index:
            return self.read(instr.operands[index[0]], index[1:])
        if op is Opcode.BITCAST:
            return rule_for(op)(instr, [self.read(instr.operands[0])], self.plain)
        if op.forwards_operand:
            return self.read(instr.operands[0], index)
        if op is Opcode.CALL:
            return self.read(instr.to_apply.root_instruction(), index)
        if shape.is_tuple:
            return tuple(self.read(instr, (*index, i)) for i in range(len(shape.tuple_shapes)))
        if shape.is_token:
            return TOKEN
        return self.load(instr, index)

    # -- running ---------------------------------------------------------------------------
    def run(self, comp: HloComputation) -> None:
        for instr in self.assignment.schedule.sequence(comp):
            op = instr.opcode
            if op is Opcode.PARAMETER or op is Opcode.TUPLE or op.forwards_operand:
                continue
            if op is Opcode.WHILE:
                self.run_while(instr)
            elif op is Opcode.CONDITIONAL:
                self.run_conditional(instr)
            elif op is Opcode.CALL:
                self.run(instr.to_apply)
            else:
                operands = [self.read(o) for o in instr.operands]
                try:
                    result = rule_for(op)(instr, operands, self.plain)
                except EvaluationError as e:
                    raise EvaluationError(f"in {comp.name}/{instr.name}: {e}") from e
                self.store_value(instr, (), result)

    def run_while(self, instr: HloInstruction) -> None:
        cond, body = instr.while_condition, instr.while_body
        limit = self.plain.state.get("max_while_iterations")
        iterations = 0
        while True:
            self.run(cond)
            go = self.read(cond.root_instruction())
            if not isinstance(go, np.ndarray) or go.shape != () or go.dtype != np.bool_:
                raise EvaluationError(f"{instr.name}: condition must return pred[]")
            if not bool(go):
                return
            if limit is not None and iterations >= limit:
                raise EvaluationError(f"{instr.name}: while loop ran past {limit} iterations")
            self.run(body)
            iterations += 1

    def run_conditional(self, instr: HloInstruction) -> None:
        selector = self.read(instr.operands[0])
        branches = instr.branches
        if instr.conditional_is_predicated:
            index = 0 if bool(selector) else 1
        else:
            index = int(selector)
            if not 0 <= index < len(branches):
                index = len(branches) - 1
        self.run(branches[index])


def evaluate_in_arena(assignment: BufferAssignment, args: Sequence[Value], **state) -> ArenaRun:
    """Run the assignment's module on `args` with every value in its assigned bytes."""
    module = assignment.module
    entry = module.entry_computation()
    params = entry.parameters
    if len(args) != len(params):
        raise EvaluationError(f"{module.name} takes {len(params)} arguments, {len(args)} given")
    run = _ArenaInterpreter(assignment, state)
    for param, arg in zip(params, args, strict=True):
        value = check_value(param.shape, arg, f"parameter {param.parameter_number}")
        run.store_value(param, (), value)
    run.run(entry)
    return ArenaRun(run.read(entry.root_instruction()), run.memory)
