"""Call inlining: every `call` is replaced by a copy of the computation it calls; the defuser
does the same to fusions that hold an op with a thunk of its own.

The callee's instructions are cloned into the caller just before the call, with fresh
names, parameters mapped to the call's operands and control edges kept; the clone of the
callee's root replaces the call. Calls inside cloned code are inlined in turn (the call
graph has no cycles), so after the pass no reachable computation holds a `call`; calls on
another execution thread are left alone. Callees that nothing calls any more are dropped.

The defuser inlines a fusion whose fused computation holds an op that runs as its own thunk
(fusion_rules.OWN_THUNK: dot, convolution, reduce-window, scatter, sort...): such fusions come
from another compiler (XLA's optimized HLO fuses a dot with its bias add, a reduce-window
with its operand's producers) and a loop-fusion kernel cannot compute them; inlined, the op
gets its library path or kernel and xlapy's fusion pass fuses the elementwise rest again.
"""

from __future__ import annotations

from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Opcode
from xlapy.passes.fusion_rules import OWN_THUNK, fused_computation
from xlapy.passes.hlo_edit import (
    Editor,
    reachable_computations,
    remove_unreachable_computations,
)
from xlapy.passes.pass_base import HloPass, register_pass


def inline_call(
    editor: Editor, call: HloInstruction, callee: HloComputation | None = None
) -> HloInstruction:
    """Inline one `call` instruction (or another caller of `callee`, such as a fusion);
    returns what replaced it."""
    callee = call.to_apply if callee is None else callee
    comp = editor.comp
    clones: dict[int, HloInstruction] = {}
    made: list[HloInstruction] = []
    for instr in callee.post_order():
        if instr.opcode is Opcode.PARAMETER:
            number = instr.parameter_number
            assert number is not None, "a parameter has a number"
            clones[id(instr)] = call.operands[number]
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
        comp.add_instruction(clone)  # appended here, moved before the call below
        made.append(clone)
        clones[id(instr)] = clone
    if made:  # one reorder, not a search of the caller's list per clone
        order = comp.instructions
        at = order.index(call)
        comp.reorder(order[:at] + made + order[at : len(order) - len(made)])
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
                    and i.to_apply_or_none is not None
                    and i.to_apply_or_none.execution_thread == comp.execution_thread
                ]
                if not calls:
                    break
                for call in calls:
                    inline_call(editor, call)
                changed = True
        if changed:
            remove_unreachable_computations(module)
        return changed


def holds_own_thunk_op(comp: HloComputation) -> bool:
    """Whether `comp` holds an OWN_THUNK op."""
    return any(i.opcode in OWN_THUNK for i in comp.instructions)


@register_pass
class Defuser(HloPass):
    """Inlines every fusion whose fused computation holds an op that runs as its own thunk
    (see the module comment); other fusions are left alone."""

    name = "defuser"

    def run(self, module: HloModule) -> bool:
        namer = NameUniquer(module)
        changed = False
        for comp in reachable_computations(module):
            editor = Editor(comp, namer)
            for instr in list(comp.instructions):
                body = fused_computation(instr)
                if body is None or not holds_own_thunk_op(body):
                    continue
                inline_call(editor, instr, body)
                changed = True
        if changed:
            remove_unreachable_computations(module)
        return changed
