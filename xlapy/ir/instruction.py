"""HloInstruction: one operation in a computation.

An instruction has a name, an opcode (from the opcode table), a result shape, operand
instructions, and attributes keyed by their text names (see xlapy.ir.attributes). Constants
hold a Literal; parameters hold their number. Called computations (to_apply, body, ...)
are attribute values, so `called_computations()` finds them without a per-opcode list.

Use-lists: an instruction that belongs to a computation is listed in `users` of each of its
operands (once, however often it reads it) and in `control_successors` of each of its control
predecessors. Every edit keeps them current: HloComputation.add_instruction /
remove_instruction attach and detach an instruction, and the edits below (set_operands,
replace_operand, add/remove_control_predecessor) update both ends. An instruction not in a
computation (being built, or removed) is in nobody's use-list. Code outside `ir` edits the
graph only through these methods (tests/test_architecture.py checks it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from xlapy.ir.attributes import COMPUTATION_ATTRIBUTES, Metadata
from xlapy.ir.literal import Literal
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape

if TYPE_CHECKING:
    from xlapy.ir.computation import HloComputation

# computation attribute name -> its place in the attribute order
_CALL_ORDER = {name: i for i, name in enumerate(COMPUTATION_ATTRIBUTES)}
# the attribute names that hold called computations
CALL_ATTRIBUTES = frozenset(COMPUTATION_ATTRIBUTES)
_NO_CALLS: tuple[HloComputation, ...] = ()


class HloInstruction:
    """A node of the HLO graph. Shapes, literals and attribute values are immutable; the
    graph itself (operands, attrs) may be edited by passes."""

    __slots__ = (
        "__weakref__",  # per-instruction runtime state (an FFI handler's) is keyed weakly
        "attrs",
        "control_predecessors",
        "control_successors",
        "literal",
        "name",
        "opcode",
        "operands",
        "parameter_number",
        "parent",
        "shape",
        "users",
    )

    def __init__(
        self,
        name: str,
        opcode: Opcode,
        shape: Shape,
        operands=(),
        attrs: dict[str, Any] | None = None,
        *,
        literal: Literal | None = None,
        parameter_number: int | None = None,
        control_predecessors=(),
    ):
        self.name = name
        self.opcode = opcode
        self.shape = shape
        self.operands: list[HloInstruction] = list(operands)
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.literal = literal
        self.parameter_number = parameter_number
        self.control_predecessors: list[HloInstruction] = list(control_predecessors)
        self.parent: HloComputation | None = None
        self.users: list[HloInstruction] = []  # see the module comment
        self.control_successors: list[HloInstruction] = []

    # -- queries ---------------------------------------------------------------------------
    def operand(self, i: int) -> HloInstruction:
        return self.operands[i]

    def attr(self, name: str, default=None):
        return self.attrs.get(name, default)

    def called_computations(self) -> Iterator[HloComputation]:
        """Every computation this instruction calls, in attribute order."""
        if CALL_ATTRIBUTES.isdisjoint(self.attrs):  # most instructions call nothing
            return iter(_NO_CALLS)
        keys = [key for key in self.attrs if key in _CALL_ORDER]
        if len(keys) > 1:
            keys.sort(key=_CALL_ORDER.__getitem__)
        called: list[HloComputation] = []
        for key in keys:
            value = self.attrs[key]
            if value is None:
                continue
            if isinstance(value, tuple):
                called.extend(value)
            else:
                called.append(value)
        return iter(called)

    @property
    def metadata(self) -> Metadata | None:
        return self.attrs.get("metadata")

    @property
    def op_name(self) -> str | None:
        """The op_name of the instruction's metadata (what JAX users recognise), if any."""
        meta = self.metadata
        return meta.op_name if meta is not None else None

    # -- typed accessors for the attributes passes read ------------------------------------
    @property
    def comparison_direction(self) -> str | None:
        """EQ NE LT LE GT GE of a compare (XLA prints `direction=`; `comparison_direction=`
        is accepted too), None when absent."""
        value = self.attrs.get("direction")
        if value is None:
            value = self.attrs.get("comparison_direction")
        return None if value is None else str(value)

    @property
    def comparison_type(self) -> str | None:
        """A compare's `type=` (FLOAT, TOTALORDER, SIGNED, UNSIGNED), None when absent.
        Newer XLA prints the ordering instead (`order=TOTAL` / `order=PARTIAL`): TOTAL reads
        as TOTALORDER and PARTIAL as the default comparison of the operands' type (None)."""
        value = self.attrs.get("type")
        if value is None:
            order = self.attrs.get("order")
            return "TOTALORDER" if order is not None and str(order) == "TOTAL" else None
        return str(value)

    @property
    def dimensions(self) -> tuple[int, ...]:
        """The `dimensions={...}` attribute (reduce, transpose, broadcast, reverse, ...)."""
        return tuple(self.attrs.get("dimensions", ()))

    @property
    def tuple_index(self) -> int:
        """The element a get-tuple-element reads."""
        return self.attrs["index"]

    @property
    def to_apply(self) -> HloComputation | None:
        """The computation a call, reduce, map, sort, scatter, ... applies (`to_apply=`)."""
        return self.attrs.get("to_apply")

    @property
    def while_body(self) -> HloComputation:
        return self.attrs["body"]

    @property
    def while_condition(self) -> HloComputation:
        return self.attrs["condition"]

    @property
    def branches(self) -> tuple[HloComputation, ...]:
        """A conditional's branch computations, in branch order (the predicated form's
        true and false computations too)."""
        branches = self.attrs.get("branch_computations")
        if branches is not None:
            return tuple(branches)
        return (self.attrs["true_computation"], self.attrs["false_computation"])

    @property
    def known_trip_count(self) -> int | None:
        """A while loop's trip count when its backend_config says it
        (`{"known_trip_count":{"n":"8"}}`, as XLA writes it), else None."""
        config = self.attrs.get("backend_config")
        text = getattr(config, "text", None)
        if not text or "known_trip_count" not in text:
            return None
        try:
            parsed = json.loads(text)
            n = parsed["known_trip_count"]["n"]
            return int(n)
        except (ValueError, TypeError, KeyError):
            return None

    @property
    def is_root(self) -> bool:
        return self.parent is not None and self.parent.root is self

    @property
    def has_side_effect(self) -> bool:
        if self.opcode.has_side_effect:
            return True
        if self.opcode is Opcode.CUSTOM_CALL:
            return bool(self.attrs.get("custom_call_has_side_effect", False))
        return False

    @property
    def is_elided_constant(self) -> bool:
        """A constant printed as `constant({...})`: its value was not in the text."""
        return self.opcode is Opcode.CONSTANT and self.literal is None

    @property
    def user_count(self) -> int:
        return len(self.users)

    # -- edits (each keeps the use-lists current) -----------------------------------------
    def set_operands(self, operands) -> None:
        """Make `operands` this instruction's operands."""
        operands = list(operands)
        if self.parent is not None:
            for dep in dict.fromkeys(self.operands):
                if dep not in operands:
                    dep.users.remove(self)
            for dep in dict.fromkeys(operands):
                if dep not in self.operands:
                    dep.users.append(self)
        self.operands = operands

    def replace_operand(self, old: HloInstruction, new: HloInstruction) -> None:
        """Every read of `old` by this instruction reads `new` instead."""
        if old is new or old not in self.operands:
            return
        self.operands = [new if op is old else op for op in self.operands]
        if self.parent is not None:
            old.users.remove(self)
            if self not in new.users:
                new.users.append(self)

    def replace_operand_at(self, number: int, new: HloInstruction) -> None:
        """Operand `number` becomes `new`."""
        operands = list(self.operands)
        operands[number] = new
        self.set_operands(operands)

    def replace_all_uses_with(self, new: HloInstruction, keep=()) -> None:
        """Every user of this instruction except `new` and those in `keep` reads `new`
        instead, and every instruction ordered after this one is ordered after `new` (the
        root is the computation's business: HloComputation.replace_all_uses)."""
        if new is self:
            return
        moved = [u for u in self.users if u is not new and u not in keep]
        if moved:
            stay = [u for u in self.users if u is new or u in keep]
            self.users = stay
            targets = new.users
            known = set(map(id, targets))
            for user in moved:
                user.operands = [new if op is self else op for op in user.operands]
                if id(user) not in known:
                    targets.append(user)
        for succ in [s for s in self.control_successors if s is not new]:
            succ.remove_control_predecessor(self)
            succ.add_control_predecessor(new)

    def add_control_predecessor(self, pred: HloInstruction) -> None:
        """`pred` must run before this instruction."""
        if pred in self.control_predecessors:
            return
        self.control_predecessors.append(pred)
        if self.parent is not None:
            pred.control_successors.append(self)

    def remove_control_predecessor(self, pred: HloInstruction) -> None:
        self.control_predecessors.remove(pred)
        if self.parent is not None:
            pred.control_successors.remove(self)

    def set_control_predecessors(self, preds) -> None:
        for pred in list(self.control_predecessors):
            self.remove_control_predecessor(pred)
        for pred in preds:
            self.add_control_predecessor(pred)

    def _attach(self) -> None:
        """List this instruction in its operands' and control predecessors' use-lists (it has
        just joined a computation)."""
        for dep in self.operands:
            users = dep.users
            if not users or users[-1] is not self:  # an operand read twice is listed once
                users.append(self)
        if self.control_predecessors:
            for pred in self.control_predecessors:
                pred.control_successors.append(self)

    def _detach(self) -> None:
        """The reverse of _attach (it is leaving its computation)."""
        for dep in dict.fromkeys(self.operands):
            dep.users.remove(self)
        for pred in self.control_predecessors:
            pred.control_successors.remove(self)

    def to_text(self, **options) -> str:
        """This instruction as one line of HLO text (see xlapy.ir.printer)."""
        from xlapy.ir.printer import print_instruction

        return print_instruction(self, **options)

    def __repr__(self) -> str:
        return f"<HloInstruction {self.name} = {self.shape} {self.opcode.text}>"
