"""One execution of a program on one device: argument checks, donation, dispatch.

Planning checks everything a caller can get wrong (argument count, shapes, devices,
deleted buffers, donation requests) and raises before anything is touched. Committing then
marks donated buffers, allocates the outputs, and starts the run on the device:

- donated parameter (the caller names it in `donate` and it has an alias): its buffers are
  invalidated (a parameter with any aliased leaf is donated whole); each aliased output
  takes over the input leaf's memory and the program writes the result there in place;
- aliased but not donated: copy-protection (seeds 000/001): the output gets fresh memory,
  the input is copied into it and the program runs on the copy; the caller's buffer is
  untouched;
- must-alias and not donated: DonationError;
- donated but unaliased: a DonationWarning and the buffer stays valid (an error under
  `strict_donation`).

Outputs are returned at once; the run fills them and completes their ready future, or
fails it with an ExecutionError that is raised on first use. The run happens on the
device's worker thread, or on the calling thread when the device is idle, every input is
ready and the call runs on one device (inline execution, see xlapy.runtime.device), or
nested, at once on the calling thread, when that thread is running the device's current
run (a custom call or callback calling back into the runtime: `_nested_plan`).

Dispatch cost: what can be known before a call (the parameters' leaves, which leaves are
aliased, the output leaves and their sizes, where each aliased output's memory comes
from) is computed once per executable in a CallSignature; a call then checks its buffers
against it with a few attribute reads, and takes the slow, message-building path only to
report an error. The common call (one device, every parameter one array, nothing donated,
inputs ready, a cheap program, an idle device) goes through `run_inline`: one hold of the
device's lock to check and take the inputs, count the outputs and reserve the device, the
run (untimed when the program's cost is fixed by its shapes and small), and one more hold
to let go of the inputs and the device; its outputs share the completed future. Anything
else, errors included, takes the general path (plan_call, then commit), which holds the
lock of every device of the call while it commits.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from xlapy.backends.base import CompiledProgram, LeafAlias
from xlapy.ir.shapes import Shape, ShapeIndex
from xlapy.runtime.buffer import Buffer, _Storage
from xlapy.runtime.checks import sequence as check_sequence
from xlapy.runtime.errors import DonationError, ExecutionError, RuntimeApiError, released
from xlapy.runtime.futures import COMPLETED, Future

if TYPE_CHECKING:
    from xlapy.runtime.device import Device


class DonationWarning(UserWarning):
    """A donation was requested for a parameter that no output aliases (it is not used)."""


@dataclass(frozen=True, slots=True)
class _LeafSpec:
    """One leaf of the parameters, in parameter order then pre-order."""

    param: int
    index: ShapeIndex
    shape: Shape
    is_array: bool  # False for tokens (no buffer)
    aliased: bool  # an output aliases this leaf


class CallSignature:
    """What every call of one executable shares, computed once: the parameter leaves, the
    output leaves with their sizes, and for each output leaf the position of the parameter
    leaf it aliases (None when it aliases none)."""

    def __init__(
        self,
        name: str,
        param_shapes: Sequence[Shape],
        output_shape: Shape,
        aliases: tuple[LeafAlias, ...],
    ):
        self.name = name
        self.param_shapes = tuple(param_shapes)
        self.aliases = aliases
        # How long the last run took, and how cheap runs have been: only programs known to
        # be cheap run inline (see `record_run`).
        self.last_run_seconds: float | None = None
        self.cheap_streak = 0  # runs in a row under INLINE_MAX_SECONDS
        self.streak_needed = 1  # before the next run may be inline
        self.aliased_params = frozenset(a.param_number for a in aliases)
        self.has_must_alias = any(a.must_alias for a in aliases)
        aliased_leaves = {(a.param_number, a.param_index) for a in aliases}
        leaves = []
        for p, shape in enumerate(self.param_shapes):
            for index, sub in shape.leaves():
                if sub.is_tuple:
                    continue
                leaves.append(_LeafSpec(p, index, sub, sub.is_array, (p, index) in aliased_leaves))
        self.leaves = tuple(leaves)
        self.simple = len(leaves) == len(self.param_shapes) and all(
            leaf.is_array and not leaf.index for leaf in leaves
        )
        """Every parameter is one array: argument i is leaf i."""
        position = {(leaf.param, leaf.index): i for i, leaf in enumerate(leaves)}
        alias_of = {a.output_index: a for a in aliases}
        self.output_leaves = tuple(
            (index, shape, shape.byte_size)
            for index, shape in output_shape.leaves()
            if shape.is_array
        )
        self.output_sources = tuple(
            None
            if index not in alias_of
            else position[(alias_of[index].param_number, alias_of[index].param_index)]
            for index, _, _ in self.output_leaves
        )
        self.protected = tuple(i for i, leaf in enumerate(leaves) if leaf.aliased)
        """Positions of aliased leaves: copied before the run unless donated and owned."""
        self.num_params = len(self.param_shapes)
        self.inline_checks = (
            tuple((leaf.shape.element_type, leaf.shape.dims) for leaf in leaves)
            if self.simple and not self.has_must_alias
            else None
        )
        """(element type, dims) per argument, for `run_inline`; None when it never applies."""
        self.single_output = output_shape.is_array


@dataclass(slots=True)
class CallPlan:
    """A checked execution on one device, not yet committed. `buffers` lines up with
    `signature.leaves` (None for tokens)."""

    signature: CallSignature
    device: Device
    program: CompiledProgram
    buffers: list[Buffer | None]
    donated: frozenset[int]  # parameters whose buffers the caller gives up
    collectives: Any = None  # DeviceCollectives of a multi-device execution
    completion: Future | None = None  # set by commit: done when the run is

    @property
    def name(self) -> str:
        return self.signature.name


def _where(name: str, param: int, index: ShapeIndex) -> str:
    sub = "{" + ",".join(map(str, index)) + "}" if index else ""
    return f"{name}: parameter {param}{sub}"


def _flatten(name: str, param: int, shape: Shape, arg: Any, index=()) -> Iterator[Any]:
    """The leaf buffers of argument `param` (None for tokens), checked to be Buffers."""
    if shape.is_tuple:
        if not isinstance(arg, tuple | list) or len(arg) != len(shape.tuple_shapes):
            raise RuntimeApiError(
                f"{_where(name, param, index)} expects a tuple of {len(shape.tuple_shapes)} "
                f"buffers for {shape.to_text(with_layout=False)}, got {type(arg).__name__}"
            )
        for i, (sub, item) in enumerate(zip(shape.tuple_shapes, arg, strict=True)):
            yield from _flatten(name, param, sub, item, (*index, i))
        return
    if not shape.is_array:
        yield None
        return
    if not isinstance(arg, Buffer):
        raise RuntimeApiError(
            f"{_where(name, param, index)} expects a Buffer holding "
            f"{shape.to_text(with_layout=False)}, got {type(arg).__name__} "
            "(make one with Client.buffer_from_pyval)"
        )
    yield arg


def _check_leaf(name: str, leaf: _LeafSpec, buf: Buffer, device: Device) -> None:
    where = _where(name, leaf.param, leaf.index)
    storage = buf.live_storage(where)
    owner = storage.memory_space.device
    if owner.client is not device.client:
        raise RuntimeApiError(
            f"{where}: {buf.name} belongs to another client ({owner.client!r} at "
            f"{id(owner.client):#x}) than this execution's ({device.client!r} at "
            f"{id(device.client):#x}); copy it over with to_numpy and buffer_from_pyval"
        )
    if owner is not device:
        raise RuntimeApiError(
            f"{where}: {buf.name} is on device {storage.memory_space.device.id}, but "
            f"this execution runs on device {device.id}; use copy_to_device first"
        )
    if buf.shape.dims != leaf.shape.dims or buf.dtype != leaf.shape.dtype:
        raise RuntimeApiError(
            f"{where} expects {leaf.shape.to_text(with_layout=False)}, got {buf.name}"
        )


def parameter_numbers(name: str, what: str, value: Any) -> tuple[Any, ...]:
    """`donate` / `non_donatable` as a tuple: None means none; anything but an iterable of
    parameter numbers (a bare number, a string, a flag) is a DonationError."""
    if value is None:
        return ()
    try:
        numbers = None if isinstance(value, str | bytes) else tuple(value)
    except TypeError:  # not iterable: a bare number or flag
        numbers = None
    for p in numbers if numbers is not None else (None,):
        if isinstance(p, bool | np.bool_) or not isinstance(p, int | np.integer):
            raise DonationError(
                f"{name}: {what} lists parameter numbers, got {value!r} "
                f"({type(value).__name__}); e.g. {what}=[0] names parameter 0"
            )
    assert numbers is not None
    return numbers


def plan_call(
    signature: CallSignature,
    program: CompiledProgram,
    args: Sequence[Any],
    device: Device,
    donate: Sequence[int],
    non_donatable: Sequence[int],
    strict_donation: bool,
) -> CallPlan:
    """Check one device's arguments and donation request; raise before touching anything."""
    name = signature.name
    device.check_can_start(f"executing {name}")
    check_sequence(args, f"{name}: the arguments of device {device.id}")
    if len(args) != len(signature.param_shapes):
        raise RuntimeApiError(
            f"{name} takes {len(signature.param_shapes)} arguments, {len(args)} were given"
        )
    if signature.simple:
        buffers = list(args)
        for leaf, buf in zip(signature.leaves, buffers, strict=True):
            storage = buf.storage if type(buf) is Buffer else None
            if (
                storage is None
                or storage.memory_space.device is not device
                or buf.shape.element_type is not leaf.shape.element_type
                or buf.shape.dims != leaf.shape.dims
            ):
                next(_flatten(name, leaf.param, leaf.shape, buf))
                _check_leaf(name, leaf, buf, device)
    else:
        buffers = []
        for p, (shape, arg) in enumerate(zip(signature.param_shapes, args, strict=True)):
            buffers.extend(_flatten(name, p, shape, arg))
        for leaf, buf in zip(signature.leaves, buffers, strict=True):
            if buf is not None:
                _check_leaf(name, leaf, buf, device)
    if donate or non_donatable or signature.has_must_alias:
        donated = _donation(signature, buffers, donate, non_donatable, strict_donation)
    else:
        donated = frozenset()
    return CallPlan(signature, device, program, buffers, donated)


