"""Client, devices, memory spaces, buffers, transfers, futures and the allocator."""

import gc
import threading

import numpy as np
import pytest
from runtime_programs import FAILS, INCREMENT

import xlapy
from xlapy.errors import XlapyError
from xlapy.ir.shapes import Shape
from xlapy.ir.types import PrimitiveType
from xlapy.runtime import (
    BufferDeletedError,
    Client,
    ExecutionError,
    Future,
    HostBufferSemantics,
    RuntimeApiError,
    as_completed,
    wait_all,
)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def client():
    c = Client("cpu", device_count=2)
    yield c
    c.close()


def test_platforms_and_devices(client):
    assert client.platform_name == "cpu"
    assert "cpu backend" in client.platform_version
    assert [d.id for d in client.devices()] == [0, 1]
    assert client.addressable_devices() == client.devices()
    assert client.process_index == 0
    dev = client.lookup_device(1)
    assert dev.client is client and dev.kind == "cpu" and dev.is_addressable()
    assert "cpu:1" in dev.description
    assert dev.default_memory_space.kind == "device"
    assert [s.kind for s in dev.memory_spaces] == ["device", "pinned_host"]
    assert dev.memory_space("pinned_host").devices == (dev,)
    assert len(client.memory_spaces()) == 4
    assert client.default_device_assignment(2) == ((0,), (1,))
    assert client.default_device_assignment(1, 2) == ((0, 1),)
    interp = Client("interpreter")
    assert interp.platform_name == "interpreter" and interp.devices()[0].kind == "interpreter"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.lookup_device(5), "no device 5"),
        (lambda c: c.default_device_assignment(3), "need 3 devices"),
        (lambda c: c.devices()[0].memory_space("hbm"), "no memory space 'hbm'"),
        (lambda c: Client("tpu"), "unknown platform 'tpu'"),
        (lambda c: Client("cpu", device_count=0), "device_count"),
    ],
)
def test_client_errors(client, call, message):
    with pytest.raises(RuntimeApiError, match=message):
        call(client)


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.int32, np.int8, np.bool_, np.complex64]
)
def test_buffer_round_trip(client, rng, dtype):
    host = (rng.standard_normal((3, 5)) * 10).astype(dtype)
    buf = client.buffer_from_pyval(host, client.devices()[1])
    assert buf.shape == Shape.array(PrimitiveType.from_dtype(dtype), (3, 5))
    assert buf.dtype == np.dtype(dtype)
    assert buf.device is client.devices()[1]
    assert buf.memory_space.kind == "device"
    assert buf.on_device_size_in_bytes() == host.nbytes
    out = buf.to_numpy()
    np.testing.assert_array_equal(out, host)
    assert not np.shares_memory(out, host)
    np.testing.assert_array_equal(np.asarray(buf), host)
    np.testing.assert_array_equal(buf.copy_to_host().result(timeout=60), host)


def test_copy_semantics_and_zero_copy(client, rng):
    host = rng.standard_normal(6).astype(np.float32)
    copied = client.buffer_from_pyval(host)
    shared = client.buffer_from_pyval(host, semantics=HostBufferSemantics.IMMUTABLE_ZERO_COPY)
    with copied.external_reference() as view:
        assert not np.shares_memory(view, host)
    with shared.external_reference() as view:
        assert np.shares_memory(view, host)
        assert not view.flags.writeable
    original = host.copy()
    host[0] += 100.0  # the copy taken during the call does not see this
    np.testing.assert_array_equal(copied.to_numpy(), original)


def test_buffer_protocol_input(client):
    data = bytearray(np.arange(4, dtype=np.int32).tobytes())
    buf = client.buffer_from_pyval(memoryview(data).cast("i"))
    np.testing.assert_array_equal(buf.to_numpy(), np.arange(4, dtype=np.int32))


def test_dlpack(client, rng):
    host = rng.standard_normal((2, 3)).astype(np.float32)
    buf = client.buffer_from_pyval(host)
    assert buf.__dlpack_device__() == (1, 0)
    np.testing.assert_array_equal(np.from_dlpack(buf), host)


def test_copy_to_device_and_memory_space(client, rng):
    host = rng.standard_normal(8).astype(np.float32)
    a = client.buffer_from_pyval(host)
    b = a.copy_to_device(client.devices()[1])
    pinned = a.copy_to_memory_space(client.devices()[0].memory_space("pinned_host"))
    assert b.device.id == 1 and pinned.memory_space.kind == "pinned_host"
    np.testing.assert_array_equal(b.to_numpy(), host)
    np.testing.assert_array_equal(pinned.to_numpy(), host)
    stats = client.memory_stats(0)
    assert dict(stats.bytes_in_use_by_kind) == {"device": 32, "pinned_host": 32}


