# The process's worker threads: how many (the cores this process may run on), the pool that
# kernels, dots and the graph executor split work over, the block runner that never waits on
# work nobody started (a busy pool degrades to the calling thread doing everything), and the
# cost model that decides how many blocks a library thunk is cut into (below).
#
# run_blocks hands the pool a few helper tasks, not one task per block: the caller and the
# helpers claim blocks from one shared counter, first come first served, so a helper that a
# loaded machine starts late finds the blocks taken and returns at once, and the caller only
# ever waits for blocks some thread has started (more blocks than threads keep that last wait
# short). That wait has a time limit (BLOCK_WAIT_SECONDS) past which it fails with an error
# that names the block and the thread running it, instead of hanging.

from __future__ import annotations

import functools
import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

# Worker threads for the process: the cores it may use (`os.sched_getaffinity`, or
# $XLAPY_NUM_THREADS), the count host.py gives the library calls too.
from xlapy.backends.host import available_cores as pool_size
from xlapy.errors import XlapyError

BLOCK_WAIT_SECONDS = 600.0
"""The longest run_blocks waits for a block another thread started before it fails with a
PoolTimeoutError naming the block (a block that never ends is a bug, not a slow kernel)."""
BLOCKS_PER_THREAD = 4
"""split_parts cuts a large thunk into up to this many blocks per pool thread, so threads that
start late or run slow leave their share to the others."""


class PoolTimeoutError(XlapyError):
    """A block of a split thunk did not finish within BLOCK_WAIT_SECONDS."""


_pools: dict[int, ThreadPoolExecutor] = {}  # by the process id that made it
_pools_lock = threading.Lock()


def default_pool() -> ThreadPoolExecutor:
    """The process-wide worker pool (`pool_size()` threads). A forked child gets its own:
    the parent's threads do not exist in it."""
    pid = os.getpid()
    pool = _pools.get(pid)
    if pool is not None:
        return pool
    with _pools_lock:
        if pid not in _pools:
            _pools.clear()  # a parent's pool (after fork): its threads are gone
            _pools[pid] = ThreadPoolExecutor(
                max_workers=pool_size(), thread_name_prefix="xlapy-cpu"
            )
        return _pools[pid]


def even_blocks(extent: int, parts: int) -> list[tuple[int, int]]:
    """[0, extent) cut into at most `parts` non-empty blocks of nearly equal size."""
    bounds = [extent * k // parts for k in range(parts + 1)]
    return [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]


class _Blocks:
    """One run_blocks call: its blocks, the shared claim counter, the blocks started and
    finished, the first error, and where each running block runs (for the timeout)."""

    __slots__ = ("blocks", "body", "done", "error", "finished", "lock", "next", "running")

    def __init__(self, body: Callable[[int, int], object], blocks: Sequence[tuple[int, int]]):
        self.body, self.blocks = body, blocks
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)
        self.next = 0  # the next block to claim
        self.finished = 0  # blocks claimed and ended (well or not)
        self.error: BaseException | None = None
        self.running: dict[int, str] = {}  # block index -> thread name

    def work(self) -> None:
        """Claim and run blocks until none is left (or one failed)."""
        blocks, body, lock = self.blocks, self.body, self.lock
        name = threading.current_thread().name
        while True:
            with lock:
                i = self.next
                if i >= len(blocks) or self.error is not None:
                    return
                self.next = i + 1
                self.running[i] = name
            try:
                body(*blocks[i])
            except BaseException as e:
                with lock:
                    if self.error is None:
                        self.error = e
                    self._end(i)
                return
            with lock:
                self._end(i)

    def _end(self, i: int) -> None:
        del self.running[i]
        self.finished += 1
        if self.finished == self.next and not self.running:
            self.done.notify_all()

    def wait(self) -> None:
        """Wait until every started block has ended (none is left to claim: the caller ran
        `work` to its end), then raise the first block's error if one failed."""
        deadline = time.monotonic() + BLOCK_WAIT_SECONDS
        with self.lock:
            while self.running:
                left = deadline - time.monotonic()
                if left <= 0:
                    i, where = min(self.running.items())
                    lo, hi = self.blocks[i]
                    raise PoolTimeoutError(
                        f"run_blocks: block {i} [{lo}, {hi}) of {len(self.blocks)} has run on "
                        f"thread {where} for over {BLOCK_WAIT_SECONDS:g} s"
                    )
                self.done.wait(left)
        if self.error is not None:
            raise self.error


def run_blocks(body: Callable[[int, int], object], blocks: Sequence[tuple[int, int]]) -> None:
    """`body(lo, hi)` for every block, claimed one at a time by the calling thread and by up
    to pool_size() - 1 helper tasks on the pool (see the file comment): the caller never
    waits for a block nobody started, so a busy pool, or a caller that is itself a pool
    worker, degrades to the caller running every block. The first error a block raised is
    raised once every started block has ended."""
    if not blocks:
        return
    if len(blocks) == 1:
        body(*blocks[0])
        return
    job = _Blocks(body, blocks)
    pool = default_pool()
    for _ in range(min(pool_size(), len(blocks)) - 1):
        try:
            pool.submit(job.work)
        except RuntimeError:  # the pool is shut down (interpreter exit): the caller does all
            break
    job.work()
    job.wait()


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
    one thread is cut into: at most BLOCKS_PER_THREAD per pool thread and one per unit, none
    estimated below MIN_BLOCK_TASKS hand-offs to the pool."""
    threads = pool_size()
    if threads < 2 or units < 2:
        return 1
    most = BLOCKS_PER_THREAD * threads
    per_task = MIN_BLOCK_TASKS * task_seconds()
    return max(1, min(most, units, int(seconds / per_task) if per_task > 0 else most))


def split_over(units: int, seconds: float, body) -> None:
    """`body(lo, hi)` over [0, units), cut into split_parts(units, seconds) blocks run as
    run_blocks runs them (whole on the calling thread when that is one block)."""
    parts = split_parts(units, seconds)
    if parts == 1:
        body(0, units)
        return
    run_blocks(body, even_blocks(units, parts))
