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

Removing a copy costs the size of its use list, not of its computation (the IR's
use-lists), and the schedules drop the removed copies in one pass at the end. The analyses
are read, never written: the pass keeps its own record of what it decided (live ranges
grown by the merges, and which values are now one: a removed copy's value is its source's)
and asks the liveness result whether a merge would interfere given that record. So which
copies go is decided without editing the module (`removable_copies`) and the edit follows
(`drop_copies`): the memory-plan choice judges several schedules on one module and one
dataflow and alias analysis.
"""

from __future__ import annotations

from collections import Counter

from xlapy.analysis.alias import AliasAnalysis, Aliases, HloBuffer, UnionFind
from xlapy.analysis.dataflow import (
    Dataflow,
    DataflowAnalysis,
    HloValue,
    sequential_computations,
)
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


def _array_leaves(shape) -> int:
    """How many copies `_deep_copy` makes of a value of `shape`."""
    if shape.is_array:
        return 1
    return sum(_array_leaves(s) for s in shape.tuple_shapes) if shape.is_tuple else 0


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
        added = self.add_copies(module, names)
        removed = self.remove_copies(module, names)
        return added > 0 or removed > 0

    def add_copies(self, module: HloModule, names: NameUniquer) -> int:
        """The first half of `run`: add every copy that might be needed (which copies does
        not depend on the schedule); the number added."""
        return self._add_copies(module, sequential_computations(module), names)

    def remove_copies(self, module: HloModule, names: NameUniquer) -> int:
        """The second half of `run`, on a module `add_copies` gave its copies: fix the
        schedule (`schedule_fn`), remove the copies it makes unnecessary and tidy up; the
        number removed."""
        sequences, dropped = self.removable_copies(module)
        return drop_copies(module, sequences, dropped, names)

    # -- adding ----------------------------------------------------------------------------
    def _add_copies(self, module, computations, names) -> int:
        added = 0  # copies made (a deep copy makes one per array leaf)

        def deep_copy(comp: HloComputation, instr: HloInstruction) -> HloInstruction:
            nonlocal added
            added += _array_leaves(instr.shape)
            return _deep_copy(comp, instr, names)

        for comp in computations:
            for instr in list(comp.instructions):
                if instr.opcode is Opcode.WHILE:
                    init = instr.operands[0]
                    instr.replace_operand_at(0, deep_copy(comp, init))
                    body = instr.while_body
                    # Two levels: a body that permutes its state needs a temporary.
                    inner = deep_copy(body, body.root)
                    body.root = deep_copy(body, inner)
                elif instr.opcode is Opcode.CONDITIONAL:
                    for branch in instr.branches:
                        branch.root = deep_copy(branch, branch.root)
        entry = module.entry
        params = entry.parameters_by_number()
        for alias in module.config.input_output_alias:
            param = params[alias.param_number]
            if alias.param_index or not param.shape.is_array:
                continue
            copy = entry.add_instruction(
                HloInstruction(names.fresh("copy"), Opcode.COPY, param.shape, [param])
            )
            entry.replace_all_uses(param, copy)
            added += 1
        entry.root = deep_copy(entry, entry.root)
        return added

    # -- removing --------------------------------------------------------------------------
    def removable_copies(
        self,
        module: HloModule,
        dataflow: Dataflow | None = None,
        aliases: Aliases | None = None,
    ) -> tuple[dict[HloComputation, list[HloInstruction]], list[HloInstruction]]:
        """The schedule (`schedule_fn` of each sequential computation) and the copies it
        makes unnecessary, in the order they go, judged on `module` as it is: nothing is
        edited (`drop_copies` does that). `dataflow` and `aliases`, when given, are the
        module's analyses (the memory-plan choice judges several schedules on one module)."""
        if dataflow is None:
            dataflow = DataflowAnalysis.run(module)
        if aliases is None:
            aliases = AliasAnalysis.run(module, dataflow)
        sequences = {c: list(self.schedule_fn(c)) for c in dataflow.computations}
        liveness = LivenessAnalysis.run(module, dataflow, sequences)
        entry = module.entry
        if entry is None:
            return sequences, []
        params = entry.parameters_by_number()
        writable = frozenset(
            dataflow.value_at(params[a.param_number], a.param_index)
            for a in module.config.input_output_alias
        )
        groups = UnionFind()
        members: dict[HloBuffer, list[HloValue]] = {b: list(b.values) for b in aliases.buffers}
        ranges = dict(liveness.ranges)  # grown as copies go
        same: dict[HloValue, HloValue] = {}  # a removed copy's value -> its source's

        def value_at(instr: HloInstruction) -> HloValue:
            value = dataflow.value_at(instr, ())
            while value in same:
                value = same[value]
            return value

        # how many of the entry's output positions hold each value (a removed copy's
        # outputs are its source's)
        outputs = Counter(v for _, v in dataflow.leaf_values(entry.root_instruction()))
        dropped: list[HloInstruction] = []
        candidates = [
            i
            for c in reversed(dataflow.computations)  # callees first, as XLA does
            for i in reversed(sequences[c])
            if i.opcode is Opcode.COPY and i.shape.is_array and _keeps_layout(i)
        ]
        for copy in candidates:
            copied = value_at(copy)
            kept = value_at(copy.operands[0])
            a = groups.find(aliases.buffer_of(copied))
            b = groups.find(aliases.buffer_of(kept))
            merged = [v for v in dict.fromkeys(members[a] + members[b]) if v is not copied]
            old_range = ranges[kept]
            ranges[kept] = (old_range[0], max(old_range[1], ranges[copied][1]))
            moved = outputs.pop(copied, 0)
            if moved:
                outputs[kept] += moved
            same[copied] = kept  # judge in-place reuse as if the copy were gone
            if not self._may_merge(merged, outputs, liveness, writable, ranges, same):
                ranges[kept] = old_range
                del same[copied]
                if moved:
                    outputs[copied] = moved
                    outputs[kept] -= moved
                    if not outputs[kept]:
                        del outputs[kept]
                continue
            groups.union(a, b)
            members[groups.find(a)] = merged
            dropped.append(copy)
        return sequences, dropped

    @staticmethod
    def _may_merge(merged, outputs: Counter, liveness, writable, ranges, same) -> bool:
        if liveness.conflicts(merged, writable, ranges=ranges, same=same) is not None:
            return False
        held = sum(outputs.get(v, 0) for v in merged)  # output positions in the buffer
        if held > 1:
            return False
        if held:
            for v in merged:
                if v.instruction.opcode is Opcode.CONSTANT:
                    return False
                entry = liveness.module.entry
                if v.defined_by_parameter and v.instruction.parent is entry and v not in writable:
                    return False
        return True


def drop_copies(
    module: HloModule,
    sequences: dict[HloComputation, list[HloInstruction]],
    dropped: list[HloInstruction],
    names: NameUniquer,
) -> int:
    """Remove the copies `dropped` (CopyInsertion.removable_copies, in its order: each
    copy's users read its source instead), make `sequences` less those copies the module's
    order, and tidy up; the number removed."""
    for copy in dropped:
        comp = copy.parent
        assert comp is not None, "a copy to drop is in its computation"
        comp.replace_all_uses(copy, copy.operands[0])
        comp.remove_instruction(copy)
    gone = {id(c) for c in dropped}
    for comp, sequence in sequences.items():
        comp.reorder([i for i in sequence if id(i) not in gone])
    module.config.is_scheduled = True
    if dropped:  # the deep copies' tuples that now only rebuild their source go
        _collapse_rebuilt_tuples(module, names)
        TupleSimplifier().run(module)
        DeadCodeElimination().run(module)
    return len(dropped)
