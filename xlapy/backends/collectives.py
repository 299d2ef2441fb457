# Collectives between the devices of one execution: who takes part, how they meet, and what
# each computes.
#
# Who takes part (XLA's CollectiveOpGroupMode). A collective's replica groups list ids in one
# of four spaces, chosen by whether it has a channel_id and, for the ops that carry one
# (all-reduce, all-gather, reduce-scatter), use_global_device_ids:
#   no channel_id                          cross-replica: replica ids, same partition
#   channel_id, op without the flag        cross-partition: partition ids, same replica
#   channel_id, use_global_device_ids=false cross-replica-and-partition: replica ids, and
#                                          every partition of those replicas joins
#   channel_id, use_global_device_ids=true flattened ids: replica * num_partitions + partition
# Empty groups mean every id of the space. A participant's rank is its position in its group
# (replica-major for cross-replica-and-partition), as XLA's clique keys order devices.
#
# How they meet. Every execution that runs on several devices gets one CollectiveRun shared by
# its devices (an id, the device assignment and a timeout); each device's program gets a
# DeviceCollectives for its (replica, partition). A collective is a rendezvous keyed by (the
# instruction, how many times this device has run it, the participating devices): each
# participant publishes its operand and result arrays (views of its own memory: nothing is
# copied to meet). Small collectives (LEAD_MAX_BYTES of results per device) are computed by
# the last participant to arrive, for every participant, while the others wait for it: one
# thread wake-up each. Larger ones wait until every participant has arrived, each computes
# its part reading the others' operands in place, and all wait again until every one is done
# before anyone's memory may change. Waiting is bounded: past the timeout the error names the
# collective and the devices that did not arrive; when any device of the execution fails, the
# run is aborted and every device waiting in it fails with that device's error.
#
# What each computes follows XLA's CPU runtime (in_process_communicator.cc), so results are
# the same bits: an all-reduce splits the elements into one chunk per participant; rank r
# reduces chunk r starting from the reduction's identity and taking the participants' inputs
# in rank order (so `0 + x0 + x1 + ...` for a sum; min/max keep the accumulator when the
# input compares false, as std::min/std::max do with NaN), then copies it into every
# participant's result. Reductions other than add, multiply, min, max, and, or are evaluated
# with the interpreter, in rank order from the first input. Participants in other processes
# (xlapy.runtime.distributed) exchange copies of their operands through the run's transport;
# each device then computes its whole result itself, in the same order, so the bits agree.

from __future__ import annotations

import enum
import functools
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from xlapy.errors import EvaluationError
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode

DEFAULT_TIMEOUT_SECONDS = 60.0
LEAD_MAX_BYTES = 1 << 18
"""Collectives whose results on one device are at most this many bytes are computed by the
last participant to arrive for all of them (one thread wake-up each instead of two); larger
ones have every participant compute its own part in parallel."""


class CollectiveError(EvaluationError):
    """A collective could not complete: a timeout, a failed peer, mismatched operands."""


class GroupMode(enum.Enum):
    CROSS_REPLICA = "cross-replica"
    CROSS_PARTITION = "cross-partition"
    CROSS_REPLICA_AND_PARTITION = "cross-replica-and-partition"
    FLATTENED_ID = "flattened-id"


_HAS_GLOBAL_IDS_FLAG = frozenset(
    {
        Opcode.ALL_REDUCE,
        Opcode.ALL_REDUCE_START,
        Opcode.ALL_GATHER,
        Opcode.ALL_GATHER_START,
        Opcode.REDUCE_SCATTER,
    }
)


def group_mode(instr: HloInstruction) -> GroupMode:
    """The id space of `instr`'s replica groups (see the file comment)."""
    has_channel = instr.channel_id is not None
    global_ids = instr.use_global_device_ids
    if not has_channel:
        if global_ids:
            raise EvaluationError(f"{instr.name}: use_global_device_ids needs a channel_id")
        return GroupMode.CROSS_REPLICA
    if instr.opcode not in _HAS_GLOBAL_IDS_FLAG:
        return GroupMode.CROSS_PARTITION
    return GroupMode.FLATTENED_ID if global_ids else GroupMode.CROSS_REPLICA_AND_PARTITION


def expanded_groups(instr: HloInstruction) -> tuple[tuple[int, ...], ...]:
    """`instr`'s replica groups as explicit id lists (empty groups dropped)."""
    attr = instr.replica_groups
    if attr is None:
        return ()
    try:
        groups = attr.expanded()
    except ValueError as e:
        raise EvaluationError(f"{instr.name}: {e}") from e
    return tuple(g for g in groups if g)


@dataclass(frozen=True, slots=True)
class DeviceGrid:
    """The device assignment of an execution: `ids[replica][partition]` is a device id."""

    ids: tuple[tuple[int, ...], ...]

    @property
    def num_replicas(self) -> int:
        return len(self.ids)

    @property
    def num_partitions(self) -> int:
        return len(self.ids[0]) if self.ids else 0

    def device(self, replica: int, partition: int) -> int:
        return self.ids[replica][partition]


