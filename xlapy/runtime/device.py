"""Devices, their memory spaces, allocators and execution workers.

Every device owns one Allocator that counts the bytes of the buffers living in its memory
spaces ("device" and "pinned_host"; on the CPU-like platforms both are host memory, kept
apart so that transfers between them are explicit and counted). Each device also owns one
worker thread that runs its executions in FIFO order, so that work enqueued on one device
completes in the order it was enqueued.

Inline execution: handing a task to the worker and waking the waiter afterwards costs tens
of microseconds, more than a small program takes to run. So `Device.start` runs a task on
the calling thread instead when the device is idle (nothing queued on the worker, nothing
running inline) and the caller allows it. Order is kept: while an inline task runs, tasks
started on the device from other threads wait in a backlog that is handed to the worker,
in order, when the inline task ends; and the worker runs nothing while one is inline.

Locking: each device has one reentrant lock, `Device.lock`, guarding everything about it
that calls change: the worker state (queued, inline, backlog), the allocator's counters and
the reference counts of the storages in its memory spaces. So one call takes it once to
check and take its inputs, count its outputs and reserve the device, and once more to let
go of the inputs and the device. It is reentrant because a buffer may be garbage collected
(dropping its storage, which takes the lock) at any allocation, also while it is held.

Taking a run back: a run handed to the worker costs two thread wake-ups (the worker's, then
the waiter's), each a scheduler slice on a loaded machine (~3 ms a run measured at load 15).
A caller that blocks on the result of an execution (`Future.result()` without a timeout)
whose run the worker has not started yet, with nothing running on the device and nothing
queued before it, takes that run back and runs it itself, as an inline run (`take_back`):
one wake-up fewer, and no overlap lost (a run the worker started while the caller was busy
stays the worker's). Each queued run is claimed exactly once, under the device's lock: by
the worker when it dequeues it, or by the caller taking it back (the worker then skips it).

Nested runs (re-entry): code that runs inside an execution (a custom call, a host
callback: `jax.pure_callback` whose function uses JAX) runs on the thread that holds the
device: its worker, or the caller of an inline run. When that code starts an execution on
the same device, queueing it would wait for ever (the device gets to it only after the
execution that waits for it), so it runs nested instead, as XLA:CPU runs it: at once,
synchronously, on that thread (`nested`), and its outputs are ready when `execute`
returns. A nested run is an ordinary run with its own inputs, outputs and temp arenas
(the backends take a fresh arena per run, so the same executable may be re-entered); it
may not donate memory another run still reads (execution.commit refuses), nor take part
in a collective with a device held by the same thread. Nesting is bounded
(MAX_NESTED_DEPTH: runaway recursion through a callback gets a clear error). What cannot
run nested still fails at once rather than hang: a wait, from the thread that holds the
device, for a result the device has yet to produce (the running execution's own outputs,
or a run queued behind it) raises RuntimeApiError (`check_not_running_here`), naming the
device and what was asked of it. Another device is reached as usual: an idle one runs
the work; one busy with a collective that waits for this device is bounded by the
collective's timeout, which names the devices it waited for.
"""

from __future__ import annotations

import collections
import os
import queue
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xlapy.runtime.errors import RuntimeApiError

if TYPE_CHECKING:
    from xlapy.runtime.client import Client

MEMORY_KINDS = ("device", "pinned_host")

MAX_NESTED_DEPTH = 16
"""How deep executions may nest on one device (a callback that runs a program whose callback
runs a program...): past it, `check_can_start` raises (runaway recursion)."""


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """An allocator's counters (bytes are those of live buffers)."""

    bytes_in_use: int
    peak_bytes_in_use: int
    num_allocs: int
    largest_alloc_size: int
    live_allocations: int
    bytes_in_use_by_kind: tuple[tuple[str, int], ...]


