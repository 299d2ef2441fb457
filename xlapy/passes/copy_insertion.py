"""Copy insertion: make the buffers that must be shared safe to share, with as few copies
as the schedule allows.

Buffer assignment puts a while loop's init, state and body result in one buffer, each
conditional branch's result in the conditional's buffer, and an aliased output in its
parameter's bytes. That is only correct when no value of such a buffer is overwritten
while another is still needed: a body that returns its state elements in other positions,
an init that is read again after the loop, a constant or a caller's parameter fed to a
loop, or a donated parameter read after its output is written would all be corrupted.

Like XLA, the pass first adds copies everywhere they might be needed:
  - a deep copy of every while's init and two of every while body's root (a body that
    permutes its state elements needs the inner one as a temporary);
  - a deep copy of every conditional branch's root;
  - a deep copy of the entry root (every output gets its own buffer);
  - a copy of each parameter aliased to an output, read by all its former users;
then fixes a schedule (written back as the module's instruction order,
`is_scheduled=true`; post order unless a scheduler is given) and, latest in the schedule
first, removes each copy whose removal leaves no
interference in the merged buffer under that schedule (xlapy.analysis.liveness). Copies
that keep an output apart from a constant or a non-donated parameter, or two outputs apart
from each other, stay. Loop bodies are judged before their callers (XLA's order): once a
body passes a state element through unchanged, nothing in that element's buffer is
written, so the copy of its init goes too, even for a parameter or a constant (read-only
loop state shares the caller's bytes). Last, as XLA does, the tuples that the deep copies
left rebuilding their own source are simplified away and dead code removed.

Removing a copy costs the size of its use list, not of its computation: the readers of
each instruction are indexed once per computation and kept current as copies are bypassed,
and the schedules drop the removed copies in one pass at the end.
"""

from __future__ import annotations

from xlapy.analysis.alias import AliasAnalysis, HloBuffer, UnionFind
from xlapy.analysis.dataflow import DataflowAnalysis, HloValue, sequential_computations
from xlapy.analysis.liveness import LivenessAnalysis
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Opcode
from xlapy.passes.dce import DeadCodeElimination
from xlapy.passes.hlo_edit import Editor
from xlapy.passes.pass_base import HloPass, register_pass
from xlapy.passes.tuple_simplify import TupleSimplifier, rebuilt_source


def _deep_copy(comp: HloComputation, instr: HloInstruction, names: NameUniquer) -> HloInstruction:
    """Instructions (added to `comp`) producing a copy of every array leaf of `instr`."""
    shape = instr.shape
    if shape.is_array:
        return comp.add_instruction(
            HloInstruction(names.fresh("copy"), Opcode.COPY, shape, [instr])
        )
    if not shape.is_tuple:
        return instr
    elements = []
    for i, element_shape in enumerate(shape.tuple_shapes):
        gte = comp.add_instruction(
            HloInstruction(
                names.fresh("get-tuple-element"),
                Opcode.GET_TUPLE_ELEMENT,
                element_shape,
                [instr],
                {"index": i},
            )
        )
        elements.append(_deep_copy(comp, gte, names))
    return comp.add_instruction(HloInstruction(names.fresh("tuple"), Opcode.TUPLE, shape, elements))


def _keeps_layout(copy: HloInstruction) -> bool:
    """Whether `copy` only moves bytes (a layout-changing copy is a transpose: never removed)."""
    a, b = copy.shape, copy.operands[0].shape
    return a.rank < 2 or a.layout_or_default.minor_to_major == b.layout_or_default.minor_to_major


def _rebuilt_source(instr: HloInstruction) -> HloInstruction | None:
    """x when `instr` is tuple(gte(x, 0), ..., gte(x, n-1)) of x's exact shape."""
    source = rebuilt_source(instr)
    return source if source is not None and source.shape == instr.shape else None


def _collapse_rebuilt_tuples(module: HloModule, names: NameUniquer) -> None:
    """Use x itself wherever a tuple only rebuilds x (outermost first, so the names of the
    program's own instructions survive the tuple simplifier)."""
    for comp in module.computations:
        if not any(i.opcode is Opcode.TUPLE for i in comp.instructions):
            continue
        editor = Editor(comp, names)
        for instr in reversed(comp.post_order()):
            source = _rebuilt_source(instr)
            if source is not None and instr.parent is comp:
                editor.replace(instr, source)


def _users(comp: HloComputation, instr: HloInstruction) -> list[HloInstruction]:
    return [i for i in comp.instructions if instr in i.operands]


class _Readers:
    """id(instruction) -> the instructions of its computation reading it as an operand,
    indexed per computation on first use."""

    def __init__(self):
        self._by_comp: dict[int, dict[int, list[HloInstruction]]] = {}

    def of(self, comp: HloComputation) -> dict[int, list[HloInstruction]]:
        index = self._by_comp.get(id(comp))
        if index is None:
            index = {}
            for instr in comp.instructions:
                for op in dict.fromkeys(instr.operands):
                    index.setdefault(id(op), []).append(instr)
            self._by_comp[id(comp)] = index
        return index


