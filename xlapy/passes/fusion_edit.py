"""The graph surgery behind the fusion passes, apart from the decisions about what to fuse.

A fusion instruction calls a fused computation whose parameters `param_0..param_{n-1}` stand
for the fusion's operands, in order. `FusionEditor` works on one computation of a module:

  as_fusion(c)            wrap a single op into a one-instruction fusion (the op keeps its
                          name inside, the fusion gets a new `<op>_fusion` name)
  fuse(p, c)              clone producer `p` (an op or a whole fusion body) into consumer `c`
                          in place of the parameter that read it; `p` is removed when no other
                          user is left, otherwise it stays (the work is duplicated)
  fuse_keeping_output(p, c)   the same, but `p`'s value also becomes an output of the fusion
                          and `p`'s other users read it through get-tuple-element
  merge_siblings(a, b)    one fusion computing the outputs of both, operands shared

A fusion with several outputs has a tuple root; its users read get-tuple-element. The
editor is the passes' shared Editor (passes/hlo_edit.py: the IR's use-lists, module-unique
names) plus the fused computations; it puts a new fused computation just before the
computation that calls it (callees print first).

Fusing grows one body a producer at a time, so the editor avoids walking whole bodies per
edit. Each body it made or edited is *tidy* (every instruction after its operands, nothing
dead but parameters), and it keeps, per body it was asked about, the list of members that
are not loop-fusible (fusion_rules.unfusible_members) current as it adds and removes
instructions. After a producer is spliced into a tidy body, the new order is the one a full
re-sort would give, computed from the first reader of the replaced parameters on: the part
before it is unchanged, then comes the producer's work in depth-first order, then the rest.
Where that shortcut does not provably apply (a body parsed from text, a producer body that
was never tidied) the editor re-sorts the whole body.
"""

from __future__ import annotations

from collections.abc import Iterable

from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape
from xlapy.passes.fusion_rules import (
    fused_computation,
    fusion_body,
    fusion_kind,
    is_loop_fusible_op,
    unfusible_members,
)
from xlapy.passes.hlo_edit import Editor


def root_outputs(comp: HloComputation) -> list[HloInstruction]:
    """The instructions whose values a fused computation returns (the tuple's elements)."""
    root = comp.root_instruction()
    return list(root.operands) if root.opcode is Opcode.TUPLE else [root]


def _operand_of(fusion: HloInstruction, param: HloInstruction) -> HloInstruction:
    """The operand of `fusion` that its fused parameter `param` reads."""
    assert param.parameter_number is not None, f"parameter {param.name} has no number"
    return fusion.operands[param.parameter_number]


def fusion_name(comp: HloComputation) -> str:
    """`first_last_fusion` from the opcodes of the fused work, the way XLA names fusions."""
    ops: list[str] = []
    for instr in comp.post_order():
        if instr.opcode in (Opcode.PARAMETER, Opcode.CONSTANT, Opcode.TUPLE):
            continue
        text = instr.opcode.text.replace("-", "_")
        if text not in ops:
            ops.append(text)
    if not ops:
        return "fusion"
    if len(ops) == 1:
        return f"{ops[0]}_fusion"
    return f"{ops[0]}_{ops[-1]}_fusion"


