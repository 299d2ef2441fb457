"""Code running inside an execution (a Python custom call) that calls back into the runtime.

An execution it starts on its own device runs nested, at once, on the thread that runs the
custom call (as on XLA:CPU): its outputs are ready when `execute` returns, it has its own
temp memory (the same executable may be re-entered), it may not donate memory the running
execution reads, and runaway recursion ends with a clear error. Waits that really cannot
complete (for the running execution's own outputs, or for a run queued behind it) fail at
once with a clear error instead of deadlocking the device; a wait on a device running a
collective with the caller's device is bounded by the collective's timeout. The client
keeps working afterwards. Inputs are random (nonzero) arrays."""

import os
import threading

import numpy as np
import pytest

from xlapy.errors import XlapyError
from xlapy.runtime import Client
from xlapy.runtime import device as device_module
from xlapy.runtime.errors import DonationError
from xlapy.runtime.options import CompileOptions

CALLBACK = """HloModule cb
ENTRY e {
  x = f32[4] parameter(0)
  ROOT c = f32[4] custom-call(x), custom_call_target="reenter"
}"""
NEG = """HloModule neg
ENTRY e {
  x = f32[4] parameter(0)
  ROOT n = f32[4] negate(x)
}"""
RECURSE = """HloModule rec
ENTRY e {
  x = f32[8] parameter(0)
  a = f32[8] multiply(x, x)
  b = f32[8] add(a, x)
  c = f32[8] custom-call(b), custom_call_target="recurse"
  d = f32[8] multiply(c, a)
  ROOT r = f32[8] subtract(d, b)
}"""
DOUBLE_IN_PLACE = """HloModule dbl, input_output_alias={ {}: (0, {}, may-alias) }
ENTRY e {
  x = f32[4] parameter(0)
  ROOT d = f32[4] add(x, x)
}"""
ALL_REDUCE = """HloModule ar, num_partitions=2
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  x = f32[4] parameter(0)
  ROOT r = f32[4] all-reduce(x), channel_id=1, replica_groups={},
    use_global_device_ids=true, to_apply=add
}"""
CALL_THEN_ALL_REDUCE = ALL_REDUCE.replace(
    "ROOT r = f32[4] all-reduce(x)",
    'c = f32[4] custom-call(x), custom_call_target="reenter"\n  ROOT r = f32[4] all-reduce(c)',
)
RNG = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
PLATFORMS = ["cpu", "interpreter"]


def rand(n):
    return (RNG.uniform(0.1, 0.9, n) * RNG.choice([-1, 1], n)).astype(np.float32)


def bounded(fn, seconds=120):
    """fn() on a daemon thread; its result or exception; fails the test if it hangs."""
    box: list = []

    def go():
        try:
            box.append(("ok", fn()))
        except BaseException as e:  # the outcome under test
            box.append(("error", e))

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert box, f"deadlock: still waiting after {seconds} s"
    return box[0]


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("inline", [True, False])
def test_custom_call_executing_on_its_own_device_runs_nested(platform, inline):
    client = Client(platform, inline_execution=inline)
    neg = client.compile(NEG)
    seen = []

    def reenter(ins, opaque):
        buf = client.buffer_from_pyval(np.asarray(ins[0]))
        (out,) = neg.execute([[buf]])[0]
        seen.append(out.ready().done())  # a nested run is done when execute returns
        return out.to_numpy() * 3

    client.register_custom_call("reenter", reenter)
    exe = client.compile(CALLBACK)
    for _ in range(3):  # warm: later calls may run inline
        x = rand(4)
        kind, value = bounded(
            lambda x=x: exe.execute([[client.buffer_from_pyval(x)]])[0][0].to_numpy()
        )
        assert kind == "ok", value
        np.testing.assert_array_equal(value, -x * 3)
    assert seen == [True] * 3
    x = rand(4)
    kind, value = bounded(lambda: neg.execute([[client.buffer_from_pyval(x)]])[0][0].to_numpy())
    assert kind == "ok"
    np.testing.assert_array_equal(value, -x)
    assert client.devices()[0].memory_stats().bytes_in_use < 1024
    client.close()


