"""The editor every pass shares, and graph helpers: fresh names, dead-code removal,
reachability of computations, and "does this instruction (or anything it calls) have a side
effect".

`Editor` wraps one computation. Its edits are the IR's own (which keep every instruction's
use-lists current, see xlapy.ir.instruction), so replacing an instruction costs the size of
its use list, not of the computation, and no pass keeps a users map of its own. New
instructions go just before the one they replace (or just after the one they read), which
keeps the text order a valid order. The fusion editor (passes/fusion_edit.py) is an Editor
that also grows fused computations.
"""

from __future__ import annotations

from collections.abc import Iterable

from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.literal import Literal
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape


def module_of(comp: HloComputation) -> HloModule | None:
    return comp.parent


def call_counts(module: HloModule) -> dict[HloComputation, int]:
    """How many call sites each computation has (computations nobody calls are absent).
    Skips the instructions that call nothing without asking them (the while-loop passes
    ask once per loop they look at: a scan of the whole module each time)."""
    count: dict[HloComputation, int] = {}
    get = count.get
    for comp in module.computations:
        for called in comp.called_computations():
            count[called] = get(called, 0) + 1
    return count


def has_side_effect_deep(instr: HloInstruction, _memo: dict[int, bool] | None = None) -> bool:
    """True if `instr` has a side effect or calls a computation containing one (XLA's rule:
    a while loop whose body prints has a side effect)."""
    if instr.has_side_effect:
        return True
    memo = {} if _memo is None else _memo
    for comp in instr.called_computations():
        key = id(comp)
        if key not in memo:
            memo[key] = False  # no recursion in valid modules; guard anyway
            memo[key] = any(has_side_effect_deep(i, memo) for i in comp.instructions)
        if memo[key]:
            return True
    return False


class Editor:
    """Edits one computation; hands out module-unique names."""

    def __init__(self, comp: HloComputation, namer: NameUniquer | None = None):
        self.comp = comp
        self.namer = namer or NameUniquer(comp.parent)
        self._side_effect_memo: dict[int, bool] = {}

    # -- queries ---------------------------------------------------------------------------
    @staticmethod
    def users_of(instr: HloInstruction) -> list[HloInstruction]:
        """The instructions reading `instr` as an operand (its use-list)."""
        return instr.users

    def is_root(self, instr: HloInstruction) -> bool:
        return self.comp.root is instr

    def is_dead(self, instr: HloInstruction) -> bool:
        """No users or control successors, not the root, not a parameter, and removable
        without losing an effect."""
        return (
            not instr.users
            and not instr.control_successors
            and instr is not self.comp.root
            and instr.opcode is not Opcode.PARAMETER
            and not has_side_effect_deep(instr, self._side_effect_memo)
        )

    # -- edits -----------------------------------------------------------------------------
    def add(
        self,
        opcode: Opcode,
        shape: Shape,
        operands: Iterable[HloInstruction] = (),
        attrs: dict | None = None,
        *,
        before: HloInstruction,
        literal: Literal | None = None,
        name: str | None = None,
    ) -> HloInstruction:
        """A new instruction inserted just before `before`; metadata is copied from it."""
        attrs = dict(attrs or {})
        if before.metadata is not None and "metadata" not in attrs:
            attrs["metadata"] = before.metadata
        instr = HloInstruction(
            self.namer.fresh(name or opcode.text), opcode, shape, operands, attrs, literal=literal
        )
        self.insert(instr, before)
        return instr

    def insert(self, instr: HloInstruction, before: HloInstruction) -> None:
        """Put an already built instruction into the computation just before `before`."""
        self.comp.add_instruction(instr, before=before)

    def insert_after(self, instr: HloInstruction, after: HloInstruction) -> None:
        """Put an already built instruction into the computation just after `after`."""
        order = self.comp.instructions
        i = order.index(after) + 1
        if i == len(order):
            self.comp.add_instruction(instr)
        else:
            self.comp.add_instruction(instr, before=order[i])

    @staticmethod
    def set_operands(instr: HloInstruction, operands: list[HloInstruction]) -> None:
        instr.set_operands(operands)

    def replace(self, old: HloInstruction, new: HloInstruction, keep=()) -> None:
        """Every use of `old` (operand, control edge, root) becomes a use of `new`, except the
        reads by `new` itself and by the instructions in `keep`."""
        if old is new:
            return
        old.replace_all_uses_with(new, keep)
        if self.comp.root is old:
            self.comp.root = new

    def remove(self, instr: HloInstruction) -> None:
        """Drop `instr` (which must have no users) from the computation."""
        self.comp.remove_instruction(instr)

    def remove_dead(self, candidates: Iterable[HloInstruction] | None = None) -> bool:
        """Remove dead instructions (see `is_dead`), following operands that die in turn.

        Only `candidates` and what they alone keep alive are considered when given; otherwise
        the whole computation."""
        work = list(self.comp.instructions if candidates is None else candidates)
        removed = False
        while work:
            instr = work.pop()
            if instr.parent is not self.comp or not self.is_dead(instr):
                continue
            deps = [*instr.operands, *instr.control_predecessors]
            self.remove(instr)
            removed = True
            work.extend(deps)
        return removed


def reachable_computations(module: HloModule) -> list[HloComputation]:
    """The entry and every computation it calls, directly or not, in module order."""
    if module.entry is None:
        return list(module.computations)
    seen = {id(module.entry)}
    stack = [module.entry]
    while stack:
        comp = stack.pop()
        for callee in comp.called_computations():
            if id(callee) not in seen:
                seen.add(id(callee))
                stack.append(callee)
    return [c for c in module.computations if id(c) in seen]


def remove_unreachable_computations(module: HloModule) -> bool:
    """Drop computations the entry cannot reach; True if any was dropped."""
    keep = reachable_computations(module)
    if len(keep) == len(module.computations):
        return False
    module.computations = keep
    return True


def same_shape(a: Shape, b: Shape) -> bool:
    """Equal dims and element types, and equal layouts where both are given (or default)."""
    if not a.compatible(b):
        return False
    if a.is_tuple:
        return all(same_shape(x, y) for x, y in zip(a.tuple_shapes, b.tuple_shapes, strict=True))
    if not a.is_array or a.rank == 0:
        return True
    return a.layout_or_default.minor_to_major == b.layout_or_default.minor_to_major
