"""Collectives on one device, and replica-id / partition-id.

The interpreter runs one participant: the device given by ctx.state "replica_id" and
"partition_id". Which devices take part in a collective follows XLA's modes: without a
channel_id the replica groups list replica ids; with a channel_id (and
use_global_device_ids unset) they list replica ids and every partition joins too; with
use_global_device_ids they list global ids (replica * num_partitions + partition). Empty
groups mean every device. When this device's group holds just itself, each collective
reduces to a copy (all-reduce, all-gather, reduce-scatter, all-to-all,
collective-broadcast); collective-permute copies when the device sends to itself and gives
zeros when nobody sends to it. Larger groups need the multi-device runtime: when the run is
one device of a multi-device execution, ctx.state["collectives"] holds that device's
xlapy.backends.collectives.DeviceCollectives and every collective meets its peers through
it (the same code the CPU backend's collective thunks use).
"""

from __future__ import annotations

import numpy as np

from xlapy.backends.collectives import (
    PERFORMED,
    DeviceGrid,
    compute_alone,
    in_place_layout,
    participants,
    permute_alone,
    result_parts,
    send_recv_pairs,
)
from xlapy.backends.interpreter.registry import TOKEN, evaluates
from xlapy.backends.interpreter.rules.misc import copy_value, queue
from xlapy.errors import EvaluationError
from xlapy.ir.attributes import ReplicaGroups
from xlapy.ir.opcodes import Opcode


def iota_groups(text: str) -> tuple[tuple[int, ...], ...]:
    """The explicit groups of an iota replica-group list such as `[2,2]<=[2,2]T(1,0)`."""
    try:
        return ReplicaGroups(iota_text=text.replace(" ", "")).expanded()
    except ValueError as e:
        raise EvaluationError(str(e)) from e


def _device_counts(instr) -> tuple[int, int]:
    module = instr.parent.parent if instr.parent is not None else None
    if module is None:
        return 1, 1
    return module.config.replica_count, module.config.num_partitions


def _participants(instr, ctx) -> None:
    """Raise unless this device is the only participant of `instr`."""
    replicas, partitions = _device_counts(instr)
    replica = int(ctx.state.get("replica_id", 0))
    partition = int(ctx.state.get("partition_id", 0))
    replicas, partitions = max(replicas, replica + 1), max(partitions, partition + 1)
    grid = DeviceGrid(
        tuple(tuple(r * partitions + p for p in range(partitions)) for r in range(replicas))
    )
    group = participants(instr, replica, partition, grid)
    if len(group) != 1:
        raise EvaluationError(
            f"{instr.name}: a collective over {len(group)} devices needs the "
            "multi-device runtime; the interpreter runs one device"
        )


def _array_leaves(value) -> list[np.ndarray]:
    if isinstance(value, tuple):
        return [a for v in value for a in _array_leaves(v)]
    return [value] if isinstance(value, np.ndarray) else []


def _empty_tree(shape, made: list[np.ndarray]):
    if shape.is_tuple:
        return tuple(_empty_tree(s, made) for s in shape.tuple_shapes)
    made.append(np.empty(shape.dims, dtype=shape.dtype))
    return made[-1]


def _with_peers(instr, operands, ctx):
    """The collective run with the other devices of a multi-device execution."""
    parts = result_parts(instr)
    outputs: list[np.ndarray] = []
    results = _empty_tree(instr.shape.subshape(parts.results), outputs)
    inputs = [a for o in operands for a in _array_leaves(o)]
    ctx.state["collectives"].perform(instr, inputs, outputs)
    if parts.operand is None:
        return results
    in_place = in_place_layout(instr) is not None
    again = tuple(operands) if len(operands) > 1 and not in_place else operands[0]
    extras = tuple(_zeros_like_shape(instr.shape.subshape(i)) for i in parts.extras)
    return (_copy(again), results, *extras)


def _peers(rule):
    """`rule` for one device on its own; the multi-device path when the run has peers."""

    def evaluate(instr, operands, ctx):
        if ctx.state.get("collectives") is not None and instr.opcode in PERFORMED:
            return _with_peers(instr, operands, ctx)
        return rule(instr, operands, ctx)

    return evaluate


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
    evaluates(_op)(_peers(_single_device_identity))


