"""Evaluation rule of custom-call: look the target up and call it with the convention its
API version names (see xlapy.backends.custom_calls): Python targets on NumPy views, typed
FFI handlers on typed arrays and decoded attributes, C targets on pointers to contiguous
NumPy buffers (tuple operands and results as nested pointer tables, seed 002's layout).

Targets are found in `ctx.state["custom_calls"]` first (a CustomCallRegistry, or a dict from
target name to callable), then in the global registry, for the platform
`ctx.state.get("platform", "Host")`. XLA's own "TopK" and JAX's "ApproxTopK" custom calls
are evaluated here.
"""

from __future__ import annotations

import numpy as np

from xlapy.backends import ffi
from xlapy.backends.base import replace_leaf
from xlapy.backends.custom_calls import (
    XLA_INTERNAL_TARGET_NAMES,
    ApiVersion,
    approx_topk_dimension,
    call_cpu_c_target,
    calling,
    find,
)
from xlapy.backends.interpreter.registry import evaluates
from xlapy.backends.interpreter.rules.misc import copy_value
from xlapy.backends.interpreter.rules.sorting import merge_sort_permutation
from xlapy.errors import CustomCallError
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape


def flatten(value) -> list:
    """The leaves of a value in pre-order."""
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in flatten(v)]
    return [value]


def _unflatten(shape: Shape, leaves: list):
    if not shape.is_tuple:
        return leaves.pop(0)
    return tuple(_unflatten(s, leaves) for s in shape.tuple_shapes)


def _readonly(array):
    if not isinstance(array, np.ndarray):
        return array
    view = array.view()
    view.flags.writeable = False
    return view


def _preallocated_outs(instr, operands):
    outs = []
    for _, leaf in instr.shape.leaves():
        outs.append(np.zeros(leaf.dims, leaf.dtype) if leaf.is_array else None)
    leaf_numbers = {index: i for i, (index, _) in enumerate(instr.shape.leaves())}
    for alias in instr.output_to_operand_aliasing:
        if alias.output_index not in leaf_numbers or alias.operand_number >= len(operands):
            raise CustomCallError(
                f"{instr.name}: output_to_operand_aliasing entry "
                f"{alias.output_index}: ({alias.operand_number}, "
                f"{alias.operand_index}) names no leaf"
            )
        source = operands[alias.operand_number]
        for i in alias.operand_index:
            source = source[i]
        outs[leaf_numbers[alias.output_index]] = copy_value(source)
    return outs


def _check_leaves(instr, target, leaves, outs):
    expected = instr.shape.leaves()
    if len(leaves) != len(expected):
        raise CustomCallError(
            f"{instr.name}: custom-call target {target.name!r} returned "
            f"{len(leaves)} result leaves, {instr.shape} has {len(expected)}"
        )
    checked = []
    for n, (leaf, (index, shape)) in enumerate(zip(leaves, expected, strict=True)):
        if leaf is None:
            leaf = outs[n]
        if not shape.is_array:
            checked.append(leaf)
            continue
        arr = np.asarray(leaf)
        if arr.shape != shape.dims or arr.dtype != shape.dtype:
            raise CustomCallError(
                f"{instr.name}: custom-call target {target.name!r} result leaf {n} "
                f"(index {list(index)}) is {arr.dtype}{list(arr.shape)}, expected "
                f"{shape.to_text(with_layout=False)}"
            )
        checked.append(np.array(arr, copy=True))
    return checked


def _xla_topk(instr, operands, ctx):
    """XLA's "TopK" custom call (what its optimizer turns `topk` into): the k first elements
    of each row of the last dimension in the comparator's order, ties by lower index."""
    (x,) = operands
    called = instr.custom_call_computations
    comparator = instr.to_apply_or_none or (called[0] if len(called) == 1 else None)
    if comparator is None or not instr.shape.is_tuple or x.ndim == 0:
        raise CustomCallError(
            f"{instr.name}: TopK needs one comparator computation and a (values, indices) result"
        )
    values_shape, indices_shape = instr.shape.tuple_shapes
    k, n = values_shape.dims[-1], x.shape[-1]
    rows = x.reshape(-1, n)
    keys = [rows]
    if comparator.num_parameters == 4:  # a sort comparator over (values, indices)
        keys.append(np.broadcast_to(np.arange(n, dtype=indices_shape.dtype), rows.shape))
    perm = merge_sort_permutation(ctx, comparator, keys)[:, :k]
    values = np.take_along_axis(rows, perm, axis=1).reshape(values_shape.dims)
    return values, perm.astype(indices_shape.dtype).reshape(indices_shape.dims)


