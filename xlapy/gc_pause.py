"""Python's cyclic garbage collector paused while the compiler builds and drops object graphs.

A compile makes and throws away hundreds of thousands of small objects in reference cycles
(instructions and their use-lists, fused computations, trial modules of the memory-plan
choice, analyses, pickled program images). Their growth keeps triggering full collections,
each a walk of every object the process holds, again and again: on the largest outside
training steps a sixth of the main thread's compile CPU (benchmarks/RESULTS.md, eleventh
session). Paused, the collector does that work once, at its next automatic run after the
compile; the cycles dropped meanwhile (a few MB on a BERT training step) wait until then.

Pauses nest and overlap across threads: the collector is resumed when the last overlapping
pause ends, and only if it was enabled when the first began (a caller that turned it off
keeps it off)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.Lock()
_pauses = 0  # pauses in progress, in any thread
_resume = False  # whether the collector was enabled when the first of them began


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector paused for the duration (see the module's docstring)."""
    global _pauses, _resume
    with _LOCK:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _LOCK:
            _pauses -= 1
            if _pauses == 0 and _resume:
                gc.enable()
