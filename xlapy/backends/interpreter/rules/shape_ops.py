"""Evaluation rules of the shape and data-movement ops: broadcast, reshape, transpose, slice,
concatenate, pad, iota, reverse, bitcast, dynamic-reshape and the dimension-size ops.

Values are in logical row-major order and layouts are ignored, so `bitcast` (a relayout that
moves no bytes) is evaluated as a reshape of the logical elements to the result dims; that is
exact when both shapes have default layouts, which is what the interpreter sees. Dynamic
dimensions are held at their bound: get-dimension-size answers the bound and
set-dimension-size passes its operand through.
"""

from __future__ import annotations

import numpy as np

from xlapy.backends.interpreter.registry import evaluates
from xlapy.backends.interpreter.rules.elementwise import as_value, convert_array
from xlapy.errors import EvaluationError
from xlapy.ir.opcodes import Opcode


@evaluates(Opcode.BROADCAST)
def _broadcast(instr, operands, ctx):
    x = operands[0]
    dims = instr.dimensions
    out_dims = instr.shape.dims
    if len(dims) != x.ndim:
        raise EvaluationError(
            f"{instr.name}: broadcast maps {len(dims)} dimensions but the operand has rank {x.ndim}"
        )
    order = sorted(range(x.ndim), key=lambda i: dims[i])
    moved = np.transpose(x, order)
    shape = [1] * len(out_dims)
    for i in order:
        shape[dims[i]] = x.shape[i]
    return np.broadcast_to(moved.reshape(shape), out_dims).copy()


def _reshape_to(instr, x, dims):
    if int(np.prod(dims, dtype=np.int64)) != x.size:
        raise EvaluationError(f"{instr.name}: cannot reshape {x.size} elements to {list(dims)}")
    return np.ascontiguousarray(x).reshape(dims).copy()


@evaluates(Opcode.RESHAPE)
def _reshape(instr, operands, ctx):
    return _reshape_to(instr, operands[0], instr.shape.dims)


@evaluates(Opcode.DYNAMIC_RESHAPE)
def _dynamic_reshape(instr, operands, ctx):
    return _reshape_to(instr, operands[0], instr.shape.dims)


@evaluates(Opcode.BITCAST)
def _bitcast(instr, operands, ctx):
    """Reinterpret the operand's bytes in its physical order (its layout) as the result's
    physical order (the result's layout). XLA's optimized HLO uses this to express
    transposes that only change the layout, so layouts matter here and nowhere else."""
    x = operands[0]
    out = instr.shape
    if not out.is_array:
        raise EvaluationError(f"{instr.name}: bitcast of non-array shape {out}")
    flat = _to_physical(x, instr.operands[0].shape.layout_or_default)
    if x.dtype != out.dtype:
        raw = np.ascontiguousarray(flat).view(np.uint8).reshape(-1)
        if raw.size != out.byte_size:
            raise EvaluationError(
                f"{instr.name}: bitcast from {x.nbytes} bytes to {out} ({out.byte_size} bytes)"
            )
        flat = raw.view(out.dtype)
    if flat.size != out.num_elements:
        raise EvaluationError(
            f"{instr.name}: bitcast from {x.size} elements to {out} ({out.num_elements})"
        )
    return _from_physical(flat, out.dims, out.layout_or_default)


def _to_physical(x: np.ndarray, layout) -> np.ndarray:
    """The elements of `x` in memory order: most-major dimension first."""
    major_to_minor = tuple(reversed(layout.minor_to_major))
    return np.ascontiguousarray(x.transpose(major_to_minor)).reshape(-1)


def _from_physical(flat: np.ndarray, dims, layout) -> np.ndarray:
    major_to_minor = tuple(reversed(layout.minor_to_major))
    physical = flat.reshape(tuple(dims[d] for d in major_to_minor))
    inverse = tuple(int(i) for i in np.argsort(major_to_minor))
    return physical.transpose(inverse).copy()  # (ascontiguousarray would make a 0-d array 1-d)


@evaluates(Opcode.TRANSPOSE)
def _transpose(instr, operands, ctx):
    perm = instr.dimensions
    x = operands[0]
    if sorted(perm) != list(range(x.ndim)):
        raise EvaluationError(
            f"{instr.name}: dimensions={list(perm)} is not a permutation of rank {x.ndim}"
        )
    return np.asarray(np.transpose(x, perm), order="C")


@evaluates(Opcode.SLICE)
def _slice(instr, operands, ctx):
    spec = instr.slice_spec
    x = operands[0]
    if len(spec.dims) != x.ndim:
        raise EvaluationError(f"{instr.name}: slice has {len(spec.dims)} ranges for rank {x.ndim}")
    index = tuple(slice(start, limit, stride) for start, limit, stride in spec.dims)
    return x[index].copy()


@evaluates(Opcode.CONCATENATE)
def _concatenate(instr, operands, ctx):
    dims = instr.dimensions
    return np.concatenate(operands, axis=dims[0])


@evaluates(Opcode.REVERSE)
def _reverse(instr, operands, ctx):
    dims = instr.dimensions
    return np.flip(operands[0], axis=dims).copy() if dims else operands[0].copy()


@evaluates(Opcode.PAD)
def _pad(instr, operands, ctx):
    x, value = operands
    padding = instr.padding_config
    if len(padding.dims) != x.ndim:
        raise EvaluationError(
            f"{instr.name}: padding has {len(padding.dims)} dimensions for rank {x.ndim}"
        )
    result = x
    for axis, (low, high, interior) in enumerate(padding.dims):
        result = _pad_axis(result, axis, low, high, interior, value)
    return np.array(result, order="C")  # a copy (ascontiguousarray makes a 0-d array 1-d)


def _pad_axis(x, axis, low, high, interior, value):
    n = x.shape[axis]
    size = n + max(n - 1, 0) * interior
    shape = list(x.shape)
    shape[axis] = size + max(low, 0) + max(high, 0)
    out = np.full(shape, value, x.dtype)
    index = [slice(None)] * x.ndim
    index[axis] = slice(max(low, 0), max(low, 0) + size, interior + 1)
    out[tuple(index)] = x
    crop = [slice(None)] * x.ndim
    crop[axis] = slice(max(-low, 0), shape[axis] - max(-high, 0))
    return out[tuple(crop)]


@evaluates(Opcode.IOTA)
def _iota(instr, operands, ctx):
    dim = instr.iota_dimension
    dims = instr.shape.dims
    if not 0 <= dim < len(dims):
        raise EvaluationError(f"{instr.name}: iota_dimension={dim} is outside rank {len(dims)}")
    ramp = convert_array(np.arange(dims[dim], dtype=np.int64), instr.shape.element_type)
    shape = [1] * len(dims)
    shape[dim] = dims[dim]
    return np.broadcast_to(ramp.reshape(shape), dims).copy()


@evaluates(Opcode.GET_DIMENSION_SIZE)
def _get_dimension_size(instr, operands, ctx):
    dims = instr.dimensions
    x = operands[0]
    if not 0 <= dims[0] < x.ndim:
        raise EvaluationError(f"{instr.name}: dimension {dims[0]} is outside rank {x.ndim}")
    return as_value(x.shape[dims[0]], instr.shape.dtype)


@evaluates(Opcode.SET_DIMENSION_SIZE)
def _set_dimension_size(instr, operands, ctx):
    return operands[0].copy()
