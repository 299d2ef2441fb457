"""The parallel runtime when threads start late, fail, nest, race or fork: run_blocks (blocks
claimed from a shared counter by the caller and helper tasks) and the native pool (blocks
claimed by compare-and-swap), for every block count from 1 to past the extent, with results
checked element by element; every wait here has a timeout, so a hang fails the test."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from many_threads import run_on_threads

import xlapy
from xlapy.backends.cpu.runtime import kernel_thunk, pool
from xlapy.backends.cpu.runtime.conv_thunk import DirectConvThunk
from xlapy.backends.cpu.runtime.native_pool import native_pool
from xlapy.backends.cpu.runtime.thunk import SplitChoice, walk_thunks

pytestmark = pytest.mark.usefixtures("kernel_cache")

TANH = """HloModule tanh
ENTRY e {
  p = f32[512,300] parameter(0)
  ROOT t = f32[512,300] tanh(p)
}
"""


def _covered(blocks: list[tuple[int, int]], extent: int, runner=pool.run_blocks) -> np.ndarray:
    seen = np.zeros(extent, np.int64)
    lock = threading.Lock()

    def body(lo, hi):
        with lock:
            seen[lo:hi] += 1

    runner(body, blocks)
    return seen


@pytest.mark.parametrize("extent", [1, 3, 7, 64])
def test_run_blocks_every_block_count(extent):
    """1..N blocks, counts past the extent included (even_blocks drops empty blocks)."""
    for parts in range(1, 2 * extent + 3):
        blocks = pool.even_blocks(extent, parts)
        assert len(blocks) == min(parts, extent)
        assert (_covered(blocks, extent) == 1).all(), (extent, parts)


def test_run_blocks_never_waits_for_a_block_nobody_started():
    """Every pool worker is held: the caller runs all blocks itself and returns at once; the
    helpers that start afterwards find nothing left."""
    release = threading.Event()
    workers = pool.pool_size()
    held = [pool.default_pool().submit(release.wait, 30) for _ in range(workers)]
    try:
        ran_on: list[str] = []
        start = time.monotonic()
        pool.run_blocks(
            lambda lo, hi: ran_on.append(threading.current_thread().name),
            pool.even_blocks(40, 16),
        )
        assert time.monotonic() - start < 5
        assert ran_on == [threading.current_thread().name] * 16
    finally:
        release.set()
    for f in held:
        f.result(timeout=30)


def test_run_blocks_error_in_a_helper_waits_for_started_blocks(monkeypatch):
    """A block that fails on a helper: the error reaches the caller, and only after every
    block some thread started has ended (none is still writing)."""
    monkeypatch.setattr(pool, "pool_size", lambda: 2)
    caller = threading.current_thread()
    helper_started = threading.Event()
    running = [0]
    lock = threading.Lock()

    def body(lo, hi):
        with lock:
            running[0] += 1
        try:
            if threading.current_thread() is caller:
                helper_started.wait(10)  # let a helper claim a block
                time.sleep(0.05)
                return
            helper_started.set()
            raise ValueError(f"block [{lo}, {hi}) failed on a helper")
        finally:
            with lock:
                running[0] -= 1

    with pytest.raises(ValueError, match="failed on a helper"):
        pool.run_blocks(body, pool.even_blocks(8, 8))
    assert running[0] == 0


def test_run_blocks_wait_has_a_time_limit_that_names_the_block(monkeypatch):
    monkeypatch.setattr(pool, "pool_size", lambda: 2)
    monkeypatch.setattr(pool, "BLOCK_WAIT_SECONDS", 0.2)
    caller = threading.current_thread()
    helper_started = threading.Event()
    done = threading.Event()

    def body(lo, hi):
        if threading.current_thread() is caller:
            helper_started.wait(10)
            return
        helper_started.set()
        time.sleep(1.0)  # past the limit
        done.set()

    with pytest.raises(pool.PoolTimeoutError, match=r"block \d+ \[\d+, \d+\) of 4 .*thread"):
        pool.run_blocks(body, pool.even_blocks(4, 4))
    assert done.wait(10)


def test_run_blocks_from_many_python_threads_and_nested():
    """8 Python threads call run_blocks at once, and each block splits again (nested, from
    pool workers as well as the callers)."""

    def inner_split(lo, hi):
        seen = _covered(pool.even_blocks(hi - lo + 5, 3), hi - lo + 5)
        assert (seen == 1).all()

    def caller(k: int) -> None:
        for r in range(20):
            extent = 5 + (k + r) % 11
            seen = _covered(pool.even_blocks(extent, 1 + (k * r) % 9), extent)
            assert (seen == 1).all()
            pool.run_blocks(inner_split, pool.even_blocks(6, 3))

    run_on_threads(caller, 8)


def _tanh_kernel():
    """A compiled elementwise kernel (its entry address and outer extent) and its client's
    executable, from TANH."""
    client = xlapy.Client("cpu")
    executable = client.compile(TANH)
    program = executable._programs[executable._devices[0].id]
    (thunk,) = [t for t in walk_thunks(program.compiled.entry)
                if isinstance(t, kernel_thunk.KernelThunk)]  # fmt: skip
    return thunk, executable, client


@pytest.fixture(scope="module")
def tanh_kernel():
    return _tanh_kernel()


def test_native_pool_every_block_count_and_short_extents(tanh_kernel):
    """The native pool over 1..40 blocks and extents shorter than the block count: every
    unit is computed once and nothing past the extent is written."""
    native = native_pool()
    if native is None:
        assert pool.pool_size() < 2 or os.environ.get("XLAPY_NATIVE_POOL") == "0"
        return
    thunk = tanh_kernel[0]
    address = thunk.kernel.address
    full = thunk.kernel.outer_extent
    per_unit = 512 * 300 // full
    rng = np.random.default_rng(11)
    x = rng.standard_normal((512, 300)).astype(np.float32)
    for extent in (1, 3, 7, 40, full):
        for blocks in (1, 2, 3, 8, 17, 40):
            out = np.full((512, 300), 7.0, np.float32)
            native.run(address, [out.ctypes.data, x.ctypes.data], extent, blocks)
            n = extent * per_unit
            np.testing.assert_allclose(out.ravel()[:n], np.tanh(x.ravel()[:n]), atol=2e-6)
            assert (out.ravel()[n:] == 7.0).all(), (extent, blocks)


def test_native_pool_from_python_pool_workers_and_threads(tanh_kernel):
    """run_blocks bodies and plain threads call the native pool at once: a caller that finds
    it taken runs the kernel whole; every result is right."""
    native = native_pool()
    if native is None:
        return
    thunk = tanh_kernel[0]
    address, full = thunk.kernel.address, thunk.kernel.outer_extent
    rng = np.random.default_rng(12)
    x = rng.standard_normal((512, 300)).astype(np.float32)
    want = np.tanh(x)
    outs = [np.zeros_like(x) for _ in range(15)]

    def one(k: int) -> None:
        outs[k][:] = 0
        native.run(address, [outs[k].ctypes.data, x.ctypes.data], full, 8)

    def thread(k: int) -> None:
        for _ in range(5):
            pool.run_blocks(lambda lo, hi: [one(i) for i in range(lo, hi)],
                            pool.even_blocks(8, 4) if k == 0 else [(7 + k, 8 + k)])  # fmt: skip

    run_on_threads(thread, 8)
    for k in range(15):  # 0..7 from thread 0's blocks, 8..14 from the others
        np.testing.assert_allclose(outs[k], want, atol=2e-6)


_FORK_CHILD = r"""
import os, sys, threading
import numpy as np
import xlapy
from xlapy.backends.cpu.runtime import pool
from xlapy.backends.cpu.runtime.native_pool import native_pool
text = sys.argv[1]
rng = np.random.default_rng(13)
x = rng.standard_normal((512, 300)).astype(np.float32)

