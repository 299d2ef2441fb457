"""Layouts of intermediate values become row-major before the CPU pipeline optimizes.

JAX's lowered HLO carries a layout on every instruction, and where its lowering transposes
a value it often gives the result the layout that makes the transpose free (`f32[784,512]{0,1}
transpose(dot)`): the transposed order then flows on through the elementwise ops after it.
Those layouts are not part of the program's contract. Only the entry computation's layout
(parameters and result) is; XLA's layout assignment discards the others and chooses its own,
so that, for instance, a weight gradient is computed by the dot straight into the weight's
row-major order instead of being read back transposed by the update.

This pass does the discarding: every array instruction of the entry computation that is not
a parameter, does not feed the result (directly or through tuples), and does not cross into
another computation (operands and results of while / conditional / call / fusion) gets the default
row-major layout. The simplifier then sees transposes as real data movement and folds them
into dots (rules.py: transpose(dot) and dot(transpose) rules), and reshape-to-bitcast later
turns back into bitcasts the reshapes and transposes that still move no bytes.

Modules whose meaning depends on physical layouts are left alone: anything holding a
`bitcast` (a reinterpretation of bytes, as in XLA's own optimized dumps) or a custom call
(native code reads its operands' bytes as laid out).
"""

from __future__ import annotations

from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import CallContext, Category, Opcode
from xlapy.ir.shapes import Layout
from xlapy.passes.pass_base import HloPass, register_pass

LAYOUT_SENSITIVE = frozenset({Opcode.BITCAST, Opcode.CUSTOM_CALL})
"""Opcodes whose results depend on physical layouts: their modules keep every layout."""

"""Opcodes whose operands and results are the parameters and roots of other computations."""


def _crosses(op: Opcode) -> bool:
    """Whether `op`'s operands and results are the parameters and roots of other
    computations: control flow, and fusions (whose fused parameters and root carry the
    layouts its kernel reads and writes)."""
    return op.call_context is CallContext.SEQUENTIAL or op is Opcode.FUSION


def _pinned(entry) -> set[int]:
    """ids of entry instructions whose layouts are part of a contract: parameters, the
    values the root returns (through tuples and get-tuple-elements), and the operands and
    results of control flow."""
    pinned: set[int] = set()
    stack: list[HloInstruction] = [entry.root]
    while stack:
        instr = stack.pop()
        if id(instr) in pinned:
            continue
        pinned.add(id(instr))
        if instr.opcode.category is Category.TUPLE:
            stack.extend(instr.operands)
    for instr in entry.instructions:
        if instr.opcode is Opcode.PARAMETER or _crosses(instr.opcode):
            pinned.add(id(instr))
            pinned.update(id(op) for op in instr.operands)
        if instr.opcode is Opcode.GET_TUPLE_ELEMENT and _crosses(instr.operands[0].opcode):
            pinned.add(id(instr))
    return pinned


@register_pass
class NormalizeLayouts(HloPass):
    """Give the entry computation's free intermediate values row-major layouts."""

    name = "normalize-layouts"

    def run(self, module: HloModule) -> bool:
        entry = module.entry
        if entry is None:
            return False
        for comp in module.computations:
            if any(i.opcode in LAYOUT_SENSITIVE for i in comp.instructions):
                return False
        pinned = _pinned(entry)
        changed = False
        for instr in entry.instructions:
            shape = instr.shape
            if id(instr) in pinned or not shape.is_array or shape.layout is None:
                continue
            layout = shape.layout
            if layout.is_default or layout.tiles or layout.element_size_bits:
                continue
            if layout.memory_space:
                continue
            instr.shape = shape.with_layout(Layout.default(shape.rank))
            changed = True
        return changed