def _approx_topk(instr, operands, ctx):
    """JAX's "ApproxTopK" (lax.approx_max_k / approx_min_k) as XLA runs it off TPUs: its
    inputs (values, indices) stably sorted along `reduction_dim` by the comparator, each cut
    to the result's size there (k, or the reduction output size when not aggregated)."""
    k = len(operands) // 2
    called = instr.custom_call_computations
    dim = approx_topk_dimension(instr)
    results = [s for _, s in instr.shape.leaves()]
    if len(called) != 1 or k == 0 or len(results) != k or dim is None:
        raise CustomCallError(
            f"{instr.name}: ApproxTopK needs inputs and as many init values, one comparator, "
            "one result per input and a backend_config naming reduction_dim"
        )
    inputs = operands[:k]
    if not 0 <= dim < inputs[0].ndim:
        raise CustomCallError(f"{instr.name}: reduction_dim {dim} of rank {inputs[0].ndim}")
    moved = [np.moveaxis(x, dim, -1) for x in inputs]
    n, size = moved[0].shape[-1], results[0].dims[dim]
    rows = [x.reshape(-1, n) for x in moved]
    perm = merge_sort_permutation(ctx, called[0], rows)[:, :size]
    outs = []
    for x, row, shape in zip(moved, rows, results, strict=True):
        top = np.take_along_axis(row, perm, axis=1).reshape(*x.shape[:-1], size)
        outs.append(np.ascontiguousarray(np.moveaxis(top, -1, dim)).reshape(shape.dims))
    return tuple(outs)


# Custom calls that XLA itself emits for operations with HLO semantics (they carry called
# computations, so they are evaluated here rather than through the target registry).
XLA_INTERNAL_TARGETS = {"TopK": _xla_topk, "ApproxTopK": _approx_topk}


def _contiguous(value):
    if isinstance(value, tuple):
        return tuple(_contiguous(v) for v in value)
    return np.asarray(value, order="C") if isinstance(value, np.ndarray) else None


def _aliased_operands(instr, operands, outs) -> list:
    """The operand values a C target sees: an operand leaf that an output aliases is the
    output's buffer (the copy the target updates in place)."""
    operands = list(operands)
    leaf_numbers = {index: i for i, (index, _) in enumerate(instr.shape.leaves())}
    for alias in instr.output_to_operand_aliasing:
        out = outs[leaf_numbers[alias.output_index]]
        operands[alias.operand_number] = replace_leaf(
            operands[alias.operand_number], alias.operand_index, out
        )
    return operands


def _call_c(instr, target, operands, outs, opaque):
    if target.platform != "Host":
        raise CustomCallError(
            f"{instr.name}: custom-call target {target.name!r} is a {target.platform} C "
            f"function; the interpreter calls C targets for the Host platform only"
        )
    ins = _aliased_operands(instr, [_contiguous(op) for op in operands], outs)
    try:
        call_cpu_c_target(target, ins, _unflatten(instr.shape, list(outs)), opaque)
    except CustomCallError as e:
        raise CustomCallError(
            f"{instr.name}: custom-call target {target.name!r} failed: {e}"
        ) from e


@evaluates(Opcode.CUSTOM_CALL)
def _custom_call(instr, operands, ctx):
    name = instr.custom_call_target
    if not name:
        raise CustomCallError(f"{instr.name}: custom-call needs custom_call_target=")
    if name in XLA_INTERNAL_TARGET_NAMES:
        return XLA_INTERNAL_TARGETS[name](instr, operands, ctx)
    platform = ctx.state.get("platform", "Host")
    target = find(name, platform, ctx.state.get("custom_calls"))
    config = instr.backend_config
    opaque = config.text if config is not None else ""
    outs = _preallocated_outs(instr, operands)
    with calling(name):
        return _call_target(instr, target, operands, outs, opaque)


def _call_target(instr, target, operands, outs, opaque):
    name = target.name
    if target.api_version is ApiVersion.TYPED_FFI:
        ins = tuple(_readonly(leaf) for leaf in flatten(tuple(operands)))
        ffi.call_handler(target.fn, instr, ins, outs)
        return _unflatten(instr.shape, outs)
    if target.api_version.is_c:
        _call_c(instr, target, operands, outs, opaque)
        return _unflatten(instr.shape, outs)
    ins = tuple(_readonly(leaf) for leaf in flatten(tuple(operands)))
    try:
        if target.takes_outs:
            result = target.fn(ins, opaque, outs=outs)
        else:
            result = target.fn(ins, opaque)
    except CustomCallError:
        raise
    except Exception as e:
        raise CustomCallError(
            f"{instr.name}: custom-call target {name!r} failed: {type(e).__name__}: {e}"
        ) from e
    if result is None:
        if not target.takes_outs:
            raise CustomCallError(
                f"{instr.name}: custom-call target {name!r} returned None "
                f"and takes no `outs` to fill"
            )
        leaves = outs
    elif instr.shape.is_tuple:
        leaves = flatten(tuple(result)) if isinstance(result, tuple | list) else [result]
    else:
        leaves = [result]
    return _unflatten(instr.shape, _check_leaves(instr, target, leaves, outs))
