"""conv-to-dot: a convolution with a 1x1 window that moves nothing is a matrix product.

A convolution whose window is one element in every spatial dim, with unit strides, no
padding, no dilation and no feature or batch groups, computes out[b, s..., o] = sum over c
of x[b, s..., c] * w[c, o]: a dot of x as a [batch x spatial, C] matrix and the kernel as a
[C, O] one. XLA's algebraic simplifier rewrites such convolutions into reshapes around a
dot; so does this pass, for the layouts in which the reshapes move no bytes (they become
bitcasts later, reshape-to-bitcast): x and the result in batch, spatial..., feature order
(NHWC, JAX's and Flax's usual one), row-major, and the kernel's two feature dims in either
order. The dot then runs as one planned BLAS gemm on the arena (runtime/dot_thunk.py), with
no kernel compiled for its geometry: the direct convolution kernel (codegen/emit_conv.py)
cost a wide 1x1 convolution 50-60 ms of LLVM, four times XLA's whole compile of it.
Only f32/f64 convolutions (one type in and out, the BLAS ones) are rewritten; an
operand_precision does not carry over (the CPU backend computes f32 products in f32 at
every precision).
"""

from __future__ import annotations

import math

from xlapy.ir.call_graph import CallGraph
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Layout, Shape
from xlapy.ir.types import PrimitiveType
from xlapy.passes.hlo_edit import Editor
from xlapy.passes.pass_base import HloPass, register_pass

TYPES = frozenset({PrimitiveType.F32, PrimitiveType.F64})


def _row_major(shape: Shape) -> bool:
    layout = shape.layout
    if layout is None:
        return True
    if layout.tiles or layout.element_size_bits:
        return False
    return tuple(layout.minor_to_major) == tuple(reversed(range(shape.rank)))


def pointwise_reason(conv: HloInstruction) -> str | None:
    """None when `conv` is a 1x1 convolution this pass rewrites into a dot, else why not."""
    if conv.opcode is not Opcode.CONVOLUTION or len(conv.operands) != 2:
        return "not a convolution of two operands"
    x, w = conv.operands
    shapes = (conv.shape, x.shape, w.shape)
    if not all(s.is_array and not s.is_dynamic for s in shapes):
        return "a tuple or dynamic shape"
    if {s.element_type for s in shapes} - TYPES or len({s.element_type for s in shapes}) != 1:
        return "not one f32 or f64 type"
    if conv.feature_group_count != 1 or conv.batch_group_count != 1:
        return "feature or batch groups"
    window = conv.window_or_none
    for d in window.dims if window is not None else ():
        if (d.size, d.stride, d.pad_low, d.pad_high) != (1, 1, 0, 0):
            return "a window larger than 1x1, strided or padded"
        if (d.window_dilation, d.base_dilation) != (1, 1):
            return "a dilated window"
    labels = conv.dim_labels_or_none
    if labels is None:
        return "no dimension numbers"
    n = len(labels.input_spatial)
    canonical = (0, tuple(range(1, n + 1)), n + 1)
    if (labels.input_batch, labels.input_spatial, labels.input_feature) != canonical:
        return "the input is not in batch, spatial..., feature order"
    if (labels.output_batch, labels.output_spatial, labels.output_feature) != canonical:
        return "the result is not in batch, spatial..., feature order"
    if not all(_row_major(s) for s in shapes):
        return "a layout other than row-major"
    if any(w.shape.dims[d] != 1 for d in labels.kernel_spatial):
        return "a kernel larger than 1x1"
    return None


@register_pass
class ConvToDot(HloPass):
    """Rewrite each 1x1 convolution that moves nothing (see the file comment) into a dot
    between reshapes."""

    name = "conv-to-dot"

    def run(self, module: HloModule) -> bool:
        if module.entry is None:
            return False
        namer = NameUniquer(module)
        changed = False
        for comp in CallGraph(module).sequential_computations():
            editor = Editor(comp, namer)
            for conv in list(comp.instructions):
                if conv.opcode is Opcode.CONVOLUTION and pointwise_reason(conv) is None:
                    _rewrite(editor, conv)
                    changed = True
        return changed


def _rewrite(editor: Editor, conv: HloInstruction) -> None:
    x, w = conv.operands
    labels = conv.dim_labels
    t = conv.shape.element_type
    c = x.shape.dims[labels.input_feature]
    o = w.shape.dims[labels.kernel_output_feature]
    rows = math.prod(x.shape.dims[: labels.input_feature])

    def matrix(shape_dims: tuple[int, int]) -> Shape:
        return Shape.array(t, shape_dims, Layout.default(2))

    lhs = editor.add(Opcode.RESHAPE, matrix((rows, c)), [x], before=conv, name=f"{conv.name}.rows")
    kernel_first = labels.kernel_input_feature < labels.kernel_output_feature
    rhs = editor.add(
        Opcode.RESHAPE,
        matrix((c, o) if kernel_first else (o, c)),
        [w],
        before=conv,
        name=f"{conv.name}.kernel",
    )
    attrs = {"lhs_contracting_dims": (1,), "rhs_contracting_dims": (0 if kernel_first else 1,)}
    dot = editor.add(
        Opcode.DOT, matrix((rows, o)), [lhs, rhs], attrs, before=conv, name=f"{conv.name}.dot"
    )
    out = editor.add(Opcode.RESHAPE, conv.shape, [dot], before=conv, name=f"{conv.name}.out")
    editor.replace(conv, out)
    editor.remove(conv)
