"""Dead code elimination.

An instruction is dead when nothing uses it (no operand use, no control edge), it is not
its computation's root or a parameter, and neither it nor any computation it calls has a
side effect (so an outfeed, a custom call marked custom_call_has_side_effect, or a while
loop whose body sends data all stay). Removing one can kill its operands in turn. After
that, computations the entry can no longer reach are dropped.

Most computations have nothing dead, so each is first checked with a set of the
instructions that something reads; only one with an unread candidate gets an Editor (and
its users index).
"""

from __future__ import annotations

from xlapy.ir.computation import HloComputation
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Opcode
from xlapy.passes.hlo_edit import (
    Editor,
    has_side_effect_deep,
    reachable_computations,
    remove_unreachable_computations,
)
from xlapy.passes.pass_base import HloPass, register_pass


@register_pass
class DeadCodeElimination(HloPass):
    """Removes dead instructions, then unreachable computations."""

    name = "dce"

    def run(self, module: HloModule) -> bool:
        namer = NameUniquer(None)
        changed = False
        side_effects: dict[int, bool] = {}
        reachable = reachable_computations(module)
        for comp in reachable:
            if _may_have_dead(comp, side_effects):
                changed |= Editor(comp, namer).remove_dead()
        if changed:  # a removed call site may have left a computation unreachable
            return remove_unreachable_computations(module) or changed
        if len(reachable) == len(module.computations):
            return False
        module.computations = reachable
        return True


def _may_have_dead(comp: HloComputation, side_effects: dict[int, bool]) -> bool:
    """Whether some instruction of `comp` is dead by Editor.is_dead's rule (then
    Editor.remove_dead has work; otherwise it would remove nothing). Reads the use-lists,
    as is_dead does."""
    root = comp.root
    for instr in comp.instructions:
        if instr.users or instr.control_successors or instr is root:
            continue
        if instr.opcode is Opcode.PARAMETER:
            continue
        if not has_side_effect_deep(instr, side_effects):
            return True
    return False
