"""Compiler, executables, compile cache, serialization, memory stats, cost analysis,
multi-device execution, the backend interface and the MLP train step."""

import struct
from pathlib import Path

import numpy as np
import pytest
from runtime_programs import AXPY, DONOR, INCREMENT, TWO_OUT

from xlapy.analysis.cost import analyze_cost
from xlapy.backends import execute, get_backend
from xlapy.backends.base import alias_leaves
from xlapy.errors import HloParseError, VerifierError, XlapyError
from xlapy.ir.parser import parse_module
from xlapy.runtime import (
    Client,
    CompileOptions,
    Compiler,
    RuntimeApiError,
    SerializationError,
)
from xlapy.runtime.serialize import FORMAT_VERSION, MAGIC

MLP = Path(__file__).resolve().parent.parent / "examples" / "mlp_train_step.hlo"


@pytest.fixture
def rng():
    return np.random.default_rng(99)


@pytest.fixture
def client():
    c = Client("cpu", device_count=4)
    yield c
    c.close()


# -- compile cache -----------------------------------------------------------------------


def test_compile_cache_hits(client):
    first = client.compile(AXPY)
    assert client.compile_cache_stats() == {"hits": 0, "misses": 1, "entries": 1}
    assert client.compile(AXPY) is first
    assert client.compile(parse_module(AXPY)) is first  # same program as a module
    assert client.compile_cache_stats()["hits"] == 2
    other = client.compile(
        AXPY, CompileOptions.make(debug_options={"xla_dump_hlo_module_re": "^none"})
    )
    assert other is not first and other.fingerprint != first.fingerprint
    changed = client.compile(AXPY.replace("f32[4]", "f32[5]"))
    assert changed is not first
    assert client.compile_cache_stats() == {"hits": 2, "misses": 3, "entries": 3}
    client.clear_compile_cache()
    assert client.compile(AXPY) is not first


def test_fingerprint_depends_on_platform():
    a = Client("cpu").compile(INCREMENT)
    b = Client("interpreter").compile(INCREMENT)
    assert a.fingerprint != b.fingerprint and len(a.fingerprint) == 64


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("HloModule m\nENTRY e {\n  ROOT p = f32[ parameter(0)\n}", HloParseError),
        (
            "HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT a = f32[3] add(p, p)\n}",
            VerifierError,
        ),
    ],
)
def test_invalid_programs_rejected(client, text, error):
    with pytest.raises(error):
        client.compile(text)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_replicas": 0}, "must be >= 1"),
        ({"num_replicas": 2, "device_assignment": [[0]]}, "2 rows"),
        ({"num_replicas": 2, "device_assignment": [[1], [1]]}, "uses a device twice"),
        ({"backend_options": {"k": [1]}}, "backend_options"),
    ],
)
def test_compile_options_checked(kwargs, message):
    with pytest.raises(RuntimeApiError, match=message):
        CompileOptions.make(**kwargs)


# -- serialization -----------------------------------------------------------------------


def test_serialize_round_trip(client, rng):
    exe = client.compile(AXPY, CompileOptions.make(backend_options={"max_while_iterations": 2}))
    data = exe.serialize()
    assert data[:8] == MAGIC and struct.unpack_from("<I", data, 8)[0] == FORMAT_VERSION
    loaded = client.deserialize_executable(data)
    assert loaded.fingerprint == exe.fingerprint
    assert loaded.hlo_text() == exe.hlo_text()
    assert loaded.options == exe.options
    vals = [np.float32(rng.standard_normal()), *(rng.standard_normal((2, 4)).astype(np.float32))]
    outs = []
    for e in (exe, loaded):
        bufs = [client.buffer_from_pyval(v) for v in vals]
        [out] = e.execute_portable(bufs, client.devices()[0], donate=[1])
        outs.append(out.to_numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], vals[0] * vals[1] + vals[2], rtol=1e-6)


