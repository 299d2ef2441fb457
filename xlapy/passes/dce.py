"""Dead code elimination.

An instruction is dead when nothing uses it (no operand use, no control edge), it is not
its computation's root or a parameter, and neither it nor any computation it calls has a
side effect (so an outfeed, a custom call marked custom_call_has_side_effect, or a while
loop whose body sends data all stay). Removing one can kill its operands in turn. After
that, computations the entry can no longer reach are dropped.
"""

from __future__ import annotations

from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.passes.hlo_edit import (
    Editor,
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
        for comp in reachable_computations(module):
            changed |= Editor(comp, namer).remove_dead()
        changed |= remove_unreachable_computations(module)
        return changed
