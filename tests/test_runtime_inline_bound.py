"""Inline execution is bounded: a program that was cheap and turns out slow (its run time
depends on its data) blocks the caller of execute ever more rarely, not on every slow run
that follows a cheap one."""

import threading
import time

import numpy as np

from xlapy.runtime import Client

SOMETIMES_SLOW = """HloModule sometimes_slow
ENTRY e {
  x = f32[4] parameter(0)
  ROOT c = f32[4] custom-call(x), custom_call_target="maybe_sleep"
}"""
SLEEP = 0.15


def test_a_program_turning_slow_stops_blocking_its_callers():
    """A slow run blocked its caller when it ran inside `execute` (inline): counted by
    whether execute had returned when the slow run began, not by timing execute, which a
    loaded machine can stall for longer than the slow run takes. (A run handed to the
    worker may still run on the caller's thread: taken back by the caller's wait for its
    result, Device.take_back, after execute returned.)"""
    client = Client("cpu")
    slow_runs = []  # per slow run: whether execute had returned when it began
    returned = threading.Event()

    def maybe_sleep(ins, opaque):
        if ins[0][0] > 0:
            slow_runs.append(returned.is_set())
            time.sleep(SLEEP)
        return np.asarray(ins[0]) + 1

    client.register_custom_call("maybe_sleep", maybe_sleep)
    exe = client.compile(SOMETIMES_SLOW)
    fast = client.buffer_from_pyval(np.zeros(4, np.float32))
    slow = client.buffer_from_pyval(np.ones(4, np.float32))
    for _ in range(6):
        for _ in range(3):  # cheap runs: the program looks cheap again
            exe.execute([[fast]])[0][0].block_until_ready()
        returned.clear()
        [out] = exe.execute([[slow]])[0]
        returned.set()
        np.testing.assert_array_equal(out.to_numpy(), np.full(4, 2, np.float32))
    assert len(slow_runs) == 6
    blocked = sum(not after for after in slow_runs)
    assert blocked <= 1, f"execute blocked its caller for a slow run {blocked} times of 6"
    client.close()


def test_a_cheap_program_still_runs_inline_after_its_first_run(monkeypatch):
    from xlapy.runtime import execution

    # cheap by CPU time alone: a loaded machine can stall the timed run past the wall limit
    monkeypatch.setattr(execution, "INLINE_MAX_WALL_SECONDS", 600.0)
    client = Client("cpu")
    runs = []  # per run: whether execute had returned when it began (not inline)
    returned = threading.Event()

    def record(ins, opaque):
        runs.append(returned.is_set())
        return np.asarray(ins[0]) + 1

    client.register_custom_call("maybe_sleep", record)
    exe = client.compile(SOMETIMES_SLOW)
    x = client.buffer_from_pyval(np.zeros(4, np.float32))
    for _ in range(3):
        returned.clear()
        [out] = exe.execute([[x]])[0]
        returned.set()
        out.block_until_ready()
    assert runs[0] and not runs[-1]
    client.close()
