"""The CPU backend's parallel policy: run_blocks (caller runs a block, takes back unstarted
ones) and SplitChoice (per-kernel choice between split and whole, from measured times)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from xlapy.backends.cpu.runtime.pool import default_pool, even_blocks, pool_size, run_blocks
from xlapy.backends.cpu.runtime.thunk import SplitChoice
from xlapy.errors import XlapyError


@pytest.mark.parametrize("parts", [1, 2, 3, 8])
def test_run_blocks_covers_every_block_once(parts):
    assert len(even_blocks(100, parts)) == parts
    seen = np.zeros(100, np.int64)
    lock = threading.Lock()

    def body(lo, hi):
        with lock:
            seen[lo:hi] += 1

    run_blocks(body, even_blocks(100, parts))
    assert (seen == 1).all()


def test_run_blocks_from_pool_workers_does_not_deadlock():
    """Every pool worker calls run_blocks at once: queued blocks no worker can start are
    taken back by their callers."""
    workers = pool_size()
    seen = np.zeros(workers * 64, np.int64)
    lock = threading.Lock()

    def body(lo, hi):
        with lock:
            seen[lo:hi] += 1

    def outer(k):
        run_blocks(body, [(k * 64 + lo, k * 64 + hi) for lo, hi in even_blocks(64, 4)])

    futures = [default_pool().submit(outer, k) for k in range(workers)]
    for f in futures:
        f.result(timeout=120)
    assert (seen == 1).all()


def test_run_blocks_raises_the_callers_error():
    def body(lo, hi):
        if lo == 0:
            raise ValueError("block 0 failed")

    with pytest.raises(ValueError, match="block 0"):
        run_blocks(body, even_blocks(10, 2))


def test_run_blocks_raises_a_workers_error():
    def body(lo, hi):
        if lo != 0:
            raise ValueError("a later block failed")

    with pytest.raises(ValueError, match="later block"):
        run_blocks(body, even_blocks(10, 3))


def _drive(choice: SplitChoice, split_seconds: float, whole_seconds: float, calls: int):
    picks = []
    for _ in range(calls):
        split = choice.next_split()
        picks.append(split)
        choice.record(split, split_seconds if split else whole_seconds)
    return picks


def test_split_choice_probes_both_ways_first():
    picks = _drive(SplitChoice(), 1.0, 2.0, 2 * SplitChoice.PROBES)
    assert picks.count(True) == picks.count(False) == SplitChoice.PROBES


@pytest.mark.parametrize("split_s,whole_s,expect", [(1.0, 2.0, True), (3.0, 1.0, False)])
def test_split_choice_keeps_the_faster_way(split_s, whole_s, expect):
    choice = SplitChoice()
    picks = _drive(choice, split_s, whole_s, 200)
    steady = picks[2 * SplitChoice.PROBES :]
    assert steady.count(expect) > 0.9 * len(steady)
    assert steady.count(not expect) >= 1  # the other way is re-tried now and then


def test_split_choice_follows_a_change_of_load():
    choice = SplitChoice()
    _drive(choice, 1.0, 2.0, 100)
    assert choice.split
    picks = _drive(choice, 5.0, 2.0, 400)  # the other core got busy: splitting got slower
    assert not choice.split
    assert picks[-50:].count(False) > 45


def test_split_choice_ignores_the_warm_up_run():
    """The first run pays first-touch costs; it must not decide anything."""
    choice = SplitChoice()
    split = choice.next_split()
    choice.record(split, 100.0)
    assert not choice.times[0] and not choice.times[1]
    picks = _drive(choice, 1.0, 2.0, 2 * SplitChoice.PROBES)
    assert picks.count(True) == picks.count(False) == SplitChoice.PROBES
    assert choice.split


def test_pool_size_follows_the_affinity_mask_not_cpu_count(monkeypatch):
    pool_size.cache_clear()
    try:
        monkeypatch.delenv("XLAPY_NUM_THREADS", raising=False)
        monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 3, 5})
        monkeypatch.setattr("os.cpu_count", lambda: 64)
        assert pool_size() == 3
        pool_size.cache_clear()
        monkeypatch.setenv("XLAPY_NUM_THREADS", "2")
        assert pool_size() == 2
        pool_size.cache_clear()
        monkeypatch.setenv("XLAPY_NUM_THREADS", "many")
        with pytest.raises(XlapyError, match="XLAPY_NUM_THREADS"):
            pool_size()
    finally:
        pool_size.cache_clear()