def _donation(signature: CallSignature, buffers, donate, non_donatable, strict) -> frozenset:
    name, num_params = signature.name, len(signature.param_shapes)
    requested: list[int] = []
    for p in donate:
        if isinstance(p, bool | np.bool_) or not isinstance(p, int | np.integer):
            raise DonationError(
                f"{name}: donate lists parameter numbers, got {p!r} "
                f"({type(p).__name__}); e.g. donate=[0] donates parameter 0"
            )
        if not 0 <= p < num_params:
            raise DonationError(
                f"{name}: donate names parameter {p}, which does not exist "
                f"(the program has {num_params})"
            )
        if p in requested:
            raise DonationError(f"{name}: parameter {p} is donated twice in one call")
        requested.append(int(p))
    for p in non_donatable:
        if isinstance(p, bool | np.bool_) or not isinstance(p, int | np.integer):
            raise DonationError(f"{name}: non_donatable lists parameter numbers, got {p!r}")
        if not 0 <= p < num_params:
            raise DonationError(
                f"{name}: non_donatable names parameter {p}, which does not exist "
                f"(the program has {num_params})"
            )
    vetoed = {int(p) for p in non_donatable}
    donated = set()
    for p in requested:
        if p in vetoed:
            continue
        if p not in signature.aliased_params:
            msg = (
                f"{name}: parameter {p} was donated but no output aliases it, so its "
                "buffer cannot be reused (it stays valid)"
            )
            if strict:
                raise DonationError(msg + "; strict_donation is on")
            warnings.warn(msg, DonationWarning, stacklevel=4)
            continue
        donated.add(p)
    for alias in signature.aliases:
        if alias.must_alias and alias.param_number not in donated:
            why = (
                "is listed in non_donatable" if alias.param_number in vetoed else "was not donated"
            )
            raise DonationError(
                f"{name}: parameter {alias.param_number} must alias output "
                f"{{{','.join(map(str, alias.output_index))}}} (must-alias) but {why}"
            )
    seen: dict[int, _LeafSpec] = {}
    for leaf, buf in zip(signature.leaves, buffers, strict=True):
        if buf is None:
            continue
        first = seen.get(id(buf))
        if first is not None and (leaf.param in donated or first.param in donated):
            both_donated = leaf.param in donated and first.param in donated
            what = "donated twice" if both_donated else "donated and also passed again"
            raise DonationError(
                f"{name}: {buf.name} is {what} (as {_where(name, first.param, first.index)} "
                f"and {_where(name, leaf.param, leaf.index)}); pass a copy instead"
            )
        seen[id(buf)] = leaf
        if leaf.param in donated and buf.has_external_references:
            raise DonationError(
                f"{_where(name, leaf.param, leaf.index)}: {buf.name} cannot be donated while "
                "an external reference to it is held"
            )
    return frozenset(donated)


