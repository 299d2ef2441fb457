"""Concurrency and leaks: many threads on one executable, many executions in a row."""

import gc
import os
import threading
import time
import tracemalloc

import numpy as np
from runtime_programs import AXPY

from xlapy.runtime import Client

THREADS, CALLS = 8, 500


def test_threads_share_an_executable_with_donation():
    client = Client("cpu", device_count=2)
    exe = client.compile(AXPY)
    failures: list[str] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        dev = client.devices()[seed % 2]
        try:
            for i in range(CALLS):
                a = np.float32(rng.integers(1, 5))
                x = rng.integers(-100, 100, 4).astype(np.float32)
                y = rng.integers(-100, 100, 4).astype(np.float32)
                bufs = [client.buffer_from_pyval(v, dev) for v in (a, x, y)]
                donate = [1] if i % 2 else []
                [out] = exe.execute_portable(bufs, dev, donate=donate)
                got = out.to_numpy()
                if not np.array_equal(got, a * x + y):
                    failures.append(f"thread {seed} call {i}: {got} != {a * x + y}")
                if bufs[1].is_deleted != bool(donate):
                    failures.append(f"thread {seed} call {i}: donation state wrong")
                if not donate and not np.array_equal(bufs[1].to_numpy(), x):
                    failures.append(f"thread {seed} call {i}: input modified")
        except Exception as e:  # reported below with the thread that raised it
            failures.append(f"thread {seed}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "deadlock: a thread did not finish"
    assert failures == []
    gc.collect()
    assert [d.memory_stats().bytes_in_use for d in client.devices()] == [0, 0]
    client.close()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_no_leak_over_many_executions():
    """10,000 executions (half donating): the allocator stays flat; process RSS stays flat
    within generous slack; Python allocations traced over the last 1,500 stay flat."""
    client = Client("cpu")
    exe = client.compile(AXPY)
    dev = client.devices()[0]
    rng = np.random.default_rng(5)
    a = client.buffer_from_pyval(np.float32(0.5))
    y_host = rng.standard_normal(4).astype(np.float32)
    y = client.buffer_from_pyval(y_host)
    x = client.buffer_from_pyval(rng.standard_normal(4).astype(np.float32))
    expected = x.to_numpy()
    in_use = set()
    rss_start = None
    for i in range(10_000):
        [x] = exe.execute_portable([a, x, y], dev, donate=[1] if i % 2 else [])
        if i < 20:
            expected = np.float32(0.5) * expected + y_host
            np.testing.assert_allclose(x.to_numpy(), expected, rtol=1e-5)
        if i % 500 == 499:
            x.block_until_ready()
            in_use.add(dev.memory_stats().bytes_in_use)
        if i == 1000:
            x.block_until_ready()
            rss_start = _rss_bytes()
        if i == 8500:
            x.block_until_ready()
            gc.collect()
            tracemalloc.start()
        if i == 9000:
            x.block_until_ready()
            gc.collect()
            traced_start, _ = tracemalloc.get_traced_memory()
    x.block_until_ready()
    gc.collect()
    traced_end, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert in_use == {36}  # a, y and the live x, nothing more
    assert _rss_bytes() - rss_start < 32 * 2**20
    assert traced_end - traced_start < 64 * 1024  # 1,000 calls: a leak of 64 bytes a call shows
    client.close()


def _distinct_program(i: int) -> str:
    return f"""HloModule distinct{i}
ENTRY e {{
  p = f32[16] parameter(0)
  c = f32[] constant({i}.25)
  b = f32[16] broadcast(c), dimensions={{}}
  s = f32[16] sine(p)
  ROOT a = f32[16] multiply(s, b)
}}"""


def test_compiled_code_is_freed_with_its_last_executable():
    """Issue 16 item 5: every compiled program kept its JIT code (~238 KiB) after its client
    was gone. The code goes with the last executable using it (XLAPY_LEAK_CYCLES=N runs
    N cycles, 2,000 in the attack; 12 here, for CI)."""
    from xlapy.backends.cpu.jit import engine as jit

    engine = jit.shared_engine()
    x = np.random.default_rng(16).standard_normal(16).astype(np.float32)
    cycles = int(os.environ.get("XLAPY_LEAK_CYCLES", "12"))
    gc.collect()
    before = engine.stats()
    for i in range(cycles):
        client = Client("cpu")
        exe = client.compile(_distinct_program(i))
        [out] = exe.execute_portable([client.buffer_from_pyval(x)], client.devices()[0])
        np.testing.assert_allclose(out.to_numpy(), np.sin(x) * (i + 0.25), rtol=1e-5, atol=1e-5)
        client.close()
        del client, exe, out
    deadline = time.monotonic() + 60  # the last client's worker thread is still exiting
    while True:
        gc.collect()
        after = engine.stats()
        if after["held"] <= before["held"] or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert after["held"] <= before["held"], (before, after)
    assert after["objects"] <= before["objects"] + jit.SharedEngine.ENGINE_OBJECTS, after


def test_an_execution_keeps_its_code_after_the_executable_is_dropped():
    """A queued execution holds its program's code: dropping the executable and the client
    before the result is read neither frees code that is about to run nor changes it."""
    x = np.random.default_rng(17).standard_normal(16).astype(np.float32)
    client = Client("cpu")
    exe = client.compile(_distinct_program(10_001))
    outs = [exe.execute_portable([client.buffer_from_pyval(x)], client.devices()[0])[0]]
    outs += [exe.execute_portable([client.buffer_from_pyval(x)], client.devices()[0])[0]]
    del exe, client
    gc.collect()
    for out in outs:
        np.testing.assert_allclose(out.to_numpy(), np.sin(x) * 10_001.25, rtol=1e-5, atol=1e-3)
