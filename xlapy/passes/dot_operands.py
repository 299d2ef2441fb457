"""dot-matrix-operands: transpose the dot operands that no matrix routine can read in place.

A dot runs as one BLAS gemm, or one gemm per batch item, or a native matrix-vector kernel,
when each operand, laid out as it is, reads as a matrix: its free dims merge into one
dimension with one stride, its contracting dims (in the dot's pairing order) merge into
another, and one of the two is contiguous. JAX's attention gradients break this:
`dk = dot(q_grad [b,h,t,d], w_k [D,h,d])` contracting (h, d) has the token dim between the
head and feature dims, so no stride walks (h, d) as one dimension. Such a dot went to a
NumPy matmul on strided views (copies and a slow loop inside, ~200 us where the gemm takes
10, and a break in the native runs of the runtime).

XLA canonicalizes every dot into [batch, m, k] x [batch, k, n] with transposes
(DotDecomposer) and lets layout assignment and transpose folding remove the ones that move
nothing. This pass does the part that moves bytes: an operand that does not read as a
matrix gets a transpose into [batch, free, contracting] order (lhs) or [batch, contracting,
free] (rhs), row-major, and the dot reads that. The result's dimensions keep their order
(free dims keep theirs), so the dot's users do not change. Operands that already read as
matrices, in whatever layout, are left as they are (BLAS takes transpose flags), and two
dots that need the same transpose of one value share it.

It runs late in the CPU pipeline, after the simplifier (whose transpose-into-dot folding
made these dots) and before fusion, which fuses each transpose with its producer where it
can. Only dots of one float or complex type in and out (what the BLAS and gemv paths
take): the mixed-type library path copies its operands into this order anyway.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from xlapy.ir.call_graph import CallGraph
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Layout, Shape, merged_stride
from xlapy.ir.types import PrimitiveType
from xlapy.passes.hlo_edit import Editor
from xlapy.passes.pass_base import HloPass, register_pass
from xlapy.passes.rules import DOT_DIM_ATTRS

MATRIX_TYPES = frozenset(
    {PrimitiveType.F32, PrimitiveType.F64, PrimitiveType.C64, PrimitiveType.C128}
)
"""Element types whose dots run as BLAS gemms or native gemv kernels."""


def reads_as_matrix(shape: Shape, rows: Sequence[int], cols: Sequence[int]) -> bool:
    """Whether `shape`'s bytes, as laid out, read as a [rows, cols] matrix (each group of
    logical dims one stride, one of the two contiguous) that BLAS takes, maybe transposed."""
    r, c = merged_stride(shape, rows), merged_stride(shape, cols)
    if r is None or c is None:
        return False
    one_row = math.prod(shape.dims[d] for d in rows) == 1
    one_col = math.prod(shape.dims[d] for d in cols) == 1
    return one_row or one_col or r == 1 or c == 1


def _tiled(shape: Shape) -> bool:
    layout = shape.layout
    return layout is not None and bool(layout.tiles or layout.element_size_bits)


def _matrix_dot(dot: HloInstruction) -> bool:
    t = dot.shape.element_type if dot.shape.is_array else None
    if t not in MATRIX_TYPES or len(dot.operands) != 2:
        return False
    shapes = [dot.shape, *(o.shape for o in dot.operands)]
    return all(
        s.is_array and s.element_type is t and not s.is_dynamic and not _tiled(s) for s in shapes
    )


@register_pass
class DotMatrixOperands(HloPass):
    """Transpose each float dot operand that does not read as a matrix (see the file
    comment) into [batch, free, contracting] (lhs) or [batch, contracting, free] (rhs)."""

    name = "dot-matrix-operands"

    def run(self, module: HloModule) -> bool:
        if module.entry is None:
            return False
        namer = NameUniquer(module)
        changed = False
        for comp in CallGraph(module).sequential_computations():
            editor = Editor(comp, namer)
            made: dict[tuple[int, tuple[int, ...]], HloInstruction] = {}
            for dot in list(comp.instructions):
                if dot.opcode is Opcode.DOT and _matrix_dot(dot):
                    changed |= _transpose_operands(editor, dot, made)
        return changed


def _transpose_operands(
    editor: Editor, dot: HloInstruction, made: dict[tuple[int, tuple[int, ...]], HloInstruction]
) -> bool:
    """Make `dot` read transposes of its operands that do not read as matrices (`made`:
    the transposes made so far in its computation, by operand and permutation); whether it
    changed."""
    dn = dot.dot_dimension_numbers
    batch = [dn.lhs_batch, dn.rhs_batch]
    contracting = [dn.lhs_contracting, dn.rhs_contracting]
    operands = list(dot.operands)
    for side, operand in enumerate(dot.operands):
        shape = operand.shape
        b, c = batch[side], contracting[side]
        free = tuple(d for d in range(shape.rank) if d not in b and d not in c)
        rows, cols = (free, c) if side == 0 else (c, free)
        if reads_as_matrix(shape, rows, cols):
            continue
        perm = (*b, *rows, *cols)
        t = made.get((id(operand), perm))
        if t is None:
            dims = tuple(shape.dims[d] for d in perm)
            layout = Layout.default(len(dims)) if shape.layout is not None else None
            t = editor.add(
                Opcode.TRANSPOSE,
                Shape.array(shape.element_type, dims, layout),
                [operand],
                {"dimensions": perm},
                before=dot,
                name=f"{operand.name}.transpose",
            )
            made[(id(operand), perm)] = t
        operands[side] = t
        nb = len(b)
        first = nb + (len(free) if side == 0 else 0)
        batch[side] = tuple(range(nb))
        contracting[side] = tuple(range(first, first + len(c)))
    if operands == list(dot.operands):
        return False
    editor.set_operands(dot, operands)
    attrs = {k: v for k, v in dot.attrs.items() if k not in DOT_DIM_ATTRS}
    attrs.update((k, v) for k, v in zip(DOT_DIM_ATTRS, (*batch, *contracting), strict=True) if v)
    dot.attrs = attrs
    return True
