"""Evaluation rule of custom-call: look the target up and call it (see
xlapy.backends.custom_calls for the calling convention of Python targets).

Targets are found in `ctx.state["custom_calls"]` first (a CustomCallRegistry, or a dict from
target name to callable), then in the global registry, for the platform
`ctx.state.get("platform", "Host")`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from xlapy.backends.custom_calls import (
    GLOBAL_REGISTRY,
    ApiVersion,
    CustomCallRegistry,
    CustomCallTarget,
    takes_outs_parameter,
    unknown_target_message,
)
from xlapy.backends.interpreter.registry import evaluates
from xlapy.backends.interpreter.rules.misc import copy_value
from xlapy.backends.interpreter.rules.sorting import merge_sort_permutation
from xlapy.errors import CustomCallError
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape


def find_target(ctx, name: str, platform: str) -> CustomCallTarget:
    """The target `name` for `platform`, from the run's registry or the global one."""
    local = ctx.state.get("custom_calls")
    if isinstance(local, CustomCallRegistry):
        target = local.get(name, platform)
        if target is not None:
            return target
    elif isinstance(local, Mapping) and name in local:
        fn = local[name]
        if isinstance(fn, CustomCallTarget):
            return fn
        return CustomCallTarget(name, platform, fn, ApiVersion.PYTHON, takes_outs_parameter(fn))
    target = GLOBAL_REGISTRY.get(name, platform)
    if target is not None:
        return target
    known = set(GLOBAL_REGISTRY.names(platform))
    if isinstance(local, CustomCallRegistry):
        known |= set(local.names(platform))
    elif isinstance(local, Mapping):
        known |= set(local)
    raise CustomCallError(unknown_target_message(name, platform, sorted(known)))


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
    for alias in instr.attrs.get("output_to_operand_aliasing", ()):
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
    called = instr.attrs.get("called_computations") or ()
    comparator = instr.attrs.get("to_apply") or (called[0] if len(called) == 1 else None)
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


# Custom calls that XLA itself emits for operations with HLO semantics (they carry called
# computations, so they are evaluated here rather than through the target registry).
XLA_INTERNAL_TARGETS = {"TopK": _xla_topk}


@evaluates(Opcode.CUSTOM_CALL)
def _custom_call(instr, operands, ctx):
    name = instr.attrs.get("custom_call_target")
    if not name:
        raise CustomCallError(f"{instr.name}: custom-call needs custom_call_target=")
    if name in XLA_INTERNAL_TARGETS:
        return XLA_INTERNAL_TARGETS[name](instr, operands, ctx)
    platform = ctx.state.get("platform", "Host")
    target = find_target(ctx, name, platform)
    if target.api_version is not ApiVersion.PYTHON:
        raise CustomCallError(
            f"{instr.name}: custom-call target {name!r} uses "
            f"{target.api_version.value}, which the interpreter cannot call "
            f"(it runs Python targets)"
        )
    config = instr.attrs.get("backend_config")
    opaque = config.text if config is not None else ""
    ins = tuple(_readonly(leaf) for leaf in flatten(tuple(operands)))
    outs = _preallocated_outs(instr, operands)
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
