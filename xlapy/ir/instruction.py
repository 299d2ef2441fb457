"""HloInstruction: one operation in a computation.

An instruction has a name, an opcode (from the opcode table), a result shape, operand
instructions, and attributes keyed by their text names (see xlapy.ir.attributes). Constants
hold a Literal; parameters hold their number. Called computations (to_apply, body, ...)
are attribute values, so `called_computations()` finds them without a per-opcode list.
"""

from __future__ import annotations

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
        "attrs",
        "control_predecessors",
        "literal",
        "name",
        "opcode",
        "operands",
        "parameter_number",
        "parent",
        "shape",
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

    # -- edits -----------------------------------------------------------------------------
    def replace_operand(self, old: HloInstruction, new: HloInstruction) -> None:
        self.operands = [new if op is old else op for op in self.operands]

    def to_text(self, **options) -> str:
        """This instruction as one line of HLO text (see xlapy.ir.printer)."""
        from xlapy.ir.printer import print_instruction

        return print_instruction(self, **options)

    def __repr__(self) -> str:
        return f"<HloInstruction {self.name} = {self.shape} {self.opcode.text}>"