@functools.lru_cache(maxsize=4096)
def participants(
    instr: HloInstruction, replica: int, partition: int, grid: DeviceGrid
) -> tuple[tuple[int, int], ...]:
    """The (replica, partition) of every device taking part in `instr` with this one, in
    rank order."""
    mode = group_mode(instr)
    replicas, partitions = grid.num_replicas, grid.num_partitions
    if mode is GroupMode.CROSS_PARTITION:
        me, space = partition, partitions
    elif mode is GroupMode.FLATTENED_ID:
        me, space = replica * partitions + partition, replicas * partitions
    else:
        me, space = replica, replicas
    groups = expanded_groups(instr)
    if not groups:
        group: tuple[int, ...] = tuple(range(space))
    else:
        found = [g for g in groups if me in g]
        if not found:
            raise EvaluationError(
                f"{instr.name}: {mode.value} id {me} is in none of the replica groups {groups}"
            )
        group = found[0]
    for i in group:
        if not 0 <= i < space:
            raise EvaluationError(
                f"{instr.name}: replica group {group} names id {i}, but the {mode.value} "
                f"space has {space} ids ({replicas} replicas x {partitions} partitions)"
            )
    if mode is GroupMode.CROSS_REPLICA:
        return tuple((r, partition) for r in group)
    if mode is GroupMode.CROSS_PARTITION:
        return tuple((replica, p) for p in group)
    if mode is GroupMode.CROSS_REPLICA_AND_PARTITION:
        return tuple((r, p) for r in group for p in range(partitions))
    return tuple(divmod(i, partitions) for i in group)


@functools.lru_cache(maxsize=4096)
def _meeting(
    instr: HloInstruction, replica: int, partition: int, grid: DeviceGrid
) -> tuple[tuple[int, ...], int, str]:
    """(the devices taking part in `instr` with this one in rank order, this one's rank,
    how errors name the collective on this device)."""
    members = tuple(grid.device(r, p) for r, p in participants(instr, replica, partition, grid))
    device = grid.device(replica, partition)
    return members, members.index(device), f"{instr.opcode.text} {instr.name} on device {device}"


def permute_ids(instr: HloInstruction, replica: int, partition: int, grid: DeviceGrid):
    """For a collective-permute: (this device's id in the pairs' space, the (replica,
    partition) of an id, the pairs)."""
    pairs = instr.source_target_pairs
    if group_mode(instr) is GroupMode.CROSS_PARTITION:
        return partition, (lambda i: (replica, i)), pairs
    return replica, (lambda i: (i, partition)), pairs


_PAIR = re.compile(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}")


def send_recv_pairs(instr: HloInstruction) -> tuple[tuple[int, int], ...] | None:
    """The (source, target) pairs of a send or recv between devices (XLA's frontend
    attribute `_xla_send_recv_source_target_pairs`), or None (a host transfer)."""
    text = instr.frontend_attributes.get("_xla_send_recv_source_target_pairs")
    if text is None:
        return None
    return tuple((int(a), int(b)) for a, b in _PAIR.findall(text))


# -- reductions ---------------------------------------------------------------------------


def _identity(kind: str, dtype: np.dtype):
    if kind == "add":
        return 0
    if kind == "multiply":
        return 1
    if dtype == np.bool_:
        return kind in ("min", "and")
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return info.max if kind == "min" else info.min
    return np.inf if kind == "min" else -np.inf


_BINARY_KINDS = {
    Opcode.ADD: "add",
    Opcode.MULTIPLY: "multiply",
    Opcode.MINIMUM: "min",
    Opcode.MAXIMUM: "max",
    Opcode.AND: "and",
    Opcode.OR: "or",
}


@functools.lru_cache(maxsize=4096)
def reduction_kind(instr: HloInstruction) -> str | None:
    """The reduction ("add", "multiply", "min", "max"; "and"/"or" on pred become min/max) when
    `instr`'s computation is that one binary op on its two parameters; else None."""
    comp = instr.to_apply_or_none
    if comp is None:
        return None
    root = comp.root_instruction()
    kind = _BINARY_KINDS.get(root.opcode)
    params = comp.parameters
    if kind is None or len(params) != 2 or set(map(id, root.operands)) != set(map(id, params)):
        return None
    if kind in ("and", "or"):
        if root.shape.dtype != np.bool_:
            return None
        return "min" if kind == "and" else "max"
    return kind


def reduce_into(acc: np.ndarray, inputs: Sequence[np.ndarray], instr: HloInstruction) -> None:
    """acc = reduction of `inputs` in order, the way XLA's CPU runtime computes it."""
    kind = reduction_kind(instr)
    if kind is None:
        np.copyto(acc, _generic_reduce(instr, inputs), casting="no")
        return
    if any(np.may_share_memory(acc, x) for x in inputs):  # an in-place result
        fresh = np.empty_like(acc)
        reduce_into(fresh, inputs, instr)
        acc[...] = fresh
        return
    acc[...] = _identity(kind, acc.dtype)
    for x in inputs:
        if kind == "add":
            np.add(acc, x, out=acc, casting="unsafe")
        elif kind == "multiply":
            np.multiply(acc, x, out=acc, casting="unsafe")
        elif kind == "min":
            np.copyto(acc, x, where=x < acc)
        else:
            np.copyto(acc, x, where=acc < x)