class Allocator:
    """Counts the memory of one device: every buffer's storage is allocated and freed here."""

    def __init__(self, lock: threading.RLock | None = None) -> None:
        self._lock = threading.RLock() if lock is None else lock
        self._in_use = 0
        self._peak = 0
        self._num_allocs = 0
        self._largest = 0
        self._live = 0
        self._by_kind = dict.fromkeys(MEMORY_KINDS, 0)
        self._counters: Any = None  # native counters in use (see use_counters)

    def allocate(self, nbytes: int, kind: str) -> None:
        with self._lock:
            self.allocate_locked(nbytes, kind)

    def free(self, nbytes: int, kind: str) -> None:
        with self._lock:
            self.free_locked(nbytes, kind)

    def allocate_locked(self, nbytes: int, kind: str) -> None:
        """`allocate` for a caller that holds the device's lock."""
        self._in_use += nbytes
        self._by_kind[kind] += nbytes
        if self._in_use > self._peak:
            self._peak = self._in_use
        self._num_allocs += 1
        if nbytes > self._largest:
            self._largest = nbytes
        self._live += 1

    def free_locked(self, nbytes: int, kind: str) -> None:
        """`free` for a caller that holds the device's lock."""
        self._in_use -= nbytes
        self._by_kind[kind] -= nbytes
        self._live -= 1

    def use_counters(self, counters: Any) -> None:
        """Keep the figures in `counters` from now on (xlapy.pjrt.native.NativeCounters:
        native memory that native code allocating and freeing buffers without this lock
        updates too, atomically): allocations and frees go to it, `stats` reads it."""
        with self._lock:
            counters.load(
                self._in_use, self._peak, self._num_allocs, self._largest, self._live,
                self._by_kind,
            )  # fmt: skip
            self.allocate_locked = counters.allocate  # type: ignore[method-assign]
            self.free_locked = counters.free  # type: ignore[method-assign]
            self._counters = counters

    def stats(self) -> MemoryStats:
        counters = self._counters
        if counters is not None:
            in_use, peak, allocs, largest, live, by_kind = counters.figures()
            return MemoryStats(in_use, peak, allocs, largest, live, tuple(by_kind.items()))
        with self._lock:
            return MemoryStats(
                self._in_use,
                self._peak,
                self._num_allocs,
                self._largest,
                self._live,
                tuple(self._by_kind.items()),
            )

    def reset_peak(self) -> None:
        with self._lock:
            if self._counters is not None:
                self._counters.reset_peak()
            self._peak = self._in_use


class MemorySpace:
    """A place buffers live: a `kind` ("device" or "pinned_host") attached to one device."""

    def __init__(self, id: int, kind: str, device: Device):
        self.id = id
        self.kind = kind
        self.device = device

    @property
    def devices(self) -> tuple[Device, ...]:
        return (self.device,)

    @property
    def client(self) -> Client:
        return self.device.client

    def __repr__(self) -> str:
        return f"MemorySpace(id={self.id}, kind={self.kind!r}, device={self.device.id})"


class _Queued:
    """A task handed to a device's worker; `completes`: the future its run completes (a
    caller waiting for it may take the run back). `taken` is set, under the device's lock,
    by whichever thread runs it: the worker or a caller that took it back."""

    __slots__ = ("completes", "taken", "task")

    def __init__(self, task: Callable[[], None], completes: object | None):
        self.task: Callable[[], None] | None = task
        self.completes = completes
        self.taken = False


class _Worker:
    """One daemon thread running tasks of one device in FIFO order: each that `claim`
    gives it (False: a caller took it back); `on_done` is called after each it ran."""

    def __init__(self, name: str, claim: Callable[[_Queued], bool], on_done: Callable[[], None]):
        self._queue: queue.SimpleQueue[_Queued | None] = queue.SimpleQueue()
        self._claim = claim
        self._on_done = on_done
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def submit(self, entry: _Queued) -> None:
        self._queue.put(entry)

    def stop(self) -> None:
        self._queue.put(None)

    def _loop(self) -> None:
        while True:
            entry = self._queue.get()
            if entry is None:
                return
            if not self._claim(entry):
                del entry  # taken back: nothing to run, nothing to hold on to
                continue
            try:
                assert entry.task is not None, "a claimed task is still there"
                entry.task()
            finally:
                del entry  # drop the finished task before blocking on the next one
                self._on_done()


_LIVE_DEVICES: weakref.WeakSet[Device] = weakref.WeakSet()
"""Every Device of the process, for the fork handlers below."""
FORK_LOCK_SECONDS = 10.0
"""How long a fork waits for each device's lock (a run holding it only briefly)."""
_held_at_fork: list[threading.RLock] = []


def _before_fork() -> None:
    # Take every device's lock (in id order) so that no other thread is inside a device's
    # bookkeeping at the fork: the child would inherit that lock held by a thread it has not.
    for device in sorted(_LIVE_DEVICES, key=lambda d: (id(d.client), d.id)):
        if device.lock.acquire(timeout=FORK_LOCK_SECONDS):
            _held_at_fork.append(device.lock)


