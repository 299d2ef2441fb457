"""Code running inside an execution (a Python custom call) that calls back into the runtime:
starting an execution on its own device, or waiting for a result that device has yet to
produce, fails at once with a clear error instead of deadlocking the device; the client
keeps working afterwards."""

import threading

import numpy as np
import pytest

from xlapy.errors import XlapyError
from xlapy.runtime import Client

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
X = np.arange(4, dtype=np.float32)


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


@pytest.mark.parametrize("inline", [True, False])
def test_custom_call_executing_on_its_own_device_fails_clearly(inline):
    client = Client("cpu", inline_execution=inline)
    neg = client.compile(NEG)

    def reenter(ins, opaque):
        buf = client.buffer_from_pyval(np.asarray(ins[0]))
        return neg.execute([[buf]])[0][0].to_numpy()

    client.register_custom_call("reenter", reenter)
    exe = client.compile(CALLBACK)
    for _ in range(2):  # warm: the second call may run inline
        kind, value = bounded(lambda: exe.execute([[client.buffer_from_pyval(X)]])[0][0].to_numpy())
        assert kind == "error", value
        assert isinstance(value, XlapyError)
        assert "from inside an execution running on that device" in str(value)
    kind, value = bounded(lambda: neg.execute([[client.buffer_from_pyval(X)]])[0][0].to_numpy())
    assert kind == "ok"
    np.testing.assert_array_equal(value, -X)
    client.close()


def test_custom_call_waiting_for_later_work_on_its_device_fails_clearly():
    client = Client("cpu", inline_execution=False)
    neg = client.compile(NEG)
    later: list = []
    go = threading.Event()

    def reenter(ins, opaque):
        assert go.wait(60)
        return later[0].to_numpy()

    client.register_custom_call("reenter", reenter)
    exe = client.compile(CALLBACK)
    first = exe.execute([[client.buffer_from_pyval(X)]])[0][0]
    later.append(neg.execute([[client.buffer_from_pyval(X)]])[0][0])
    go.set()
    kind, value = bounded(first.to_numpy)
    assert kind == "error", value
    assert "waiting for a result of an execution on device 0" in str(value)
    kind, value = bounded(later[0].to_numpy)
    assert kind == "ok"
    np.testing.assert_array_equal(value, -X)
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
    kind, value = bounded(lambda: exe.execute([[client.buffer_from_pyval(X)]])[0][0].to_numpy())
    assert kind == "ok", value
    np.testing.assert_array_equal(value, -X)
    client.close()


def test_custom_call_wait_without_timeout_is_bounded_and_named(monkeypatch):
    from xlapy.runtime import futures

    monkeypatch.setattr(futures, "CUSTOM_CALL_WAIT_SECONDS", 0.2, raising=False)
    client = Client("cpu")
    never = futures.Future()
    client.register_custom_call("reenter", lambda ins, opaque: never.result())
    exe = client.compile(CALLBACK)
    kind, value = bounded(lambda: exe.execute([[client.buffer_from_pyval(X)]])[0][0].to_numpy())
    assert kind == "error"
    assert "custom-call target 'reenter' waited 0.2 s" in str(value)
    client.close()