def commit(plans: Sequence[CallPlan], whole_execution: bool = False) -> list[list[Buffer]]:
    """Donate, allocate outputs and start every planned execution; return their outputs.
    A cheap single-device call on an idle device with ready inputs runs inline before
    returning; so does the last device of a cheap multi-device execution when `plans` are
    all its local devices (`whole_execution`: its peers are started first, so the caller's
    thread takes the last device's part of the collectives, saving a thread hand-off at
    either end; a lone `execute_sharded` plan never runs inline, as the caller may have yet
    to start its peers). The devices' locks are held (taken in device order) while
    committing."""
    if len(plans) == 1:
        locks = [plans[0].device.lock]
    else:
        devices = sorted({p.device.id: p.device for p in plans}.items())
        locks = [device.lock for _, device in devices]
    for lock in locks:
        lock.acquire()
    try:
        for plan in plans:  # a buffer may have changed since planning (another thread)
            _recheck(plan)
        nested = _nested_plan(plans)
        held = None  # (device, task) of the nested run
        results = []
        tasks = []
        last = len(plans) - 1
        for i, plan in enumerate(plans):
            outputs, task, inputs_done = _commit_one(plan)
            results.append(outputs)
            if plan is nested:
                held = (plan.device, task)
                continue
            inline_ok = (
                nested is None  # the caller's thread runs the nested part of the collectives
                and inputs_done
                and i == last
                and (plan.collectives is None or whole_execution)
                and (_is_cheap(plan.signature) or _fixed_cheap(plan.program))
            )
            # a caller waiting for a lone device's outputs may take its queued run back
            completes = plan.completion if plan.collectives is None else None
            tasks.append((plan.device, task, inline_ok, completes))
        inline = None
        for device, task, inline_ok, completes in tasks:
            if device.start(task, inline_ok, completes):
                inline = (device, task)
    finally:
        for lock in reversed(locks):
            lock.release()
    if held is not None:
        held[0].nested(held[1])
    elif inline is not None:
        inline[0].run_inline(inline[1])
    return results