def _corrupt(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d[:10], "truncated"),
        (lambda d: d[:-5], "truncated"),
        (lambda d: d + b"x", "trailing bytes"),
        (lambda d: b"NOTXLAPY" + d[8:], "not a serialized xlapy executable"),
        (lambda d: d[:8] + struct.pack("<I", 99) + d[12:], "format version 99"),
        (lambda d: _corrupt(d, 40), "checksum mismatch"),
        (lambda d: _corrupt(d, len(d) - 40), "checksum mismatch"),
        (lambda d: b"", "truncated"),
    ],
)
def test_bad_bytes_rejected(client, damage, message):
    data = client.compile(INCREMENT).serialize()
    with pytest.raises(SerializationError, match=message):
        client.deserialize_executable(damage(data))


def test_wrong_platform_rejected(client):
    data = Client("interpreter").compile(INCREMENT).serialize()
    with pytest.raises(SerializationError, match="platform 'interpreter'"):
        client.deserialize_executable(data)


def test_compiler_and_load(client):
    exe = Compiler("cpu").compile(TWO_OUT)
    loaded = client.load(exe)
    assert loaded.fingerprint == exe.fingerprint
    with pytest.raises(RuntimeApiError, match="compiled for platform 'interpreter'"):
        client.load(Compiler("interpreter").compile(TWO_OUT))


# -- memory stats and cost ---------------------------------------------------------------


def test_memory_stats_count_alias_once(client):
    stats = client.compile(AXPY).memory_stats()
    assert (stats.argument_bytes, stats.output_bytes, stats.alias_bytes) == (36, 16, 16)
    assert stats.peak_bytes == 36 + 16 - 16 + stats.temp_bytes
    donor = client.compile(DONOR).memory_stats()
    assert donor.alias_bytes == 24


def test_mlp_memory_stats_and_cost(client):
    exe = client.compile(MLP.read_text())
    stats = exe.memory_stats()
    params = 4 * (64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10)
    assert stats.alias_bytes == params
    assert stats.argument_bytes == params + 4 * 32 * 64 + 4 * 32
    assert stats.peak_bytes == (
        stats.argument_bytes + stats.output_bytes - stats.alias_bytes + stats.temp_bytes
    )
    cost = exe.cost_analysis()
    forward = 2 * 32 * (64 * 128 + 128 * 128 + 128 * 10)
    assert 2.5 * forward < cost["flops"] < 4 * forward  # forward + two backward dots each
    assert cost["transcendentals"] > 0 and cost["bytes accessed"] > params


@pytest.mark.parametrize(
    ("body", "flops", "transcendentals"),
    [
        ("ROOT r = f32[8,16] add(p, p)", 128, 0),
        ("ROOT r = f32[8,16] exponential(p)", 0, 128),
        (
            "q = f32[16,4] constant({...})\n  ROOT r = f32[8,4] dot(p, q), "
            "lhs_contracting_dims={1}, rhs_contracting_dims={0}",
            2 * 8 * 4 * 16,
            0,
        ),
    ],
)
def test_cost_rules(body, flops, transcendentals):
    text = f"HloModule c\nENTRY e {{\n  p = f32[8,16] parameter(0)\n  {body}\n}}"
    cost = analyze_cost(parse_module(text))
    assert (cost.flops, cost.transcendentals) == (flops, transcendentals)
    assert cost.bytes_accessed > 0


# -- devices -----------------------------------------------------------------------------


def test_execute_over_replicas(client, rng):
    exe = client.compile(AXPY, CompileOptions.make(num_replicas=2))
    devices = exe.addressable_devices
    assert [d.id for d in devices] == [0, 1]
    host = [
        [np.float32(rng.standard_normal()), *rng.standard_normal((2, 4)).astype(np.float32)]
        for _ in devices
    ]
    args = [[client.buffer_from_pyval(v, d) for v in vals] for vals, d in zip(host, devices)]
    results = exe.execute(args, donate=[1])
    for (a, x, y), outs, d in zip(host, results, devices):
        assert outs[0].device is d
        np.testing.assert_allclose(outs[0].to_numpy(), a * x + y, rtol=1e-6)
    assert all(lst[1].is_donated for lst in args)
    [single] = exe.execute_sharded(
        [client.buffer_from_pyval(v, devices[1]) for v in host[1]], devices[1]
    )
    np.testing.assert_allclose(single.to_numpy(), host[1][0] * host[1][1] + host[1][2], rtol=1e-6)