def test_delete_and_use_after_delete(client, rng):
    buf = client.buffer_from_pyval(rng.standard_normal(4).astype(np.float32))
    assert client.memory_stats(0).bytes_in_use == 16
    buf.delete()
    assert buf.is_deleted and not buf.is_donated
    assert client.memory_stats(0).bytes_in_use == 0
    buf.delete()  # twice is fine
    for use in (buf.to_numpy, buf.ready, buf.copy_to_host, lambda: buf.device):
        with pytest.raises(BufferDeletedError, match=r"buffer #\d+ f32\[4\] was deleted"):
            use()


def test_allocator_stats_and_gc(client, rng):
    dev = client.devices()[0]
    before = dev.memory_stats()
    bufs = [client.buffer_from_pyval(rng.standard_normal(n).astype(np.float32)) for n in (4, 16, 8)]
    stats = dev.memory_stats()
    assert stats.bytes_in_use - before.bytes_in_use == 4 * 28
    assert stats.num_allocs - before.num_allocs == 3
    assert stats.largest_alloc_size >= 64
    assert stats.peak_bytes_in_use >= stats.bytes_in_use
    assert stats.live_allocations == 3
    del bufs
    gc.collect()
    assert dev.memory_stats().bytes_in_use == before.bytes_in_use
    assert dev.memory_stats().peak_bytes_in_use >= 4 * 28


def test_external_reference_pins_memory(client, rng):
    host = rng.standard_normal(5).astype(np.float32)
    buf = client.buffer_from_pyval(host)
    with buf.external_reference() as view:
        assert buf.has_external_references
        buf.delete()
        assert client.memory_stats(0).bytes_in_use == 20  # still pinned
        np.testing.assert_array_equal(view, host)
    assert not buf.has_external_references
    assert client.memory_stats(0).bytes_in_use == 0


def test_unknown_dtype_rejected(client):
    with pytest.raises(RuntimeApiError, match="dtype"):
        client.buffer_from_pyval(np.array(["a", "b"]))


NEG3 = """HloModule neg3
ENTRY e {
  p = f32[3] parameter(0)
  ROOT n = f32[3] negate(p)
}"""


# -- futures ---------------------------------------------------------------------------


def test_future_basics():
    fut = Future()
    seen = []
    fut.add_done_callback(lambda f: seen.append(f.result()))
    assert not fut.done()
    with pytest.raises(TimeoutError):
        fut.result(timeout=0.01)
    threading.Timer(0.01, fut.set_result, args=(42,)).start()
    assert fut.result(timeout=60) == 42 and fut.done() and seen == [42]
    fut.add_done_callback(lambda f: seen.append("late"))
    assert seen == [42, "late"]
    bad = Future.failed(ValueError("boom"))
    assert isinstance(bad.exception(), ValueError)
    with pytest.raises(ValueError, match="boom"):
        bad.result()
    with pytest.raises(RuntimeError):
        bad.set_result(1)


def test_wait_all_and_as_completed():
    futs = [Future() for _ in range(4)]
    order = [2, 0, 3, 1]
    for delay, i in enumerate(order):
        threading.Timer(0.005 * (delay + 1), futs[i].set_result, args=(i * 10,)).start()
    done = [f.result() for f in as_completed(futs, timeout=60)]
    assert sorted(done) == [0, 10, 20, 30]
    assert wait_all(futs, timeout=60) == [0, 10, 20, 30]
    failing = [Future.completed(1), Future.failed(KeyError("x"))]
    with pytest.raises(KeyError):
        wait_all(failing)


def test_async_outputs_and_errors_on_first_use(client, rng):
    exe = client.compile(FAILS)
    arg = client.buffer_from_pyval(rng.standard_normal(3).astype(np.float32))
    [out] = exe.execute_portable([arg], client.devices()[0])  # returns; the error comes later
    assert isinstance(out, xlapy.runtime.Buffer)
    error = out.ready().exception(timeout=60)
    assert isinstance(error, ExecutionError) and isinstance(error, XlapyError)
    assert "xlapy_test_fails_at_run_time" in str(error)
    with pytest.raises(ExecutionError, match="execution of fails on device 0 failed"):
        out.to_numpy()
    with pytest.raises(ExecutionError):
        out.copy_to_host().result(timeout=60)
    # an execution fed by the failed output fails too, with the cause in its message
    neg = client.compile(NEG3)
    [chained] = neg.execute_portable([out], client.devices()[0])
    with pytest.raises(ExecutionError, match="an input of neg3 failed"):
        chained.to_numpy()
    # the argument is intact
    assert not arg.is_deleted


def test_executions_on_one_device_are_ordered(client, rng):
    exe = client.compile(INCREMENT)
    dev = client.devices()[0]
    buf = client.buffer_from_pyval(np.float32(rng.standard_normal()))
    start = buf.to_numpy()
    outs = []
    for _ in range(50):
        [buf] = exe.execute_portable([buf], dev, donate=[0])
        outs.append(buf)
    futures = [b.ready() for b in outs[-1:]]
    wait_all(futures, timeout=60)
    np.testing.assert_allclose(buf.to_numpy(), start + 50, rtol=1e-5)
    assert all(b.is_donated for b in outs[:-1])