def _generic_reduce(instr: HloInstruction, inputs: Sequence[np.ndarray]) -> np.ndarray:
    from xlapy.backends.interpreter.evaluator import Interpreter

    comp = instr.to_apply
    interpreter = Interpreter()
    acc = np.array(inputs[0], copy=True)
    for x in inputs[1:]:
        acc = np.asarray(interpreter.call(comp, [acc, np.asarray(x)]))
    return acc


# -- meeting ------------------------------------------------------------------------------


class Transport(Protocol):
    """Exchanges contributions with participants in other processes (xlapy.runtime)."""

    def is_local(self, device: int) -> bool: ...

    def exchange(
        self, run: CollectiveRun, key: tuple, members: Sequence[int], local: dict[int, Any]
    ) -> dict[int, Any]:
        """Send the local members' contributions (device -> Contribution) to the processes
        of the other members; return every remote member's (without outputs)."""
        ...

    def abort(self, run_id: Any, device: int, error: BaseException) -> None:
        """Tell the other processes that local device `device` failed in run `run_id`."""
        ...

    def send_to(self, run: CollectiveRun, key: tuple, device: int, value: np.ndarray) -> None:
        """Post `value` under `key` for `device` of another process (a send)."""
        ...

    def receive(self, run: CollectiveRun, key: tuple, source: int) -> np.ndarray:
        """Wait for what device `source` of another process posted under `key` (a recv)."""
        ...


@dataclass
class _Slot:
    cond: threading.Condition  # on the run's lock: wakes only this rendezvous's members
    values: dict[int, Any] = field(default_factory=dict)  # rank -> contribution
    remote_done: bool = False
    leaving: int = 0
    finished: bool = False  # led: the last to arrive has computed every part
    error: BaseException | None = None  # led: what the last to arrive raised


class CollectiveRun:
    """What the devices of one execution share to meet in collectives (see the file
    comment). `run_id` names the execution (the same in every process); `names` maps a
    device id to how errors call it."""

    def __init__(
        self,
        run_id: Any,
        grid: DeviceGrid,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        transport: Transport | None = None,
    ):
        self.run_id = run_id
        self.grid = grid
        self.timeout = timeout
        self.transport = transport
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # send/recv mail, aborts
        self._slots: dict[tuple, _Slot] = {}
        self._mail: dict[tuple, Any] = {}  # send/recv: key -> the data sent
        self.error: tuple[int, BaseException] | None = None

    def for_device(self, replica: int, partition: int) -> DeviceCollectives:
        return DeviceCollectives(self, replica, partition)

    def abort(self, device: int, error: BaseException) -> None:
        """Device `device` failed: wake every device waiting in this run with its error."""
        with self._cond:
            first = self.error is None
            if first:
                self.error = (device, error)
            self._cond.notify_all()
            for slot in self._slots.values():
                slot.cond.notify_all()
        if first and self.transport is not None and self.transport.is_local(device):
            self.transport.abort(self.run_id, device, error)

    def raise_if_aborted(self, what: str) -> None:
        if self.error is not None:
            device, error = self.error
            raise CollectiveError(
                f"{what}: device {device} failed, so the collective cannot complete: "
                f"{type(error).__name__}: {error}"
            ) from error

    def _slot(self, key: tuple) -> _Slot:
        """The rendezvous under `key` (with the run's lock held)."""
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot(threading.Condition(self._lock))
        return slot

    def _is_local(self, device: int) -> bool:
        return self.transport is None or self.transport.is_local(device)

    def meet(self, key: tuple, what: str, members: Sequence[int], rank: int, value: Any) -> list:
        """Publish `value` as member `rank` and return every member's value, in rank order,
        once all have arrived."""
        n = len(members)
        local_ranks = [i for i, d in enumerate(members) if self._is_local(d)]
        deadline = time.monotonic() + self.timeout
        with self._cond:
            self.raise_if_aborted(what)
            slot = self._slot(key)
            slot.values[rank] = value
            if len(slot.values) == n or (
                not slot.remote_done and all(i in slot.values for i in local_ranks)
            ):
                slot.cond.notify_all()
            while len(slot.values) < n:
                self.raise_if_aborted(what)
                if not slot.remote_done and all(i in slot.values for i in local_ranks):
                    slot.remote_done = True  # this thread exchanges for the process
                    local = {members[i]: slot.values[i] for i in local_ranks}
                    self._cond.release()
                    try:
                        assert self.transport is not None, "remote members need a transport"
                        remote = self.transport.exchange(self, key, members, local)
                    finally:
                        self._cond.acquire()
                    for i, d in enumerate(members):
                        if d in remote:
                            slot.values[i] = remote[d]
                    slot.cond.notify_all()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [members[i] for i in range(n) if i not in slot.values]
                    raise CollectiveError(
                        f"{what}: devices {missing} did not arrive within {self.timeout:g} s "
                        f"(devices {list(members)} take part; arrived: "
                        f"{sorted(members[i] for i in slot.values)})"
                    )
                slot.cond.wait(min(left, 1.0))
            return [slot.values[i] for i in range(n)]

    def post(self, key: tuple, value: Any) -> None:
        """Leave `value` for the device that will `take` it under `key` (send)."""
        with self._cond:
            self._mail[key] = value
            self._cond.notify_all()

    def take(self, key: tuple, what: str, source: int) -> Any:
        """Wait for the value posted under `key` by device `source` (recv)."""
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while key not in self._mail:
                self.raise_if_aborted(what)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveError(
                        f"{what}: device {source} did not send within {self.timeout:g} s"
                    )
                self._cond.wait(min(left, 1.0))
            return self._mail.pop(key)

    def meet_led(
        self,
        key: tuple,
        what: str,
        members: Sequence[int],
        rank: int,
        value: Any,
        lead: Callable[[list], None],
    ) -> None:
        """Publish `value` as member `rank`; the last member to arrive calls `lead` with
        every member's value (in rank order) while the others wait for it to finish: one
        wake-up per member instead of two (every member local)."""
        n = len(members)
        deadline = 0.0
        with self._cond:
            self.raise_if_aborted(what)
            slot = self._slot(key)
            slot.values[rank] = value
            values = [slot.values[i] for i in range(n)] if len(slot.values) == n else None
            if values is None:
                deadline = time.monotonic() + self.timeout
            while values is None and not slot.finished:
                self.raise_if_aborted(what)
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [members[i] for i in range(n) if i not in slot.values]
                    raise CollectiveError(
                        f"{what}: devices {missing} did not arrive within {self.timeout:g} s "
                        f"(devices {list(members)} take part)"
                    )
                slot.cond.wait(min(left, 1.0))
        if values is None:
            if slot.error is not None:
                raise CollectiveError(f"{what}: {slot.error}") from slot.error
            return
        error: BaseException | None = None
        try:
            lead(values)
        except BaseException as e:
            error = e
        with self._cond:
            slot.error, slot.finished = error, True
            del self._slots[key]
            slot.cond.notify_all()
        if error is not None:
            raise error

    def leave(self, key: tuple, what: str, members: Sequence[int]) -> None:
        """Wait until every local member is done with the others' memory."""
        local = sum(1 for d in members if self._is_local(d))
        deadline = time.monotonic() + self.timeout
        with self._cond:
            slot = self._slots[key]
            slot.leaving += 1
            if slot.leaving == local:
                del self._slots[key]
                slot.cond.notify_all()
                return
            while slot.leaving < local:
                self.raise_if_aborted(what)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CollectiveError(
                        f"{what}: not every device finished within {self.timeout:g} s"
                    )
                slot.cond.wait(min(left, 1.0))


