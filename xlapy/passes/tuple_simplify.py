"""Tuple simplification: tuples that are built only to be taken apart disappear.

  get-tuple-element(tuple(a, b, ...), i) -> the i-th operand
  tuple(gte(x, 0), ..., gte(x, n-1)) -> x   when x has exactly the tuple's shape

Both rules run in post order until neither fires; what they leave dead is removed. A
computation without tuples or get-tuple-elements (most fused bodies) is not walked.
"""

from __future__ import annotations

from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Category, Opcode
from xlapy.passes.hlo_edit import Editor, reachable_computations, same_shape
from xlapy.passes.pass_base import HloPass, register_pass


def _forwarded(instr: HloInstruction) -> HloInstruction | None:
    if instr.opcode is Opcode.GET_TUPLE_ELEMENT:
        source = instr.operands[0]
        if source.opcode is Opcode.TUPLE:
            return source.operands[instr.tuple_index]
        return None
    return rebuilt_source(instr)


def rebuilt_source(instr: HloInstruction) -> HloInstruction | None:
    """x when `instr` is tuple(gte(x, 0), ..., gte(x, n-1)) taking every element of x."""
    if instr.opcode is not Opcode.TUPLE or not instr.operands:
        return None
    first = instr.operands[0]
    if first.opcode is not Opcode.GET_TUPLE_ELEMENT:
        return None
    source = first.operands[0]
    for i, o in enumerate(instr.operands):
        if o.opcode is not Opcode.GET_TUPLE_ELEMENT or o.operands[0] is not source:
            return None
        if o.tuple_index != i:
            return None
    if len(source.shape.tuple_shapes) != len(instr.operands):
        return None
    return source


@register_pass
class TupleSimplifier(HloPass):
    """Forwards tuple elements through get-tuple-element and removes rebuilt tuples."""

    name = "tuple-simplifier"

    def run(self, module: HloModule) -> bool:
        namer = NameUniquer(None)
        changed = False
        for comp in reachable_computations(module):
            if not any(i.opcode.category is Category.TUPLE for i in comp.instructions):
                continue
            editor = Editor(comp, namer)
            for instr in comp.post_order():
                if instr.parent is not comp:
                    continue
                new = _forwarded(instr)
                if new is None or not same_shape(new.shape, instr.shape):
                    continue
                editor.replace(instr, new)
                editor.remove_dead([instr])
                changed = True
        return changed
