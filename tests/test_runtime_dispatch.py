"""Dispatch: inline execution on idle devices, ordering with the worker, cheap futures, and
the precomputed call checks (same errors as the slow path)."""

import threading

import numpy as np
import pytest
from runtime_programs import AXPY, TUPLE_PARAM

from xlapy.runtime import BufferDeletedError, Client, ExecutionError, Future, RuntimeApiError

TRACE = """HloModule trace
ENTRY e {
  x = f32[8] parameter(0)
  ROOT c = f32[8] custom-call(x), custom_call_target="trace", backend_config="TAG"
}"""


def _tracing_client(inline: bool = True, devices: int = 1):
    """A client with a Python target "trace" that records (tag, thread) and, for the tag
    "block", waits for `gate` before returning x + 1."""
    client = Client("cpu", device_count=devices, inline_execution=inline)
    calls: list[tuple[str, threading.Thread]] = []
    gate = threading.Event()
    started = threading.Event()

    def trace(ins, opaque):
        tag = opaque.decode() if isinstance(opaque, bytes) else str(opaque)
        calls.append((tag, threading.current_thread()))
        if tag == "block":
            started.set()
            if not gate.wait(60):
                raise RuntimeError("gate was never opened")
        if tag == "fail":
            raise ValueError("the target failed on purpose")
        return ins[0] + 1

    client.register_custom_call("trace", trace)
    return client, calls, gate, started


def _program(client, tag):
    return client.compile(TRACE.replace("TAG", tag))


@pytest.fixture(autouse=True)
def _no_take_back(monkeypatch):
    """These tests tell a run inside `execute` (inline) from a queued one by the thread it
    ran on; a caller's wait may take a queued run back onto its own thread
    (Device.take_back, tested in test_runtime_take_back.py), so here it never does."""
    from xlapy.runtime.device import Device

    monkeypatch.setattr(Device, "take_back", lambda self, future: False)


@pytest.fixture
def cheap_by_cpu_time(monkeypatch):
    """Cheap runs are told by their CPU time alone: a loaded machine can stall a 100 us run
    past INLINE_MAX_WALL_SECONDS of wall time, and then the run after it is not inline (by
    design, tested with explicit times in test_preempted_cheap_runs_...); tests of what
    happens once a program is known to be cheap must not depend on that."""
    from xlapy.runtime import execution

    monkeypatch.setattr(execution, "INLINE_MAX_WALL_SECONDS", 600.0)


@pytest.fixture
def x():
    return np.random.default_rng(7).standard_normal(8).astype(np.float32)


@pytest.mark.usefixtures("cheap_by_cpu_time")
def test_first_run_is_asynchronous_then_a_cheap_program_runs_inline(x):
    client, calls, _, _ = _tracing_client()
    program = _program(client, "a")
    [first] = program.execute([[client.buffer_from_pyval(x)]])[0]
    first.block_until_ready()
    assert calls[0][1] is not threading.current_thread()  # not yet known to be cheap
    [out] = program.execute([[client.buffer_from_pyval(x)]])[0]
    assert out.ready().done()  # already filled when execute returned
    np.testing.assert_allclose(out.to_numpy(), x + 1, rtol=1e-6)
    assert calls[1] == ("a", threading.current_thread())
    client.close()


def test_a_slow_program_never_runs_inline(x, monkeypatch):
    from xlapy.runtime import execution

    monkeypatch.setattr(execution, "INLINE_MAX_SECONDS", 0.0)
    client, calls, _, _ = _tracing_client()
    program = _program(client, "a")
    for _ in range(3):
        [out] = program.execute([[client.buffer_from_pyval(x)]])[0]
        out.block_until_ready()
    assert all(thread is not threading.current_thread() for _, thread in calls)
    client.close()


def test_preempted_cheap_runs_stay_inline_and_waiting_runs_count_as_slow(x):
    """A run's wall time counts the OS giving the core away (whole scheduler ticks on a
    loaded machine); its CPU time does not. A cheap program preempted during a run keeps
    running inline; one that waits long (a blocking target) still counts as slow."""
    from xlapy.runtime import execution

    client, calls, _, _ = _tracing_client()
    program = _program(client, "a")
    for _ in range(2):
        [out] = program.execute([[client.buffer_from_pyval(x)]])[0]
        out.block_until_ready()
    signature = program._signature
    assert execution._is_cheap(signature)
    execution._record_run(signature, 0.027, 2e-5)  # 27 ms wall, 20 us of CPU: preempted
    assert execution._is_cheap(signature) and signature.streak_needed == 1
    [out] = program.execute([[client.buffer_from_pyval(x)]])[0]
    assert calls[-1] == ("a", threading.current_thread())  # still inline
    execution._record_run(signature, execution.INLINE_MAX_WALL_SECONDS, 1e-5)  # it waited
    assert not execution._is_cheap(signature) and signature.streak_needed > 1
    execution._record_run(signature, 0.006, execution.INLINE_MAX_SECONDS)  # it computed
    assert signature.cheap_streak == 0
    client.close()


