"""The heap simulator: property tests over random buffers, hand examples, a 10k case."""

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xlapy.errors import XlapyError
from xlapy.memory.heap_simulator import (
    ALGORITHMS,
    HeapBuffer,
    MemoryPlanningError,
    find_conflicts,
    live_bytes_timeline,
    lower_bound,
    simulate_heap,
    simulate_peak,
)

ALL = [*ALGORITHMS, "best"]


# -- an independent checker -------------------------------------------------------------------
def overlapping_pairs(buffers, result):
    bad = []
    for i, a in enumerate(buffers):
        for b in buffers[i + 1 :]:
            if a.colocation is not None and a.colocation == b.colocation:
                continue
            if a.end < b.start or b.end < a.start or not a.size or not b.size:
                continue
            lo_a, lo_b = result.offsets[a.id], result.offsets[b.id]
            if lo_a < lo_b + b.size and lo_b < lo_a + a.size:
                bad.append((a.id, b.id))
    return bad


def brute_lower_bound(buffers):
    groups = {}
    for b in buffers:
        key = ("solo", b.id) if b.colocation is None else ("group", b.colocation)
        size, start, end = groups.get(key, (0, b.start, b.end))
        groups[key] = (max(size, b.size), min(start, b.start), max(end, b.end))
    steps = range(min(b.start for b in buffers), max(b.end for b in buffers) + 1)
    return max(sum(s for s, lo, hi in groups.values() if lo <= t <= hi) for t in steps)


@st.composite
def buffer_lists(draw, max_buffers=24, colocate=True):
    n = draw(st.integers(1, max_buffers))
    buffers = []
    for i in range(n):
        start = draw(st.integers(0, 30))
        group = draw(st.one_of(st.none(), st.integers(0, 3))) if colocate else None
        buffers.append(
            HeapBuffer(
                id=f"b{i}",
                size=draw(st.integers(0, 1000)),
                start=start,
                end=start + draw(st.integers(0, 12)),
                alignment=draw(st.sampled_from([1, 4, 8, 64, 256])),
                colocation=group,
            )
        )
    return buffers


@pytest.mark.parametrize("algorithm", ALL)
@settings(max_examples=60, deadline=None)
@given(buffers=buffer_lists())
def test_placement_is_valid(algorithm, buffers):
    result = simulate_heap(buffers, algorithm)
    assert overlapping_pairs(buffers, result) == []
    assert find_conflicts(buffers, result) == []
    assert all(result.offsets[b.id] % b.alignment == 0 for b in buffers)
    assert result.lower_bound == brute_lower_bound(buffers) == lower_bound(buffers)
    assert result.heap_size >= result.lower_bound
    assert result.heap_size == max(result.offsets[b.id] + b.size for b in buffers)
    for b in buffers:
        for c in buffers:
            if b.colocation is not None and b.colocation == c.colocation:
                assert result.offsets[b.id] == result.offsets[c.id]


@settings(max_examples=60, deadline=None)
@given(buffers=buffer_lists())
def test_best_is_the_smallest_candidate(buffers):
    best = simulate_heap(buffers, "best")
    each = {name: simulate_heap(buffers, name).heap_size for name in ALGORITHMS}
    assert dict(best.candidates) == each
    assert best.heap_size == min(each.values())
    assert each[best.algorithm] == best.heap_size


@pytest.mark.parametrize("algorithm", ALL)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_all_live_together_stack_up(algorithm, data):
    n = data.draw(st.integers(1, 20))
    common = data.draw(st.integers(0, 50))
    buffers = [
        HeapBuffer(
            i,
            data.draw(st.integers(1, 500)) * 8,
            common - data.draw(st.integers(0, 10)),
            common + data.draw(st.integers(0, 10)),
            alignment=8,
        )
        for i in range(n)
    ]
    result = simulate_heap(buffers, algorithm)
    assert result.heap_size == sum(b.size for b in buffers) == result.lower_bound


@pytest.mark.parametrize("algorithm", ALL)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_never_live_together_share_one_slot(algorithm, data):
    sizes = data.draw(st.lists(st.integers(1, 5000), min_size=1, max_size=20))
    buffers, step = [], 0
    for i, size in enumerate(sizes):
        length = data.draw(st.integers(0, 4))
        buffers.append(HeapBuffer(i, size, step, step + length))
        step += length + 1 + data.draw(st.integers(0, 2))
    result = simulate_heap(buffers, algorithm)
    assert result.heap_size == max(sizes) == result.lower_bound
    assert set(result.offsets.values()) == {0}


# -- hand examples ----------------------------------------------------------------------------
def test_hand_example_reuses_a_dead_slot():
    buffers = [
        HeapBuffer("a", 100, 0, 1, alignment=1),
        HeapBuffer("b", 50, 1, 2, alignment=1),
        HeapBuffer("c", 100, 2, 3, alignment=1),
    ]
    for algorithm in ALL:
        result = simulate_heap(buffers, algorithm)
        assert result.offsets == {"a": 0, "b": 100, "c": 0}, algorithm
        assert (result.heap_size, result.lower_bound) == (150, 150)


