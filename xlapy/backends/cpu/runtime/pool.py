# The process's worker threads: how many (the cores this process may run on), the pool that
# kernels, dots and the graph executor split work over, and the block runner that never
# waits on queued work (a busy pool degrades to the calling thread doing everything).

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from xlapy.errors import XlapyError

THREADS_ENV_VAR = "XLAPY_NUM_THREADS"


@functools.cache
def pool_size() -> int:
    """Worker threads for the process: the cores this process may run on
    (`os.sched_getaffinity`, so `taskset` and container CPU sets are honoured, unlike
    `os.cpu_count()`), or $XLAPY_NUM_THREADS where it is set to a positive integer."""
    override = os.environ.get(THREADS_ENV_VAR, "").strip()
    if override:
        if not override.isdigit() or int(override) < 1:
            raise XlapyError(f"${THREADS_ENV_VAR} must be a positive integer, got {override!r}")
        return int(override)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # platforms without affinity masks
        return os.cpu_count() or 1


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
