"""Loop fusion: producer-consumer fusion into `fusion` instructions, XLA's instruction fusion.

The pass walks each computation that runs as a sequence of kernels (the entry, while bodies
and conditions, conditional branches, called computations; never reducers, comparators or
fused computations) from the root towards the parameters, in reverse post-order. Each
consumer greedily pulls in its operands while `should_fuse` allows: a consumer that is not
yet a fusion becomes a one-instruction fusion first, and a producer that is itself a loop
fusion is inlined whole (fusion merging). A reduce joins only as the root, which makes an
input fusion (`kind=kInput`); everything else makes a loop fusion (`kind=kLoop`). With
`in_place_roots` (the default), a dynamic-update-slice is a consumer too: its update and
indices are pulled in, its operand 0 never (nor a producer that reads it), so the fusion can
run in that operand's bytes.

A producer with other users stays in place and its work is duplicated into the consumer; that
is allowed only when the producer is cheap and either reads no more bytes than it writes or
every one of its users can fuse it (so it disappears) and the computed values it reads are no
larger than it (duplicated into users further on, it would hold them live until its last user
instead of holding its own buffer: memory, where XLA's rule only weighs memory traffic).
Sweeps repeat until nothing changes.
"""

from __future__ import annotations

from xlapy.ir.call_graph import CallGraph, Context
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Opcode
from xlapy.passes.fusion_edit import FusionEditor, NameUniquer
from xlapy.passes.fusion_rules import (
    can_be_consumer,
    can_be_producer,
    fused_computation,
    in_place_operand,
    is_expensive,
    operand_bytes,
    reuses_operand,
)
from xlapy.passes.pass_base import HloPass, register_pass


def fusible_computations(module: HloModule) -> list[HloComputation]:
    """Computations fusion may rewrite: the entry and those run only as control flow."""
    graph = CallGraph(module)
    return [c for c in module.computations if graph.context(c) is Context.SEQUENTIAL]


def shared_fused_computations(module: HloModule) -> set[int]:
    """ids of fused computations called by more than one fusion (left alone: editing one
    caller's body would change the others)."""
    count: dict[int, int] = {}
    for instr in module.instructions():
        comp = fused_computation(instr)
        if comp is not None:
            count[id(comp)] = count.get(id(comp), 0) + 1
    return {k for k, n in count.items() if n > 1}