def check():
    # a client of this process's own: a client's device worker threads do not survive a
    # fork (the pools are what this checks)
    client = xlapy.Client("cpu")
    ex = client.compile(text)
    buf = client.buffer_from_pyval(x)
    for _ in range(6):  # past SplitChoice's warm-up: split and whole runs
        ((out,),) = ex.execute([[buf]])
        np.testing.assert_allclose(np.asarray(out), np.tanh(x), atol=2e-6)
    seen = np.zeros(50, np.int64)
    lock = threading.Lock()
    def body(lo, hi):
        with lock:
            seen[lo:hi] += 1
    pool.run_blocks(body, pool.even_blocks(50, 9))
    assert (seen == 1).all()

check()  # the parent's pools are running now
native_pool()
pid = os.fork()
if pid == 0:
    try:
        check()
    except BaseException as e:
        print("child failed:", repr(e), flush=True)
        os._exit(1)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child status", os.waitstatus_to_exitcode(status))
check()
"""


def test_fork_after_the_pools_started():
    """A forked child has none of the parent's threads: its splits run on the calling thread
    (native pool) or a new Python pool, right and without hanging; the parent goes on. (The
    child makes its own client: a client's device worker thread is not carried over.)"""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", _FORK_CHILD, TANH],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "child status 0" in done.stdout


def test_kernel_split_blocks_follow_the_cost_rule():
    least = kernel_thunk.PARALLEL_MIN_ELEMENTS
    per = pool.BLOCKS_PER_THREAD
    assert kernel_thunk.split_blocks(least - 1, 1000, least, 16) == 1  # too small
    assert kernel_thunk.split_blocks(least, 1, least, 16) == 1  # one unit
    assert kernel_thunk.split_blocks(10 * least, 1000, least, 1) == 1  # one thread
    assert kernel_thunk.split_blocks(least, 1000, least, 16) == 2 * per  # two threads' worth
    assert kernel_thunk.split_blocks(3 * least, 1000, least, 16) == 6 * per
    assert kernel_thunk.split_blocks(100 * least, 1000, least, 16) == 16 * per  # all threads
    assert kernel_thunk.split_blocks(100 * least, 5, least, 16) == 5  # at most the extent


def test_split_choice_goes_by_the_typical_run_not_the_best():
    """Split runs that are usually slow (a descheduled worker) with a rare fast one: the
    best split run beats every whole run, the median does not, so whole is kept."""
    choice = SplitChoice()
    for k in range(200):
        split = choice.next_split()
        seconds = (0.5 if k % 7 == 0 else 3.0) if split else 1.0
        choice.record(split, seconds)
    assert not choice.split


def test_direct_conv_split_and_whole_match_the_interpreter():
    """A convolution big enough to split (over 1 MFLOP): runs past the split choice's probes
    take both ways, every result equal to the interpreter's."""
    import jax
    from jax import lax

    from xlapy.backends.interpreter import evaluate

    def stem(x, w):
        dims = ("NHWC", "HWIO", "NHWC")
        return lax.conv_general_dilated(x, w, (2, 2), ((3, 3), (3, 3)), dimension_numbers=dims)

    rng = np.random.default_rng(14)
    x = rng.standard_normal((2, 32, 32, 3)).astype(np.float32)
    w = (0.1 * rng.standard_normal((7, 7, 3, 32))).astype(np.float32)
    text = jax.jit(stem).lower(x, w).as_text()
    want = np.asarray(evaluate(xlapy.load(text), [x, w]))
    client = xlapy.Client("cpu")
    executable = client.compile(text)
    program = executable._programs[executable._devices[0].id]
    convs = [t for t in walk_thunks(program.compiled.entry) if isinstance(t, DirectConvThunk)]
    assert len(convs) == 1
    assert (convs[0]._choice is not None) == (pool.pool_size() > 1)
    bufs = [client.buffer_from_pyval(x), client.buffer_from_pyval(w)]
    for _ in range(2 * SplitChoice.PROBES + 2):
        ((out,),) = executable.execute([bufs])
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=1e-4)
