"""HloComputation: an ordered list of instructions with numbered parameters and a root.

The list order is the text order. For a scheduled module (`is_scheduled=true`) it is also
the schedule; otherwise `post_order()` gives an order in which every operand and control
predecessor comes before its users.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from xlapy.errors import VerifierError
from xlapy.ir.instruction import CALL_ATTRIBUTES, HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import ProgramShape

if TYPE_CHECKING:
    from xlapy.ir.module import HloModule


class HloComputation:
    """A function in HLO: parameters, instructions and a root whose value is the result."""

    __slots__ = (
        "_hint",
        "_list",
        "_removed",
        "execution_thread",
        "is_entry",
        "name",
        "parent",
        "root",
    )

    def __init__(self, name: str, instructions=(), root: HloInstruction | None = None):
        self.name = name
        self._list: list[HloInstruction] = []
        self._removed: set[HloInstruction] = set()  # still in _list, see `instructions`
        self._hint = 0  # where the last insertion before an instruction found it
        self.root: HloInstruction | None = None
        self.parent: HloModule | None = None
        self.is_entry = False
        self.execution_thread = "main"
        for instr in instructions:
            self.add_instruction(instr)
        if root is not None:
            self.root = root
        elif self.instructions:
            self.root = self.instructions[-1]

    def release(self) -> None:
        """Take apart a computation its module drops (`HloModule.release`): its instructions'
        use-lists, control edges and `parent`, and its own instruction list, root and parent
        are removed; any later use raises AttributeError."""
        for instr in self._list:  # (removed ones included)
            del instr.operands, instr.users, instr.parent
            del instr.control_predecessors, instr.control_successors
        del self._list, self._removed, self.root, self.parent

    @property
    def instructions(self) -> list[HloInstruction]:
        """The instructions in text order. Removing one from the middle of a long list costs
        the list's length, and a pass removes hundreds between two reads of the list: so
        `remove_instruction` only notes the removal, and the list drops the removed
        instructions in one pass when it is next read."""
        if self._removed:
            removed = self._removed
            self._list = [i for i in self._list if i not in removed]
            removed.clear()
        return self._list

    @instructions.setter
    def instructions(self, order: list[HloInstruction]) -> None:
        self._list = order
        self._removed.clear()

    # -- building (each edit keeps the use-lists current; see xlapy.ir.instruction) ----------
    def add_instruction(
        self, instr: HloInstruction, *, before: HloInstruction | None = None
    ) -> HloInstruction:
        """Append `instr` (or put it just before `before`) and list it in its operands'
        use-lists."""
        if instr in self._removed:  # removed and added back: list it once, at its new place
            self.instructions  # noqa: B018  (drops the removed ones)
        if before is None:
            self._list.append(instr)
        elif before in self._removed:
            raise ValueError(f"{before.name} is not in computation {self.name}")
        else:
            self._list.insert(self._position(before), instr)
        attached = instr.parent is not None
        instr.parent = self
        if not attached and (instr.operands or instr.control_predecessors):
            instr._attach()
        return instr

    def _position(self, instr: HloInstruction) -> int:
        """The index of `instr` in the list. Passes insert while they walk the graph, near
        where they inserted last: look around there first, then everywhere."""
        lst = self._list
        hint = getattr(self, "_hint", 0)  # (a computation unpickled from before the hint)
        try:
            at = lst.index(instr, max(0, hint - 64), hint + 64)
        except ValueError:
            at = lst.index(instr)
        self._hint = at
        return at

    def remove_instruction(self, instr: HloInstruction) -> None:
        """Drop `instr` and take it off its operands' use-lists. Its own users, if any, keep
        reading it (remove users first, or replace its uses)."""
        if instr.parent is self and instr not in self._removed:
            self._removed.add(instr)
        else:
            self.instructions.remove(instr)  # ValueError when it is not listed here
        instr._detach()
        instr.parent = None

    def replace_all_uses(self, old: HloInstruction, new: HloInstruction) -> None:
        """Make every user of `old` (except `new` itself), every instruction ordered after it,
        and the root, if it is `old`, use `new` instead."""
        old.replace_all_uses_with(new)
        if self.root is old:
            self.root = new

    def set_root(self, root: HloInstruction) -> None:
        self.root = root

    def reorder(self, order: list[HloInstruction]) -> None:
        """Make `order`, a permutation of the instructions, the text order."""
        if len(order) != len(self.instructions):
            raise ValueError(
                f"computation {self.name}: a new order must list each of its "
                f"{len(self.instructions)} instructions once, got {len(order)}"
            )
        self.instructions = order

    # -- queries ---------------------------------------------------------------------------
    @property
    def parameters(self) -> list[HloInstruction]:
        """Parameter instructions ordered by parameter number."""
        params = [i for i in self.instructions if i.opcode is Opcode.PARAMETER]
        return sorted(params, key=_parameter_number)

    def parameters_by_number(self) -> dict[int, HloInstruction]:
        """Parameter number -> the parameter `parameter(number)` finds, from one pass over
        the instructions: for callers that look many up (an entry with hundreds of aliased
        parameters; `parameter` scans the instructions each time)."""
        found: dict[int, HloInstruction] = {}
        for instr in self.instructions:
            if instr.opcode is Opcode.PARAMETER and instr.parameter_number is not None:
                found.setdefault(instr.parameter_number, instr)
        return found

    def parameter(self, number: int) -> HloInstruction:
        for instr in self.instructions:
            if instr.opcode is Opcode.PARAMETER and instr.parameter_number == number:
                return instr
        raise IndexError(f"computation {self.name} has no parameter {number}")

    @property
    def num_parameters(self) -> int:
        return sum(1 for i in self.instructions if i.opcode is Opcode.PARAMETER)

    def root_instruction(self) -> HloInstruction:
        """The root, for code that needs one (`root` is None only while a computation is being
        built); VerifierError naming the computation when it has none."""
        if self.root is None:
            raise VerifierError(f"computation {self.name} has no root instruction")
        return self.root

    @property
    def program_shape(self) -> ProgramShape:
        root = self.root_instruction()
        return ProgramShape(tuple(p.shape for p in self.parameters), root.shape)

    def get_instruction(self, name: str) -> HloInstruction:
        for instr in self.instructions:
            if instr.name == name:
                return instr
        raise KeyError(f"computation {self.name} has no instruction named {name}")

    def post_order(self) -> list[HloInstruction]:
        """Instructions with operands and control predecessors before users.

        Keeps the text order where it already satisfies that, and includes instructions not
        reachable from the root (side effects, dead code) in text order.
        """
        if self._text_order_is_post_order():
            return list(self.instructions)
        order: list[HloInstruction] = []
        state: dict[int, int] = {}  # id -> 1 visiting, 2 done
        for start in self.instructions:
            if state.get(id(start)) == 2:
                continue
            stack: list[tuple[HloInstruction, Iterator[HloInstruction]]] = [
                (start, iter([*start.operands, *start.control_predecessors]))
            ]
            state[id(start)] = 1
            while stack:
                node, deps = stack[-1]
                dep = next(deps, None)
                if dep is None:
                    stack.pop()
                    state[id(node)] = 2
                    order.append(node)
                    continue
                s = state.get(id(dep))
                if s == 2:
                    continue
                if s == 1:
                    raise ValueError(f"cycle in computation {self.name} through {dep.name}")
                state[id(dep)] = 1
                stack.append((dep, iter([*dep.operands, *dep.control_predecessors])))
        return order

    def _text_order_is_post_order(self) -> bool:
        """Whether each instruction is listed once, after its operands and control
        predecessors, all of this computation (then the depth-first walk keeps the text
        order)."""
        seen: set[HloInstruction] = set()
        add = seen.add
        all_seen = seen.issuperset  # walks a list in C, stopping at the first miss
        for instr in self.instructions:
            if not all_seen(instr.operands):
                return False
            if instr.control_predecessors and not all_seen(instr.control_predecessors):
                return False
            add(instr)
        return len(seen) == len(self.instructions)  # else one is listed twice

    def use_list_problems(self) -> list[str]:
        """Where the use-lists differ from a recomputation from the operands and control
        predecessors (empty when they are current); for tests and debug verification."""
        users: dict[int, list[HloInstruction]] = {id(i): [] for i in self.instructions}
        succs: dict[int, list[HloInstruction]] = {id(i): [] for i in self.instructions}
        for instr in self.instructions:
            for dep in dict.fromkeys(instr.operands):
                users.setdefault(id(dep), []).append(instr)
            for dep in instr.control_predecessors:
                succs.setdefault(id(dep), []).append(instr)
        problems = []
        for instr in self.instructions:
            for kind, have, want in (
                ("users", instr.users, users[id(instr)]),
                ("control successors", instr.control_successors, succs[id(instr)]),
            ):
                if len(have) != len(want) or set(map(id, have)) != set(map(id, want)):
                    problems.append(
                        f"{self.name}: {kind} of {instr.name} are "
                        f"{sorted(i.name for i in have)}, expected {sorted(i.name for i in want)}"
                    )
        return problems

    def called_computations(self) -> Iterator[HloComputation]:
        """Every computation an instruction of this one calls (repeats included)."""
        calls_nothing = CALL_ATTRIBUTES.isdisjoint  # (most instructions call nothing)
        for instr in [i for i in self.instructions if not calls_nothing(i.attrs)]:
            yield from instr.called_computations()

    def to_text(self, **options) -> str:
        from xlapy.ir.printer import print_computation

        return print_computation(self, **options)

    def __repr__(self) -> str:
        return f"<HloComputation {self.name}: {len(self.instructions)} instructions>"


def _parameter_number(param: HloInstruction) -> int:
    assert param.parameter_number is not None, f"parameter {param.name} has no number"
    return param.parameter_number