@dataclass(frozen=True, slots=True)
class Contribution:
    """What a participant publishes: its operands, its results (None when remote) and a
    description of both to check against the others'."""

    inputs: tuple[np.ndarray, ...]
    outputs: tuple[np.ndarray, ...] | None
    signature: tuple


def _signature(arrays: Sequence[np.ndarray]) -> tuple:
    return tuple((a.dtype.str, a.shape) for a in arrays)


class DeviceCollectives:
    """One device's side of a CollectiveRun: runs the collectives of its program."""

    def __init__(self, run: CollectiveRun, replica: int, partition: int):
        self.run = run
        self.replica = replica
        self.partition = partition
        self.device = run.grid.device(replica, partition)
        self._counts: dict[str, int] = {}

    @property
    def state(self) -> dict[str, Any]:
        """What a program's interpreter state gets from this device."""
        return {"replica_id": self.replica, "partition_id": self.partition, "collectives": self}

    def _key(self, instr: HloInstruction, members: tuple[int, ...]) -> tuple:
        count = self._counts.get(instr.name, 0)
        self._counts[instr.name] = count + 1
        return (self.run.run_id, instr.name, count, members)

    def perform(
        self, instr: HloInstruction, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]
    ) -> None:
        """Run collective `instr`: `inputs` are its array operands, `outputs` the arrays its
        results go to (one per operand; for the start ops, the result leaves after the
        operand's), all indexed logically."""
        op = instr.opcode
        if op in (Opcode.COLLECTIVE_PERMUTE, Opcode.COLLECTIVE_PERMUTE_START):
            self._permute(instr, inputs, outputs)
            return
        members, rank, what = _meeting(instr, self.replica, self.partition, self.run.grid)
        key = self._key(instr, members)
        if len(members) == 1:
            compute_alone(instr, inputs, outputs)
            return
        compute = _COMPUTE[op]

        def part(values: list[Contribution], r: int) -> None:
            local = all(v.outputs is not None for v in values)
            compute(instr, [v.inputs for v in values], r, [v.outputs for v in values], local)

        whole = _COMPUTE_ALL.get(op)
        every = None
        if whole is not None:

            def every(values: list[Contribution]) -> None:
                whole(instr, [v.inputs for v in values], [v.outputs for v in values])

        self._together(key, what, members, rank, inputs, outputs, part, every)

    def _channel(self, instr: HloInstruction, kind: str):
        """(this device's id among the pairs, id -> device, pairs, the key's prefix) of a
        send or recv: ids are partition ids when the program has partitions, else replica
        ids; the k-th send of a channel from one device meets the k-th recv on the other."""
        pairs = send_recv_pairs(instr) or ()
        grid = self.run.grid
        channel = instr.channel_id or 0
        count = self._counts.get(f"{kind}:{channel}", 0)
        self._counts[f"{kind}:{channel}"] = count + 1
        if grid.num_partitions > 1:
            me, device = self.partition, (lambda i: grid.device(self.replica, i))
        else:
            me, device = self.replica, (lambda i: grid.device(i, self.partition))
        return me, device, pairs, (self.run.run_id, "channel", channel, count)

    def send(self, instr: HloInstruction, value: np.ndarray) -> None:
        """A send to the devices its pairs name (a copy: the sender may reuse its memory)."""
        me, device, pairs, key = self._channel(instr, "send")
        for s, t in pairs:
            if s != me:
                continue
            target = device(t)
            copy = np.array(value, copy=True)
            if self.run._is_local(target):
                self.run.post((*key, self.device, target), copy)
                continue
            assert self.run.transport is not None, "a remote device needs a transport"
            self.run.transport.send_to(self.run, (*key, self.device, target), target, copy)

    def recv(self, instr: HloInstruction, shape) -> np.ndarray:
        """What the device its pairs name sent (zeros when none sends to this one)."""
        me, device, pairs, key = self._channel(instr, "recv")
        sources = [s for s, t in pairs if t == me]
        if not sources:
            return np.zeros(shape.dims, shape.dtype)
        source = device(sources[0])
        what = f"recv {instr.name} on device {self.device}"
        if not self.run._is_local(source):
            assert self.run.transport is not None, "a remote device needs a transport"
            return self.run.transport.receive(self.run, (*key, source, self.device), source)
        return self.run.take((*key, source, self.device), what, source)

    def _together(self, key, what, members, rank, inputs, outputs, part, every=None) -> None:
        """Meet the other members and have `part(values, r)` compute member r's results:
        the last to arrive computes every member's when all are local and the results are
        small (with `every(values)` at once when given), else each member its own (see the
        file comment)."""
        run = self.run
        mine = Contribution(tuple(inputs), tuple(outputs), _signature(inputs))
        small = sum(o.nbytes for o in outputs) <= LEAD_MAX_BYTES
        if small and (run.transport is None or all(run._is_local(d) for d in members)):

            def lead(values: list[Contribution]) -> None:
                _check_signatures(what, members, values)
                if every is not None:
                    every(values)
                    return
                for r in range(len(values)):
                    part(values, r)

            run.meet_led(key, what, members, rank, mine, lead)
            return
        values = run.meet(key, what, members, rank, mine)
        try:
            _check_signatures(what, members, values)
            part(values, rank)
        finally:
            run.leave(key, what, members)

    def _permute(self, instr, inputs, outputs) -> None:
        grid = self.run.grid
        me, position, pairs = permute_ids(instr, self.replica, self.partition, grid)
        layout = in_place_layout(instr)
        ids = sorted({i for pair in pairs for i in pair})
        if layout is None:
            _unique_targets(instr, pairs)
        if me not in ids:
            _permute_part(
                instr, layout, pairs, [me], [Contribution(tuple(inputs), tuple(outputs), ())], 0
            )
            return
        members = tuple(grid.device(*position(i)) for i in ids)
        what = f"{instr.opcode.text} {instr.name} on device {self.device}"
        key = self._key(instr, members)

        def part(values: list[Contribution], r: int) -> None:
            _permute_part(instr, layout, pairs, ids, values, r)

        self._together(key, what, members, ids.index(me), inputs, outputs, part)


