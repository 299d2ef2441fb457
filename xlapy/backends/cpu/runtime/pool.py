# The process's worker threads: how many (the cores this process may run on), the pool that
# kernels, dots and the graph executor split work over, the block runner that never waits on
# queued work (a busy pool degrades to the calling thread doing everything), and the cost
# model that decides how many blocks a library thunk is cut into (below).

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# Worker threads for the process: the cores it may use (`os.sched_getaffinity`, or
# $XLAPY_NUM_THREADS), the count host.py gives the library calls too.
from xlapy.backends.host import available_cores as pool_size


@functools.cache
def default_pool() -> ThreadPoolExecutor:
    """The process-wide worker pool (`pool_size()` threads)."""
    return ThreadPoolExecutor(max_workers=pool_size(), thread_name_prefix="xlapy-cpu")


def even_blocks(extent: int, parts: int) -> list[tuple[int, int]]:
    """[0, extent) cut into at most `parts` non-empty blocks of nearly equal size."""
    bounds = [extent * k // parts for k in range(parts + 1)]
    return [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]


def run_blocks(body, blocks: Sequence[tuple[int, int]]) -> None:
    """`body(lo, hi)` for every block: the first on the calling thread, the others on the
    pool. A block no worker has started by the time the caller is done is taken back and
    run by the caller, so a busy pool (or a caller that is itself a pool worker) never
    waits on queued work: with the other cores taken the caller does everything itself,
    at the price of one submission per block."""
    if not blocks:
        return
    pool = default_pool()
    futures = [pool.submit(body, lo, hi) for lo, hi in blocks[1:]]
    try:
        body(*blocks[0])
    except BaseException:
        for f in futures:
            if not f.cancel():
                f.exception()
        raise
    for f, (lo, hi) in zip(futures, blocks[1:], strict=True):
        if f.cancel():
            body(lo, hi)
        else:
            f.result()


# The split decision for library thunks (NumPy passes, BLAS loops), after XLA:CPU's parallel
# task assigner: a thunk's work is estimated from the bytes it streams (and flops where it
# has them), and it is cut into as many blocks as the pool has threads, but never into
# blocks cheaper than MIN_BLOCK_TASKS hand-offs to the pool. Both sides of the comparison
# are measured once per process, on the machine it runs on: the cost of handing one block
# to the pool (run_blocks over empty blocks) and the time a NumPy pass takes per byte (a
# large copy), so the same thresholds fit a loaded 2-core machine and a quiet 16-core one.

MIN_BLOCK_TASKS = 4
"""A block must be estimated at this many pool hand-offs (task_seconds) or more."""


@functools.cache
def task_seconds() -> float:
    """Seconds one block handed to the pool costs (submission, wake-up, result), measured
    once: the best of a few run_blocks over pool_size() empty blocks, per extra block."""
    parts = pool_size()
    if parts < 2:
        return 0.0
    blocks = [(i, i + 1) for i in range(parts)]
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        run_blocks(lambda lo, hi: None, blocks)
        best = min(best, time.perf_counter() - start)
    return best / (parts - 1)


@functools.cache
def byte_seconds() -> float:
    """Seconds a NumPy pass takes per byte it streams (read or written), measured once on a
    copy of 4 MiB (the best of three)."""
    src = np.ones(1 << 20, np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return best / (2 * src.nbytes)


def split_parts(units: int, seconds: float) -> int:
    """How many blocks a thunk of `units` independent units and about `seconds` of work on
    one thread is cut into: at most one per pool thread and per unit, none estimated below
    MIN_BLOCK_TASKS hand-offs to the pool."""
    threads = pool_size()
    if threads < 2 or units < 2:
        return 1
    per_task = MIN_BLOCK_TASKS * task_seconds()
    return max(1, min(threads, units, int(seconds / per_task) if per_task > 0 else threads))


def split_over(units: int, seconds: float, body) -> None:
    """`body(lo, hi)` over [0, units), cut into split_parts(units, seconds) blocks run as
    run_blocks runs them (whole on the calling thread when that is one block)."""
    parts = split_parts(units, seconds)
    if parts == 1:
        body(0, units)
        return
    run_blocks(body, even_blocks(units, parts))
