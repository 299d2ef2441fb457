# Running the independent thunks of one sequence at the same time.
#
# Analysis (at compile time). Every thunk declares the byte ranges it reads and writes
# (`Access`: merged (allocation, start, end) ranges, from its instruction's operand and
# result slices; a control-flow thunk's are the union of its nested sequences' plus its own
# copies) and whether it has side effects. Walking the sequence in schedule order, a thunk
# depends on every earlier thunk whose writes overlap its reads or writes (read after write,
# write after write) or whose reads overlap its writes (write after read); thunks with side
# effects depend on the previous such thunk, so they keep their order; a thunk without an
# Access is a barrier: it depends on everything before it and everything after depends on
# it. The walk keeps each allocation cut into segments, each with its last writer and the
# readers since, so a temporary slice reused many times stays one segment. Edges implied by
# others are dropped (ancestor sets as bit masks).
#
# Decision. Handing a thunk to another thread costs tens of microseconds on a loaded
# machine, so a sequence runs as a graph only when two thunks that do not depend on each
# other are both estimated to take at least MIN_OVERLAP_NS and keep to one thread each (a
# thunk that splits itself over the pool already uses the cores); otherwise (every chain,
# most small programs) it keeps the plain loop. Whether another thread helps depends on a
# core being free, which only the load at run time decides, so each execution of such a
# sequence runs as a graph or in order, whichever has been faster (thunk.GraphChoice).
# Mode "always" (tests) runs every sequence that has two independent thunks as a graph,
# every time; "off" runs none.
#
# Execution. The calling thread is one of the workers: it takes the ready thunk with the
# longest estimated path to the end, and when more thunks are ready than threads are taking
# them it submits a helper to the kernel pool (at most one fewer than the pool's workers).
# Helpers take ready thunks until none is left, then exit. Ready thunks stay in the shared
# list until some thread takes them, so a helper that no worker starts in time (a busy
# pool, or a caller that is itself a pool worker running a nested sequence) costs nothing:
# the caller runs the work itself. The caller only sleeps while no thunk is ready and some
# thunk is running on another thread, never on queued work. Only independent thunks
# overlap, so results are those of the sequential run, bit for bit. A thunk that raises
# stops the hand-out of further thunks; once the running ones finish, the caller raises the
# error of the earliest failed thunk in schedule order.

from __future__ import annotations

import os
import threading
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any

from xlapy.backends.cpu.runtime.pool import default_pool, pool_size
from xlapy.errors import XlapyError

MIN_OVERLAP_NS = 20_000.0
"""Two independent thunks must each be estimated at this many nanoseconds or more for a
sequence to run as a graph (mode "auto")."""

MODES = ("auto", "off", "always")
ENV_VAR = "XLAPY_CPU_CONCURRENCY"
"""The mode when the compile options do not name one (option `thunk_concurrency`)."""
DEFAULT_MODE = "off"
"""The mode when neither names one. Off: on the loaded 2-core machine it was measured on,
two threads got no more done than one, so "auto" gained nothing and its probes cost a few
percent (rnn_scan); measure again with $XLAPY_CPU_CONCURRENCY=auto where cores are free."""

Range = tuple[int, int, int]  # (allocation, start byte, end byte)


