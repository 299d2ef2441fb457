"""chlo ops, decomposed into HLO."""

from __future__ import annotations

from xlapy.ir.shapes import Shape
from xlapy.stablehlo.convert import Converter, Scope, rule
from xlapy.stablehlo.mlir import Op


@rule("chlo.top_k")
def _top_k(conv: Converter, op: Op, scope: Scope, operands):
    k = int(
        op.attrs.get("k", 1) if not hasattr(op.attrs.get("k"), "value") else op.attrs["k"].value
    )
    shapes = conv.result_shapes(op)
    value = conv.add(scope, "topk", Shape.tuple(shapes), [operands[0][0]], f", k={k}, largest=true")
    return conv.tuple_parts(scope, value)


@rule("chlo.square")
def _square(conv: Converter, op: Op, scope: Scope, operands):
    x = operands[0][0]
    return [conv.add(scope, "multiply", operands[0][1], [x, x])]