class FusionEditor(Editor):
    """Builds and grows fusions inside `comp`."""

    def __init__(self, module: HloModule, comp: HloComputation, names: NameUniquer):
        super().__init__(comp, names)
        self.module = module
        self.names = names
        self.created: list[HloInstruction] = []
        # per fusion: id(original) -> (original, its clone inside), so that a producer
        # reached again through another operand is not cloned a second time
        self._inside: dict[int, dict[int, tuple[HloInstruction, HloInstruction]]] = {}
        # id(body) -> (body, its unfusible members by id), for bodies asked about
        self._unfusible: dict[int, tuple[HloComputation, dict[int, HloInstruction]]] = {}
        # id(body) -> body, for the bodies made or edited here (all tidy)
        self._tidy_bodies: dict[int, HloComputation] = {}
        # body -> how many edits this editor made to it (see `edits`)
        self._edits: dict[HloComputation, int] = {}
        # body -> its parameters in number order, while known (see `_parameters`)
        self._params: dict[HloComputation, list[HloInstruction]] = {}

    # -- queries ---------------------------------------------------------------------------
    def unfusible(self, body: HloComputation) -> Iterable[HloInstruction]:
        """fusion_rules.unfusible_members(body), from the index this editor keeps current."""
        entry = self._unfusible.get(id(body))
        if entry is None:
            entry = (body, {id(i): i for i in unfusible_members(body)})
            self._unfusible[id(body)] = entry
        return entry[1].values()

    def edits(self, body: HloComputation) -> int:
        """A count that changes whenever this editor changes `body` (its instructions, root,
        parameter numbers, or the shape and kind of the fusion calling it): a fact computed
        from a fusion holds while the count stays the same."""
        return self._edits.get(body, 0)

    # -- fused bodies ----------------------------------------------------------------------
    def _touch(self, body: HloComputation) -> None:
        self._edits[body] = self._edits.get(body, 0) + 1

    def _body_add(self, body: HloComputation, instr: HloInstruction) -> HloInstruction:
        self._touch(body)
        body.add_instruction(instr)
        entry = self._unfusible.get(id(body))
        is_param = instr.opcode is Opcode.PARAMETER
        if entry is not None and not is_param and not is_loop_fusible_op(instr):
            entry[1][id(instr)] = instr
        return instr

    def _body_remove(self, body: HloComputation, instr: HloInstruction) -> None:
        self._touch(body)
        if instr.opcode is Opcode.PARAMETER:
            self._params.pop(body, None)
        body.remove_instruction(instr)
        entry = self._unfusible.get(id(body))
        if entry is not None:
            entry[1].pop(id(instr), None)

    def _tidy(self, body: HloComputation) -> None:
        """Drop instructions the root no longer reaches and order the rest operands-first."""
        live: set[int] = set()
        work = [body.root_instruction()]
        while work:
            instr = work.pop()
            if id(instr) in live:
                continue
            live.add(id(instr))
            work.extend(instr.operands)
        for instr in list(body.instructions):
            if id(instr) not in live and instr.opcode is not Opcode.PARAMETER:
                self._body_remove(body, instr)
        body.reorder(body.post_order())
        self._tidy_bodies[id(body)] = body
        self._touch(body)

    def _tidy_splice(
        self,
        body: HloComputation,
        added: list[HloInstruction],
        value: HloInstruction,
        readers: list[HloInstruction],
        producer_tidy: bool,
    ) -> None:
        """`_tidy(body)` after `added` (new parameters and clones, appended in that order)
        was spliced into `body` as `value`, which `readers` now read in place of the
        parameters it replaced. Equal to the full re-sort (see the module comment) when the
        body and the producer's body were tidy; otherwise it does the full re-sort."""
        order = body.instructions
        new = {id(i) for i in added}
        ok = producer_tidy and id(body) in self._tidy_bodies and id(value) in new and readers
        if not ok or any(id(r) in new for r in readers):
            self._tidy(body)
            return
        old = order[: len(order) - len(added)]
        first = min(old.index(r) for r in readers)
        done = set(map(id, old[:first]))
        spliced = _post_order_from(value, done)
        if not new <= done:
            self._tidy(body)
            return
        moved_old = any(id(i) not in new for i in spliced)
        rest = [i for i in old[first:] if id(i) not in done] if moved_old else old[first:]
        body.reorder(old[:first] + spliced + rest)

    # -- low-level edits -------------------------------------------------------------------
    def remove(self, instr: HloInstruction) -> None:
        """Drop `instr` (which must have no users), and its fused computation with it."""
        super().remove(instr)
        called = fused_computation(instr)
        if called is not None and called in self.module.computations:
            self.module.computations.remove(called)

    def _gte(self, fusion: HloInstruction, index: int) -> HloInstruction:
        """A get-tuple-element of `fusion`, placed right after it."""
        gte = HloInstruction(
            self.names.fresh("get-tuple-element"),
            Opcode.GET_TUPLE_ELEMENT,
            fusion.shape.tuple_shapes[index],
            [fusion],
            {"index": index},
        )
        self.insert_after(gte, fusion)
        return gte

    # -- fused computations ----------------------------------------------------------------
    def _parameters(self, comp: HloComputation) -> list[HloInstruction]:
        """comp.parameters (a fresh list), without sorting the body's parameters out of its
        instructions at every producer fused in: _drop_params leaves the list it makes
        here, and adding or removing a parameter any other way drops it."""
        params = self._params.get(comp)
        if params is None:
            params = self._params[comp] = comp.parameters
        return list(params)

    def _new_param(self, comp: HloComputation, number: int, shape: Shape) -> HloInstruction:
        self._params.pop(comp, None)
        param = HloInstruction(
            self.names.fresh(f"param_{number}"), Opcode.PARAMETER, shape, parameter_number=number
        )
        return self._body_add(comp, param)

    def _clone(self, instr: HloInstruction, operands, reuse_name: bool) -> HloInstruction:
        name = instr.name if reuse_name else self.names.fresh(instr.name)
        return HloInstruction(  # (which copies the attrs)
            name, instr.opcode, instr.shape, operands, instr.attrs, literal=instr.literal
        )

    def _clone_body(
        self, comp: HloComputation, source: HloInstruction, param_for, reuse_names: bool
    ) -> dict[int, HloInstruction]:
        """Clone the work of `source` (an op or a fusion's body) into `comp`; operand i of
        `source` is read through `param_for(operand)`. Returns id(original) -> clone."""
        mapping: dict[int, HloInstruction] = {}
        body = fused_computation(source)
        if body is None:
            ops = [param_for(op) for op in source.operands]
            mapping[id(source)] = self._body_add(comp, self._clone(source, ops, reuse_names))
            return mapping
        tidy = id(body) in self._tidy_bodies
        for instr in body.instructions if tidy else body.post_order():
            if instr.opcode is Opcode.PARAMETER:
                mapping[id(instr)] = param_for(_operand_of(source, instr))
                continue
            if instr is body.root and instr.opcode is Opcode.TUPLE:
                continue
            ops = [mapping[id(op)] for op in instr.operands]
            mapping[id(instr)] = self._body_add(comp, self._clone(instr, ops, reuse_names))
        return mapping

    def _param_finder(self, fusion: HloInstruction, params: list[HloInstruction] | None = None):
        """param_for(operand): the fused parameter reading `operand`, made if missing.
        `params`, when given, is the body's parameter list in number order; new parameters
        are appended to it."""
        comp = fusion_body(fusion)
        if params is None:
            params = self._parameters(comp)
        by_operand: dict[int, HloInstruction] = {}
        operands = fusion.operands  # (_operand_of inlined: once per parameter per fuse)
        for param in params:
            by_operand.setdefault(id(operands[param.parameter_number]), param)  # type: ignore[index]
        inside = self._inside.get(id(fusion), {})

        def param_for(operand: HloInstruction) -> HloInstruction:
            copy = inside.get(id(operand))
            if copy is not None and copy[0] is operand and copy[1].parent is comp:
                return copy[1]
            found = by_operand.get(id(operand))
            if found is None:
                found = self._new_param(comp, len(fusion.operands), operand.shape)
                by_operand[id(operand)] = found
                params.append(found)
                fusion.set_operands([*fusion.operands, operand])
            return found

        return param_for

    def _drop_params(
        self, fusion: HloInstruction, numbers: list[int], params: list[HloInstruction]
    ) -> None:
        """Remove parameters `numbers` (now unused) and renumber the rest 0..n-1; `params` is
        the body's parameter list in number order."""
        comp = fusion_body(fusion)
        self._touch(comp)
        drop = set(numbers)
        kept = []
        for param in params:
            if param.parameter_number in drop:
                self._body_remove(comp, param)
            else:
                kept.append(param)
        old = fusion.operands
        operands = []
        for i, param in enumerate(kept):
            operands.append(old[param.parameter_number])  # type: ignore[index]
            if param.parameter_number != i:
                param.parameter_number = i
                param.name = self.names.fresh(f"param_{i}")
        fusion.set_operands(operands)
        self._params[comp] = kept

    def _set_outputs(self, fusion: HloInstruction, outputs: list[HloInstruction]) -> None:
        """Make `outputs` the fused computation's results (a tuple when several); users of a
        fusion that had a single output read element 0 afterwards."""
        comp = fusion_body(fusion)
        self._touch(comp)
        old_root = comp.root_instruction()
        was_tuple = fusion.shape.is_tuple
        if len(outputs) == 1:
            root = outputs[0]
        else:
            shape = Shape.tuple(o.shape for o in outputs)
            root = HloInstruction(self.names.fresh("tuple"), Opcode.TUPLE, shape, outputs)
            self._body_add(comp, root)
        comp.root = root
        if old_root.opcode is Opcode.TUPLE and old_root is not root:
            self._body_remove(comp, old_root)
        fusion.shape = root.shape
        fusion.attrs["kind"] = fusion_kind(comp)
        if not was_tuple and fusion.shape.is_tuple:
            first = self._gte(fusion, 0)
            self.replace(fusion, first)
        self._tidy(comp)

    # -- fusion-level edits ----------------------------------------------------------------
    def as_fusion(self, instr: HloInstruction) -> HloInstruction:
        """`instr` itself if it is a fusion, else a new fusion holding just `instr`."""
        if instr.opcode is Opcode.FUSION:
            return instr
        comp = HloComputation(self.names.fresh("fused_computation", plain_first=True))
        comp.execution_thread = self.comp.execution_thread
        operands = list(dict.fromkeys(instr.operands))
        params = [self._new_param(comp, i, op.shape) for i, op in enumerate(operands)]
        by_operand = {id(op): p for op, p in zip(operands, params, strict=True)}
        inner = self._clone(instr, [by_operand[id(op)] for op in instr.operands], True)
        comp.add_instruction(inner)
        comp.root = inner
        comp.parent = self.module
        self._tidy_bodies[id(comp)] = comp
        self.module.computations.insert(self.module.computations.index(self.comp), comp)
        attrs: dict = {"kind": fusion_kind(comp), "calls": comp}
        if instr.metadata is not None:
            attrs["metadata"] = instr.metadata
        name = self.names.fresh(f"{instr.opcode.text.replace('-', '_')}_fusion", True)
        fusion = HloInstruction(name, Opcode.FUSION, instr.shape, [], attrs)
        self.insert(fusion, instr)
        fusion.set_operands(operands)
        self.replace(instr, fusion)
        self.remove(instr)
        self.created.append(fusion)
        return fusion

    def _absorb(self, fusion: HloInstruction, producer: HloInstruction, reuse_names: bool):
        """Compute `producer` inside `fusion` instead of reading it; returns the clone of its
        value in the fused computation."""
        comp = fusion_body(fusion)
        numbers = [i for i, op in enumerate(fusion.operands) if op is producer]
        params = self._parameters(comp)
        replaced = [_parameter(comp, params, n) for n in numbers]
        param_for = self._param_finder(fusion, params)
        first_new = len(comp.instructions)
        mapping = self._clone_body(comp, producer, param_for, reuse_names)
        added = comp.instructions[first_new:]
        body = fused_computation(producer)
        value = mapping[id(body.root if body is not None else producer)]
        readers: list[HloInstruction] = []
        for param in replaced:
            for user in list(param.users):
                user.replace_operand(param, value)
                readers.append(user)
            if comp.root is param:
                comp.root = value
        self._drop_params(fusion, numbers, params)
        fusion.attrs["kind"] = fusion_kind(comp)
        self._inside.setdefault(id(fusion), {})[id(producer)] = (producer, value)
        producer_tidy = body is None or id(body) in self._tidy_bodies
        self._tidy_splice(comp, added, value, readers, producer_tidy)
        self._touch(comp)
        return value

    def fuse(self, producer: HloInstruction, consumer: HloInstruction) -> HloInstruction:
        """Fuse `producer` into `consumer`; returns the fusion that replaced `consumer`."""
        fusion = self.as_fusion(consumer)
        others = [u for u in self.users_of(producer) if u is not fusion]
        dies = not others and not self.is_root(producer)
        self._absorb(fusion, producer, reuse_names=dies)
        if dies:
            self.remove(producer)
        return fusion

    def fuse_keeping_output(
        self, producer: HloInstruction, consumer: HloInstruction
    ) -> HloInstruction:
        """Fuse `producer` into `consumer` and also output its value; the producer's other
        users read that output. Returns the multi-output fusion."""
        fusion = self.as_fusion(consumer)
        value = self._absorb(fusion, producer, reuse_names=True)
        outputs = [*root_outputs(fusion_body(fusion)), value]
        self._set_outputs(fusion, outputs)
        gte = self._gte(fusion, len(outputs) - 1)
        self.replace(producer, gte)
        self.remove(producer)
        return fusion

    def merge_siblings(self, a: HloInstruction, b: HloInstruction) -> HloInstruction:
        """One fusion computing what `a` and `b` compute; both must be independent. Users of
        a tuple-shaped `a` or `b` must all be get-tuple-elements."""
        a, b = self.as_fusion(a), self.as_fusion(b)
        order = self.comp.instructions
        base, other = (a, b) if order.index(a) > order.index(b) else (b, a)
        comp = fusion_body(base)
        first_outputs = root_outputs(comp)
        other_body = fusion_body(other)
        mapping = self._clone_body(comp, other, self._param_finder(base), reuse_names=True)
        added = [mapping[id(o)] for o in root_outputs(other_body)]
        self._set_outputs(base, [*first_outputs, *added])
        offset = len(first_outputs)
        if other.shape.is_tuple:
            for user in list(self.users_of(other)):
                user.attrs["index"] = user.tuple_index + offset
                user.set_operands([base])
        else:
            self.replace(other, self._gte(base, offset))
        self.remove(other)
        return base

    def absorb_constants(self, fusion: HloInstruction, max_bytes: int) -> None:
        """Copy every constant operand of at most `max_bytes` into `fusion`."""
        for operand in list(dict.fromkeys(fusion.operands)):
            if operand.opcode is not Opcode.CONSTANT or operand.shape.byte_size > max_bytes:
                continue
            if operand.control_predecessors:
                continue
            self.fuse(operand, fusion)

    def finish(self) -> None:
        """Name the fusions made here after their contents and restore a valid text order."""
        for fusion in self.created:
            if fusion.parent is not self.comp:
                continue
            comp = fusion_body(fusion)
            fusion.name = self.names.fresh(fusion_name(comp), plain_first=True)
        self.comp.reorder(self.comp.post_order())


def _parameter(comp: HloComputation, params: list[HloInstruction], number: int):
    """Parameter `number` of `comp`, whose parameters in number order are `params`."""
    if number < len(params) and params[number].parameter_number == number:
        return params[number]
    return comp.parameter(number)


def _post_order_from(start: HloInstruction, done: set[int]) -> list[HloInstruction]:
    """`start` and what it depends on outside `done`, in the order the depth-first walk of
    HloComputation.post_order emits them (operands, then control predecessors, in order);
    adds their ids to `done`."""
    order: list[HloInstruction] = []
    done.add(id(start))
    stack = [(start, iter([*start.operands, *start.control_predecessors]))]
    while stack:
        node, deps = stack[-1]
        dep = next(deps, None)
        if dep is None:
            stack.pop()
            order.append(node)
            continue
        if id(dep) in done:
            continue
        done.add(id(dep))
        stack.append((dep, iter([*dep.operands, *dep.control_predecessors])))
    return order
