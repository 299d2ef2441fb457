"""Reshapes and transposes that move no bytes become bitcasts.

Under the assigned layouts (row-major where a shape has none), a reshape or transpose whose
result lists the operand's elements in the same physical order is a reinterpretation of
the operand's bytes. XLA's CPU pipeline rewrites such instructions into `bitcast` late,
after layout assignment and fusion; buffer assignment then forwards the operand's buffer
(dataflow treats bitcast as forwarding) and the instruction costs no bytes and no kernel.

The test is exact. A transpose keeps the physical order when, ignoring dimensions of size
1, the result's major-to-minor dimensions map through the permutation onto the operand's.
A reshape between two layouts that are row-major once size-1 dimensions are ignored always
keeps it (a reshape is a row-major reinterpretation); for other layouts the pass follows
every element's physical offset through the reshape, for arrays of up to IOTA_LIMIT
elements, and leaves larger ones alone.

Only computations that run as a sequence of thunks are rewritten (the entry, loop bodies
and conditions, branches, called computations); fused computations and reducers keep their
reshapes, which the kernels compute per element anyway.
"""

from __future__ import annotations

import numpy as np

from xlapy.ir.call_graph import CallGraph
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Layout, Shape
from xlapy.passes.hlo_edit import Editor
from xlapy.passes.pass_base import HloPass, register_pass

IOTA_LIMIT = 1 << 20
"""The largest array whose reshape is checked element by element."""


def _plain_layout(shape: Shape) -> Layout | None:
    """The shape's minor-to-major layout, None when it has tiles, sub-byte packing, dynamic
    dimensions or a memory space (then the pass does not reason about it)."""
    if not shape.is_array or shape.is_dynamic:
        return None
    layout = shape.layout_or_default
    if layout.tiles or layout.element_size_bits or layout.memory_space:
        return None
    return layout


def _major_to_minor(shape: Shape, layout: Layout) -> list[int]:
    """The dimensions from most major to most minor, those of size 1 left out."""
    return [d for d in reversed(layout.minor_to_major) if shape.dims[d] != 1]


def transpose_is_bitcast(instr: HloInstruction) -> bool:
    """Whether a transpose leaves every element at its physical offset."""
    operand = instr.operands[0]
    lin, lout = _plain_layout(operand.shape), _plain_layout(instr.shape)
    if lin is None or lout is None:
        return False
    perm = instr.dimensions
    mapped = [perm[d] for d in _major_to_minor(instr.shape, lout)]
    return mapped == _major_to_minor(operand.shape, lin)


def reshape_is_bitcast(instr: HloInstruction) -> bool:
    """Whether a reshape leaves every element at its physical offset."""
    operand = instr.operands[0]
    lin, lout = _plain_layout(operand.shape), _plain_layout(instr.shape)
    if lin is None or lout is None or operand.shape.element_type != instr.shape.element_type:
        return False
    ins, outs = _major_to_minor(operand.shape, lin), _major_to_minor(instr.shape, lout)
    if ins == sorted(ins) and outs == sorted(outs):
        return True
    n = instr.shape.num_elements
    if n > IOTA_LIMIT:
        return False
    offsets = _logical(np.arange(n), operand.shape.dims, lin).reshape(instr.shape.dims)
    return bool((_physical(offsets, lout) == np.arange(n)).all())


def _logical(flat: np.ndarray, dims, layout: Layout) -> np.ndarray:
    """The array whose bytes in `layout` are `flat`, in logical (row-major) order."""
    major_to_minor = tuple(reversed(layout.minor_to_major))
    physical = flat.reshape(tuple(dims[d] for d in major_to_minor))
    return physical.transpose(tuple(int(i) for i in np.argsort(major_to_minor)))


def _physical(array: np.ndarray, layout: Layout) -> np.ndarray:
    return array.transpose(tuple(reversed(layout.minor_to_major))).reshape(-1)


IS_BITCAST = {Opcode.RESHAPE: reshape_is_bitcast, Opcode.TRANSPOSE: transpose_is_bitcast}


@register_pass
class ReshapeToBitcast(HloPass):
    """Rewrites layout-preserving reshapes and transposes outside fusions as bitcasts."""

    name = "reshape-to-bitcast"

    def run(self, module: HloModule) -> bool:
        namer = NameUniquer(module)
        changed = False
        graph = CallGraph(module)
        for comp in [c for c in module.computations if graph.is_sequential(c)]:
            editor = None
            for instr in list(comp.instructions):
                test = IS_BITCAST.get(instr.opcode)
                if test is None or not test(instr):
                    continue
                editor = editor or Editor(comp, namer)
                attrs = {k: v for k, v in instr.attrs.items() if k == "metadata"}
                bitcast = editor.add(
                    Opcode.BITCAST,
                    instr.shape,
                    instr.operands,
                    attrs,
                    before=instr,
                    name="bitcast",
                )
                editor.replace(instr, bitcast)
                editor.remove(instr)
                changed = True
        return changed
