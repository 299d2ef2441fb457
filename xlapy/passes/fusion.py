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

A producer with other users stays in place and its work is duplicated into the consumer. The
rule is XLA's instruction fusion's: at the start of each sweep, a producer that reads more
than it writes (more than one operand as large as its result, broadcasts, iotas and scalar
constants aside, and more elements in than out) is marked *do not duplicate* unless it can be
fused into every user along every path to it (`fuses_on_all_paths`: a path through a
reduction, a dot, or anything else that cannot take the producer in blocks it). So the
residual stream x_k = x_{k-1} + f(x_{k-1}) of a transformer, whose users reach it through a
layer norm's reduction, is computed once instead of again from x_0 inside every layer.
Beyond that, a duplicated producer must be cheap (`is_expensive`: no transcendental, divide,
power or gather; a widening convert is always allowed, it makes its consumers read fewer
bytes) and must not concatenate computed values (a consumer would compute every operand of
the concatenate at each element: an LSTM's joined gate gradients, copied into the bias
gradient's reduce, cost it four times their work); the work copied in a computation
(elements computed by arithmetic, data movement free) stays within
`max_duplicated_fraction` of the work it had (2: a chain may be copied whole into two users
and partly into a third), or a small floor (a copy leaves the
producer's operands to other consumers to copy again, so a per-kernel limit would not bound
a long cheap chain with several users). Copying cheap arithmetic is what XLA does and costs
far less than a round trip of the value through memory (a vector add of a u32 is ~1/8 cycle
an element, writing and reading it back ~2 cycles at 10 GB/s): threefry's rounds, where
each x0 += x1; x1 = rotl(x1, r) ^ x0 has two users, fuse into one kernel per output word
as XLA's do, instead of a kernel per round (a budget of 1/4 left 6 of them); and a producer
that reads more bytes than it writes is duplicated only when every user can take it in and
the computed values it reads are no larger than it (duplicated into users further on, it
would hold them live until its last user instead of holding its own buffer: memory, where
XLA's rule only weighs memory traffic). Sweeps repeat until nothing changes.
"""

from __future__ import annotations

from xlapy.analysis.reachability import Reachability
from xlapy.ir.call_graph import CallGraph, Context
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Category, Opcode
from xlapy.passes.fusion_edit import FusionEditor, NameUniquer
from xlapy.passes.fusion_rules import (
    arithmetic_work,
    can_be_consumer,
    can_be_producer,
    concatenates_computed_values,
    fused_computation,
    in_place_operand,
    is_always_duplicable,
    is_expensive,
    is_light_to_duplicate,
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
    root a fusion; the work copied from producers that other users keep stays within
    `max_duplicated_fraction` of each computation's arithmetic (or `min_duplicated_work`
    elements, whichever is more). After `run`, `fusions_made` counts the new fusion instructions and
    `producers_fused` every producer taken into one."""

    name = "fusion"

    def __init__(
        self,
        max_parameters: int = 64,
        max_instructions: int = 256,
        small_constant_bytes: int = 64,
        max_sweeps: int = 8,
        in_place_roots: bool = True,
        max_duplicated_fraction: float = 2.0,
        min_duplicated_work: int = 1 << 16,
    ):
        self.max_parameters = max_parameters
        self.max_instructions = max_instructions
        self.small_constant_bytes = small_constant_bytes
        self.max_sweeps = max_sweeps
        self.in_place_roots = in_place_roots
        self.max_duplicated_fraction = max_duplicated_fraction
        self.min_duplicated_work = min_duplicated_work
        self.fusions_made = 0
        self.producers_fused = 0
        self._facts: dict[tuple, tuple] = {}  # see _fact

    def run(self, module: HloModule) -> bool:
        names = NameUniquer(module)
        self.fusions_made = 0
        self.producers_fused = 0
        self._shared = shared_fused_computations(module)
        self._no_dup: set[HloInstruction] = set()
        self._copy_budget = 0  # elements of arithmetic the current computation may copy
        changed = False
        for comp in fusible_computations(module):
            changed |= self._run_on(module, comp, names)
        return changed

    def _run_on(self, module: HloModule, comp: HloComputation, names: NameUniquer) -> bool:
        editor = FusionEditor(module, comp, names)
        self._facts = {}  # answers hold within one computation's editor
        work = sum(arithmetic_work(i) for i in comp.instructions)
        budget = int(self.max_duplicated_fraction * work)
        self._copy_budget = max(budget, self.min_duplicated_work)
        changed_any = False
        for _ in range(self.max_sweeps):
            changed = False
            self._no_dup = self.unduplicable(editor, comp)
            for consumer in reversed(comp.post_order()):
                if consumer.parent is not comp:
                    continue
                while (found := self._pick_producer(editor, consumer)) is not None:
                    consumer = editor.fuse(found, consumer)
                    if found.parent is comp:  # it stays for its other users: a copy
                        self._copy_budget -= self._fact(editor, arithmetic_work, found)
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
        for i, producer in enumerate(consumer.operands):  # the consumer is checked once
            if self._should_fuse_into(editor, producer, consumer, i):
                return producer
        return None

    def _fact(self, editor: FusionEditor, rule, instr: HloInstruction, *args):
        """rule(instr, *args); for a fusion, computed once per state of its body (the editor
        counts its edits): fusing asks the same questions about the same consumer and
        producers again and again, and each answer walks a fused body. Within one
        computation's run the args of a rule are the same but for reuses_operand's index."""
        body = fused_computation(instr)
        if body is None:
            return rule(instr, *args)
        key = (rule, instr, args[0] if rule is reuses_operand else None)
        edits = editor.edits(body)
        known = self._facts.get(key)
        if known is not None and known[0] is body and known[1] == edits:
            return known[2]
        value = rule(instr, *args)
        self._facts[key] = (body, edits, value)
        return value

    def _consumer_ok(self, editor: FusionEditor, instr: HloInstruction) -> bool:
        comp = fused_computation(instr)
        if comp is None:
            return can_be_consumer(instr, self.in_place_roots, editor.unfusible)
        if id(comp) in self._shared:
            return False
        return self._fact(editor, can_be_consumer, instr, self.in_place_roots, editor.unfusible)

    def _producer_ok(self, editor: FusionEditor, instr: HloInstruction) -> bool:
        comp = fused_computation(instr)
        if comp is None:
            return can_be_producer(instr, editor.unfusible)
        if id(comp) in self._shared:
            return False
        return self._fact(editor, can_be_producer, instr, editor.unfusible)

    def can_fuse(
        self, editor: FusionEditor, producer: HloInstruction, consumer: HloInstruction, i: int
    ) -> bool:
        """May operand `i` (`producer`) of `consumer` be computed inside it, duplication
        aside: both take part in fusion, the in-place operand stays out, small constants
        only, no expensive producer re-read per element, within the limits."""
        return self._consumer_ok(editor, consumer) and self._can_fuse_into(
            editor, producer, consumer, i
        )

    def _can_fuse_into(
        self, editor: FusionEditor, producer: HloInstruction, consumer: HloInstruction, i: int
    ) -> bool:
        """can_fuse for a consumer that passed _consumer_ok."""
        if not self._producer_ok(editor, producer) or producer.control_predecessors:
            return False
        if producer.control_successors:
            return False
        k = self._fact(editor, in_place_operand, consumer)
        if k is not None and (i == k or consumer.operands[k] in producer.operands):
            return False
        if producer.opcode is Opcode.CONSTANT:
            small = producer.shape.byte_size <= self.small_constant_bytes
            return small and consumer.opcode is Opcode.FUSION
        if self._fact(editor, is_expensive, producer) and self._fact(
            editor, reuses_operand, consumer, i
        ):
            return False
        return self._within_limits(producer, consumer)

    def should_fuse(
        self, editor: FusionEditor, producer: HloInstruction, consumer: HloInstruction, i: int
    ) -> bool:
        """May operand `i` (`producer`) of `consumer` be computed inside it?"""
        return self._consumer_ok(editor, consumer) and self._should_fuse_into(
            editor, producer, consumer, i
        )

    def _should_fuse_into(
        self, editor: FusionEditor, producer: HloInstruction, consumer: HloInstruction, i: int
    ) -> bool:
        """should_fuse for a consumer that passed _consumer_ok."""
        if not self._can_fuse_into(editor, producer, consumer, i):
            return False
        if producer.opcode is Opcode.CONSTANT:
            return True
        others = [u for u in editor.users_of(producer) if u is not consumer]
        if not others and not editor.is_root(producer):
            return True
        return self._may_duplicate(editor, producer, others)

    def _may_duplicate(self, editor: FusionEditor, producer, others) -> bool:
        """Duplicate a multi-user producer only when it is cheap, not marked do-not-duplicate
        (see the module comment), within the computation's copy budget, and, when it reads
        more bytes than it writes, every user can take it in and the temporaries it reads are
        no larger than it."""
        if self._fact(editor, is_expensive, producer) and not is_always_duplicable(producer):
            return False
        if self._fact(editor, concatenates_computed_values, producer):
            return False
        if producer in self._no_dup:
            return False
        if self._fact(editor, arithmetic_work, producer) > self._copy_budget:
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

    def unduplicable(self, editor: FusionEditor, comp: HloComputation) -> set[HloInstruction]:
        """XLA's globally unfusible producers: those that read more than they write
        (`is_light_to_duplicate` false) and cannot be fused into all their users on all
        paths, so duplicating them into some users would leave them computed anyway."""
        reach = _LazyReachability(comp)  # most sweeps ask it nothing
        cache: dict[tuple[int, int], bool] = {}
        marked: set[HloInstruction] = set()
        for producer in reversed(comp.post_order()):
            users = editor.users_of(producer)
            if len(users) < 2 and not editor.is_root(producer):
                continue
            if is_light_to_duplicate(producer):
                continue
            if not self._producer_ok(editor, producer) or editor.is_root(producer):
                marked.add(producer)
                continue
            for user in users:
                if not self.fuses_on_all_paths(editor, reach, producer, user, marked, cache):
                    marked.add(producer)
                    break
        return marked

    def fuses_on_all_paths(
        self,
        editor: FusionEditor,
        reach: Reachability | _LazyReachability,
        producer: HloInstruction,
        consumer: HloInstruction,
        marked: set[HloInstruction],
        cache: dict[tuple[int, int], bool],
        depth: int = 0,
    ) -> bool:
        """Can `producer` be fused into `consumer` through every operand of `consumer` that
        depends on it (XLA's CanFuseOnAllPaths)? Paths longer than `_MAX_PATH` count as not
        fusible (a bound on the search, and on the fusion such a path would build)."""
        if consumer is producer:
            return True
        key = (id(producer), id(consumer))
        if key in cache:
            return cache[key]
        ok = depth < _MAX_PATH and self._consumer_ok(editor, consumer)
        for i, operand in enumerate(consumer.operands):
            if not ok:
                break
            if not reach.reaches(producer, operand):
                continue
            ok = (
                operand not in marked
                and self.can_fuse(editor, operand, consumer, i)
                and self.fuses_on_all_paths(
                    editor, reach, producer, operand, marked, cache, depth + 1
                )
            )
        cache[key] = ok
        return ok

    def _within_limits(self, producer: HloInstruction, consumer: HloInstruction) -> bool:
        if len(consumer.operands) + len(producer.operands) > self.max_parameters:
            operands = set(consumer.operands)  # (the sum bounds the count: most stop there)
            operands.discard(producer)
            operands.update(producer.operands)
            if len(operands) > self.max_parameters:
                return False
        return _size(producer) + _size(consumer) <= self.max_instructions


_MAX_PATH = 64  # instructions on a path from a producer to a user, for fuses_on_all_paths


class _LazyReachability:
    """Reachability(comp), built at the first question."""

    def __init__(self, comp: HloComputation):
        self._comp = comp
        self._reach: Reachability | None = None

    def reaches(self, a: HloInstruction, b: HloInstruction) -> bool:
        if self._reach is None:
            self._reach = Reachability(self._comp)
        return self._reach.reaches(a, b)


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
    return instr.opcode.category is Category.CONSTANT


def _size(instr: HloInstruction) -> int:
    comp = fused_computation(instr)
    return 1 if comp is None else len(comp.instructions)
