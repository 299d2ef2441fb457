"""Misuse that must fail with a typed xlapy error saying what is wrong (not an untyped
Python error, a silent misreading, or a misleading message)."""

import hashlib
import json
import struct

import numpy as np
import pytest

from xlapy.errors import VerifierError, XlapyError
from xlapy.ir.parser import parse_module
from xlapy.ir.verifier import verify
from xlapy.runtime import Client, CompileOptions, DonationError, RuntimeApiError
from xlapy.runtime.errors import SerializationError

INCREMENT = """HloModule increment, input_output_alias={ {}: 0 }
ENTRY entry {
  p = f32[] parameter(0)
  c = f32[] constant(1)
  ROOT out = f32[] add(p, c)
}"""
NEG = """HloModule neg
ENTRY e {
  x = f32[4] parameter(0)
  ROOT n = f32[4] negate(x)
}"""


@pytest.fixture
def client():
    c = Client("cpu")
    yield c
    c.close()


@pytest.mark.parametrize(
    "dims",
    ["4611686018427387904,4", "9223372036854775807", "2305843009213693952"],
)
def test_byte_size_beyond_int64_is_a_verifier_error(client, dims):
    text = f"""HloModule big
ENTRY e {{
  p = f32[{dims}] parameter(0)
  ROOT n = f32[{dims}] negate(p)
}}"""
    with pytest.raises(VerifierError, match="int64"):
        verify(parse_module(text))
    with pytest.raises(XlapyError, match="int64"):
        client.compile(text)


def test_buffers_together_beyond_int64_is_a_verifier_error():
    big = "f32[1152921504606846976]"  # 2^62 bytes each: fine alone, not together
    text = f"""HloModule big
ENTRY e {{
  p = {big} parameter(0)
  n = {big} negate(p)
  ROOT m = {big} negate(n)
}}"""
    with pytest.raises(VerifierError, match="together"):
        verify(parse_module(text))


@pytest.mark.parametrize("data", ["XLAPYEXE....", 42, None, [1, 2]])
def test_deserializing_what_is_not_bytes_is_a_serialization_error(client, data):
    with pytest.raises(SerializationError, match="must be bytes"):
        client.deserialize_executable(data)


def test_trailing_bytes_message_reads(client):
    data = client.compile(NEG).serialize() + b"x"
    with pytest.raises(SerializationError) as info:
        client.deserialize_executable(data)
    assert "executable has trailing bytes" in str(info.value)
    assert "is has" not in str(info.value)


def test_non_utf8_hlo_text_is_reported_as_such(client):
    meta = json.dumps({"platform": "cpu"}).encode()
    text = b"HloModule m\xff"
    header = struct.pack("<8sIIQ", b"XLAPYEXE", 1, len(meta), len(text))
    body = header + meta + text
    with pytest.raises(SerializationError, match="HLO text is not UTF-8") as info:
        client.deserialize_executable(body + hashlib.sha256(body).digest())
    assert "metadata" not in str(info.value)


@pytest.mark.parametrize(
    "assignment",
    [[["a"]], [[0.5]], [[None]], [[True]], "0", [0], [[-1]]],
    ids=["str", "float", "none", "bool", "text", "flat", "negative"],
)
def test_bad_device_assignment_is_a_runtime_error(assignment):
    with pytest.raises(RuntimeApiError, match="device"):
        CompileOptions.make(device_assignment=assignment)


@pytest.mark.parametrize("count", ["2", 1.0, None, True])
def test_non_integer_replica_count_is_a_runtime_error(count):
    with pytest.raises(RuntimeApiError, match="num_replicas must be an integer"):
        CompileOptions.make(num_replicas=count)


@pytest.mark.parametrize("donate", [[True], [False], [np.True_]])
def test_donate_takes_parameter_numbers_not_flags(client, donate):
    exe = client.compile(INCREMENT)
    buf = client.buffer_from_pyval(np.float32(1))
    with pytest.raises(DonationError, match="parameter numbers"):
        exe.execute([[buf]], donate=donate)
    assert not buf.is_deleted


@pytest.mark.parametrize("veto", [[True], [0.0], ["0"]])
def test_non_donatable_takes_parameter_numbers(client, veto):
    exe = client.compile(INCREMENT)
    buf = client.buffer_from_pyval(np.float32(1))
    with pytest.raises(DonationError, match="parameter numbers"):
        exe.execute([[buf]], donate=[0], non_donatable=veto)
    assert not buf.is_deleted


