"""Alias analysis: group HLO values into HloBuffers, the sets that must share one buffer.

Values are merged with a union-find when the program's meaning requires one address:
  while        init{i}, body parameter{i}, condition parameter{i}, body root{i} and the
               while's result{i} are one loop-carried buffer per index i;
  conditional  every branch root{i} and the conditional's result{i}; each branch parameter
               and the operand passed to that branch;
  call         each callee parameter and the operand passed to it (the callee's root is
               forwarded to the call's result by the dataflow already);
  module       each input_output_alias entry: the parameter value and the output value.

In-place updates (dynamic-update-slice, scatter, in-place fusions and custom calls) are NOT
merged here: whether an output may reuse its operand's bytes depends on whether the
operand is still needed afterwards, which is a liveness question. Buffer assignment makes
that decision (see xlapy.memory.buffer_assignment).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xlapy.analysis.dataflow import Dataflow, DataflowError, HloValue
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import index_text


@dataclass(frozen=True, slots=True, eq=False)
class HloBuffer:
    """Values that must share one buffer; `id` is its identity, `values` sorted by id."""

    id: int
    values: tuple[HloValue, ...]
    size: int = field(init=False)  # bytes the buffer needs: its largest member's

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", max((value_bytes(v) for v in self.values), default=0))

    def __hash__(self) -> int:
        return self.id

    def __eq__(self, other) -> bool:
        return self is other

    def __repr__(self) -> str:
        return f"<HloBuffer {self.id}: {', '.join(v.name for v in self.values)}>"


def value_bytes(value: HloValue) -> int:
    """Bytes of a value: an array's dense size, a tuple's table of 8-byte pointers, 0 for a
    token."""
    return value.byte_size


class UnionFind:
    """Disjoint sets over hashable items, with path halving."""

    def __init__(self) -> None:
        self.parent: dict = {}

    def find(self, item):
        parent = self.parent
        parent.setdefault(item, item)
        while parent[item] is not item:
            parent[item] = parent[parent[item]]
            item = parent[item]
        return item

    def union(self, a, b) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra is not rb:
            if rb.id < ra.id:
                ra, rb = rb, ra
            self.parent[rb] = ra


@dataclass
class Aliases:
    """The result of AliasAnalysis.run: the buffers and each value's buffer."""

    dataflow: Dataflow
    buffers: list[HloBuffer]
    _of: dict[HloValue, HloBuffer] = field(repr=False)

    def buffer_of(self, value: HloValue) -> HloBuffer:
        return self._of[value]

    def buffer_at(self, instr, index=()) -> HloBuffer:
        return self._of[self.dataflow.value_at(instr, index)]

    def merged(self, pairs) -> Aliases:
        """These buffers with the buffers of each (value, value) pair of `pairs` merged:
        what `AliasAnalysis.run` with `pairs` as its extra pairs gives, from the buffers
        already made instead of every value and must-alias pair again."""
        if not pairs:
            return self
        sets = UnionFind()
        for a, b in pairs:
            sets.union(self._of[a], self._of[b])
        groups: dict[HloBuffer, list[HloBuffer]] = {}
        for buffer in self.buffers:
            groups.setdefault(sets.find(buffer), []).append(buffer)
        return _buffers_of(
            self.dataflow,
            [
                list(group[0].values)
                if len(group) == 1
                else sorted(v for b in group for v in b.values)
                for group in groups.values()
            ],
        )


def must_alias_pairs(module: HloModule, dataflow: Dataflow) -> list[tuple[HloValue, HloValue]]:
    """Every pair of values the program requires to share a buffer (module comment)."""
    at = dataflow.value_at
    pairs: list[tuple[HloValue, HloValue]] = []
    for comp in dataflow.computations:
        for instr in comp.instructions:
            op = instr.opcode
            if op is Opcode.WHILE:
                body, cond = instr.while_body, instr.while_condition
                init = instr.operands[0]
                for index, _ in instr.shape.subshapes():
                    result = at(instr, index)
                    for position in (
                        (init, index),
                        (body.parameter(0), index),
                        (cond.parameter(0), index),
                        (body.root_instruction(), index),
                    ):
                        pairs.append((result, at(*position)))
            elif op is Opcode.CONDITIONAL:
                branches = instr.branches
                for index, _ in instr.shape.subshapes():
                    for branch in branches:
                        pairs.append((at(instr, index), at(branch.root_instruction(), index)))
                for branch, operand in zip(branches, instr.operands[1:], strict=True):
                    for index, _ in operand.shape.subshapes():
                        pairs.append((at(branch.parameter(0), index), at(operand, index)))
            elif op is Opcode.CALL:
                callee = instr.to_apply
                for number, operand in enumerate(instr.operands):
                    for index, _ in operand.shape.subshapes():
                        pairs.append((at(callee.parameter(number), index), at(operand, index)))
    if not module.config.input_output_alias:
        return pairs
    entry = module.entry
    if entry is None or entry.root is None:
        raise DataflowError(f"module {module.name} has no entry computation with a root")
    root = entry.root
    params = entry.parameters_by_number()
    for alias in module.config.input_output_alias:
        param = params.get(alias.param_number)
        if param is None:
            raise DataflowError(
                f"input_output_alias names parameter {alias.param_number}, which "
                f"{entry.name} does not have"
            )
        if not param.shape.has_index(alias.param_index) or not root.shape.has_index(
            alias.output_index
        ):
            raise DataflowError(
                f"input_output_alias {index_text(alias.output_index)}: ({alias.param_number}, "
                f"{index_text(alias.param_index)}) names a position the program does not have"
            )
        pairs.append((at(param, alias.param_index), at(root, alias.output_index)))
    return pairs


class AliasAnalysis:
    """Runs the alias analysis (see the module comment)."""

    @staticmethod
    def run(module: HloModule, dataflow: Dataflow, extra_pairs=()) -> Aliases:
        """Buffers of `module`; `extra_pairs` adds more (value, value) merges (buffer
        assignment passes the in-place pairs it accepted)."""
        values = dataflow.values
        parent = list(range(len(values)))  # union-find over value ids (a value's id is its
        # place in `values`), with path halving

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = i = parent[parent[i]]
            return i

        for a, b in [*must_alias_pairs(module, dataflow), *extra_pairs]:
            ra, rb = find(a.id), find(b.id)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
        groups: dict[int, list[HloValue]] = {}
        for value in values:
            groups.setdefault(find(value.id), []).append(value)
        return _buffers_of(dataflow, list(groups.values()))


def _buffers_of(dataflow: Dataflow, groups: list[list[HloValue]]) -> Aliases:
    """Aliases with one buffer per group of values (each sorted by id), numbered in the
    order of their first values."""
    buffers: list[HloBuffer] = []
    of: dict[HloValue, HloBuffer] = {}
    for members in sorted(groups, key=lambda m: m[0].id):
        buffer = HloBuffer(len(buffers), tuple(members))
        buffers.append(buffer)
        for value in members:
            of[value] = buffer
    return Aliases(dataflow, buffers, of)
