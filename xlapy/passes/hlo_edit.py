"""Graph-editing helpers shared by the passes: fresh names, a users index that stays current
while a pass rewrites a computation, dead-code removal, reachability of computations, and
"does this instruction (or anything it calls) have a side effect".

`Editor` wraps one computation. It keeps a map from each instruction to its users so that
replacing an instruction costs the size of its use list, not of the computation; new
instructions are inserted just before the one they replace, which keeps the text order a
valid order. Passes that edit through it never leave a stale users map behind.
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


def users_index(comp: HloComputation) -> dict[int, list[HloInstruction]]:
    """id(instruction) -> the instructions using it (operand or control edge), in text
    order, each once."""
    users: dict[int, list[HloInstruction]] = {id(i): [] for i in comp.instructions}
    for instr in comp.instructions:
        for dep in dict.fromkeys([*instr.operands, *instr.control_predecessors]):
            users.setdefault(id(dep), []).append(instr)
    return users


class Editor:
    """Edits one computation while keeping an index of users."""

    def __init__(self, comp: HloComputation, namer: NameUniquer | None = None):
        self.comp = comp
        self.namer = namer or NameUniquer(comp.parent)
        self._users: dict[int, list[HloInstruction]] | None = None
        self._side_effect_memo: dict[int, bool] = {}

    @property
    def users(self) -> dict[int, list[HloInstruction]]:
        """id(instruction) -> its users, built on first use (a pass that finds nothing to
        rewrite in a computation never pays for it) and kept current by every edit."""
        if self._users is None:
            self._users = users_index(self.comp)
        return self._users

    # -- queries ---------------------------------------------------------------------------
    def users_of(self, instr: HloInstruction) -> list[HloInstruction]:
        return self.users.get(id(instr), [])

    def is_dead(self, instr: HloInstruction) -> bool:
        """No users, not the root, not a parameter, and removable without losing an effect."""
        return (
            not self.users_of(instr)
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
        if "metadata" in before.attrs and "metadata" not in attrs:
            attrs["metadata"] = before.attrs["metadata"]
        instr = HloInstruction(
            self.namer.fresh(name or opcode.text), opcode, shape, operands, attrs, literal=literal
        )
        self.insert(instr, before)
        return instr

    def insert(self, instr: HloInstruction, before: HloInstruction) -> None:
        """Put an already built instruction into the computation just before `before`."""
        instr.parent = self.comp
        self.comp.instructions.insert(self.comp.instructions.index(before), instr)
        self.users[id(instr)] = []
        for dep in dict.fromkeys([*instr.operands, *instr.control_predecessors]):
            self.users.setdefault(id(dep), []).append(instr)

    def set_operands(self, instr: HloInstruction, operands: list[HloInstruction]) -> None:
        for dep in dict.fromkeys(instr.operands):
            if dep not in operands and dep not in instr.control_predecessors:
                self.users[id(dep)].remove(instr)
        for dep in dict.fromkeys(operands):
            if dep not in instr.operands and dep not in instr.control_predecessors:
                self.users.setdefault(id(dep), []).append(instr)
        instr.operands = list(operands)

    def replace(self, old: HloInstruction, new: HloInstruction) -> None:
        """Every use of `old` (operand, control edge, root) becomes a use of `new`."""
        if old is new:
            return
        moved = self.users.get(id(old), [])
        self.users[id(old)] = []
        targets = self.users.setdefault(id(new), [])
        for user in moved:
            user.operands = [new if op is old else op for op in user.operands]
            user.control_predecessors = [new if p is old else p for p in user.control_predecessors]
            if user is not new and user not in targets:
                targets.append(user)
        if self.comp.root is old:
            self.comp.root = new

    def remove(self, instr: HloInstruction) -> None:
        """Drop `instr` (which must have no users) from the computation."""
        for dep in dict.fromkeys([*instr.operands, *instr.control_predecessors]):
            users = self.users.get(id(dep))
            if users is not None and instr in users:
                users.remove(instr)
        self.users.pop(id(instr), None)
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
