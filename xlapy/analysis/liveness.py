"""Live ranges of HLO values over one flattened sequential schedule.

The schedule gives each sequential computation an instruction order. Flattening walks the
entry's order and, at a while, conditional or call, steps into the called computations:
such an instruction gets a start time (when it reads its operands), then the condition's
and the body's instructions (a while), each branch in turn (a conditional) or the callee
(a call), then an end time (when its results exist). Every other instruction takes one
time, its start and end alike.

A value is live from its definition to its last use, both inclusive:
  start  the defining instruction's end time; 0 for entry parameters (the caller's bytes
         exist before the program runs);
  end    the latest start time of an instruction that reads it (a use by a while,
         conditional or call happens when it starts: the callee's parameter, a separate
         value in the same buffer, carries it on); the end of its computation if it is
         (part of) that computation's root; the last time of the program for the entry's
         outputs.
A loop body's times are visited once, but they stand for every iteration: a value defined
before a loop and read after it spans the whole loop, so nothing in the loop can reuse its
bytes, while a temporary of the body is live only inside the body's own range.

`conflicts` checks one would-be buffer: its values may share bytes only if no value is
written while another value of the buffer, holding different bytes, is still live. A
transform that is still deciding (copy insertion removing copies one at a time) asks it
about a program that differs from the analysed one: it passes its own live ranges and the
values it has made one (`same`: a removed copy's value -> its source's value); the
analysis results are never written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from xlapy.analysis.dataflow import (
    Dataflow,
    DataflowError,
    HloValue,
    in_place_operands,
    layouts_differ,
)
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import CallContext, Opcode

Sequences = Mapping[HloComputation, Sequence[HloInstruction]]


@dataclass
class Liveness:
    """Times of instructions and live ranges of values (see the module comment)."""

    module: HloModule
    dataflow: Dataflow
    order: list[tuple[int, HloInstruction, str]]  # (time, instruction, "start"|"end")
    spans: dict[HloInstruction, tuple[int, int]]
    computation_spans: dict[HloComputation, tuple[int, int]]
    ranges: dict[HloValue, tuple[int, int]]
    end_time: int

    def live_range(self, value: HloValue) -> tuple[int, int]:
        return self.ranges[value]

    def span(self, instr: HloInstruction) -> tuple[int, int]:
        return self.spans[instr]

    def live_at(self, time: int) -> list[HloValue]:
        """The values live at `time`."""
        return [v for v, (s, e) in self.ranges.items() if s <= time <= e]

    def executes_before(self, a: HloInstruction, b: HloInstruction) -> bool:
        """True if `a` finishes before `b` starts in the flattened schedule."""
        return self.spans[a][1] < self.spans[b][0]

    def conflicts(
        self,
        values: Iterable[HloValue],
        writable=frozenset(),
        *,
        ranges: Mapping[HloValue, tuple[int, int]] | None = None,
        same: Mapping[HloValue, HloValue] | None = None,
    ) -> str | None:
        """Why `values` cannot share one buffer, or None if they can. `writable` holds entry
        parameter values the program may overwrite (donated, aliased to an output).
        `ranges` and `same` describe an edited program (see the module comment)."""
        if ranges is None:
            ranges = self.ranges
        values = sorted(values, key=lambda v: ranges[v][0])
        writes = [v for v in values if v.is_write]
        if not writes:
            return None
        entry = self.module.entry
        for v in values:
            opcode = v.instruction.opcode
            if opcode is not Opcode.CONSTANT and opcode is not Opcode.PARAMETER:
                continue  # (neither check below applies)
            other = writes[0] if writes[0] is not v else writes[1] if len(writes) > 1 else None
            if other is None:
                continue
            if opcode is Opcode.CONSTANT:
                return f"{other.name} would overwrite the constant {v.name}"
            entry_parameter = v.instruction.parent is entry
            if entry_parameter and v not in writable:
                return f"{other.name} would overwrite the entry parameter {v.name}"
        for w in writes:
            at = ranges[w][0]
            for u in values:
                start, end = ranges[u]
                if start > at:
                    break  # (`values` is sorted by start: no later one is live at `at`)
                if u is w or end < at:
                    continue
                if end == at and start < at and may_update_in_place(w, u, self.dataflow, same):
                    continue
                return (
                    f"{w.name} is written at time {at} while {u.name} (live {start}..{end}) is live"
                )
        return None


def may_update_in_place(
    output: HloValue,
    operand: HloValue,
    dataflow: Dataflow,
    same: Mapping[HloValue, HloValue] | None = None,
) -> bool:
    """True if the instruction defining `output` may write it over `operand`, one of its
    inputs, that dies at that instruction: an in-place op's updated operand, or an operand of
    an elementwise op of the same dimensions and element size. `same` maps values merged
    into others by an edit not yet made (see the module comment)."""
    instr = output.instruction

    def value_at(operand_instr: HloInstruction, index=()) -> HloValue:
        value = dataflow.value_at(operand_instr, index)
        if same:
            while value in same:
                value = same[value]
        return value

    if layouts_differ(output.shape, operand.shape):
        return False  # written in place, the operand's bytes would read back reordered
    for out_index, number, operand_index in in_place_operands(instr):
        if out_index == output.index and value_at(instr.operands[number], operand_index) is operand:
            return True
    if instr.opcode is Opcode.FUSION:
        return _fusion_elementwise_in(instr, operand, value_at, output)
    if not instr.opcode.is_elementwise or not output.shape.is_array:
        return False
    if not operand.shape.is_array or operand.shape.dims != output.shape.dims:
        return False
    if operand.shape.element_type.byte_size != output.shape.element_type.byte_size:
        return False
    return any(value_at(op) is operand for op in instr.operands if op.shape.is_array)


def _fusion_elementwise_in(fusion: HloInstruction, operand: HloValue, value_at, output) -> bool:
    """True if every path from the fused parameters reading `operand` to the fusion's root
    (an array of `operand`'s element count and element size) goes through elementwise
    operations and reshapes, all row-major: each output element is then computed from the
    operand's element at its own position, so the output may be written over the operand."""
    comp = fusion.calls_or_none
    if comp is None or output.index != () or not output.shape.is_array:
        return False
    if not operand.shape.is_array or operand.shape.num_elements != output.shape.num_elements:
        return False
    if operand.shape.element_type.byte_size != output.shape.element_type.byte_size:
        return False
    reshaped = operand.shape.dims != output.shape.dims
    if reshaped and not (_row_major(operand.shape) and _row_major(output.shape)):
        return False
    numbers = [
        n for n, op in enumerate(fusion.operands) if op.shape.is_array and value_at(op) is operand
    ]
    if not numbers:
        return False
    pending = [comp.parameter(n) for n in numbers]
    seen = set()
    while pending:
        instr = pending.pop()
        if instr in seen:
            continue
        seen.add(instr)
        if instr is not comp.root and not instr.users:
            continue
        for user in instr.users:
            if user.opcode.is_elementwise and user.shape.dims == instr.shape.dims:
                pending.append(user)
            elif user.opcode is Opcode.RESHAPE and _row_major(user.shape):
                pending.append(user)  # the same elements in the same order
            else:
                return False
    return True


def _row_major(shape) -> bool:
    return shape.layout is None or shape.layout.is_default


class LivenessAnalysis:
    """Computes live ranges over a flattened schedule."""

    @staticmethod
    def run(module: HloModule, dataflow: Dataflow, sequences: Sequences | None = None) -> Liveness:
        """`sequences` maps each sequential computation to its order (default: post order)."""
        entry = module.entry
        if entry is None:
            raise DataflowError(f"module {module.name} has no entry computation")
        order: list[tuple[int, HloInstruction, str]] = []
        spans: dict[HloInstruction, tuple[int, int]] = {}
        comp_spans: dict[HloComputation, tuple[int, int]] = {}
        clock = [0]

        def tick(instr: HloInstruction, kind: str) -> int:
            t = clock[0]
            order.append((t, instr, kind))
            clock[0] += 1
            return t

        def visit(comp: HloComputation) -> None:
            sequence = sequences.get(comp) if sequences is not None else None
            if sequence is None:
                sequence = comp.post_order()
            first = clock[0]
            for instr in sequence:
                if instr.opcode.call_context is not CallContext.SEQUENTIAL:
                    t = tick(instr, "end")
                    spans[instr] = (t, t)
                    continue
                start = tick(instr, "start")
                for called in _called_in_order(instr):
                    visit(called)
                spans[instr] = (start, tick(instr, "end"))
            comp_spans[comp] = (first, clock[0] - 1)

        visit(entry)
        end_time = clock[0] - 1
        ranges: dict[HloValue, tuple[int, int]] = {}
        for value in dataflow.values:
            instr = value.instruction
            start = spans[instr][1]
            if instr.opcode is Opcode.PARAMETER and instr.parent is module.entry:
                start = 0
            end = start
            for use in dataflow.uses(value):
                end = max(end, spans[use.instruction][0])
            for holder, _ in dataflow.positions(value):
                if holder.parent is not None and holder.parent.root is holder:
                    comp = holder.parent
                    end = max(end, end_time if comp is module.entry else comp_spans[comp][1])
            ranges[value] = (start, end)
        return Liveness(module, dataflow, order, spans, comp_spans, ranges, end_time)


def _called_in_order(instr: HloInstruction) -> list[HloComputation]:
    if instr.opcode is Opcode.WHILE:
        return [instr.while_condition, instr.while_body]
    if instr.opcode is Opcode.CONDITIONAL:
        return list(instr.branches)
    return [instr.to_apply]