def _unique_targets(instr: HloInstruction, pairs) -> None:
    source: dict[int, int] = {}
    for s, t in pairs:
        if t in source:
            raise EvaluationError(f"{instr.name}: id {t} receives from {source[t]} and {s}")
        source[t] = s


def _permute_part(instr, layout, pairs, ids, values, r) -> None:
    """Member r's results of a collective-permute among `ids` (every id in the pairs)."""
    outs = values[r].outputs
    assert outs is not None, "a member's own results are local"
    if layout is None:
        sources = [s for s, t in pairs if t == ids[r]]
        if not sources:
            for out in outs:
                out[...] = 0
            return
        for out, x in zip(outs, values[ids.index(sources[0])].inputs, strict=True):
            np.copyto(out, x, casting="no")
        return
    mine = values[r].inputs
    for j, out in enumerate(outs):
        given = mine[layout.buffers + j]
        if not np.may_share_memory(out, given):
            np.copyto(out, given, casting="no")
    for p, (s, t) in enumerate(pairs):
        if t != ids[r]:
            continue
        theirs = values[ids.index(s)].inputs
        for j, out in enumerate(outs):
            size = layout.sizes[p]
            x = theirs[j]
            src = _starts(instr, theirs, layout.input_starts[j][p], x.shape, size, "input")
            dst = _starts(instr, mine, layout.output_starts[j][p], out.shape, size, "output")
            np.copyto(
                out[tuple(slice(o, o + n) for o, n in zip(dst, size, strict=True))],
                x[tuple(slice(o, o + n) for o, n in zip(src, size, strict=True))],
                casting="no",
            )


