"""Multi-output fusion: fusions that return a tuple, to read a shared operand only once.

Two rewrites, both after loop fusion has run (XLA's GPU multi-output fusion does the same):

  producer-consumer   a producer that loop fusion left alone because it has other users
                      (typically expensive work such as the `exp` of a softmax, feeding both a
                      reduce and a divide) is fused into one consumer and also returned by it;
                      its other users read that output through get-tuple-element.
  siblings            two fusible users of the same operand that do not depend on each other
                      become one fusion returning both results.

Either is done only when it saves reading an array of at least `min_bytes`, when both
kernels run over the same loop (same iteration dims, same reduced dims where both reduce),
within the parameter limit, and never when it would create a cycle: a producer is not fused
into a consumer that also reaches it through another operand, and siblings must be mutually
unreachable. Reachability is a bitset per instruction, recomputed after each rewrite.
"""

from __future__ import annotations

from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Opcode
from xlapy.passes.fusion import fusible_computations, shared_fused_computations
from xlapy.passes.fusion_edit import FusionEditor, NameUniquer
from xlapy.passes.fusion_rules import (
    can_be_consumer,
    can_be_producer,
    fused_computation,
    is_expensive,
    is_variadic_reduce_kernel,
    iteration_space,
    reuses_operand,
    spaces_compatible,
)
from xlapy.passes.pass_base import HloPass, register_pass


class Reachability:
    """Which instructions of a computation each instruction depends on (itself included)."""

    def __init__(self, comp: HloComputation):
        self.bit: dict[int, int] = {}
        self.deps: dict[int, int] = {}
        for n, instr in enumerate(comp.post_order()):
            mask = 1 << n
            for dep in (*instr.operands, *instr.control_predecessors):
                mask |= self.deps[id(dep)]
            self.bit[id(instr)] = 1 << n
            self.deps[id(instr)] = mask

    def reaches(self, a: HloInstruction, b: HloInstruction) -> bool:
        """Is there a path from `a` to `b` (does `b` depend on `a`)?"""
        return bool(self.deps[id(b)] & self.bit[id(a)])


@register_pass
class MultiOutputFusion(HloPass):
    """Producer-consumer and sibling multi-output fusion (see the module comment)."""

    name = "multi-output-fusion"

    def __init__(
        self, min_bytes: int = 256, max_parameters: int = 64, small_constant_bytes: int = 64
    ):
        self.min_bytes = min_bytes
        self.max_parameters = max_parameters
        self.small_constant_bytes = small_constant_bytes
        self.fusions_made = 0

    def run(self, module: HloModule) -> bool:
        names = NameUniquer(module)
        self.fusions_made = 0
        changed = False
        for comp in fusible_computations(module):
            self._shared = shared_fused_computations(module)
            editor = FusionEditor(module, comp, names)
            step = self._producer_consumer(editor) | self._siblings(editor)
            if step:
                editor.finish()
            changed |= step
        return changed

    # -- eligibility -----------------------------------------------------------------------
    def _fusible(self, instr: HloInstruction, editor: FusionEditor) -> bool:
        """A kernel that may take part: a fusible op or fusion whose tuple result (if any)
        is read only through get-tuple-element."""
        comp = fused_computation(instr)
        if comp is not None and id(comp) in self._shared:
            return False
        if not can_be_consumer(instr) or instr.opcode is Opcode.CONSTANT:
            return False
        if instr.control_successors or is_variadic_reduce_kernel(instr):
            return False
        if instr.shape.is_tuple:
            if editor.is_root(instr):
                return False
            users = editor.users_of(instr)
            return all(u.opcode is Opcode.GET_TUPLE_ELEMENT for u in users)
        return True

    def _operand_count(self, *instrs: HloInstruction, without=None) -> int:
        ids = {id(op) for i in instrs for op in i.operands if op is not without}
        return len(ids - {id(i) for i in instrs})

    # -- producer-consumer -----------------------------------------------------------------
    def _producer_consumer(self, editor: FusionEditor) -> bool:
        changed = False
        comp = editor.comp
        reach = Reachability(comp)
        for consumer in reversed(comp.post_order()):
            if consumer.parent is not comp:
                continue
            while self._fusible(consumer, editor):
                producer = next(
                    (
                        p
                        for i, p in enumerate(consumer.operands)
                        if self._pc_ok(editor, reach, p, consumer, i)
                    ),
                    None,
                )
                if producer is None:
                    break
                consumer = editor.fuse_keeping_output(producer, consumer)
                editor.absorb_constants(consumer, self.small_constant_bytes)
                self.fusions_made += 1
                changed = True
                reach = Reachability(comp)
        return changed

    def _pc_ok(self, editor, reach, producer, consumer, i) -> bool:
        comp = fused_computation(producer)
        if comp is not None and id(comp) in self._shared:
            return False
        if not can_be_producer(producer) or producer.opcode is Opcode.CONSTANT:
            return False
        if producer.control_predecessors or producer.shape.byte_size < self.min_bytes:
            return False
        if producer.control_successors:
            return False
        if len(editor.users_of(producer)) < 2 and not editor.is_root(producer):
            return False
        if is_expensive(producer) and reuses_operand(consumer, i):
            return False
        if producer.shape.dims != iteration_space(consumer)[0]:
            return False
        if self.creates_cycle(reach, producer, consumer):
            return False
        outputs = 1 + (len(consumer.shape.tuple_shapes) if consumer.shape.is_tuple else 1)
        count = self._operand_count(producer, consumer, without=producer)
        return count + outputs <= self.max_parameters

    @staticmethod
    def creates_cycle(reach: Reachability, producer, consumer) -> bool:
        """Would fusing `producer` into `consumer` (keeping both) make a cycle: does another
        operand of `consumer` depend on `producer`?"""
        return any(op is not producer and reach.reaches(producer, op) for op in consumer.operands)

    # -- siblings --------------------------------------------------------------------------
    def _siblings(self, editor: FusionEditor) -> bool:
        changed = False
        comp = editor.comp
        reach = Reachability(comp)
        for shared in comp.post_order():
            if shared.parent is not comp or not shared.shape.is_array:
                continue
            if shared.shape.byte_size < self.min_bytes:
                continue
            while (pair := self._sibling_pair(editor, reach, shared)) is not None:
                merged = editor.merge_siblings(*pair)
                editor.absorb_constants(merged, self.small_constant_bytes)
                self.fusions_made += 1
                changed = True
                reach = Reachability(comp)
        return changed

    def _sibling_pair(self, editor, reach, shared):
        users = [u for u in editor.users_of(shared) if self._fusible(u, editor)]
        for n, a in enumerate(users):
            for b in users[n + 1 :]:
                if reach.reaches(a, b) or reach.reaches(b, a):
                    continue
                if not spaces_compatible(a, b):
                    continue
                outputs = sum(len(x.shape.tuple_shapes) if x.shape.is_tuple else 1 for x in (a, b))
                if self._operand_count(a, b) + outputs > self.max_parameters:
                    continue
                return a, b
        return None