def test_device_errors(client, rng):
    exe = client.compile(AXPY, CompileOptions.make(num_replicas=2))
    bufs = [
        client.buffer_from_pyval(v)
        for v in (np.float32(1), *rng.standard_normal((2, 4)).astype(np.float32))
    ]
    with pytest.raises(RuntimeApiError, match="runs on 2 devices, 1 argument lists"):
        exe.execute([bufs])
    with pytest.raises(
        RuntimeApiError, match="is on device 0, but this execution runs on device 1"
    ):
        exe.execute([bufs, bufs])
    assert not any(b.is_deleted for b in bufs)
    with pytest.raises(RuntimeApiError, match="not assigned to device 3"):
        exe.execute_sharded(bufs, client.devices()[3])
    with pytest.raises(RuntimeApiError, match="execute_portable needs exactly one"):
        exe.execute_portable(bufs, client.devices()[0])
    single = client.compile(AXPY)
    moved = [b.copy_to_device(client.devices()[3]) for b in bufs]
    [out] = single.execute_portable(moved, client.devices()[3])
    assert out.device.id == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (lambda c, r: [], "takes 3 arguments, 0 were given"),
        (lambda c, r: [np.float32(1), None, None], "expects a Buffer"),
        (lambda c, r: [c.buffer_from_pyval(np.float32(1))] * 3, r"parameter 1 expects f32\[4\]"),
    ],
)
def test_argument_errors(client, rng, args, message):
    exe = client.compile(AXPY)
    with pytest.raises(RuntimeApiError, match=message):
        exe.execute_portable(args(client, rng), client.devices()[0])


# -- backend interface -------------------------------------------------------------------


def test_backend_interface_in_place(rng):
    module = parse_module(AXPY)
    backend = get_backend("interpreter")
    assert backend.name == "interpreter" and backend.platform == "interpreter"
    program = backend.compile(module)
    a, x, y = (
        np.array(np.float32(2)),
        rng.standard_normal(4).astype(np.float32),
        rng.standard_normal(4).astype(np.float32),
    )
    keep = x.copy()
    out = program.run([a, x, y], frozenset())
    assert not np.shares_memory(out, x)
    np.testing.assert_array_equal(x, keep)
    out = program.run([a, x, y], frozenset({1}))
    assert out is x
    np.testing.assert_allclose(x, 2 * keep + y, rtol=1e-6)
    assert alias_leaves(module)[0].param_number == 1
    np.testing.assert_allclose(execute(module, [a, keep, y]), 2 * keep + y, rtol=1e-6)
    with pytest.raises(XlapyError, match="unknown backend 'gpu'"):
        get_backend("gpu")


# -- the MLP train step ------------------------------------------------------------------


def test_mlp_train_step_with_donation(client, rng):
    exe = client.compile(MLP.read_text())
    shapes = exe.parameter_shapes
    params = [
        (rng.standard_normal(s.dims) * (0.1 if s.rank else 0.01)).astype(s.dtype)
        for s in shapes[:6]
    ]
    x = rng.standard_normal(shapes[6].dims).astype(np.float32)
    y = rng.integers(0, 10, shapes[7].dims).astype(np.int32)
    module = parse_module(MLP.read_text())
    ref_params = [p.copy() for p in params]
    dev = client.devices()[0]
    bufs = [client.buffer_from_pyval(p, dev) for p in params]
    bx, by = client.buffer_from_pyval(x, dev), client.buffer_from_pyval(y, dev)
    pointers = [b.unsafe_buffer_pointer() for b in bufs]
    losses = []
    for _ in range(10):
        old = bufs
        loss, *bufs = exe.execute_portable([*bufs, bx, by], dev, donate=range(6))
        assert all(b.is_donated for b in old)
        losses.append(float(loss.to_numpy()))
        ref = execute(module, [*ref_params, x, y])
        np.testing.assert_allclose(losses[-1], ref[0], rtol=1e-5)
        ref_params = list(ref[1:])
    assert [b.unsafe_buffer_pointer() for b in bufs] == pointers  # updated in place all along
    for b, r in zip(bufs, ref_params):
        np.testing.assert_allclose(b.to_numpy(), r, rtol=1e-5, atol=1e-6)
    assert losses[-1] < losses[0]
    live = sum(p.nbytes for p in params) + x.nbytes + y.nbytes + 4
    assert dev.memory_stats().bytes_in_use == live