def _starts(instr, leaves, at: tuple[int, ...], dims, size, which: str) -> list[int]:
    """Start indices read from the scalar leaves `at`, clamped as dynamic-slice clamps."""
    starts = []
    for d, (i, n) in enumerate(zip(at, size, strict=True)):
        if n > dims[d]:
            raise EvaluationError(
                f"{instr.name}: slice size {list(size)} does not fit the {which} buffer "
                f"{list(dims)}"
            )
        starts.append(min(max(int(leaves[i]), 0), dims[d] - n))
    return starts


@dataclass(frozen=True, slots=True)
class InPlaceLayout:
    """Where the pieces of an in-place collective-permute `collective-permute(input, output,
    input_starts, output_starts), slice_sizes={...}` sit among its flattened operand leaves:
    `buffers` input leaves, as many output leaves, then the start-index scalars.
    `input_starts[j][p]` / `output_starts[j][p]` are the leaf indices of buffer j's start
    indices for pair p; `sizes[p]` is the slice pair p moves."""

    buffers: int
    input_starts: tuple[tuple[tuple[int, ...], ...], ...]
    output_starts: tuple[tuple[tuple[int, ...], ...], ...]
    sizes: tuple[tuple[int, ...], ...]


def is_in_place_permute(instr: HloInstruction) -> bool:
    """Whether `instr` is the in-place (sliced) collective-permute form: four operands
    (input, output, input start indices, output start indices) with slice_sizes, or
    whose last two are tuples of integers."""
    ops = instr.operands
    if instr.opcode not in (Opcode.COLLECTIVE_PERMUTE, Opcode.COLLECTIVE_PERMUTE_START):
        return False
    if len(ops) != 4:
        return False
    if instr.permute_slice_sizes:
        return True
    return all(
        o.shape.is_tuple and all(leaf.element_type.is_integral for _, leaf in o.shape.leaves())
        for o in ops[2:]
    )


@functools.lru_cache(maxsize=1024)
def in_place_layout(instr: HloInstruction) -> InPlaceLayout | None:
    """The InPlaceLayout of an in-place collective-permute; None for the plain form.

    Start indices come as a tuple of one s32 scalar per dimension (the same for every
    pair) or a tuple of such tuples, one per pair; for tuple buffers, one such entry per
    buffer. slice_sizes holds one size list for every pair, or one per pair."""
    if not is_in_place_permute(instr):
        return None
    ops = instr.operands
    pairs = instr.source_target_pairs
    x, out = ops[0].shape, ops[1].shape
    xs = list(x.tuple_shapes) if x.is_tuple else [x]
    outs = list(out.tuple_shapes) if out.is_tuple else [out]
    if len(xs) != len(outs) or any(not s.is_array for s in xs + outs):
        raise EvaluationError(
            f"{instr.name}: the input and output of an in-place collective-permute must be "
            f"as many arrays, got {x} and {out}"
        )
    for a, b in zip(xs, outs, strict=True):
        if a.dtype != b.dtype or a.rank != b.rank:
            raise EvaluationError(f"{instr.name}: input {a} and output {b} differ in type/rank")
    ranks = {a.rank for a in xs}
    if len(ranks) != 1:
        raise EvaluationError(f"{instr.name}: in-place buffers of different ranks {xs}")
    rank = ranks.pop()
    given = list(instr.permute_slice_sizes)
    if not given:
        raise EvaluationError(f"{instr.name}: an in-place collective-permute needs slice_sizes")
    if len(given) not in (1, len(pairs)) or any(len(g) != rank for g in given):
        raise EvaluationError(
            f"{instr.name}: slice_sizes {given} must hold one list of {rank} sizes, or one per "
            f"source-target pair ({len(pairs)})"
        )
    sizes = tuple(given * len(pairs)) if len(given) == 1 else tuple(given)
    first = 2 * len(xs)
    count = [first]

    def starts(shape, what: str) -> tuple[tuple[tuple[int, ...], ...], ...]:
        entries = list(shape.tuple_shapes) if x.is_tuple and shape.is_tuple else [shape]
        if len(entries) != len(xs):
            raise EvaluationError(f"{instr.name}: {what} needs one entry per buffer")
        per_buffer = []
        for entry in entries:
            per_buffer.append(one_buffer(entry, what))
        return tuple(per_buffer)

    def scalars(shape, what: str) -> tuple[int, ...]:
        if not shape.is_tuple or len(shape.tuple_shapes) != rank:
            raise EvaluationError(
                f"{instr.name}: {what} must be a tuple of {rank} integer scalars, got {shape}"
            )
        for leaf in shape.tuple_shapes:
            if leaf.is_tuple or leaf.rank != 0 or not leaf.element_type.is_integral:
                raise EvaluationError(f"{instr.name}: {what} holds {leaf}, not an integer scalar")
        at = tuple(range(count[0], count[0] + rank))
        count[0] += rank
        return at

    def one_buffer(shape, what: str) -> tuple[tuple[int, ...], ...]:
        if shape.is_tuple and shape.tuple_shapes and shape.tuple_shapes[0].is_tuple:
            if len(shape.tuple_shapes) != len(pairs):
                raise EvaluationError(
                    f"{instr.name}: {what} has {len(shape.tuple_shapes)} entries for "
                    f"{len(pairs)} source-target pairs"
                )
            return tuple(scalars(s, what) for s in shape.tuple_shapes)
        return (scalars(shape, what),) * len(pairs)

    input_starts = starts(ops[2].shape, "the input start indices")
    output_starts = starts(ops[3].shape, "the output start indices")
    return InPlaceLayout(len(xs), input_starts, output_starts, sizes)