@evaluates(Opcode.RAGGED_ALL_TO_ALL)
@_peers
def _ragged_all_to_all(instr, operands, ctx):
    _participants(instr, ctx)
    result = np.empty(instr.shape.dims, instr.shape.dtype)
    compute_alone(instr, list(operands), [result])
    return result


@evaluates(Opcode.ALL_REDUCE_DONE)
def _all_reduce_done(instr, operands, ctx):
    return operands[0]


@evaluates(Opcode.ALL_GATHER_START)
@_peers
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


def _permute(instr, operands, result_shape, ctx):
    """This device's result of a collective-permute run alone: what it sends itself, zeros
    (or, in place, its output operand) where nobody sends to it."""
    replica = int(ctx.state.get("replica_id", 0))
    partition = int(ctx.state.get("partition_id", 0))
    me = partition if instr.channel_id is not None else replica
    made: list[np.ndarray] = []
    result = _empty_tree(result_shape, made)
    inputs = [a for o in operands for a in _array_leaves(o)]
    permute_alone(instr, me, inputs, made)
    return result


@evaluates(Opcode.COLLECTIVE_PERMUTE)
@_peers
def _collective_permute(instr, operands, ctx):
    return _permute(instr, operands, instr.shape, ctx)


@evaluates(Opcode.COLLECTIVE_PERMUTE_START)
@_peers
def _collective_permute_start(instr, operands, ctx):
    shape = instr.shape
    if not shape.is_tuple or len(shape.tuple_shapes) < 2:
        raise EvaluationError(
            f"{instr.name}: collective-permute-start must return a tuple (operand, result, ...)"
        )
    received = _permute(instr, operands, shape.tuple_shapes[1], ctx)
    extra = tuple(_zeros_like_shape(s) for s in shape.tuple_shapes[2:])
    again = operands[0] if len(operands) == 1 or in_place_layout(instr) else tuple(operands)
    return (again, received, *extra)


@evaluates(Opcode.REPLICA_ID)
def _replica_id(instr, operands, ctx):
    return np.array(ctx.state.get("replica_id", 0), dtype=np.uint32)


@evaluates(Opcode.PARTITION_ID)
def _partition_id(instr, operands, ctx):
    return np.array(ctx.state.get("partition_id", 0), dtype=np.uint32)


# -- send / recv: through the peers of a multi-device run, else a loopback channel ---------
def _channel(ctx, instr):
    channels = queue(ctx, instr, "channels")
    return channels.setdefault(instr.channel_id or 0, [])


def _send_recv_peers(instr, ctx):
    """The run's DeviceCollectives when `instr` sends between devices of a multi-device
    execution (it names source-target pairs), else None (a loopback through the state)."""
    comm = ctx.state.get("collectives")
    return comm if comm is not None and send_recv_pairs(instr) is not None else None


@evaluates(Opcode.SEND)
def _send(instr, operands, ctx):
    comm = _send_recv_peers(instr, ctx)
    if comm is not None:
        comm.send(instr, operands[0])
    else:
        _channel(ctx, instr).append(copy_value(operands[0]))
    return (operands[0], np.zeros((), np.uint32), TOKEN)


@evaluates(Opcode.SEND_DONE)
def _send_done(instr, operands, ctx):
    return TOKEN


@evaluates(Opcode.RECV)
def _recv(instr, operands, ctx):
    comm = _send_recv_peers(instr, ctx)
    if comm is not None:
        return (comm.recv(instr, instr.shape.tuple_shapes[0]), np.zeros((), np.uint32), TOKEN)
    channel = _channel(ctx, instr)
    if not channel:
        raise EvaluationError(f"{instr.name}: nothing was sent on channel {instr.channel_id or 0}")
    return (channel.pop(0), np.zeros((), np.uint32), TOKEN)


@evaluates(Opcode.RECV_DONE)
def _recv_done(instr, operands, ctx):
    value = operands[0]
    return (value[0], TOKEN)
