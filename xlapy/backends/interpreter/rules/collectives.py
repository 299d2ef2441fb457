"""Collectives on one device, and replica-id / partition-id.

The interpreter runs one participant: the device given by ctx.state "replica_id" and
"partition_id". Which devices take part in a collective follows XLA's modes: without a
channel_id the replica groups list replica ids; with a channel_id (and
use_global_device_ids unset) they list replica ids and every partition joins too; with
use_global_device_ids they list global ids (replica * num_partitions + partition). Empty
groups mean every device. When this device's group holds just itself, each collective
reduces to a copy (all-reduce, all-gather, reduce-scatter, all-to-all,
collective-broadcast); collective-permute copies when the device sends to itself and gives
zeros when nobody sends to it. Larger groups need the multi-device runtime.
"""

from __future__ import annotations

import re

import numpy as np

from xlapy.backends.interpreter.registry import evaluates
from xlapy.errors import EvaluationError
from xlapy.ir.attributes import ReplicaGroups
from xlapy.ir.opcodes import Opcode

_IOTA = re.compile(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")


def iota_groups(text: str) -> tuple[tuple[int, ...], ...]:
    """The explicit groups of an iota replica-group list such as `[2,2]<=[2,2]T(1,0)`."""
    m = _IOTA.fullmatch(text.replace(" ", ""))
    if m is None:
        raise EvaluationError(f"cannot read replica groups '{text}'")
    shape = [int(v) for v in m.group(1).split(",")]
    reshape = [int(v) for v in m.group(2).split(",")]
    ids = np.arange(int(np.prod(reshape))).reshape(reshape)
    if m.group(3):
        ids = ids.transpose([int(v) for v in m.group(3).split(",")])
    return tuple(tuple(int(v) for v in row) for row in ids.reshape(shape))


def _device_counts(instr) -> tuple[int, int]:
    module = instr.parent.parent if instr.parent is not None else None
    if module is None:
        return 1, 1
    return module.config.replica_count, module.config.num_partitions


def _participants(instr, ctx) -> tuple[int, ...]:
    """The ids (in the group's id space) of the devices taking part with this one; raises if
    any device other than this one takes part."""
    replicas, partitions = _device_counts(instr)
    replica = int(ctx.state.get("replica_id", 0))
    partition = int(ctx.state.get("partition_id", 0))
    if instr.attrs.get("use_global_device_ids", False):
        me, total, joined = replica * partitions + partition, replicas * partitions, 1
    elif instr.attrs.get("channel_id") is not None:
        me, total, joined = replica, replicas, partitions
    else:
        me, total, joined = replica, replicas, 1
    groups_attr = instr.attrs.get("replica_groups")
    groups: tuple[tuple[int, ...], ...] = ()
    if isinstance(groups_attr, ReplicaGroups):
        groups = iota_groups(groups_attr.iota_text) if groups_attr.iota_text else groups_attr.groups
    groups = tuple(g for g in groups if g)
    group = next((g for g in groups if me in g), None) if groups else tuple(range(total))
    if group is None:
        raise EvaluationError(f"{instr.name}: device {me} is in none of the replica groups")
    if len(group) * joined != 1:
        raise EvaluationError(
            f"{instr.name}: a collective over {len(group) * joined} devices needs the "
            "multi-device runtime; the interpreter runs one device"
        )
    return group


def _copy(value):
    if isinstance(value, tuple):
        return tuple(_copy(v) for v in value)
    return np.array(value, copy=True)


def _single_device_identity(instr, operands, ctx):
    _participants(instr, ctx)
    result = tuple(_copy(v) for v in operands)
    return result if instr.shape.is_tuple and len(result) > 1 else result[0]


for _op in (
    Opcode.ALL_REDUCE,
    Opcode.ALL_REDUCE_START,
    Opcode.ALL_GATHER,
    Opcode.REDUCE_SCATTER,
    Opcode.ALL_TO_ALL,
    Opcode.COLLECTIVE_BROADCAST,
):
    evaluates(_op)(_single_device_identity)


@evaluates(Opcode.ALL_REDUCE_DONE)
def _all_reduce_done(instr, operands, ctx):
    return operands[0]


@evaluates(Opcode.ALL_GATHER_START)
def _all_gather_start(instr, operands, ctx):
    _participants(instr, ctx)
    inputs = tuple(operands) if len(operands) > 1 else operands[0]
    return inputs, _copy(inputs)


@evaluates(Opcode.ALL_GATHER_DONE, Opcode.COLLECTIVE_PERMUTE_DONE)
def _start_done(instr, operands, ctx):
    (started,) = operands
    return started[1]


def _zeros_like_shape(shape):
    if shape.is_tuple:
        return tuple(_zeros_like_shape(s) for s in shape.tuple_shapes)
    return np.zeros(shape.dims, dtype=shape.dtype)


def _permute(instr, value, result_shape, ctx):
    if len(instr.operands) != 1:
        raise EvaluationError(
            f"{instr.name}: the in-place collective-permute form (buffers and start "
            "indices) is not supported by the interpreter"
        )
    replica = int(ctx.state.get("replica_id", 0))
    partition = int(ctx.state.get("partition_id", 0))
    me = partition if instr.attrs.get("channel_id") is not None else replica
    pairs = instr.attrs.get("source_target_pairs", ())
    sources = [src for src, dst in pairs if dst == me]
    if not sources:
        return _zeros_like_shape(result_shape)
    if sources != [me]:
        raise EvaluationError(
            f"{instr.name}: device {me} receives from {sources}, which needs the multi-device "
            "runtime"
        )
    return _copy(value)


@evaluates(Opcode.COLLECTIVE_PERMUTE)
def _collective_permute(instr, operands, ctx):
    return _permute(instr, operands[0], instr.shape, ctx)


@evaluates(Opcode.COLLECTIVE_PERMUTE_START)
def _collective_permute_start(instr, operands, ctx):
    shape = instr.shape
    if not shape.is_tuple or len(shape.tuple_shapes) < 2:
        raise EvaluationError(
            f"{instr.name}: collective-permute-start must return a tuple (operand, result, ...)"
        )
    received = _permute(instr, operands[0], shape.tuple_shapes[1], ctx)
    extra = tuple(_zeros_like_shape(s) for s in shape.tuple_shapes[2:])
    return (operands[0], received, *extra)


@evaluates(Opcode.REPLICA_ID)
def _replica_id(instr, operands, ctx):
    return np.array(ctx.state.get("replica_id", 0), dtype=np.uint32)


@evaluates(Opcode.PARTITION_ID)
def _partition_id(instr, operands, ctx):
    return np.array(ctx.state.get("partition_id", 0), dtype=np.uint32)