def _check_signatures(what: str, members: Sequence[int], values: Sequence[Contribution]) -> None:
    first = values[0].signature
    for device, v in zip(members, values, strict=True):
        if v.signature != first:
            raise CollectiveError(
                f"{what}: devices disagree on the operands: device {members[0]} has "
                f"{_describe(first)}, device {device} has {_describe(v.signature)}"
            )


def _describe(signature: tuple) -> str:
    return ", ".join(f"{np.dtype(t).name}{list(s)}" for t, s in signature)


# -- what each participant computes --------------------------------------------------------
# compute(instr, inputs per rank, my rank, outputs per rank (None: remote), all local)


CHUNK_MIN_ELEMENTS = 4096
"""All-reduces of fewer elements are not split into chunks: each member reduces its whole
result (the same bits, without the bookkeeping)."""


def _all_reduce(instr, inputs, rank, outputs, local) -> None:
    n = len(inputs)
    for k, out in enumerate(outputs[rank]):
        ins = [inputs[j][k] for j in range(n)]
        flat_ok = (
            local
            and n > 1
            and out.size >= CHUNK_MIN_ELEMENTS
            and all(a.flags.c_contiguous for a in ins)
            and all(o[k].flags.c_contiguous for o in outputs)
        )
        if not flat_ok:
            reduce_into(out, ins, instr)
            continue
        count = out.size
        chunk = math.ceil(count / n) if n else 0
        lo, hi = min(chunk * rank, count), min(chunk * (rank + 1), count)
        if lo == hi:
            continue
        acc = out.reshape(-1)[lo:hi]
        reduce_into(acc, [a.reshape(-1)[lo:hi] for a in ins], instr)
        for j, o in enumerate(outputs):
            if j != rank:
                o[k].reshape(-1)[lo:hi] = acc


def _all_reduce_every(instr, inputs, outputs) -> None:
    """Every member's all-reduce results at once (the last to arrive, small operands): one
    reduction into the first member's result, copied to the others. The same bits as
    chunk by chunk: every element is reduced in rank order from the identity either way."""
    n = len(inputs)
    first = outputs[0]
    for k, acc in enumerate(first):
        reduce_into(acc, [inputs[j][k] for j in range(n)], instr)
        for j in range(1, n):
            np.copyto(outputs[j][k], acc, casting="no")


def _gather_dim(instr) -> int:
    dims = instr.dimensions
    if not dims:
        raise EvaluationError(f"{instr.name}: needs dimensions={{d}}")
    return int(dims[0])


def _all_gather(instr, inputs, rank, outputs, local) -> None:
    d = _gather_dim(instr)
    for k, out in enumerate(outputs[rank]):
        at = 0
        for ins in inputs:
            x = ins[k]
            index = [slice(None)] * out.ndim
            index[d] = slice(at, at + x.shape[d])
            np.copyto(out[tuple(index)], x, casting="no")
            at += x.shape[d]


def _reduce_scatter(instr, inputs, rank, outputs, local) -> None:
    d = _gather_dim(instr)
    for k, out in enumerate(outputs[rank]):
        size = out.shape[d]
        index = [slice(None)] * out.ndim
        index[d] = slice(rank * size, (rank + 1) * size)
        reduce_into(out, [ins[k][tuple(index)] for ins in inputs], instr)


def _all_to_all(instr, inputs, rank, outputs, local) -> None:
    n = len(inputs)
    mine = outputs[rank]
    if len(mine) == n and len(instr.operands) == n and n > 1:  # tuple form
        for j, out in enumerate(mine):
            np.copyto(out, inputs[j][rank], casting="no")
        return
    d = _gather_dim(instr)
    for k, out in enumerate(mine):
        size = out.shape[d] // n
        for j in range(n):
            x = inputs[j][k]
            src = [slice(None)] * x.ndim
            src[d] = slice(rank * size, (rank + 1) * size)
            dst = [slice(None)] * out.ndim
            dst[d] = slice(j * size, (j + 1) * size)
            np.copyto(out[tuple(dst)], x[tuple(src)], casting="no")