def test_nothing_starts_after_close():
    client = Client("cpu")
    exe = client.compile(NEG)
    buf = client.buffer_from_pyval(np.ones(4, np.float32))
    for _ in range(2):  # warm: the second call would run inline
        exe.execute([[buf]])[0][0].block_until_ready()
    client.close()
    with pytest.raises(RuntimeApiError, match="client was closed"):
        exe.execute([[buf]])
    with pytest.raises(RuntimeApiError, match="client was closed"):
        exe.execute([[buf]], donate=[0])
    with pytest.raises(RuntimeApiError, match="client was closed"):
        client.compile(NEG)
    with pytest.raises(RuntimeApiError, match="client was closed"):
        client.compile(INCREMENT)
    with pytest.raises(RuntimeApiError, match="client was closed"):
        client.buffer_from_pyval(np.ones(4, np.float32))
    np.testing.assert_array_equal(buf.to_numpy(), np.ones(4, np.float32))


def test_another_clients_buffer_is_named_as_such():
    one, two = Client("cpu"), Client("cpu")
    exe = one.compile(NEG)
    buf = two.buffer_from_pyval(np.ones(4, np.float32))
    with pytest.raises(RuntimeApiError) as info:
        exe.execute([[buf]])
    message = str(info.value)
    assert "another client" in message
    assert "runs on device 0" not in message
    one.close()
    two.close()


@pytest.mark.parametrize("donate", [None, (), []])
def test_donate_none_means_no_donation(client, donate):
    exe = client.compile(INCREMENT)
    x = np.float32(np.random.default_rng(5).standard_normal())
    buf = client.buffer_from_pyval(x)
    for call in (
        lambda: exe.execute([[buf]], donate=donate, non_donatable=donate)[0],
        lambda: exe.execute_portable([buf], client.devices()[0], donate=donate),
        lambda: exe.execute_sharded([buf], client.devices()[0], donate=donate),
    ):
        [out] = call()
        np.testing.assert_allclose(out.to_numpy(), x + 1, rtol=1e-6)
        assert not buf.is_deleted


@pytest.mark.parametrize("what", ["donate", "non_donatable"])
@pytest.mark.parametrize("value", [0, 1.5, "0", True, b"\x00"])
def test_donation_lists_that_are_not_lists_are_typed_errors(client, what, value):
    exe = client.compile(INCREMENT)
    buf = client.buffer_from_pyval(np.float32(1))
    with pytest.raises(DonationError, match=f"{what} lists parameter numbers"):
        exe.execute([[buf]], **{what: value})
    with pytest.raises(DonationError, match=f"{what} lists parameter numbers"):
        exe.execute_portable([buf], client.devices()[0], **{what: value})
    assert not buf.is_deleted


# -- issue 16, fourth attack: every public runtime call checks its arguments' types --------
TWO = """HloModule two
ENTRY e {
  a = f32[4] parameter(0)
  ROOT r = f32[4] negate(a)
}"""
SLOW_TARGET = """HloModule slow
ENTRY e {
  x = f32[4] parameter(0)
  ROOT c = f32[4] custom-call(x), custom_call_target="attack4_slow"
}"""