def concurrency_mode(options: dict[str, Any]) -> str:
    """The concurrency mode of a compile: option `thunk_concurrency`, else
    $XLAPY_CPU_CONCURRENCY, else DEFAULT_MODE."""
    mode = options.get("thunk_concurrency")
    if mode is None:
        mode = os.environ.get(ENV_VAR) or DEFAULT_MODE
    if mode is True:
        mode = "auto"
    elif mode is False:
        mode = "off"
    mode = str(mode).lower()
    if mode not in MODES:
        raise XlapyError(f"thunk_concurrency must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def merge_ranges(ranges) -> tuple[Range, ...]:
    """`ranges` sorted, with overlapping or touching ranges of one allocation joined and
    empty ones dropped."""
    out: list[list[int]] = []
    for alloc, start, end in sorted(r for r in ranges if r[2] > r[1]):
        if out and out[-1][0] == alloc and start <= out[-1][2]:
            out[-1][2] = max(out[-1][2], end)
        else:
            out.append([alloc, start, end])
    return tuple((a, s, e) for a, s, e in out)


@dataclass(frozen=True, slots=True)
class Access:
    """The memory one thunk touches: byte ranges read and written (merged), and whether it
    has side effects that must keep their order among such thunks."""

    reads: tuple[Range, ...]
    writes: tuple[Range, ...]
    ordered: bool = False

    @staticmethod
    def of(reads, writes, ordered: bool = False) -> Access:
        return Access(merge_ranges(reads), merge_ranges(writes), ordered)

    @staticmethod
    def union(parts: Sequence[Access | None], ordered: bool = False) -> Access | None:
        """Everything `parts` touch (None when any of them is unknown)."""
        if any(p is None for p in parts):
            return None
        reads = [r for p in parts for r in p.reads]  # type: ignore[union-attr]
        writes = [w for p in parts for w in p.writes]  # type: ignore[union-attr]
        ordered = ordered or any(p.ordered for p in parts)  # type: ignore[union-attr]
        return Access.of(reads, writes, ordered)


def dependencies(accesses: Sequence[Access | None]) -> list[tuple[int, ...]]:
    """For each thunk, the earlier thunks it must run after (see the file comment), with
    edges implied by other edges removed."""
    memory: dict[int, _Segments] = {}
    masks: list[int] = []  # bit p of masks[i]: thunk i depends on thunk p
    preds: list[tuple[int, ...]] = []
    last_barrier = last_ordered = -1
    for i, acc in enumerate(accesses):
        deps: set[int] = set()
        if last_barrier >= 0:
            deps.add(last_barrier)
        if acc is None:
            deps.update(range(last_barrier + 1, i))
            last_barrier = i
            memory.clear()
        else:
            if acc.ordered:
                if last_ordered >= 0:
                    deps.add(last_ordered)
                last_ordered = i
            for alloc, start, end in acc.reads:
                if alloc in memory:
                    memory[alloc].collect(start, end, deps, False)
            for alloc, start, end in acc.writes:
                if alloc in memory:
                    memory[alloc].collect(start, end, deps, True)
            deps.discard(-1)
        implied = mask = 0
        for p in deps:
            implied |= masks[p]
            mask |= masks[p] | (1 << p)
        masks.append(mask)
        preds.append(tuple(sorted(p for p in deps if not (implied >> p) & 1)))
        if acc is None:
            continue
        for alloc, start, end in acc.writes:
            memory.setdefault(alloc, _Segments()).write(start, end, i)
        for alloc, start, end in acc.reads:
            memory.setdefault(alloc, _Segments()).read(start, end, i, mask)
    return preds


class _Segments:
    """The bytes of one allocation cut into segments, each with its last writer (-1: none)
    and the readers since; `bounds[k]` starts segment k, which ends where k + 1 starts.
    Readers that a newer reader depends on are dropped: whatever waits for the newer one
    waits for them too."""

    __slots__ = ("bounds", "readers", "writer")

    def __init__(self):
        self.bounds = [0, 1 << 62]
        self.writer = [-1, -1]
        self.readers: list[tuple[int, ...]] = [(), ()]

    def _cut(self, at: int) -> int:
        """The index of the segment starting at `at`, cutting the one around it."""
        k = bisect_right(self.bounds, at) - 1
        if self.bounds[k] == at:
            return k
        self.bounds.insert(k + 1, at)
        self.writer.insert(k + 1, self.writer[k])
        self.readers.insert(k + 1, self.readers[k])
        return k + 1

    def collect(self, start: int, end: int, deps: set[int], readers: bool) -> None:
        """Add the writers of [start, end), and its readers when `readers`, to `deps`."""
        a, b = self._cut(start), self._cut(end)
        deps.update(self.writer[a:b])
        if readers:
            for rs in self.readers[a:b]:
                deps.update(rs)

    def write(self, start: int, end: int, i: int) -> None:
        a, b = self._cut(start), self._cut(end)
        del self.bounds[a + 1 : b]
        self.writer[a:b] = [i]
        self.readers[a:b] = [()]

    def read(self, start: int, end: int, i: int, mask: int) -> None:
        a, b = self._cut(start), self._cut(end)
        writer, readers = self.writer, self.readers
        for k in range(a, b):
            if writer[k] != i:
                readers[k] = (*(r for r in readers[k] if not (mask >> r) & 1), i)


def ancestor_masks(preds: Sequence[Sequence[int]]) -> list[int]:
    """Bit i of entry j is set when thunk j (transitively) depends on thunk i."""
    masks: list[int] = []
    for deps in preds:
        mask = 0
        for p in deps:
            mask |= masks[p] | (1 << p)
        masks.append(mask)
    return masks


@dataclass(frozen=True, slots=True)
class GraphPlan:
    """How a sequence runs as a graph: per thunk its number of predecessors and its
    successors; `rank` orders thunks by priority (longest estimated path to the end first,
    then schedule order) and `order` maps a rank back to the thunk; `roots` are the ranks
    of thunks with no predecessors; `share[rank]`: whether that thunk, ready while this
    thread is busy, is worth waking a helper for (its path is long enough)."""

    waiting: tuple[int, ...]
    succs: tuple[tuple[int, ...], ...]
    rank: tuple[int, ...]
    order: tuple[int, ...]
    roots: tuple[int, ...]
    share: tuple[bool, ...]

    def describe(self) -> str:
        edges = sum(len(s) for s in self.succs)
        return f"runs as a graph: {len(self.succs)} thunks, {edges} edges"


def plan_graph(
    accesses: Sequence[Access | None],
    costs: Sequence[float],
    mode: str,
    alone: Sequence[bool] | None = None,
) -> GraphPlan | None:
    """The graph plan of a sequence, or None when it should run in order (see the file
    comment for the decision). `costs`: estimated nanoseconds per thunk; `alone[i]`:
    thunk i keeps to one thread (one that splits itself over the pool gains little from
    running beside another, so it does not count towards the decision)."""
    n = len(accesses)
    if mode == "off" or n < 2:
        return None
    candidates = [
        i
        for i in range(n)
        if mode == "always" or (costs[i] >= MIN_OVERLAP_NS and (alone is None or alone[i]))
    ]
    if len(candidates) < 2:
        return None
    preds = dependencies(accesses)
    masks = ancestor_masks(preds)
    if not any(not (masks[j] >> i) & 1 for k, j in enumerate(candidates) for i in candidates[:k]):
        return None
    succs: list[list[int]] = [[] for _ in range(n)]
    for j, deps in enumerate(preds):
        for p in deps:
            succs[p].append(j)
    path = [0.0] * n
    for i in reversed(range(n)):
        path[i] = costs[i] + max((path[s] for s in succs[i]), default=0.0)
    order = sorted(range(n), key=lambda i: (-path[i], i))
    rank = [0] * n
    for r, i in enumerate(order):
        rank[i] = r
    return GraphPlan(
        tuple(len(d) for d in preds),
        tuple(tuple(s) for s in succs),
        tuple(rank),
        tuple(order),
        tuple(sorted(rank[i] for i in range(n) if not preds[i])),
        tuple(mode == "always" or path[i] >= MIN_OVERLAP_NS for i in order),
    )


def run_graph(thunks: Sequence[Any], plan: GraphPlan, ctx: Any) -> None:
    """Run `thunks` as `plan` orders them, the calling thread taking part (see the file
    comment); raises the error of the earliest thunk that failed."""
    _Run(thunks, plan, ctx).drive()


class _Run:
    """The state of one graph execution, shared by the caller and its helpers; every field
    but the constants is read and written under `lock`."""

    __slots__ = (
        "ctx",
        "failed",
        "helpers",
        "lock",
        "max_helpers",
        "order",
        "rank",
        "ready",
        "running",
        "share",
        "sleeping",
        "succs",
        "thunks",
        "waiting",
        "wake",
    )

    def __init__(self, thunks: Sequence[Any], plan: GraphPlan, ctx: Any):
        self.thunks, self.ctx = thunks, ctx
        self.succs, self.rank, self.order = plan.succs, plan.rank, plan.order
        self.share = plan.share
        self.waiting = list(plan.waiting)
        self.ready = list(plan.roots)  # a heap of ranks (sorted is a heap)
        self.running = 0
        self.helpers = 0
        self.max_helpers = max(1, pool_size() - 1)
        self.sleeping = False
        self.failed: list[tuple[int, BaseException]] = []
        self.lock = threading.Lock()
        self.wake = threading.Lock()
        self.wake.acquire()

    def drive(self) -> None:
        """The caller's loop: run ready thunks; sleep only while others run."""
        lock, wake = self.lock, self.wake
        done = -1
        while True:
            lock.acquire()
            i = self._next(done)
            if i >= 0:
                lock.release()
                done = self._run(i)
                continue
            done = -1
            if self.running == 0:
                lock.release()
                break
            self.sleeping = True
            lock.release()
            wake.acquire()
        if self.failed:
            raise min(self.failed, key=lambda f: f[0])[1]

    def help(self) -> None:
        """A helper's loop on a pool worker: run ready thunks until none is left."""
        lock = self.lock
        done = -1
        while True:
            lock.acquire()
            i = self._next(done)
            if i < 0:
                self.helpers -= 1
                if self.sleeping and self.running == 0:
                    self.sleeping = False
                    self.wake.release()
                lock.release()
                return
            lock.release()
            done = self._run(i)

    def _run(self, i: int) -> int:
        """Run thunk `i` (outside the lock); `i`, or -1 when it raised (recorded)."""
        try:
            self.thunks[i].run(self.ctx)
        except BaseException as e:
            with self.lock:
                self.failed.append((i, e))
                self.running -= 1
            return -1
        return i

    def _next(self, done: int) -> int:
        """Under the lock: retire thunk `done` (when >= 0), then take the ready thunk of the
        best rank (-1 when none is ready or a thunk failed), sharing any other ready ones."""
        ready = self.ready
        if done >= 0:
            self.running -= 1
            waiting, rank = self.waiting, self.rank
            for s in self.succs[done]:
                left = waiting[s] - 1
                waiting[s] = left
                if not left:
                    heappush(ready, rank[s])
        if not ready or self.failed:
            return -1
        i = self.order[heappop(ready)]
        self.running += 1
        if ready:
            spare = len(ready)
            if self.sleeping:
                self.sleeping = False
                self.wake.release()
                spare -= 1
            if spare > 0 and self.helpers < self.max_helpers and self.share[ready[0]]:
                try:
                    default_pool().submit(self.help)
                    self.helpers += 1
                except RuntimeError:  # the pool is shut down: this thread does the work
                    pass
        return i