@pytest.mark.usefixtures("cheap_by_cpu_time")
def test_inline_execution_off_runs_on_the_worker(x):
    client, calls, _, _ = _tracing_client(inline=False)
    [out] = _program(client, "a").execute([[client.buffer_from_pyval(x)]])[0]
    np.testing.assert_allclose(out.to_numpy(), x + 1, rtol=1e-6)
    assert calls[0][1] is not threading.current_thread()
    client.inline_execution = True
    program = _program(client, "b")
    for _ in range(2):  # the first run times it; the second runs inline
        [out] = program.execute([[client.buffer_from_pyval(x)]])[0]
        out.block_until_ready()
    assert calls[2] == ("b", threading.current_thread())
    client.close()


def test_work_started_while_one_runs_inline_waits_and_keeps_order(x):
    """Thread A's run is inline and blocked; the main thread's calls on the same device
    must neither run inline nor overtake it; they run in order once A's run ends."""
    client, calls, gate, started = _tracing_client()
    blocker, later = _program(client, "block"), _program(client, "later")
    buf = client.buffer_from_pyval(x)
    done_a: list = []
    thread_a = threading.Thread(target=lambda: done_a.append(blocker.execute([[buf]])[0]))
    thread_a.start()
    assert started.wait(60)
    pending = [later.execute([[buf]])[0][0] for _ in range(3)]  # returns at once
    assert not any(p.ready().done() for p in pending)
    assert [tag for tag, _ in calls] == ["block"]
    gate.set()
    thread_a.join(60)
    for p in pending:
        np.testing.assert_allclose(p.to_numpy(), x + 1, rtol=1e-6)
    assert [tag for tag, _ in calls] == ["block", "later", "later", "later"]
    assert all(t is not threading.current_thread() for _, t in calls[1:])
    assert np.array_equal(done_a[0][0].to_numpy(), x + 1)
    client.close()


def test_busy_worker_queues_instead_of_running_inline(x):
    client, calls, gate, started = _tracing_client(inline=False)
    blocker = _program(client, "block")
    buf = client.buffer_from_pyval(x)
    [first] = blocker.execute([[buf]])[0]
    assert started.wait(60)
    client.inline_execution = True  # the worker is busy: the next call must still queue
    [second] = _program(client, "second").execute([[buf]])[0]
    assert not second.ready().done()
    gate.set()
    np.testing.assert_allclose(second.to_numpy(), x + 1, rtol=1e-6)
    assert [tag for tag, _ in calls] == ["block", "second"]
    assert calls[1][1] is calls[0][1]  # both on the worker
    first.block_until_ready()
    client.close()


def test_input_not_ready_is_not_run_inline(x):
    """An input still being produced (copied from a busy device) makes the call queue, so
    execute does not block the caller."""
    client, _, gate, started = _tracing_client(inline=False, devices=2)
    d0, d1 = client.devices()
    [on_d1] = _program(client, "block").execute_portable([client.buffer_from_pyval(x, d1)], d1)
    assert started.wait(60)
    client.inline_execution = True
    moved = on_d1.copy_to_device(d0)
    [out] = _program(client, "after").execute_portable([moved], d0)
    assert not out.ready().done()
    gate.set()
    np.testing.assert_allclose(out.to_numpy(), x + 2, rtol=1e-6)
    client.close()


@pytest.mark.usefixtures("cheap_by_cpu_time")
def test_inline_errors_travel_through_the_outputs(x):
    client, _, _, _ = _tracing_client()
    failing = _program(client, "fail")
    [warm] = failing.execute([[client.buffer_from_pyval(x)]])[0]  # times it, asynchronously
    with pytest.raises(ExecutionError, match="failed on purpose"):
        warm.block_until_ready()
    [out] = failing.execute([[client.buffer_from_pyval(x)]])[0]  # inline now; no raise
    assert out.ready().done()
    with pytest.raises(ExecutionError, match="failed on purpose"):
        out.to_numpy()
    [downstream] = _program(client, "ok").execute([[out]])[0]
    with pytest.raises(ExecutionError, match="an input of trace failed"):
        downstream.block_until_ready()
    client.close()