def _recursion_reference(x, depth, limit):
    a = x * x
    b = a + x
    c = _recursion_reference(b, depth + 1, limit) if depth < limit else b
    return c * a - b


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("inline", [True, False])
def test_same_executable_reentered_keeps_its_own_temps(platform, inline):
    # Each level's temps (a, b) live across the custom call that runs the same executable
    # again: a shared arena would let the inner run overwrite them.
    client = Client(platform, inline_execution=inline)
    limit = 3
    depth = [0]

    def recurse(ins, opaque):
        if depth[0] >= limit:
            return np.asarray(ins[0]).copy()
        depth[0] += 1
        try:
            buf = client.buffer_from_pyval(np.asarray(ins[0]))
            return exe.execute([[buf]])[0][0].to_numpy()
        finally:
            depth[0] -= 1

    client.register_custom_call("recurse", recurse)
    exe = client.compile(RECURSE)
    for _ in range(3):
        x = rand(8)
        kind, value = bounded(
            lambda x=x: exe.execute([[client.buffer_from_pyval(x)]])[0][0].to_numpy()
        )
        assert kind == "ok", value
        np.testing.assert_allclose(value, _recursion_reference(x, 0, limit), rtol=1e-5, atol=1e-6)
    client.close()


def test_runaway_recursion_gets_a_clear_error(monkeypatch):
    monkeypatch.setattr(device_module, "MAX_NESTED_DEPTH", 4)
    client = Client("cpu")
    calls = [0]

    def recurse(ins, opaque):
        calls[0] += 1
        buf = client.buffer_from_pyval(np.asarray(ins[0]))
        return exe.execute([[buf]])[0][0].to_numpy()

    client.register_custom_call("recurse", recurse)
    exe = client.compile(RECURSE)
    kind, value = bounded(
        lambda: exe.execute([[client.buffer_from_pyval(rand(8))]])[0][0].to_numpy()
    )
    assert kind == "error" and isinstance(value, XlapyError), value
    assert "executions nest 4 deep on that device" in str(value)
    assert "MAX_NESTED_DEPTH = 4" in str(value)
    assert calls[0] == 5  # the outer run and 4 nested ones each called back once
    x = rand(4)  # the device is usable again
    neg = client.compile(NEG)
    np.testing.assert_array_equal(neg.execute([[client.buffer_from_pyval(x)]])[0][0].to_numpy(), -x)
    client.close()


@pytest.mark.parametrize("inline", [True, False])
def test_nested_donation_of_memory_the_running_execution_reads_is_refused(inline):
    client = Client("cpu", inline_execution=inline)
    dbl = client.compile(DOUBLE_IN_PLACE)
    outer_input: list = []
    seen: dict = {}

    def reenter(ins, opaque):
        fresh = client.buffer_from_pyval(np.asarray(ins[0]))
        (out,) = dbl.execute([[fresh]], donate=[0])[0]  # memory no other run uses: fine
        seen["fresh donated"] = fresh.is_donated
        (kept,) = dbl.execute([[outer_input[0]]])[0]  # not donated: copy-protection
        seen["copy-protected"] = kept.to_numpy()
        try:
            dbl.execute([[outer_input[0]]], donate=[0])
        except DonationError as e:
            seen["refused"] = str(e)
        return out.to_numpy()

    client.register_custom_call("reenter", reenter)
    exe = client.compile(CALLBACK)
    x = rand(4)
    outer_input.append(client.buffer_from_pyval(x))
    kind, value = bounded(lambda: exe.execute([[outer_input[0]]])[0][0].to_numpy())
    assert kind == "ok", value
    np.testing.assert_array_equal(value, x * 2)
    assert seen["fresh donated"]
    np.testing.assert_array_equal(seen["copy-protected"], x * 2)
    assert "cannot be donated to an execution nested in one running on device 0" in seen["refused"]
    np.testing.assert_array_equal(outer_input[0].to_numpy(), x)  # untouched, still valid
    assert not outer_input[0].is_donated
    client.close()