def _release_after_fork() -> None:
    while _held_at_fork:
        _held_at_fork.pop().release()


def _after_fork_in_child() -> None:
    _release_after_fork()
    for device in list(_LIVE_DEVICES):
        device.forget_worker_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_release_after_fork,
        after_in_child=_after_fork_in_child,
    )


class Device:
    """One device of a client: id, kind, description, memory spaces, allocator, worker.

    A forked child keeps its parent's clients and devices, but not their worker threads: the
    child's first queued run starts a new worker; runs the parent had queued or was running
    at the fork stay the parent's (their results never arrive in the child)."""

    def __init__(self, client: Client, id: int, kind: str):
        self.client = client
        self.id = id
        self.kind = kind
        self.process_index = 0
        self.local_hardware_id = id
        self.lock = threading.RLock()
        """Guards the worker state, the allocator and the storages' reference counts."""
        self.allocator = Allocator(self.lock)
        self.memory_spaces = tuple(
            MemorySpace(id * len(MEMORY_KINDS) + i, k, self) for i, k in enumerate(MEMORY_KINDS)
        )
        self.inline_execution = getattr(client, "inline_execution", True)
        """Whether `start` may run a task on the calling thread when the device is idle."""
        self._worker: _Worker | None = None
        self._queued = 0  # tasks handed to the worker, not taken back, not finished
        self._inline = False  # a task is running on some caller's thread
        self._inline_thread: int | None = None  # which one
        self._backlog: list[_Queued] = []  # started while one ran inline
        self._waiting: collections.deque[_Queued] = collections.deque()
        """Tasks handed to the worker that nobody has claimed yet, oldest first."""
        self._worker_running = False  # the worker runs a task it claimed
        self._closed = False  # its client was closed: nothing new starts
        self._nested = 0  # nested runs in progress (only the thread holding the device counts)
        _LIVE_DEVICES.add(self)

    @property
    def platform(self) -> str:
        return self.client.platform

    @property
    def description(self) -> str:
        return f"{self.client.platform}:{self.id} ({self.kind}, process {self.process_index})"

    @property
    def default_memory_space(self) -> MemorySpace:
        return self.memory_spaces[0]

    def memory_space(self, kind: str) -> MemorySpace:
        """This device's memory space of `kind`."""
        for space in self.memory_spaces:
            if space.kind == kind:
                return space
        raise RuntimeApiError(
            f"device {self.id} has no memory space '{kind}'; it has {', '.join(MEMORY_KINDS)}"
        )

    def memory_stats(self) -> MemoryStats:
        """The allocator's counters for this device (all its memory spaces)."""
        return self.allocator.stats()

    def is_addressable(self) -> bool:
        return True

    def submit(self, task: Callable[[], None]) -> None:
        """Queue `task` on this device's worker thread (started on first use)."""
        with self.lock:
            self._enqueue(task)

    def start(
        self, task: Callable[[], None], inline_ok: bool = True, completes: object | None = None
    ) -> bool:
        """Start `task` after everything started on this device before it: run it now on
        the calling thread when inline execution is on, `inline_ok` and the device is idle,
        else queue it. Returns whether it reserved the device to run inline; the caller
        must then call `run_inline(task)` (it may first let go of its own locks).
        `completes`: the future the task completes, for `take_back`."""
        with self.lock:
            if inline_ok and self.reserve_inline_locked():
                return True
            self._enqueue(task, completes)
            return False

    def take_back(self, future: object) -> bool:
        """Run on the calling thread the queued task that completes `future`, when the
        worker has not started it, runs nothing, and has nothing else queued (see the
        module docstring); True once it ran. False, having touched nothing, otherwise."""
        if not self.inline_execution:
            return False
        with self.lock:
            waiting = self._waiting
            if (
                len(waiting) != 1
                or waiting[0].completes is not future
                or self._worker_running
                or self._inline
            ):
                return False
            entry = waiting.popleft()
            entry.taken = True  # the worker skips it when it comes to it
            task, entry.task = entry.task, None  # the worker's queue keeps only the shell
            self._queued -= 1
            self._inline = True
            self._inline_thread = threading.get_ident()
        assert task is not None, "an unclaimed task is still there"
        self.run_inline(task)
        return True

    def run_inline(self, task: Callable[[], None]) -> None:
        """Run a task that `start` reserved the device for, then hand the tasks started
        meanwhile to the worker."""
        try:
            task()
        finally:
            with self.lock:
                self.end_inline_locked()

    def reserve_inline_locked(self) -> bool:
        """With the lock held: reserve the idle device for a run on the calling thread (the
        caller runs it, then calls `end_inline_locked`). False when inline execution is off
        or the device is busy."""
        if self._inline or self._queued or not self.inline_execution or self._closed:
            return False
        self._inline = True
        self._inline_thread = threading.get_ident()
        return True

    def end_inline_locked(self) -> None:
        """With the lock held: end an inline run; tasks started meanwhile go to the worker."""
        self._inline = False
        self._inline_thread = None
        if self._backlog:
            backlog, self._backlog = self._backlog, []
            for queued in backlog:
                self._hand_over(queued)

    def runs_on_current_thread(self) -> bool:
        """Whether the calling thread is the one running this device's current task (its
        worker, or the caller of an inline run)."""
        ident = threading.get_ident()
        if self._inline_thread == ident:
            return True
        worker = self._worker
        return worker is not None and worker.ident == ident

    def check_can_start(self, what: str) -> None:
        """RuntimeApiError when `what` (an execution) cannot start on this device: its
        client is closed, or it would nest deeper than MAX_NESTED_DEPTH."""
        if self._closed:
            raise RuntimeApiError(
                f"{what} on device {self.id}: the client was closed (client.close()); "
                "make a new Client"
            )
        if self._nested >= MAX_NESTED_DEPTH and self.runs_on_current_thread():
            raise RuntimeApiError(
                f"{what} on device {self.id}: executions nest {self._nested} deep on that "
                f"device (a custom call or callback running a program whose custom call or "
                f"callback runs another, ...), the most there may be is MAX_NESTED_DEPTH = "
                f"{MAX_NESTED_DEPTH}; is the recursion through the callback meant to end?"
            )

    def nested(self, task: Callable[[], None]) -> None:
        """Run `task` (an execution started by the thread that holds this device, from
        inside the device's current task) at once on the calling thread (see the module
        docstring); the caller has checked the depth (`check_can_start`)."""
        self._nested += 1
        try:
            task()
        finally:
            self._nested -= 1

    def check_not_running_here(self, what: str) -> None:
        """RuntimeApiError when the calling thread runs this device's current task: `what`
        (waiting for a result the device has yet to produce: the running execution's own,
        or one of a run queued behind it) could then never happen (see the module
        docstring)."""
        if self.runs_on_current_thread():
            raise RuntimeApiError(
                f"{what} on device {self.id} was asked for from inside an execution running "
                f"on that device (a custom call or callback calling back into the runtime), "
                f"but that result comes from the running execution itself or from a run "
                f"queued behind it: the device cannot produce it before the running execution "
                f"ends, so it would wait for ever. Wait for it after the execution (executions "
                f"started from inside it run nested and are ready at once)"
            )

    def _enqueue(self, task: Callable[[], None], completes: object | None = None) -> None:
        self._hand_over(_Queued(task, completes))

    def _hand_over(self, entry: _Queued) -> None:
        if self._inline:
            self._backlog.append(entry)
            return
        if self._worker is None:
            name = f"xlapy-{self.client.platform}-{self.id}"
            self._worker = _Worker(name, self._claim, self._task_done)
        self._queued += 1
        self._waiting.append(entry)
        self._worker.submit(entry)

    def _claim(self, entry: _Queued) -> bool:
        """On the worker: whether it runs `entry` (False: a caller took it back)."""
        with self.lock:
            if entry.taken:
                return False
            entry.taken = True
            oldest = self._waiting.popleft()
            assert oldest is entry, "the worker claims tasks in the order they were queued"
            self._worker_running = True
            return True

    def _task_done(self) -> None:
        with self.lock:
            self._queued -= 1
            self._worker_running = False

    def forget_worker_after_fork(self) -> None:
        """In a forked child: the worker thread and the inline run belonged to the parent
        (only the forking thread exists here), so the device starts idle, with no worker."""
        self._worker = None
        self._queued = 0
        self._inline = False
        self._inline_thread = None
        self._backlog = []
        self._waiting = collections.deque()
        self._worker_running = False
        self._nested = 0

    def stop(self) -> None:
        """Stop the worker thread once its queued work is done (Client.close)."""
        with self.lock:
            self._closed = True
            if self._worker is not None:
                self._worker.stop()
                self._worker = None

    def __repr__(self) -> str:
        return f"Device(id={self.id}, platform={self.client.platform!r}, kind={self.kind!r})"
