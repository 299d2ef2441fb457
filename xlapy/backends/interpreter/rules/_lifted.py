"""Calling a scalar computation (a sort comparator, a scatter combiner) on whole arrays.

Rules that apply a called computation to many elements lift it first: a copy of the
computation in which every scalar instruction (constants excepted, NumPy broadcasts them)
has the shape of the batch, so one interpreter pass computes every element at once with
the ordinary elementwise rules. A computation that is not purely scalar, or whose lifted
copy fails, is called element by element instead, which is always right.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape

_LIFTED: dict[tuple, tuple[HloComputation, HloComputation | None]] = {}
_CACHE_LIMIT = 256


def _lift_shape(shape: Shape, dims: tuple[int, ...]) -> Shape | None:
    if shape.is_tuple:
        parts = [_lift_shape(s, dims) for s in shape.tuple_shapes]
        return None if any(p is None for p in parts) else Shape.tuple(parts)
    if shape.is_array and shape.rank == 0:
        return Shape.array(shape.element_type, dims)
    return None


def lifted(computation: HloComputation, dims: tuple[int, ...]) -> HloComputation | None:
    """`computation` with its scalar values widened to arrays of `dims`; None if it has
    instructions that are not scalar (they cannot be widened)."""
    key = (_snapshot(computation), dims)
    cached = _LIFTED.get(key)
    if cached is not None and cached[0] is computation:
        return cached[1]
    if len(_LIFTED) >= _CACHE_LIMIT:
        _LIFTED.clear()
    result = _widen(computation, dims)
    _LIFTED[key] = (computation, result)
    return result


def _snapshot(computation: HloComputation) -> tuple:
    """A key that changes whenever a pass edits the computation in place (instructions,
    operands, shapes, attributes, literals, root), so a stale lifted copy is never reused."""
    return (
        id(computation),
        id(computation.root),
        tuple(
            (
                id(i),
                i.opcode,
                i.shape,
                tuple(id(o) for o in i.operands),
                tuple(i.attrs.items()),
                i.literal,
                i.parameter_number,
            )
            for i in computation.instructions
        ),
    )


def _widen(computation: HloComputation, dims: tuple[int, ...]) -> HloComputation | None:
    if computation.root is None:
        return None
    copies: dict[int, HloInstruction] = {}
    for instr in computation.post_order():
        shape: Shape | None
        if instr.opcode is Opcode.CONSTANT:
            shape = instr.shape
        else:
            shape = _lift_shape(instr.shape, dims)
        if shape is None or next(instr.called_computations(), None) is not None:
            return None
        copies[id(instr)] = HloInstruction(
            instr.name,
            instr.opcode,
            shape,
            [copies[id(op)] for op in instr.operands],
            instr.attrs,
            literal=instr.literal,
            parameter_number=instr.parameter_number,
        )
    return HloComputation(
        f"{computation.name}.lifted", list(copies.values()), copies[id(computation.root)]
    )


def call_elementwise(ctx, computation: HloComputation, args: Sequence[np.ndarray]):
    """Apply the scalar computation `computation` at each position of the equally shaped
    arrays `args`; returns an array (or a tuple of arrays, for a tuple result) of that shape
    with the computation's result types."""
    dims = tuple(np.shape(args[0]))
    result_shape = computation.root_instruction().shape
    leaf_shapes = result_shape.tuple_shapes if result_shape.is_tuple else (result_shape,)
    wide = lifted(computation, dims)
    if wide is not None:
        try:
            result = ctx.call(wide, list(args))
        except Exception:  # some rule insists on scalars: go element by element
            result = None
        if result is not None:
            leaves = result if result_shape.is_tuple else (result,)
            out = tuple(
                np.broadcast_to(np.asarray(v), dims).astype(s.dtype, copy=True)
                for v, s in zip(leaves, leaf_shapes, strict=True)
            )
            return out if result_shape.is_tuple else out[0]
    return _call_each(ctx, computation, args, dims, leaf_shapes, result_shape.is_tuple)


def _call_each(ctx, computation, args, dims, leaf_shapes, is_tuple):
    outs = [np.empty(dims, dtype=s.dtype) for s in leaf_shapes]
    for pos in np.ndindex(*dims):
        result = ctx.call(computation, [np.asarray(a[pos]) for a in args])
        leaves = result if is_tuple else (result,)
        for out, v in zip(outs, leaves, strict=True):
            out[pos] = v
    return tuple(outs) if is_tuple else outs[0]