def test_custom_call_waiting_for_its_own_execution_fails_clearly():
    client = Client("cpu", inline_execution=False)
    mine: list = []
    go = threading.Event()

    def reenter(ins, opaque):
        assert go.wait(60)
        return mine[0].to_numpy()

    client.register_custom_call("reenter", reenter)
    exe = client.compile(CALLBACK)
    mine.append(exe.execute([[client.buffer_from_pyval(rand(4))]])[0][0])
    go.set()
    kind, value = bounded(mine[0].to_numpy)
    assert kind == "error", value
    assert "waiting for a result of an execution on device 0" in str(value)
    assert "would wait for ever" in str(value)
    client.close()


def test_custom_call_waiting_for_later_work_on_its_device_fails_clearly():
    # The later run is queued behind the running one: it really cannot complete first.
    client = Client("cpu", inline_execution=False)
    neg = client.compile(NEG)
    later: list = []
    go = threading.Event()

    def reenter(ins, opaque):
        assert go.wait(60)
        return later[0].to_numpy()

    client.register_custom_call("reenter", reenter)
    exe = client.compile(CALLBACK)
    first = exe.execute([[client.buffer_from_pyval(rand(4))]])[0][0]
    x = rand(4)
    later.append(neg.execute([[client.buffer_from_pyval(x)]])[0][0])
    go.set()
    kind, value = bounded(first.to_numpy)
    assert kind == "error", value
    assert "waiting for a result of an execution on device 0" in str(value)
    kind, value = bounded(later[0].to_numpy)
    assert kind == "ok"
    np.testing.assert_array_equal(value, -x)
    client.close()


def test_custom_call_may_execute_on_another_device():
    client = Client("cpu", device_count=2)
    neg = client.compile(NEG)
    other = client.devices()[1]

    def reenter(ins, opaque):
        buf = client.buffer_from_pyval(np.asarray(ins[0]), other)
        return neg.execute_portable([buf], other)[0].to_numpy()

    client.register_custom_call("reenter", reenter)
    exe = client.compile(CALLBACK)
    x = rand(4)
    kind, value = bounded(lambda: exe.execute([[client.buffer_from_pyval(x)]])[0][0].to_numpy())
    assert kind == "ok", value
    np.testing.assert_array_equal(value, -x)
    client.close()


@pytest.mark.parametrize("platform", PLATFORMS)
def test_custom_call_runs_a_collective_with_an_idle_device(platform):
    # Device 0's part runs nested on the custom call's thread, device 1's on its worker.
    client = Client(platform, device_count=2)
    d0, d1 = client.devices()
    options = CompileOptions.make(num_partitions=2, backend_options={"collective_timeout": 60})
    ar = client.compile(ALL_REDUCE, options)
    y = rand(4)

    def reenter(ins, opaque):
        args = [
            [client.buffer_from_pyval(np.asarray(ins[0]), d0)],
            [client.buffer_from_pyval(y, d1)],
        ]
        outs = ar.execute(args)
        return outs[0][0].to_numpy() + outs[1][0].to_numpy()

    client.register_custom_call("reenter", reenter)
    exe = client.compile(CALLBACK)
    x = rand(4)
    kind, value = bounded(lambda: exe.execute([[client.buffer_from_pyval(x, d0)]])[0][0].to_numpy())
    assert kind == "ok", value
    np.testing.assert_allclose(value, 2 * (x + y), rtol=1e-6)
    client.close()