def _nested_plan(plans: Sequence[CallPlan]) -> CallPlan | None:
    """The plan whose device the calling thread holds (it is called from inside that
    device's current run: a custom call or callback), which then runs nested on this
    thread (see xlapy.runtime.device); None when there is none. Raises, before anything is
    touched, what a nested run cannot do: run two devices' parts of one execution on one
    thread (their collectives would wait for each other), or donate memory that another
    run of the device (the one running, or one queued behind it) still reads."""
    held = [plan for plan in plans if plan.device.runs_on_current_thread()]
    if not held:
        return None
    plan = held[0]
    if len(held) > 1:
        ids = ", ".join(str(p.device.id) for p in held)
        raise RuntimeApiError(
            f"executing {plan.name} on devices {ids} from inside executions running on those "
            "devices (custom calls or callbacks calling back into the runtime): their parts "
            "would have to run nested on one thread, and their collectives would wait for "
            "each other for ever"
        )
    signature = plan.signature
    for leaf, buf in zip(signature.leaves, plan.buffers, strict=True):
        if buf is None or leaf.param not in plan.donated:
            continue
        storage = buf.storage
        if storage is not None and (storage.refs > 1 or storage.holds):
            raise DonationError(
                f"{_where(plan.name, leaf.param, leaf.index)}: {buf.name} cannot be donated "
                f"to an execution nested in one running on device {plan.device.id} (started "
                "from its custom call or callback): another run of the device (the running "
                "one, or one queued behind it) or a host read still uses its memory; pass a "
                "copy, or do not donate it"
            )
    return plan


