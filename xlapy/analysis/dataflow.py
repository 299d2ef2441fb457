"""Dataflow analysis: which HLO values exist and which value each position holds.

A position is (instruction, shape index). A value is defined at exactly one position and
may appear at many: a tuple defines only its table of element pointers and forwards its
operands' values as its elements; get-tuple-element, bitcast, opt-barrier, domain and
add-dependency forward their operand; a call forwards the root of the computation it
calls. Everything else defines a new value at every position of its shape.

Control flow uses definitions, not value sets with several members: the parameter of a
while body or condition, of a conditional branch and of a called computation defines its
own values, and a while or a conditional defines the values it returns. Which of these must
share a buffer with the values flowing in (the while's init and body root, the
conditional's operands and branch roots, the call's operands) is the alias analysis'
business. So every position holds exactly one value; `value_set` returns it as a 1-tuple.

Only the computations that run sequentially are analysed: the entry and whatever a while,
conditional or call reaches from it. Computations called by other instructions (fusion
bodies, reducers, comparators, scatter combiners, ...) run inside their caller: a fusion is
one operation that defines its outputs. Such computations are "thread-local".

In-place pairs record outputs that may be computed in their operand's buffer:
dynamic-update-slice and scatter (operand 0 / the scattered operands), a fusion whose root
is one of those applied to a fusion parameter, and custom calls with
output_to_operand_aliasing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xlapy.errors import XlapyError
from xlapy.ir.call_graph import CallGraph, Context
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape, ShapeIndex, index_text


class DataflowError(XlapyError):
    """The module cannot be analysed (e.g. a control-flow computation with two callers)."""


Position = tuple[HloInstruction, ShapeIndex]


@dataclass(frozen=True, slots=True, eq=False)
class HloValue:
    """A value: defined once, at `instruction` / `index`, with `shape`. Identity is `id`."""

    id: int
    instruction: HloInstruction
    index: ShapeIndex
    shape: Shape
    _bytes: int | None = field(default=None, init=False, repr=False)

    @property
    def byte_size(self) -> int:
        """`shape.byte_size`, computed once (buffer assignment asks for it again and again)."""
        size = self._bytes
        if size is None:
            size = self.shape.byte_size
            object.__setattr__(self, "_bytes", size)
        return size

    @property
    def is_phi(self) -> bool:
        """Defined by a while or conditional: the value the control flow leaves behind."""
        return self.instruction.opcode.is_control_flow

    @property
    def defined_by_parameter(self) -> bool:
        return self.instruction.opcode is Opcode.PARAMETER

    @property
    def is_write(self) -> bool:
        """True when defining the value writes new bytes (not a parameter or a phi, which only
        name bytes some other value wrote)."""
        return not (self.defined_by_parameter or self.is_phi)

    def __hash__(self) -> int:
        return self.id

    def __eq__(self, other) -> bool:
        return self is other

    def __lt__(self, other: HloValue) -> bool:
        return self.id < other.id

    def __repr__(self) -> str:
        index = index_text(self.index) if self.index else ""
        return f"<HloValue {self.id} {self.instruction.name}{index}>"

    @property
    def name(self) -> str:
        index = index_text(self.index) if self.index else ""
        return f"{self.instruction.name}{index}"


@dataclass(frozen=True, slots=True)
class Use:
    """`instruction` reads the value as (part of) operand `operand_number` at
    `operand_index` of that operand."""

    instruction: HloInstruction
    operand_number: int
    operand_index: ShapeIndex


@dataclass(frozen=True, slots=True)
class InPlacePair:
    """`output` (a value defined by an instruction) may be computed in the buffer of
    `operand` (the value read at operand `operand_number`/`operand_index`)."""

    output: HloValue
    operand: HloValue
    operand_number: int


@dataclass
class Dataflow:
    """The result of DataflowAnalysis.run: values, per-position values, uses, callers."""

    module: HloModule
    values: list[HloValue]
    computations: list[HloComputation]  # the sequential ones, callers before callees
    thread_local: set[HloComputation]
    callers: dict[HloComputation, HloInstruction]  # control-flow computation -> call site
    in_place_pairs: list[InPlacePair]
    _at: dict[tuple[int, ShapeIndex], HloValue] = field(repr=False)
    _positions: dict[HloValue, list[Position]] = field(repr=False)
    _uses: dict[HloValue, list[Use]] = field(repr=False)

    def __getstate__(self) -> dict:
        """The result with its positions keyed by instruction, not by id() (which another
        process's objects do not share): for pickling (a CPU program image)."""
        by_id = {id(i): i for i in self.module.instructions()}
        state = dict(self.__dict__)
        state["_at"] = [(by_id[i], index, value) for (i, index), value in self._at.items()]
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        state["_at"] = {(id(instr), index): value for instr, index, value in state["_at"]}
        self.__dict__.update(state)

    def value_at(self, instr: HloInstruction, index: ShapeIndex = ()) -> HloValue:
        """The value at a position; DataflowError naming it if it is not analysed."""
        value = self._at.get((id(instr), tuple(index)))
        if value is None:
            raise DataflowError(
                f"no value at {instr.name}{index_text(tuple(index))}: the position does not "
                "exist or its computation was not analysed (fusion bodies, reducers and "
                "other thread-local computations are not)"
            )
        return value

    def value_set(self, instr: HloInstruction, index: ShapeIndex = ()) -> tuple[HloValue, ...]:
        """The values that may be at a position (always one in this analysis)."""
        return (self.value_at(instr, index),)

    def defining_value(self, instr: HloInstruction, index: ShapeIndex = ()) -> HloValue:
        """The value `instr` defines at `index`; DataflowError if it forwards one instead."""
        value = self.value_at(instr, index)
        if value.instruction is not instr or value.index != tuple(index):
            raise DataflowError(
                f"{instr.name}{index_text(tuple(index))} does not define a value; it holds "
                f"{value.name}"
            )
        return value

    def defines(self, instr: HloInstruction, index: ShapeIndex = ()) -> bool:
        value = self._at.get((id(instr), tuple(index)))
        return value is not None and value.instruction is instr and value.index == index

    def positions(self, value: HloValue) -> list[Position]:
        """Every position holding `value`, the defining one first."""
        return self._positions[value]

    def uses(self, value: HloValue) -> list[Use]:
        """Every instruction operand that reads `value` (forwarding instructions excluded:
        a read through a get-tuple-element is a use by the get-tuple-element's user)."""
        return self._uses[value]

    def values_of(self, instr: HloInstruction) -> list[tuple[ShapeIndex, HloValue]]:
        """(index, value) for every position of `instr`, in pre-order."""
        return [(index, self._at[(id(instr), index)]) for index, _ in instr.shape.subshapes()]

    def leaf_values(self, instr: HloInstruction) -> list[tuple[ShapeIndex, HloValue]]:
        """(index, value) for the array and token leaves of `instr`, in pre-order."""
        return [
            (index, self._at[(id(instr), index)])
            for index, shape in instr.shape.subshapes()
            if not shape.is_tuple
        ]

    def is_analysed(self, comp: HloComputation) -> bool:
        return comp in self.callers or comp is self.module.entry


class DataflowAnalysis:
    """Runs the dataflow analysis (see the module comment)."""

    @staticmethod
    def run(module: HloModule) -> Dataflow:
        computations, callers, thread_local = _split_computations(module)
        builder = _Builder()
        for comp in reversed(computations):  # a call forwards its callee's root
            for instr in comp.post_order():
                builder.visit(instr)
        pairs = [
            pair
            for comp in computations
            for i in comp.instructions
            for pair in _in_place_pairs(i, builder.at)
        ]
        uses: dict[HloValue, list[Use]] = {v: [] for v in builder.values}
        for comp in computations:
            for instr in comp.instructions:
                if instr.opcode.forwards_operand or instr.opcode is Opcode.TUPLE:
                    continue
                for number, operand in enumerate(instr.operands):  # each Use made once
                    if not operand.shape.tuple_shapes:  # (one position: most operands)
                        value = builder.at[(id(operand), ())]
                        uses[value].append(Use(instr, number, ()))
                        continue
                    for index, _ in operand.shape.subshapes():
                        value = builder.at[(id(operand), index)]
                        uses[value].append(Use(instr, number, index))
        return Dataflow(
            module,
            builder.values,
            computations,
            thread_local,
            callers,
            pairs,
            builder.at,
            builder.positions,
            uses,
        )


class _Builder:
    def __init__(self) -> None:
        self.values: list[HloValue] = []
        self.at: dict[tuple[int, ShapeIndex], HloValue] = {}
        self.positions: dict[HloValue, list[Position]] = {}

    def define(self, instr: HloInstruction, index: ShapeIndex, shape: Shape) -> None:
        value = HloValue(len(self.values), instr, index, shape)
        self.values.append(value)
        self.positions[value] = []
        self.hold(instr, index, value)

    def hold(self, instr: HloInstruction, index: ShapeIndex, value: HloValue) -> None:
        self.at[(id(instr), index)] = value
        self.positions[value].append((instr, index))

    def forward(self, instr: HloInstruction, source: HloInstruction, prefix: ShapeIndex) -> None:
        for index, _ in instr.shape.subshapes():
            value = self.at.get((id(source), (*prefix, *index)))
            if value is None:
                raise DataflowError(
                    f"{instr.name}: shape {instr.shape} does not match the operand "
                    f"{source.name} it forwards"
                )
            self.hold(instr, index, value)

    def visit(self, instr: HloInstruction) -> None:
        op = instr.opcode
        if op is Opcode.TUPLE:
            self.define(instr, (), instr.shape)
            for i, operand in enumerate(instr.operands):
                for index, _ in operand.shape.subshapes():
                    self.hold(instr, (i, *index), self.at[(id(operand), index)])
            return
        if op is Opcode.GET_TUPLE_ELEMENT:
            self.forward(instr, instr.operands[0], (instr.tuple_index,))
            return
        if op.forwards_operand:
            if op is Opcode.BITCAST and not instr.shape.is_array:
                raise DataflowError(f"{instr.name}: expected an array-shaped bitcast")
            self.forward(instr, instr.operands[0], ())
            return
        if op is Opcode.CALL:
            self.forward(instr, instr.to_apply.root_instruction(), ())
            return
        for index, shape in instr.shape.subshapes():
            self.define(instr, index, shape)


def sequential_computations(module: HloModule) -> list[HloComputation]:
    """The computations the analysis covers (the entry and those reached through control
    flow, callers first), without analysing them; DataflowError as `run` would raise for
    a call graph that is not flat."""
    return _split_computations(module)[0]


def _split_computations(
    module: HloModule,
) -> tuple[list[HloComputation], dict[HloComputation, HloInstruction], set[HloComputation]]:
    """The sequential computations (callers first), the one call site of each but the entry,
    and the embedded ("thread-local") ones, from the module's call graph; DataflowError when
    a control-flow computation has two call sites or runs both ways."""
    entry = module.entry
    if entry is None:
        raise DataflowError(f"module {module.name} has no entry computation")
    graph = CallGraph(module)
    computations = graph.sequential_computations()
    callers: dict[HloComputation, HloInstruction] = {}
    for comp in computations:
        sites = [
            c
            for c in graph.node(comp).sequential_callers
            if c.parent is not None and graph.is_sequential(c.parent)
        ]
        if len(sites) > (0 if comp is entry else 1):
            first = "the entry" if comp is entry else sites[0].name
            raise DataflowError(
                f"computation {comp.name} is called by both {first} and {sites[-1].name}; "
                "expected one call site per control-flow computation (run the "
                "flatten-call-graph pass first)"
            )
        if sites:
            callers[comp] = sites[0]
    for comp in computations:
        if graph.context(comp) is Context.BOTH:
            raise DataflowError(
                f"computation {comp.name} is called both as control flow and from inside an "
                "operation; expected separate computations (run flatten-call-graph first)"
            )
    thread_local = set(graph.embedded_computations())
    return computations, callers, thread_local


# -- in-place operations ------------------------------------------------------------------------
def in_place_operands(instr: HloInstruction) -> list[tuple[ShapeIndex, int, ShapeIndex]]:
    """(output index, operand number, operand index) for each output `instr` may compute in
    its operand's buffer."""
    op = instr.opcode
    if op is Opcode.DYNAMIC_UPDATE_SLICE:
        return [((), 0, ())]
    if op is Opcode.SCATTER:
        n = len(instr.operands) // 2
        if instr.shape.is_tuple:
            return [((i,), i, ()) for i in range(n)]
        return [((), 0, ())]
    if op is Opcode.SORT:  # sorts its operands into the results (XLA sorts in place too)
        if instr.shape.is_tuple:
            return [((i,), i, ()) for i in range(len(instr.operands))]
        return [((), 0, ())]
    if op is Opcode.CUSTOM_CALL:
        return [
            (a.output_index, a.operand_number, a.operand_index)
            for a in instr.output_to_operand_aliasing
        ]
    if op is Opcode.FUSION:
        return _fusion_in_place(instr)
    return []


def _fusion_in_place(fusion: HloInstruction) -> list[tuple[ShapeIndex, int, ShapeIndex]]:
    comp = fusion.calls_or_none
    if comp is None or comp.root is None:
        return []
    root = comp.root
    outputs: list[tuple[ShapeIndex, HloInstruction]] = (
        [((i,), r) for i, r in enumerate(root.operands)]
        if root.opcode is Opcode.TUPLE
        else [((), root)]
    )
    result: list[tuple[ShapeIndex, int, ShapeIndex]] = []
    for out_index, inner in outputs:
        if inner.opcode not in (Opcode.DYNAMIC_UPDATE_SLICE, Opcode.SCATTER):
            continue
        target = inner.operands[0]
        while target.opcode is Opcode.BITCAST:
            target = target.operands[0]
        number = target.parameter_number
        if target.opcode is not Opcode.PARAMETER or number is None:
            continue
        operand = fusion.operands[number]
        if operand.shape.is_array and operand.shape.byte_size == inner.shape.byte_size:
            result.append((out_index, number, ()))
    return result


def layouts_differ(a: Shape, b: Shape) -> bool:
    """True if arrays `a` and `b` have the same dims but lay their elements out in different
    orders (a value written over another's buffer must not: `u32[2,4]{0,1}` updated in
    place over a `{1,0}` operand would read back transposed)."""
    return (
        a.is_array
        and b.is_array
        and a.dims == b.dims
        and a.layout_or_default.minor_to_major != b.layout_or_default.minor_to_major
    )


def _in_place_pairs(instr: HloInstruction, at) -> list[InPlacePair]:
    pairs = []
    for out_index, number, operand_index in in_place_operands(instr):
        output = at.get((id(instr), out_index))
        operand = at.get((id(instr.operands[number]), operand_index))
        if output is None or operand is None or output.instruction is not instr:
            continue
        if layouts_differ(output.shape, operand.shape):
            continue
        pairs.append(InPlacePair(output, operand, number))
    return pairs
