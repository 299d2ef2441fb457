"""Common subexpression elimination.

Within each computation, in post order, an instruction is keyed by everything that fixes its
value: opcode, shape (with layout), operands (by identity, already merged), attributes other
than metadata, and a constant's literal. The first instruction with a key stays; each later
one is replaced by it. Instructions with side effects (or that call computations with side
effects), parameters, elided constants and instructions with control edges are never merged:
merging two prints would print once, and control edges encode an order the key cannot see.
"""

from __future__ import annotations

from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Opcode
from xlapy.passes.hlo_edit import Editor, has_side_effect_deep, reachable_computations
from xlapy.passes.pass_base import HloPass, register_pass

_IGNORED_ATTRIBUTES = frozenset({"metadata"})


def cse_key(instr: HloInstruction, memo: dict) -> tuple | None:
    """The identity of `instr`'s value, or None if it must never be merged."""
    if instr.opcode is Opcode.PARAMETER or instr.is_elided_constant:
        return None
    if instr.control_predecessors or has_side_effect_deep(instr, memo):
        return None
    # sorted by name (the names differ, so the values are never compared); most
    # instructions carry metadata alone
    if instr.attrs.keys() <= _IGNORED_ATTRIBUTES:
        attrs: tuple = ()
    else:
        attrs = tuple(
            sorted(
                [(k, _hashable(v)) for k, v in instr.attrs.items() if k not in _IGNORED_ATTRIBUTES]
            )
        )
    return (
        instr.opcode,
        instr.shape,
        tuple(map(id, instr.operands)),
        attrs,
        instr.literal,
    )


def _hashable(value):
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


@register_pass
class CommonSubexpressionElimination(HloPass):
    """Merges instructions that compute the same value."""

    name = "cse"
    # One walk finds every merge: in post order an instruction's operands are final (merged
    # already) when its key is taken, and no key reads another computation.
    settled = True

    def run(self, module: HloModule) -> bool:
        namer = NameUniquer(None)
        memo: dict = {}
        changed = False
        for comp in reachable_computations(module):
            editor = Editor(comp, namer)
            seen: dict[tuple, HloInstruction] = {}
            for instr in comp.post_order():
                key = cse_key(instr, memo)
                if key is None:
                    continue
                first = seen.setdefault(key, instr)
                if first is instr:
                    continue
                editor.replace(instr, first)
                editor.remove(instr)
                changed = True
        return changed