@register_pass
class LoopFusion(HloPass):
    """Producer-consumer fusion (see the module comment). Limits: `max_parameters` operands
    per fusion, `max_instructions` fused instructions, constants up to
    `small_constant_bytes` are copied into fusions; `in_place_roots` lets dynamic-update-slice
    root a fusion. After `run`, `fusions_made` counts the new fusion instructions and
    `producers_fused` every producer taken into one."""

    name = "fusion"

    def __init__(
        self,
        max_parameters: int = 64,
        max_instructions: int = 256,
        small_constant_bytes: int = 64,
        max_sweeps: int = 8,
        in_place_roots: bool = True,
    ):
        self.max_parameters = max_parameters
        self.max_instructions = max_instructions
        self.small_constant_bytes = small_constant_bytes
        self.max_sweeps = max_sweeps
        self.in_place_roots = in_place_roots
        self.fusions_made = 0
        self.producers_fused = 0

    def run(self, module: HloModule) -> bool:
        names = NameUniquer(module)
        self.fusions_made = 0
        self.producers_fused = 0
        self._shared = shared_fused_computations(module)
        changed = False
        for comp in fusible_computations(module):
            changed |= self._run_on(module, comp, names)
        return changed

    def _run_on(self, module: HloModule, comp: HloComputation, names: NameUniquer) -> bool:
        editor = FusionEditor(module, comp, names)
        changed_any = False
        for _ in range(self.max_sweeps):
            changed = False
            for consumer in reversed(comp.post_order()):
                if consumer.parent is not comp:
                    continue
                while (found := self._pick_producer(editor, consumer)) is not None:
                    consumer = editor.fuse(found, consumer)
                    self.producers_fused += 1
                    changed = True
            if not changed:
                break
            changed_any = True
        editor.finish()
        self.fusions_made += sum(1 for f in editor.created if f.parent is comp)
        return changed_any

    def _pick_producer(self, editor: FusionEditor, consumer: HloInstruction):
        if not self._consumer_ok(editor, consumer):
            return None
        for i, producer in enumerate(consumer.operands):
            if self.should_fuse(editor, producer, consumer, i):
                return producer
        return None

    def _consumer_ok(self, editor: FusionEditor, instr: HloInstruction) -> bool:
        comp = fused_computation(instr)
        ok = can_be_consumer(instr, self.in_place_roots, editor.unfusible)
        return ok and (comp is None or id(comp) not in self._shared)

    def _producer_ok(self, editor: FusionEditor, instr: HloInstruction) -> bool:
        comp = fused_computation(instr)
        ok = can_be_producer(instr, editor.unfusible)
        return ok and (comp is None or id(comp) not in self._shared)

    def should_fuse(
        self, editor: FusionEditor, producer: HloInstruction, consumer: HloInstruction, i: int
    ) -> bool:
        """May operand `i` (`producer`) of `consumer` be computed inside it?"""
        if not self._producer_ok(editor, producer) or producer.control_predecessors:
            return False
        if producer.control_successors:
            return False
        k = in_place_operand(consumer)
        if k is not None and (i == k or consumer.operands[k] in producer.operands):
            return False
        if producer.opcode is Opcode.CONSTANT:
            small = producer.shape.byte_size <= self.small_constant_bytes
            return small and consumer.opcode is Opcode.FUSION
        if is_expensive(producer) and reuses_operand(consumer, i):
            return False
        if not self._within_limits(producer, consumer):
            return False
        others = [u for u in editor.users_of(producer) if u is not consumer]
        if not others and not editor.is_root(producer):
            return True
        return self._may_duplicate(editor, producer, others)

    def _may_duplicate(self, editor: FusionEditor, producer, others) -> bool:
        """Duplicate a multi-user producer only when it is cheap and either reads no more
        than it writes or every user can take it in (so it disappears) and the temporaries
        it reads are no larger than it (they live on to its last user instead)."""
        if is_expensive(producer):
            return False
        if operand_bytes(producer) <= producer.shape.byte_size:
            return True
        if (
            editor.is_root(producer)
            or _held_operand_bytes(editor, producer) > producer.shape.byte_size
        ):
            return False
        return all(
            self._consumer_ok(editor, u) and not any(u is c for c in producer.control_predecessors)
            for u in others
        )

    def _within_limits(self, producer: HloInstruction, consumer: HloInstruction) -> bool:
        operands = {id(op) for op in consumer.operands if op is not producer}
        operands.update(id(op) for op in producer.operands)
        if len(operands) > self.max_parameters:
            return False
        return _size(producer) + _size(consumer) <= self.max_instructions


def _held_operand_bytes(editor: FusionEditor, producer: HloInstruction) -> int:
    """Bytes of the operands of `producer` that are computed values (not parameters or
    constants, which live throughout anyway) and that nothing else reads (or others would
    hold them anyway). Duplicating the producer into all its users keeps these alive until
    its last user: for an LSTM's cell state c = f*c' + i*g, fused into the next step's c and
    into tanh(c), its three gates, step after step, instead of one buffer for c."""
    held = {
        id(op): op.shape.byte_size
        for op in producer.operands
        if op.shape.is_array
        and not _lives_throughout(op)
        and not editor.is_root(op)
        and all(u is producer for u in editor.users_of(op))  # else others hold it anyway
    }
    return sum(held.values())


def _lives_throughout(instr: HloInstruction) -> bool:
    while instr.opcode is Opcode.GET_TUPLE_ELEMENT:
        instr = instr.operands[0]
    return instr.opcode in (Opcode.PARAMETER, Opcode.CONSTANT)


def _size(instr: HloInstruction) -> int:
    comp = fused_computation(instr)
    return 1 if comp is None else len(comp.instructions)