def run_inline(
    signature: CallSignature, program: CompiledProgram, device: Device, args: Sequence[Any]
) -> list[Buffer] | None:
    """Run the common call on the calling thread and return its outputs: one device, every
    parameter one array buffer of the right shape on `device`, nothing donated, every input
    ready, the program known to be cheap and the device idle. Returns None, having touched
    nothing, when any of that does not hold; the general path then runs the call (or
    raises the error it finds)."""
    checks = signature.inline_checks
    if checks is None or not device.inline_execution or type(args) not in (list, tuple):
        return None
    if len(args) != signature.num_params:
        return None
    fixed = program.fixed_cost_seconds
    untimed = fixed is not None and fixed < FIXED_CHEAP_SECONDS  # cheap whatever the data
    if not untimed and signature.cheap_streak < signature.streak_needed:
        return None
    storages, values = [], []
    for buf, (element_type, dims) in zip(args, checks):
        if type(buf) is not Buffer:
            return None
        storage, shape, ready = buf.storage, buf.shape, buf.contents_ready
        if (
            storage is None
            or storage.device is not device
            or shape.element_type is not element_type
            or shape.dims != dims
            or not ready.done()
            or ready.exception() is not None
        ):
            return None
        storages.append(storage)
        values.append(storage.array)
    space = device.default_memory_space
    with device.lock:
        for buf, storage in zip(args, storages):
            if buf.storage is not storage:  # deleted or donated by another thread
                return None
        if not device.reserve_inline_locked():
            return None
        for storage in storages:
            storage.refs += 1
        allocate, kind = device.allocator.allocate_locked, space.kind
        for _, _, nbytes in signature.output_leaves:
            allocate(nbytes, kind)
        temp = program.temp_allocation_bytes
        if temp:
            allocate(temp, kind)
    arrays: Sequence[np.ndarray | None]
    try:
        for i in signature.protected:
            values[i] = np.array(values[i], copy=True)  # copy-protection
        if untimed:
            out = program.run(values, signature.aliased_params)
        else:
            start, start_cpu = time.perf_counter(), time.thread_time()
            try:
                out = program.run(values, signature.aliased_params)
            finally:
                wall = time.perf_counter() - start
                _record_run(signature, wall, time.thread_time() - start_cpu)
        arrays = (out,) if signature.single_output else _output_arrays(signature, out)
        ready = COMPLETED
    except (KeyboardInterrupt, SystemExit):  # the caller's own: raised, nothing kept
        with device.lock:
            for _, _, nbytes in signature.output_leaves:
                device.allocator.free_locked(nbytes, kind)
        raise
    except BaseException as e:  # every failure travels to the outputs
        arrays = (None,) * len(signature.output_leaves)
        ready = Future.failed(_failure(signature.name, device, e))
    finally:
        with device.lock:
            if temp:
                device.allocator.free_locked(temp, kind)
            for storage in storages:
                storage.release_locked()
            device.end_inline_locked()
    return [
        Buffer(shape, _Storage(space, nbytes, array=array, counted=True), ready)
        for (_, shape, nbytes), array in zip(signature.output_leaves, arrays, strict=True)
    ]


def _output_arrays(signature: CallSignature, out: Any) -> list[Any]:
    arrays = []
    for index, _, _ in signature.output_leaves:
        leaf = out
        for i in index:
            leaf = leaf[i]
        arrays.append(leaf)
    return arrays


INLINE_MAX_SECONDS = 5e-3
"""Programs whose last run took less than this may run inline on the caller's thread: for
them the hand-off to the device worker (two thread wake-ups: 50-170 us per call measured on
a shared 2-core machine, 100 us for a 4 MiB relu that itself takes 110 us) costs more than
the overlap it could buy, or a noticeable share of it. A program runs asynchronously until
it has been timed once, and always when it takes longer (see `_record_run`)."""

INLINE_MAX_WALL_SECONDS = 8 * INLINE_MAX_SECONDS
"""A run is slow when its thread's CPU time reaches INLINE_MAX_SECONDS or its wall time
reaches this. Wall time alone also counts the time the OS gave the core to other processes
and the waits for the GIL: on a loaded machine a 20 us program was timed at 4, 8 and 27 ms
wall (whole scheduler ticks) a few times per thousand runs, which backed every program off
inline execution for good. CPU time alone would miss a run that waits (a blocking custom
call): past this wall time it counts as slow whatever its CPU time."""

