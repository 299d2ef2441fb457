# The process's worker threads: how many (the cores this process may run on), the pool that
# kernels, dots and the graph executor split work over, and the block runner that never
# waits on queued work (a busy pool degrades to the calling thread doing everything).

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

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