@register_pass
class CopyInsertion(HloPass):
    """Add the copies buffer sharing needs, then remove the unnecessary ones."""

    name = "copy-insertion"

    def __init__(self, schedule_fn=None):
        """`schedule_fn(computation) -> sequence` fixes the order copies are judged under
        (default: post order); xlapy.memory passes its best scheduler."""
        self.schedule_fn = schedule_fn or (lambda comp: comp.post_order())

    def run(self, module: HloModule) -> bool:
        if module.entry is None:
            return False
        names = NameUniquer(module)
        added = self._add_copies(module, sequential_computations(module), names)
        removed = self._remove_copies(module)
        if removed:  # the deep copies' tuples that now only rebuild their source go
            _collapse_rebuilt_tuples(module, names)
            TupleSimplifier().run(module)
            DeadCodeElimination().run(module)
        return added > 0 or removed > 0

    # -- adding ----------------------------------------------------------------------------
    def _add_copies(self, module, computations, names) -> int:
        before = sum(1 for i in module.instructions() if i.opcode is Opcode.COPY)
        for comp in computations:
            for instr in list(comp.instructions):
                if instr.opcode is Opcode.WHILE:
                    init = instr.operands[0]
                    instr.operands[0] = _deep_copy(comp, init, names)
                    body = instr.attrs["body"]
                    # Two levels: a body that permutes its state needs a temporary.
                    inner = _deep_copy(body, body.root, names)
                    body.root = _deep_copy(body, inner, names)
                elif instr.opcode is Opcode.CONDITIONAL:
                    branches = instr.attrs.get("branch_computations") or (
                        instr.attrs["true_computation"],
                        instr.attrs["false_computation"],
                    )
                    for branch in branches:
                        branch.root = _deep_copy(branch, branch.root, names)
        entry = module.entry
        for alias in module.config.input_output_alias:
            param = entry.parameter(alias.param_number)
            if alias.param_index or not param.shape.is_array:
                continue
            users = _users(entry, param)
            copy = entry.add_instruction(
                HloInstruction(names.fresh("copy"), Opcode.COPY, param.shape, [param])
            )
            for user in users:
                user.replace_operand(param, copy)
            if entry.root is param:
                entry.root = copy
        entry.root = _deep_copy(entry, entry.root, names)
        return sum(1 for i in module.instructions() if i.opcode is Opcode.COPY) - before

    # -- removing --------------------------------------------------------------------------
    def _remove_copies(self, module: HloModule) -> int:
        dataflow = DataflowAnalysis.run(module)
        sequences = {c: list(self.schedule_fn(c)) for c in dataflow.computations}
        liveness = LivenessAnalysis.run(module, dataflow, sequences)
        aliases = AliasAnalysis.run(module, dataflow)
        entry = module.entry
        if entry is None:
            return 0
        writable = frozenset(
            dataflow.value_at(entry.parameter(a.param_number), a.param_index)
            for a in module.config.input_output_alias
        )
        groups = UnionFind()
        members: dict[HloBuffer, list[HloValue]] = {b: list(b.values) for b in aliases.buffers}
        ranges = liveness.ranges
        outputs = [v for _, v in dataflow.leaf_values(entry.root_instruction())]
        removed = 0
        readers = _Readers()
        dropped: set[int] = set()
        candidates = [
            i
            for c in reversed(dataflow.computations)  # callees first, as XLA does
            for i in reversed(sequences[c])
            if i.opcode is Opcode.COPY and i.shape.is_array and _keeps_layout(i)
        ]
        for copy in candidates:
            source = copy.operands[0]
            copied = dataflow.value_at(copy, ())
            kept = dataflow.value_at(source, ())
            a = groups.find(aliases.buffer_of(copied))
            b = groups.find(aliases.buffer_of(kept))
            merged = [v for v in dict.fromkeys(members[a] + members[b]) if v is not copied]
            old_range = ranges[kept]
            ranges[kept] = (old_range[0], max(old_range[1], ranges[copied][1]))
            outs = [kept if v is copied else v for v in outputs]
            held = dataflow.positions(copied)
            for instr, index in held:  # judge in-place reuse as if the copy were gone
                dataflow._at[(id(instr), index)] = kept
            if not self._may_merge(merged, outs, liveness, writable):
                ranges[kept] = old_range
                for instr, index in held:
                    dataflow._at[(id(instr), index)] = copied
                continue
            outputs = outs
            groups.union(a, b)
            members[groups.find(a)] = merged
            dropped.add(id(copy))
            self._apply(readers.of(copy.parent), dataflow, copy, source, copied, kept)
            removed += 1
        for comp, sequence in sequences.items():
            comp.instructions = [i for i in sequence if id(i) not in dropped]
        module.config.is_scheduled = True
        return removed

    @staticmethod
    def _may_merge(merged, outputs, liveness, writable) -> bool:
        if liveness.conflicts(merged, writable) is not None:
            return False
        in_buffer = set(merged)
        held = [v for v in outputs if v in in_buffer]
        if len(held) > 1:
            return False
        if held:
            for v in merged:
                if v.instruction.opcode is Opcode.CONSTANT:
                    return False
                entry = liveness.module.entry
                if v.defined_by_parameter and v.instruction.parent is entry and v not in writable:
                    return False
        return True

    @staticmethod
    def _apply(readers, dataflow, copy, source, copied, kept) -> None:
        """Bypass and remove `copy`; `readers` is its computation's index (kept current)."""
        comp = copy.parent
        users = readers.pop(id(copy), [])
        for user in users:
            user.replace_operand(copy, source)
        source_users = readers.setdefault(id(source), [])
        source_users.remove(copy)
        source_users.extend(u for u in users if u not in source_users)
        if comp.root is copy:
            comp.root = source
        dataflow._positions[kept].extend(dataflow.positions(copied))
        dataflow._uses[kept].extend(dataflow._uses[copied])
        comp.remove_instruction(copy)