INLINE_BACKOFF = 8
"""After a run over INLINE_MAX_SECONDS, the cheap runs in a row a program needs before it
runs inline again are multiplied by this (up to INLINE_MAX_STREAK)."""
INLINE_MAX_STREAK = 4096


def _record_run(signature: CallSignature, seconds: float, cpu_seconds: float) -> None:
    """Note a run's wall and CPU time (see INLINE_MAX_WALL_SECONDS). A program runs inline
    once `streak_needed` runs in a row were cheap (1 at first). A run that turns out slow
    (its time depends on its data: a while loop, a custom call) once the program was taken
    for cheap may have blocked its caller; so each such run multiplies the cheap runs
    needed by INLINE_BACKOFF. A program alternating cheap and slow runs thus blocks its
    callers ever more rarely (after 1, 8, 64, ... cheap runs, which run asynchronously
    meanwhile), while a one-off hiccup costs a cheap program a few asynchronous calls, not
    inline execution for good."""
    signature.last_run_seconds = seconds
    if cpu_seconds < INLINE_MAX_SECONDS and seconds < INLINE_MAX_WALL_SECONDS:
        signature.cheap_streak += 1
        return
    if _is_cheap(signature):  # it was taken for cheap: callers may have been blocked
        needed = signature.streak_needed * INLINE_BACKOFF
        signature.streak_needed = min(needed, INLINE_MAX_STREAK)
    signature.cheap_streak = 0


def _is_cheap(signature: CallSignature) -> bool:
    return signature.cheap_streak >= signature.streak_needed


FIXED_CHEAP_SECONDS = INLINE_MAX_SECONDS / 10
"""A program whose run time is fixed by its shapes (`CompiledProgram.fixed_cost_seconds`)
and estimated under this runs inline from its first call, and its inline runs are not
timed (two clock reads each side, ~2 us of a ~20 us call): no data can make it slow. The
margin of 10 covers the estimate's error."""


def _fixed_cheap(program: CompiledProgram) -> bool:
    fixed = program.fixed_cost_seconds
    return fixed is not None and fixed < FIXED_CHEAP_SECONDS


def _recheck(plan: CallPlan) -> None:
    signature = plan.signature
    for leaf, buf in zip(signature.leaves, plan.buffers, strict=True):
        if buf is None:
            continue
        if buf.storage is None:
            buf.live_storage(_where(plan.name, leaf.param, leaf.index))
        if leaf.param in plan.donated and buf.has_external_references:
            raise DonationError(
                f"{_where(plan.name, leaf.param, leaf.index)}: {buf.name} "
                "cannot be donated while an external reference to it is held"
            )


def _commit_one(plan: CallPlan):
    """(outputs, the task that runs the plan, whether every input is ready)."""
    signature, donated = plan.signature, plan.donated
    inputs_ready: list[Future] = []
    storages: list[_Storage | None] = []
    inputs_done = True
    for leaf, buf in zip(signature.leaves, plan.buffers, strict=True):
        if buf is None:
            storages.append(None)
            continue
        ready = buf.contents_ready
        inputs_ready.append(ready)
        if not ready.done():
            inputs_done = False
        held = buf.donate() if leaf.param in donated else buf.live_storage("execute").acquire()
        storages.append(held)
    space = plan.device.default_memory_space
    out_storages: list[_Storage] = []
    in_place: set[int] = set()
    for (_, _, nbytes), source in zip(
        signature.output_leaves, signature.output_sources, strict=True
    ):
        storage = None
        if source is not None and signature.leaves[source].param in donated:
            src = storages[source]
            if src is not None and src.owned and not src.holds:  # no host read in progress
                # The output takes over the donated reference; the run keeps one of its
                # own (the device lock is held), so that deleting the output before the run
                # has read its input cannot free the input under it.
                src.refs += 1
                storage = src
                in_place.add(id(src))
        if storage is None:
            storage = _Storage(space, nbytes)
        out_storages.append(storage)
    ready = Future(plan.device)  # waits on it from the device's own thread: re-entry
    outputs = [
        Buffer(shape, storage, ready)
        for (_, shape, _), storage in zip(signature.output_leaves, out_storages, strict=True)
    ]
    plan.buffers = []  # the plan must not keep the argument buffers alive
    plan.completion = ready

    def task() -> None:
        _run(plan, storages, inputs_ready, out_storages, in_place, ready)

    return outputs, task, inputs_done