def _ragged_all_to_all(instr, inputs, rank, outputs, local) -> None:
    """XLA's ragged-all-to-all: member s's input_offsets/send_sizes/output_offsets entries
    [r*k, (r+1)*k) (k = their length / members) say which rows of its input go to member r
    and where they land in r's result, which starts as r's `output` operand; r's
    recv_sizes[s*k + q] must equal what s sends it as its q-th piece."""
    n = len(inputs)
    mine = inputs[rank]
    (out,) = outputs[rank]
    if not np.may_share_memory(out, mine[1]):
        np.copyto(out, mine[1], casting="no")
    count = mine[2].shape[0]
    if count % n:
        raise CollectiveError(
            f"{instr.name}: {count} offsets cannot be split among {n} participants"
        )
    k = count // n
    for s, theirs in enumerate(inputs):
        x, starts, sizes, at = theirs[0], theirs[2], theirs[3], theirs[4]
        for q in range(k):
            i = rank * k + q
            start, size, dst = int(starts[i]), int(sizes[i]), int(at[i])
            expected = int(mine[5][s * k + q])
            if size != expected:
                raise CollectiveError(
                    f"{instr.name}: participant {s} sends {size} rows as piece {q} to "
                    f"participant {rank}, whose recv_sizes[{s * k + q}] says {expected}"
                )
            if size < 0 or start < 0 or start + size > x.shape[0]:
                raise CollectiveError(
                    f"{instr.name}: participant {s} sends rows [{start}, {start + size}) of "
                    f"an input with {x.shape[0]} rows"
                )
            if dst < 0 or dst + size > out.shape[0]:
                raise CollectiveError(
                    f"{instr.name}: participant {s} writes rows [{dst}, {dst + size}) of "
                    f"participant {rank}'s output, which has {out.shape[0]} rows"
                )
            np.copyto(out[dst : dst + size], x[start : start + size], casting="no")


def _broadcast(instr, inputs, rank, outputs, local) -> None:
    for out, x in zip(outputs[rank], inputs[0], strict=True):
        np.copyto(out, x, casting="no")


_COMPUTE: dict[Opcode, Callable] = {
    Opcode.ALL_REDUCE: _all_reduce,
    Opcode.ALL_REDUCE_START: _all_reduce,
    Opcode.ALL_GATHER: _all_gather,
    Opcode.ALL_GATHER_START: _all_gather,
    Opcode.REDUCE_SCATTER: _reduce_scatter,
    Opcode.ALL_TO_ALL: _all_to_all,
    Opcode.RAGGED_ALL_TO_ALL: _ragged_all_to_all,
    Opcode.COLLECTIVE_BROADCAST: _broadcast,
}
_COMPUTE_ALL: dict[Opcode, Callable] = {
    Opcode.ALL_REDUCE: _all_reduce_every,
    Opcode.ALL_REDUCE_START: _all_reduce_every,
}
"""Opcodes whose every member's results the last to arrive computes at once, when it
computes them all (instead of member by member)."""
PERFORMED = frozenset(_COMPUTE) | {Opcode.COLLECTIVE_PERMUTE, Opcode.COLLECTIVE_PERMUTE_START}
"""The opcodes DeviceCollectives.perform runs."""


def compute_alone(instr: HloInstruction, inputs: Sequence[np.ndarray], outputs) -> None:
    """Collective `instr` where this device is the only participant."""
    _COMPUTE[instr.opcode](instr, [tuple(inputs)], 0, [tuple(outputs)], True)


def permute_alone(instr: HloInstruction, me: int, inputs, outputs) -> None:
    """A collective-permute run by device `me` (an id of its pairs) on its own: raises when
    another device sends to it."""
    pairs = instr.source_target_pairs
    layout = in_place_layout(instr)
    if layout is None:
        _unique_targets(instr, pairs)
    sources = sorted({s for s, t in pairs if t == me})
    if sources and sources != [me]:
        raise EvaluationError(
            f"{instr.name}: device {me} receives from {sources}, which needs the multi-device "
            "runtime"
        )
    mine = Contribution(tuple(inputs), tuple(outputs), ())
    _permute_part(instr, layout, pairs, [me], [mine], 0)


@dataclass(frozen=True, slots=True)
class ResultParts:
    """Where a collective's pieces sit in its result: `results` is the index of the
    subtree its results fill (one array leaf per operand leaf), `operand` the subtree
    holding its operands again (start ops), `extras` the context scalars."""

    results: tuple[int, ...] = ()
    operand: tuple[int, ...] | None = None
    extras: tuple[tuple[int, ...], ...] = ()


def result_parts(instr: HloInstruction) -> ResultParts:
    """The ResultParts of collective `instr`."""
    op = instr.opcode
    if op is Opcode.ALL_GATHER_START:
        return ResultParts((1,), (0,))
    if op is Opcode.COLLECTIVE_PERMUTE_START:
        count = len(instr.shape.tuple_shapes)
        return ResultParts((1,), (0,), tuple((i,) for i in range(2, count)))
    return ResultParts()
