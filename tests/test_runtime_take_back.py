"""A caller blocking on the result of a run the device's worker has not started takes it
back and runs it itself (Device.take_back): every run happens exactly once, by one thread,
in the device's order; a run the worker already runs, or one queued behind another, stays
the worker's; donation chains give the same bytes."""

import threading
import time

import numpy as np
import pytest
from many_threads import run_on_threads
from test_runtime_races import BUMP, N

from xlapy.runtime import Client

RECORD = """HloModule record
ENTRY e {
  x = f32[4] parameter(0)
  ROOT c = f32[4] custom-call(x), custom_call_target="record"
}"""


def _handed_off(executable) -> None:
    """Every run of `executable` goes to the device's worker (as a slow program's does)."""
    signature = executable._signature
    signature.cheap_streak, signature.streak_needed = 0, 1 << 30


@pytest.fixture
def recorded():
    """(client, executable, the threads its runs ran on, a gate the target waits on)."""
    client = Client("cpu")
    threads: list[threading.Thread] = []
    lock = threading.Lock()
    gate = threading.Event()
    gate.set()

    def record(ins, opaque):
        assert gate.wait(60), "the test's gate was not opened in 60 s"
        with lock:
            threads.append(threading.current_thread())
        return np.asarray(ins[0]) + 1

    client.register_custom_call("record", record)
    executable = client.compile(RECORD)
    _handed_off(executable)
    yield client, executable, threads, gate
    client.close()


def test_a_blocked_caller_takes_back_a_run_the_worker_has_not_started(recorded):
    client, executable, threads, _ = recorded
    device = client.devices()[0]
    claim, opened = device._claim, threading.Event()

    def slow_claim(entry):  # the worker wakes late: only after the caller has waited
        assert opened.wait(60), "the test did not let the worker claim in 60 s"
        return claim(entry)

    device._claim = slow_claim  # the worker is made on the first queued run, with this
    x = client.buffer_from_pyval(np.arange(4, dtype=np.float32))
    [out] = executable.execute([[x]])[0]
    np.testing.assert_array_equal(out.to_numpy(), np.arange(4) + 1)
    assert threads == [threading.current_thread()]
    opened.set()  # the worker now finds the run taken and skips it
    [again] = executable.execute([[x]])[0]
    np.testing.assert_array_equal(again.to_numpy(), np.arange(4) + 1)
    deadline = time.monotonic() + 60
    while device._queued and time.monotonic() < deadline:
        time.sleep(0.001)
    assert device._queued == 0 and not device._waiting
    assert len(threads) == 2


def test_a_run_the_worker_started_stays_the_workers(recorded):
    client, executable, threads, gate = recorded
    x = client.buffer_from_pyval(np.zeros(4, dtype=np.float32))
    gate.clear()  # the worker's run waits inside the target
    [first] = executable.execute([[x]])[0]
    deadline = time.monotonic() + 60
    while not client.devices()[0]._worker_running and time.monotonic() < deadline:
        time.sleep(0.001)
    [second] = executable.execute([[x]])[0]  # queued behind the running one
    device = client.devices()[0]
    assert not device.take_back(first.ready())  # running on the worker
    assert not device.take_back(second.ready())  # queued behind a running one
    gate.set()
    np.testing.assert_array_equal(second.to_numpy(), np.ones(4))
    np.testing.assert_array_equal(first.to_numpy(), np.ones(4))
    assert threads[0] is not threading.current_thread() and len(threads) == 2


def test_many_threads_blocking_on_their_runs_run_each_once(recorded):
    client, executable, threads, _ = recorded
    rounds = 40

    def caller(k: int) -> None:
        x = client.buffer_from_pyval(np.full(4, k, np.float32))
        for r in range(rounds):
            [out] = executable.execute([[x]])[0]
            if r % 3 == 0:
                time.sleep(0.0005)  # the worker sometimes gets there first
            np.testing.assert_array_equal(out.to_numpy(), np.full(4, k + 1, np.float32))

    run_on_threads(caller, 8)
    assert len(threads) == 8 * rounds
    device = client.devices()[0]
    deadline = time.monotonic() + 60
    while device._queued and time.monotonic() < deadline:
        time.sleep(0.001)
    assert device._queued == 0 and not device._waiting and not device._inline


def test_donation_chains_taken_back_keep_their_order():
    """Threads bump their own buffer in place (donated) through queued runs, some waited
    for at once (taken back), some left queued behind others: every bump lands once."""
    client = Client("cpu")
    bump = client.compile(BUMP)
    _handed_off(bump)
    rounds = 30

    def chain(k: int) -> None:
        buf = client.buffer_from_pyval(np.full(N, k, np.float32))
        for r in range(rounds):
            [buf] = bump.execute([[buf]], donate=[0])[0]
            if r % 4 == 3:
                buf.block_until_ready()
        np.testing.assert_array_equal(buf.to_numpy(), np.full(N, k + rounds, np.float32))

    run_on_threads(chain, 6)
    client.close()
