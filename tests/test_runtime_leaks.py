"""Memory a failure must not keep: a host transfer that fails counts nothing; a failed
execution's outputs are freed as soon as they are dropped, without the cyclic GC; the
error still tells where the failure happened."""

import gc

import numpy as np
import pytest

import xlapy.runtime.buffer as buffer_module
from xlapy.errors import XlapyError
from xlapy.runtime import Client

FAIL = """HloModule fail
ENTRY e {
  x = f32[1024] parameter(0)
  ROOT c = f32[1024] custom-call(x), custom_call_target="fail"
}"""
X = np.ones(1024, np.float32)


class NoMemory:
    """numpy, except that copying an array raises MemoryError."""

    def __getattr__(self, name):
        return getattr(np, name)

    def array(self, *args, **kwargs):
        raise MemoryError("no memory for the copy")


@pytest.fixture
def no_gc():
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def all_notes(error) -> str:
    notes = []
    while error is not None:
        notes += getattr(error, "__notes__", [])
        error = error.__cause__ or error.__context__
    return "\n".join(notes)


def in_use(client):
    return client.memory_stats(0).bytes_in_use


def test_failed_host_transfer_counts_nothing(monkeypatch):
    client = Client("cpu")
    monkeypatch.setattr(buffer_module, "np", NoMemory())
    with pytest.raises(MemoryError):
        client.buffer_from_pyval(X)
    assert in_use(client) == 0
    client.close()


def test_failed_device_copy_fails_its_buffer_and_counts_nothing_after(monkeypatch):
    client = Client("cpu")
    buf = client.buffer_from_pyval(X)
    monkeypatch.setattr(buffer_module, "np", NoMemory())
    copy = buf.copy_to_memory_space(client.devices()[0].memory_space("pinned_host"))
    host = buf.copy_to_host()
    monkeypatch.undo()
    with pytest.raises(MemoryError):
        copy.block_until_ready()
    with pytest.raises(MemoryError):
        host.result(timeout=60)
    del copy, buf
    assert in_use(client) == 0
    client.close()


@pytest.mark.parametrize("inline", [True, False])
def test_failed_execution_frees_its_outputs_without_the_cyclic_gc(no_gc, inline):
    client = Client("cpu", inline_execution=inline)

    def fail(ins, opaque):
        raise ValueError("the target refuses")

    client.register_custom_call("fail", fail)
    exe = client.compile(FAIL)
    x = client.buffer_from_pyval(X)
    for _ in range(3):
        [out] = exe.execute([[x]])[0]
        with pytest.raises(XlapyError, match="the target refuses") as info:
            out.to_numpy()
        assert "in fail" in all_notes(info.value)  # where it failed is still told
        del out, info
    assert in_use(client) == X.nbytes
    client.close()


@pytest.mark.parametrize("inline", [True, False])
def test_keyboard_interrupt_in_a_python_custom_call_propagates(inline):
    client = Client("cpu", inline_execution=inline)

    def interrupted(ins, opaque):
        raise KeyboardInterrupt

    client.register_custom_call("fail", interrupted)
    exe = client.compile(FAIL)
    x = client.buffer_from_pyval(X)
    with pytest.raises(KeyboardInterrupt):
        for _ in range(3):  # the second run may be inline
            exe.execute([[x]])[0][0].to_numpy()
    gc.collect()
    assert in_use(client) == X.nbytes
    client.close()