def test_global_best_fit_takes_the_smallest_gap_not_the_lowest():
    # Long-lived P0, P2, P4 with short-lived P1 (35 bytes) and P3 (25 bytes) between them
    # leave holes of 35 and 25 bytes for any later buffer that overlaps only the long ones.
    buffers = [
        HeapBuffer("P0", 40, 0, 9, alignment=1),
        HeapBuffer("P1", 35, 0, 0, alignment=1),
        HeapBuffer("P2", 30, 0, 9, alignment=1),
        HeapBuffer("P3", 25, 0, 0, alignment=1),
        HeapBuffer("P4", 20, 0, 9, alignment=1),
        HeapBuffer("N", 10, 1, 9, alignment=1),
    ]
    result = simulate_heap(buffers, "global-size")
    assert result.offsets == {"P0": 0, "P1": 40, "P2": 75, "P3": 105, "P4": 130, "N": 105}
    assert result.heap_size == 150


def test_best_fit_ties_go_to_the_lowest_offset():
    # H1 and H3 (40 bytes each) die before N is born; the long-lived W0, W2, W4 fence them,
    # leaving N two equal 40-byte holes, at 100 and at 180.
    buffers = [
        HeapBuffer("W0", 100, 0, 9, alignment=1),
        HeapBuffer("H1", 40, 0, 1, alignment=1),
        HeapBuffer("W2", 40, 1, 2, alignment=1),
        HeapBuffer("H3", 40, 1, 1, alignment=1),
        HeapBuffer("W4", 20, 0, 9, alignment=1),
        HeapBuffer("N", 10, 2, 9, alignment=1),
    ]
    result = simulate_heap(buffers, "global-size")
    assert result.offsets == {"W0": 0, "H1": 100, "W2": 140, "H3": 180, "W4": 220, "N": 100}


def test_alignment_pads_offsets():
    buffers = [HeapBuffer("a", 10, 0, 5, alignment=1), HeapBuffer("b", 10, 0, 5, alignment=64)]
    for algorithm in ALL:
        result = simulate_heap(buffers, algorithm)
        assert result.offsets["b"] % 64 == 0
        assert result.heap_size in (20, 74)


def test_colocated_group_spans_its_members():
    # "x" and "y" share a slot; the group lives over [0, 6], so "z" (live at 3) can't use it.
    buffers = [
        HeapBuffer("x", 64, 0, 1, colocation="loop"),
        HeapBuffer("y", 128, 5, 6, colocation="loop"),
        HeapBuffer("z", 64, 3, 3),
    ]
    for algorithm in ALL:
        result = simulate_heap(buffers, algorithm)
        assert result.offsets["x"] == result.offsets["y"]
        assert result.heap_size == 192 == result.lower_bound


def test_zero_size_buffers_take_no_room():
    buffers = [HeapBuffer("a", 0, 0, 3), HeapBuffer("b", 64, 0, 3)]
    result = simulate_heap(buffers)
    assert result.heap_size == 64
    assert result.offsets["a"] == 0


def test_empty_input():
    result = simulate_heap([])
    assert (result.heap_size, result.lower_bound, result.offsets) == (0, 0, {})


def test_simulate_peak_and_timeline():
    intervals = [(0, 2, 10), (1, 1, 5), (3, 4, 7), (2, 3, 1)]
    assert simulate_peak(intervals) == (15, 1)
    assert live_bytes_timeline(intervals) == [(0, 10), (1, 15), (2, 11), (3, 8), (4, 7), (5, 0)]
    assert simulate_peak([]) == (0, 0)


@pytest.mark.parametrize(
    "buffers, message",
    [
        ([HeapBuffer("a", -1, 0, 1)], "size >= 0"),
        ([HeapBuffer("a", 8, 3, 1)], "is empty"),
        ([HeapBuffer("a", 8, 0, 1, alignment=0)], "alignment >= 1"),
        ([HeapBuffer("a", 8, 0, 1), HeapBuffer("a", 8, 2, 3)], "appears twice"),
    ],
)
def test_bad_buffers_are_reported(buffers, message):
    with pytest.raises(MemoryPlanningError, match=message):
        simulate_heap(buffers)


def test_unknown_algorithm():
    with pytest.raises(XlapyError, match="unknown heap algorithm 'first-fit'"):
        simulate_heap([HeapBuffer("a", 8, 0, 1)], "first-fit")


def test_ten_thousand_buffers():
    rng = random.Random(7)
    buffers = []
    for i in range(10_000):
        start = rng.randrange(20_000)
        buffers.append(
            HeapBuffer(
                i,
                rng.randrange(1, 1 << 20),
                start,
                start + rng.randrange(400),
                rng.choice([1, 64, 256]),
            )
        )
    began = time.perf_counter()
    result = simulate_heap(buffers, "best")
    elapsed = time.perf_counter() - began
    print(f"10k buffers, all algorithms: {elapsed:.2f} s")
    assert find_conflicts(buffers, result) == []
    assert result.lower_bound <= result.heap_size < 2 * result.lower_bound