def test_inline_runs_release_memory(x):
    client = Client("cpu")
    exe = client.compile(AXPY)
    dev = client.devices()[0]
    a, y = (client.buffer_from_pyval(v) for v in (np.float32(2), x[:4]))
    xb = client.buffer_from_pyval(x[4:])
    for i in range(50):
        [xb] = exe.execute_portable([a, xb, y], dev, donate=[1] if i % 2 else [])
    expected = x[4:].copy()
    for _ in range(50):
        expected = np.float32(2) * expected + x[:4]
    np.testing.assert_allclose(xb.to_numpy(), expected, rtol=1e-4)
    for b in (a, xb, y):
        b.delete()
    assert dev.memory_stats().bytes_in_use == 0
    client.close()


# -- futures ----------------------------------------------------------------------------------


def test_completed_and_failed_futures_need_no_wait():
    assert Future.completed(3).result(timeout=0) == 3
    with pytest.raises(KeyError):
        Future.failed(KeyError("k")).result(timeout=0)
    with pytest.raises(RuntimeError, match="twice"):
        Future.completed(1).set_result(2)


def test_many_waiters_wake_and_timeout_is_raised():
    fut = Future()
    with pytest.raises(TimeoutError):
        fut.result(timeout=0.01)
    got: list = []
    waiters = [threading.Thread(target=lambda: got.append(fut.result(60))) for _ in range(4)]
    for t in waiters:
        t.start()
    fut.set_result(11)
    for t in waiters:
        t.join(60)
    assert got == [11] * 4


# -- precomputed checks give the slow path's errors ---------------------------------------


BAD_CALLS = [
    ("not a buffer", lambda c: [np.float32(1), *_bufs(c)[1:]], RuntimeApiError, "expects a Buffer"),
    (
        "wrong shape",
        lambda c: [_bufs(c)[0], c.buffer_from_pyval(np.zeros(5, np.float32)), _bufs(c)[2]],
        RuntimeApiError,
        r"parameter 1 expects f32\[4\]",
    ),
    (
        "wrong dtype",
        lambda c: [_bufs(c)[0], c.buffer_from_pyval(np.zeros(4, np.int32)), _bufs(c)[2]],
        RuntimeApiError,
        r"parameter 1 expects f32\[4\]",
    ),
    (
        "other device",
        lambda c: [
            _bufs(c)[0],
            c.buffer_from_pyval(np.ones(4, np.float32), c.devices()[1]),
            _bufs(c)[2],
        ],
        RuntimeApiError,
        "is on device 1",
    ),
    ("deleted", lambda c: _deleted(c), BufferDeletedError, "parameter 1: buffer .* was deleted"),
    ("count", lambda c: _bufs(c)[:2], RuntimeApiError, "takes 3 arguments, 2 were given"),
]


def _bufs(client):
    rng = np.random.default_rng(3)
    return [
        client.buffer_from_pyval(np.float32(2)),
        client.buffer_from_pyval(rng.standard_normal(4).astype(np.float32)),
        client.buffer_from_pyval(rng.standard_normal(4).astype(np.float32)),
    ]


def _deleted(client):
    bufs = _bufs(client)
    bufs[1].delete()
    return bufs