def test_collective_with_a_device_busy_in_one_with_the_caller_is_bounded_and_named():
    # Device 0's part of a collective program calls back and runs another collective
    # program; device 1 is in the first program's all-reduce, waiting for device 0, so the
    # second program's part for device 1 is queued behind it: the collective timeouts end
    # the wait with errors naming the devices that did not arrive.
    client = Client("cpu", device_count=2)
    d0, d1 = client.devices()
    options = CompileOptions.make(num_partitions=2, backend_options={"collective_timeout": 1.0})
    ar = client.compile(ALL_REDUCE, options)

    def reenter(ins, opaque):
        if not d0.runs_on_current_thread():
            return np.asarray(ins[0]).copy()
        args = [[client.buffer_from_pyval(np.asarray(ins[0]), d)] for d in (d0, d1)]
        return ar.execute(args)[0][0].to_numpy()

    client.register_custom_call("reenter", reenter)
    exe = client.compile(CALL_THEN_ALL_REDUCE, options)
    args = [[client.buffer_from_pyval(rand(4), d)] for d in (d0, d1)]
    kind, value = bounded(lambda: [o[0].to_numpy() for o in exe.execute(args)], seconds=60)
    assert kind == "error", value
    assert "did not arrive within 1 s" in str(value)
    x, y = rand(4), rand(4)  # both devices work afterwards
    outs = ar.execute([[client.buffer_from_pyval(x, d0)], [client.buffer_from_pyval(y, d1)]])
    np.testing.assert_allclose(outs[1][0].to_numpy(), x + y, rtol=1e-6)
    client.close()


def test_custom_call_wait_without_timeout_is_bounded_and_named(monkeypatch):
    from xlapy.runtime import futures

    monkeypatch.setattr(futures, "CUSTOM_CALL_WAIT_SECONDS", 0.2, raising=False)
    client = Client("cpu")
    never = futures.Future()
    client.register_custom_call("reenter", lambda ins, opaque: never.result())
    exe = client.compile(CALLBACK)
    kind, value = bounded(
        lambda: exe.execute([[client.buffer_from_pyval(rand(4))]])[0][0].to_numpy()
    )
    assert kind == "error"
    assert "custom-call target 'reenter' waited 0.2 s" in str(value)
    client.close()


def test_two_parts_of_one_collective_held_by_one_thread_are_refused():
    # Device 0's custom call runs a program inline on device 1 (on the same thread), whose
    # custom call runs a collective program over devices 0 and 1: both parts would have to
    # run nested on this one thread, each waiting for the other.
    client = Client("cpu", device_count=2)
    d0, d1 = client.devices()
    options = CompileOptions.make(num_partitions=2, backend_options={"collective_timeout": 60})
    ar = client.compile(ALL_REDUCE, options)

    def hop(ins, opaque):
        buf = client.buffer_from_pyval(np.asarray(ins[0]), d1)
        return on_d1.execute_portable([buf], d1)[0].to_numpy()

    def both(ins, opaque):
        args = [[client.buffer_from_pyval(np.asarray(ins[0]), d)] for d in (d0, d1)]
        return ar.execute(args)[0][0].to_numpy()

    client.register_custom_call("reenter", hop)
    client.register_custom_call("both", both)
    exe = client.compile(CALLBACK)
    on_d1 = client.compile(CALLBACK.replace('"reenter"', '"both"'))
    for signature in (exe.call_signature, on_d1.call_signature):
        signature.cheap_streak = 1000  # taken for cheap: each run inline on the caller's thread
    kind, value = bounded(
        lambda: exe.execute([[client.buffer_from_pyval(rand(4), d0)]])[0][0].to_numpy()
    )
    assert kind == "error", value
    assert "on devices 0, 1 from inside executions running on those devices" in str(value)
    assert "wait for each other" in str(value)
    x, y = rand(4), rand(4)  # both devices work afterwards
    outs = ar.execute([[client.buffer_from_pyval(x, d0)], [client.buffer_from_pyval(y, d1)]])
    np.testing.assert_allclose(outs[0][0].to_numpy(), x + y, rtol=1e-6)
    client.close()
