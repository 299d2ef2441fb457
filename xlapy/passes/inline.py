"""Call inlining: every `call` is replaced by a copy of the computation it calls.

The callee's instructions are cloned into the caller just before the call, with fresh
names, parameters mapped to the call's operands and control edges kept; the clone of the
callee's root replaces the call. Calls inside cloned code are inlined in turn (the call
graph has no cycles), so after the pass no reachable computation holds a `call`; calls on
another execution thread are left alone. Callees that nothing calls any more are dropped.
"""

from __future__ import annotations

from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Opcode
from xlapy.passes.hlo_edit import (
    Editor,
    reachable_computations,
    remove_unreachable_computations,
)
from xlapy.passes.pass_base import HloPass, register_pass


def inline_call(editor: Editor, call: HloInstruction) -> HloInstruction:
    """Inline one `call` instruction; returns what replaced it."""
    callee = call.attrs["to_apply"]
    clones: dict[int, HloInstruction] = {}
    for instr in callee.post_order():
        if instr.opcode is Opcode.PARAMETER:
            clones[id(instr)] = call.operands[instr.parameter_number]
            continue
        clone = HloInstruction(
            editor.namer.fresh(instr.name),
            instr.opcode,
            instr.shape,
            [clones[id(o)] for o in instr.operands],
            dict(instr.attrs),
            literal=instr.literal,
            control_predecessors=[
                *(clones[id(p)] for p in instr.control_predecessors),
                *(p for p in call.control_predecessors if _at_entry(instr)),
            ],
        )
        editor.insert(clone, call)
        clones[id(instr)] = clone
    result = clones[id(callee.root)]
    editor.replace(call, result)
    editor.remove(call)
    return result


def _at_entry(instr: HloInstruction) -> bool:
    """True if nothing inside the callee must run before `instr`."""
    return all(o.opcode is Opcode.PARAMETER for o in instr.operands)


@register_pass
class CallInliner(HloPass):
    """Inlines every `call` of the main execution thread."""

    name = "call-inliner"

    def run(self, module: HloModule) -> bool:
        namer = NameUniquer(module)
        changed = False
        for comp in reachable_computations(module):
            editor = Editor(comp, namer)
            while True:
                calls = [
                    i
                    for i in comp.instructions
                    if i.opcode is Opcode.CALL
                    and i.to_apply is not None
                    and i.to_apply.execution_thread == comp.execution_thread
                ]
                if not calls:
                    break
                for call in calls:
                    inline_call(editor, call)
                changed = True
        if changed:
            remove_unreachable_computations(module)
        return changed
