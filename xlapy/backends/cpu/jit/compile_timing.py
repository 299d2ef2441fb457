# Where a CPU compile's time goes: the breakdown `xlapy bench -v` prints.
#
# While `recording()` is active, the compiler's phases (parsing, HLO passes, the schedule and
# memory-plan choice, buffer assignment, lowering, IR emission, LLVM's parse, optimization and
# code generation, object loading, cache writes, the program image) add their thread CPU time
# and wall time to one process-wide record. Phases nest: time inside a nested phase counts for
# it alone, not for the phase around it, so the phases of one thread add up to the time that
# thread spent in them. LLVM runs on the compile pool's threads, beside the main thread, so
# its figures are per thread too: their sum can exceed the wall time of the compile. Python's
# cyclic garbage collector counts as a phase of its own wherever a collection runs (the one
# after the compile, when the compiler resumes the collector it paused, walks everything the
# compile made: xlapy/gc_pause.py). When no recording is active, `phase` costs one global
# read.

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class PhaseTime:
    """One phase's totals on one side (the main thread or the pool's threads): thread CPU
    seconds, wall seconds, times entered."""

    cpu: float = 0.0
    wall: float = 0.0
    count: int = 0


@dataclass
class CompileTimes:
    """The phases of the compiles run while recording (see the module comment), keyed by
    (side, phase): side "main" for the main thread, "pool" for any other thread."""

    phases: dict[tuple[str, str], PhaseTime] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    """(Reentrant: a collection, and so its phase, can start inside `add`.)"""

    def add(self, name: str, cpu: float, wall: float, entered: bool) -> None:
        main = threading.current_thread() is threading.main_thread()
        with self.lock:
            entry = self.phases.setdefault(("main" if main else "pool", name), PhaseTime())
            entry.cpu += cpu
            entry.wall += wall
            entry.count += entered

    def summary(self, wall: float, process_cpu: float) -> str:
        """The breakdown as text: the main thread's phases, then the pool's, most CPU first;
        `wall` and `process_cpu`: the whole compile's."""
        lines = [f"cold compile: {wall:.3f} s wall, {process_cpu:.3f} s process CPU (all threads)"]
        for side, title in (("main", "main thread"), ("pool", "compile pool (LLVM)")):
            rows = [(name, p) for (where, name), p in self.phases.items() if where == side]
            if not rows:
                continue
            cpu = sum(p.cpu for _, p in rows)
            lines.append(f"  {title}: {cpu:.3f} s CPU in these phases (CPU s, wall s, times):")
            for name, p in sorted(rows, key=lambda r: -r[1].cpu):
                lines.append(f"    {p.cpu:8.3f} {p.wall:8.3f} {p.count:6d}  {name}")
            if side == "main":
                rest = wall - sum(p.wall for _, p in rows)
                lines.append(f"    {'':8} {rest:8.3f} {'':6}  (main thread outside these phases)")
        return "\n".join(lines)


_current: CompileTimes | None = None
_stacks = threading.local()
GARBAGE_COLLECTION = "Python garbage collection"


@contextlib.contextmanager
def recording() -> Iterator[CompileTimes]:
    """Record the phases of the compiles run inside the block (one recording at a time)."""
    global _current
    if _current is not None:
        raise RuntimeError("a compile-time recording is already active")
    times = _current = CompileTimes()
    gc.callbacks.append(_collection)
    try:
        yield times
    finally:
        gc.callbacks.remove(_collection)
        _current = None


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Count the block's time for phase `name` (while recording; see the module comment)."""
    times = _current
    if times is None:
        yield
        return
    _enter(times, name)
    try:
        yield
    finally:
        _leave(times)


def _enter(times: CompileTimes, name: str) -> None:
    stack: list[list] = getattr(_stacks, "stack", None) or []
    _stacks.stack = stack
    now = (time.thread_time(), time.perf_counter())
    if stack:  # the phase around this one stops counting until this one ends
        outer = stack[-1]
        times.add(outer[0], now[0] - outer[1], now[1] - outer[2], False)
    stack.append([name, *now])


def _leave(times: CompileTimes) -> None:
    stack = _stacks.stack
    name, cpu0, wall0 = stack.pop()
    end = (time.thread_time(), time.perf_counter())
    times.add(name, end[0] - cpu0, end[1] - wall0, True)
    if stack:
        stack[-1][1:] = list(end)


def _collection(event: str, info: dict) -> None:
    """gc.callbacks entry: a collection is a phase of the thread that runs it."""
    times = _current
    if times is None:
        return
    if event == "start":
        _enter(times, GARBAGE_COLLECTION)
    elif getattr(_stacks, "stack", None) and _stacks.stack[-1][0] == GARBAGE_COLLECTION:
        _leave(times)