@pytest.mark.parametrize("what,make_args,error,match", BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_fast_checks_raise_the_same_errors(what, make_args, error, match):
    client = Client("cpu", device_count=2)
    exe = client.compile(AXPY)
    with pytest.raises(error, match=match):
        exe.execute_portable(make_args(client), client.devices()[0])
    client.close()


def test_tuple_parameters_take_the_general_path():
    client = Client("cpu")
    exe = client.compile(TUPLE_PARAM)
    rng = np.random.default_rng(4)
    a = rng.standard_normal(3).astype(np.float32)
    leaves = (client.buffer_from_pyval(a), client.buffer_from_pyval(np.arange(2, dtype=np.int32)))
    [out] = exe.execute([[leaves]])[0]
    np.testing.assert_allclose(out.to_numpy(), a * a, rtol=1e-6)
    np.testing.assert_array_equal(leaves[0].to_numpy(), a)  # copy-protected
    with pytest.raises(RuntimeApiError, match="expects a tuple of 2"):
        exe.execute([[leaves[0]]])
    client.close()


# -- the inline fast path -------------------------------------------------------------------


def _warm(exe, client):
    """Run once so that the program is known to be cheap: later calls may run inline."""
    for out in exe.execute_portable(_bufs(client), client.devices()[0]):
        out.block_until_ready()


@pytest.mark.parametrize("what,make_args,error,match", BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_warm_fast_path_raises_the_same_errors(what, make_args, error, match):
    client = Client("cpu", device_count=2)
    exe = client.compile(AXPY)
    _warm(exe, client)
    with pytest.raises(error, match=match):
        exe.execute_portable(make_args(client), client.devices()[0])
    with pytest.raises(error, match=match):
        exe.execute([make_args(client)])
    client.close()


def test_inline_outputs_are_ready_counted_and_copy_protected():
    client = Client("cpu")
    exe = client.compile(AXPY)
    dev = client.devices()[0]
    _warm(exe, client)
    a, x, y = _bufs(client)
    x_host, before = x.to_numpy(), dev.memory_stats()
    [out] = exe.execute([[a, x, y]])[0]
    assert out.ready().done()
    after = dev.memory_stats()
    assert after.live_allocations == before.live_allocations + 1
    assert after.bytes_in_use == before.bytes_in_use + 16
    np.testing.assert_allclose(out.to_numpy(), 2 * x_host + y.to_numpy(), rtol=1e-6)
    np.testing.assert_array_equal(x.to_numpy(), x_host)  # aliased, not donated: untouched
    out.delete()
    assert dev.memory_stats().bytes_in_use == before.bytes_in_use
    client.close()


@pytest.mark.usefixtures("cheap_by_cpu_time")
def test_inline_failure_releases_memory_and_fails_downstream(x):
    client, calls, _, _ = _tracing_client()
    failing, ok = _program(client, "fail"), _program(client, "ok")
    dev = client.devices()[0]
    buf = client.buffer_from_pyval(x)
    for program in (failing, ok):  # timed once (asynchronously): later runs are inline
        [warm] = program.execute([[buf]])[0]
        warm.ready().exception()
        warm.delete()
    [out] = failing.execute([[buf]])[0]
    assert calls[-1] == ("fail", threading.current_thread())
    with pytest.raises(ExecutionError, match="failed on purpose"):
        out.block_until_ready()
    [downstream] = ok.execute([[out]])[0]
    with pytest.raises(ExecutionError, match="an input of trace failed"):
        downstream.to_numpy()
    for b in (buf, out, downstream):
        b.delete()
    assert dev.memory_stats().bytes_in_use == 0
    client.close()


def test_inline_calls_race_with_deletion_from_another_thread():
    """One thread runs a warm program on a buffer while another deletes it: each call
    either runs on the live contents or raises BufferDeletedError; memory returns to 0."""
    client = Client("cpu")
    exe = client.compile(AXPY)
    dev = client.devices()[0]
    _warm(exe, client)
    rng = np.random.default_rng(11)
    problems: list[str] = []
    for _ in range(20):
        a, x, y = _bufs(client)
        expected = 2 * x.to_numpy() + y.to_numpy()
        deleter = threading.Thread(target=lambda b=x: (sleep_briefly(rng), b.delete()))
        deleter.start()
        for _ in range(50):
            try:
                [out] = exe.execute([[a, x, y]])[0]
            except BufferDeletedError:
                break
            if not np.array_equal(out.to_numpy(), expected):
                problems.append("wrong result")
            out.delete()
        deleter.join(60)
        for b in (a, y):
            b.delete()
    assert problems == []
    assert dev.memory_stats().bytes_in_use == 0
    client.close()


def sleep_briefly(rng):
    """Sleep up to 0.2 ms, so that a deletion lands at varying points of the calls."""
    threading.Event().wait(float(rng.uniform(0, 2e-4)))


def test_many_threads_on_one_device_keep_results_and_memory():
    client = Client("cpu")
    exe = client.compile(AXPY)
    dev = client.devices()[0]
    _warm(exe, client)
    failures: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(200):
            host = [rng.standard_normal(s).astype(np.float32) for s in ((), (4,), (4,))]
            bufs = [client.buffer_from_pyval(v) for v in host]
            [out] = exe.execute([bufs])[0]
            if not np.allclose(out.to_numpy(), host[0] * host[1] + host[2], rtol=1e-6):
                failures.append(f"thread {seed}: wrong result")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    assert dev.memory_stats().bytes_in_use == 0
    client.close()