def _misuse_cases():
    """(name, call(client, exe, buffer, closed)) pairs: each must raise an XlapyError. On
    the code before the fourth attack each raised TypeError / AttributeError / ValueError,
    hung, or was silently accepted (device_count=True, inline_execution="no",
    semantics="bogus", non_donatable=[5], strict_donation="yes", a target named None, a
    copy from a closed client)."""
    from xlapy.runtime import wait_all

    return {
        "Client(device_count=1.5)": lambda c, e, b, z: Client("cpu", 1.5),
        "Client(device_count='2')": lambda c, e, b, z: Client("cpu", "2"),
        "Client(device_count=None)": lambda c, e, b, z: Client("cpu", None),
        "Client(device_count=True)": lambda c, e, b, z: Client("cpu", True),
        "Client(device_count=2**40) (hung)": lambda c, e, b, z: Client("cpu", 1 << 40),
        "inline_execution='no'": lambda c, e, b, z: setattr(c, "inline_execution", "no"),
        "lookup_device(None)": lambda c, e, b, z: c.lookup_device(None),
        "lookup_device(0.5)": lambda c, e, b, z: c.lookup_device(0.5),
        "lookup_device(False)": lambda c, e, b, z: c.lookup_device(False),
        "memory_stats('0')": lambda c, e, b, z: c.memory_stats("0"),
        "default_device_assignment(0)": lambda c, e, b, z: c.default_device_assignment(0),
        "default_device_assignment(0.5)": lambda c, e, b, z: c.default_device_assignment(0.5),
        "buffer_from_pyval(ragged)": lambda c, e, b, z: c.buffer_from_pyval([[1, 2], [3]]),
        "buffer_from_pyval(device=0)": lambda c, e, b, z: c.buffer_from_pyval(np.ones(4), 0),
        "buffer_from_pyval(semantics)": lambda c, e, b, z: c.buffer_from_pyval(
            np.ones(4), None, "bogus"
        ),
        "compile(None)": lambda c, e, b, z: c.compile(None),
        "compile(42)": lambda c, e, b, z: c.compile(42),
        "compile(options='fast')": lambda c, e, b, z: c.compile(TWO, "fast"),
        "collective_timeout='soon'": lambda c, e, b, z: c.compile(
            TWO, CompileOptions.make(backend_options={"collective_timeout": "soon"})
        ),
        "execute(a buffer)": lambda c, e, b, z: e.execute(b),
        "execute(None)": lambda c, e, b, z: e.execute(None),
        "execute([buffer])": lambda c, e, b, z: e.execute([b]),
        "execute_portable(device=None)": lambda c, e, b, z: e.execute_portable([b], None),
        "execute_portable(device=0)": lambda c, e, b, z: e.execute_portable([b], 0),
        "execute_sharded(device=None)": lambda c, e, b, z: e.execute_sharded([b], None),
        "non_donatable=[5]": lambda c, e, b, z: e.execute([[b]], non_donatable=[5]),
        "non_donatable=[-1]": lambda c, e, b, z: e.execute([[b]], non_donatable=[-1]),
        "strict_donation='yes'": lambda c, e, b, z: e.execute([[b]], strict_donation="yes"),
        "copy_to_device(None)": lambda c, e, b, z: b.copy_to_device(None),
        "copy_to_device(0)": lambda c, e, b, z: b.copy_to_device(0),
        "copy_to_memory_space('device')": lambda c, e, b, z: b.copy_to_memory_space("device"),
        "wait_all(None)": lambda c, e, b, z: wait_all(None),
        "wait_all([1, 2])": lambda c, e, b, z: wait_all([1, 2]),
        "register_custom_call(None)": lambda c, e, b, z: c.register_custom_call(
            None, lambda ins, o: ins[0]
        ),
        "register_custom_call('')": lambda c, e, b, z: c.register_custom_call(
            "", lambda ins, o: ins[0]
        ),
        "closed: copy_to_device": lambda c, e, b, z: z[1].copy_to_device(z[0].devices()[0]),
        "closed: register_custom_call": lambda c, e, b, z: z[0].register_custom_call(
            "late", lambda ins, o: ins[0]
        ),
    }


MISUSE = _misuse_cases()


@pytest.fixture(scope="module")
def misuse_world():
    c = Client("cpu")
    exe = c.compile(TWO)
    buf = c.buffer_from_pyval(np.random.default_rng(16).standard_normal(4).astype(np.float32))
    closed = Client("cpu")
    old = closed.buffer_from_pyval(np.ones(4, np.float32))
    closed.close()
    yield c, exe, buf, (closed, old)
    c.close()


@pytest.mark.parametrize("case", MISUSE)
def test_wrong_argument_types_and_states_are_typed_errors(case, misuse_world):
    c, exe, buf, closed = misuse_world
    with pytest.raises(XlapyError):
        MISUSE[case](c, exe, buf, closed)
    # the client still works afterwards
    out = exe.execute([[buf]])[0][0].to_numpy()
    np.testing.assert_array_equal(out, -buf.to_numpy())


@pytest.mark.parametrize("timeout", ["1", float("nan"), -1])
def test_a_bad_timeout_on_a_pending_result_is_a_typed_error(timeout):
    import threading

    go = threading.Event()
    client = Client("cpu", inline_execution=False)
    client.register_custom_call("attack4_slow", lambda ins, o: (go.wait(60), ins[0])[1])
    out = client.compile(SLOW_TARGET).execute([[client.buffer_from_pyval(np.ones(4, np.float32))]])
    with pytest.raises(RuntimeApiError, match="seconds"):
        out[0][0].ready().result(timeout)
    go.set()
    np.testing.assert_array_equal(out[0][0].to_numpy(), np.ones(4, np.float32))
    client.close()


@pytest.mark.parametrize(
    "metadata", [b"[" * 100_000 + b"]" * 100_000, b"1" + b"0" * 100_000], ids=["deep", "huge"]
)
def test_metadata_json_too_deep_or_too_long_is_a_serialization_error(client, metadata):
    """RecursionError and an untyped ValueError before the fourth attack."""
    blob = client.compile(NEG).serialize()
    meta_len = struct.unpack_from("<I", blob, 12)[0]
    hlo_len = struct.unpack_from("<Q", blob, 16)[0]
    hlo = blob[24 + meta_len : 24 + meta_len + hlo_len]
    body = blob[:8] + struct.pack("<IIQ", 1, len(metadata), len(hlo)) + metadata + hlo
    with pytest.raises(SerializationError, match="unreadable metadata"):
        client.deserialize_executable(body + hashlib.sha256(body).digest())