def _run(plan: CallPlan, storages, inputs_ready, out_storages, in_place, ready: Future) -> None:
    error: BaseException | None = None
    try:
        for fut in inputs_ready:
            failed = fut.exception()
            if failed is not None:
                raise ExecutionError(f"an input of {plan.name} failed: {failed}") from failed
        signature = plan.signature
        temp = _take_temp(plan)
        start, start_cpu = time.perf_counter(), time.thread_time()
        try:
            values = _argument_values(plan, storages, in_place)
            if plan.collectives is None:
                out = plan.program.run(values, signature.aliased_params)
            else:
                out = plan.program.run(values, signature.aliased_params, plan.collectives)
        finally:
            wall = time.perf_counter() - start
            # waiting for peers in a collective is the run's own time, not the OS's
            cpu = time.thread_time() - start_cpu if plan.collectives is None else wall
            _record_run(signature, wall, cpu)
            _give_temp(plan, temp)
        arrays = (out,) if signature.single_output else _output_arrays(signature, out)
        for storage, array in zip(out_storages, arrays, strict=True):
            storage.array = array
    except BaseException as e:  # every failure travels to the outputs
        error = _failure(plan.name, plan.device, e)
        if plan.collectives is not None:  # peers waiting for this device fail too
            plan.collectives.run.abort(plan.device.id, error)
    finally:  # inputs are let go before anyone waiting on the outputs wakes up
        with plan.device.lock:
            for storage in storages:
                if storage is not None:
                    storage.release_locked()
        storages.clear()
    if error is not None:
        ready.set_exception(error)
    else:
        ready.set_result(None)


def _take_temp(plan: CallPlan) -> int:
    """Count the temp arenas of the run in the device's allocator (as XLA allocates an
    execution's temp buffer from the device allocator); returns their bytes."""
    temp = plan.program.temp_allocation_bytes
    if temp:
        plan.device.allocator.allocate(temp, plan.device.default_memory_space.kind)
    return temp


def _give_temp(plan: CallPlan, temp: int) -> None:
    if temp:
        plan.device.allocator.free(temp, plan.device.default_memory_space.kind)


def _failure(name: str, device: Device, error: BaseException) -> BaseException:
    """What the outputs of a failed run raise: the error wrapped in an ExecutionError
    (KeyboardInterrupt and SystemExit as they are), tracebacks released (errors.released)."""
    if not isinstance(error, ExecutionError | KeyboardInterrupt | SystemExit):
        error = _wrapped(name, device, error)
    return released(error)


def _wrapped(name: str, device: Device, error: BaseException) -> ExecutionError:
    wrapped = ExecutionError(
        f"execution of {name} on device {device.id} failed: {type(error).__name__}: {error}"
    )
    wrapped.__cause__ = error
    return wrapped


def _argument_values(
    plan: CallPlan, storages: list[_Storage | None], in_place: set[int]
) -> list[Any]:
    signature = plan.signature
    values = [None if s is None else s.array for s in storages]
    for i in signature.protected:
        if id(storages[i]) not in in_place:  # an output took over this memory
            values[i] = np.array(values[i], copy=True)  # copy-protection
    if signature.simple:
        return values
    flat: dict[int, dict[ShapeIndex, Any]] = {}
    for leaf, value in zip(signature.leaves, values, strict=True):
        flat.setdefault(leaf.param, {})[leaf.index] = value
    return [_rebuild(shape, flat.get(p, {})) for p, shape in enumerate(signature.param_shapes)]


def _rebuild(shape: Shape, leaves: dict[ShapeIndex, Any], index: ShapeIndex = ()) -> Any:
    if shape.is_tuple:
        return tuple(_rebuild(s, leaves, (*index, i)) for i, s in enumerate(shape.tuple_shapes))
    if shape.is_token:
        from xlapy.backends.interpreter.registry import TOKEN

        return TOKEN
    return leaves[index]
