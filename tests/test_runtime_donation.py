"""Donation at run time (seeds 000/001): in place when donated, copy-protection when not,
and every misuse rejected before anything runs."""

import gc
import warnings

import numpy as np
import pytest
from runtime_programs import AXPY, DONOR, INCREMENT, MUST, TUPLE_PARAM, TWO_OUT

from xlapy.errors import XlapyError
from xlapy.runtime import (
    BufferDonatedError,
    Client,
    CompileOptions,
    DonationError,
    DonationWarning,
    HostBufferSemantics,
)


@pytest.fixture
def rng():
    return np.random.default_rng(7)


@pytest.fixture
def client():
    c = Client("cpu")
    yield c
    c.close()


def f32(rng, *dims):
    return rng.standard_normal(dims).astype(np.float32)


def run(exe, client, args, **kw):
    return exe.execute_portable(args, client.devices()[0], **kw)


def test_seed_increment_donated_in_place(client, rng):
    exe = client.compile(INCREMENT)
    host = np.float32(rng.standard_normal())
    p = client.buffer_from_pyval(host)
    memory = p.device_array()
    pointer = p.unsafe_buffer_pointer()
    [out] = run(exe, client, [p], donate=[0])
    np.testing.assert_allclose(out.to_numpy(), host + 1, rtol=1e-6)
    assert out.unsafe_buffer_pointer() == pointer
    with out.external_reference() as view:
        assert np.shares_memory(view, memory)
    assert p.is_deleted and p.is_donated
    assert client.memory_stats(0).bytes_in_use == 4  # one buffer's worth: no copy


@pytest.mark.parametrize(
    "use",
    [
        lambda b: b.to_numpy(),
        lambda b: b.copy_to_host(),
        lambda b: b.ready(),
        lambda b: b.device,
        lambda b: b.unsafe_buffer_pointer(),
        lambda b: np.asarray(b),
    ],
)
def test_donated_buffer_raises_on_use(client, rng, use):
    exe = client.compile(INCREMENT)
    p = client.buffer_from_pyval(np.float32(rng.standard_normal()))
    run(exe, client, [p], donate=[0])
    with pytest.raises(BufferDonatedError, match=r"buffer #\d+ f32\[\] was donated") as info:
        use(p)
    assert isinstance(info.value, XlapyError)


def test_donated_buffer_as_argument_raises(client, rng):
    exe = client.compile(INCREMENT)
    p = client.buffer_from_pyval(np.float32(rng.standard_normal()))
    run(exe, client, [p], donate=[0])
    with pytest.raises(BufferDonatedError, match="parameter 0"):
        run(exe, client, [p])


def test_copy_protection_keeps_input(client, rng):
    exe = client.compile(AXPY)
    a, x, y = np.float32(rng.standard_normal()), f32(rng, 4), f32(rng, 4)
    bufs = [client.buffer_from_pyval(v) for v in (a, x, y)]
    x_memory = bufs[1].device_array()
    [out] = run(exe, client, bufs)  # x is aliased but not donated
    np.testing.assert_allclose(out.to_numpy(), a * x + y, rtol=1e-6)
    assert not bufs[1].is_deleted
    np.testing.assert_array_equal(bufs[1].to_numpy(), x)
    with out.external_reference() as view:
        assert not np.shares_memory(view, x_memory)
    [again] = run(exe, client, bufs, donate=[1])  # now donated: in place
    with again.external_reference() as view:
        assert np.shares_memory(view, x_memory)
    np.testing.assert_allclose(again.to_numpy(), a * x + y, rtol=1e-6)


def test_must_alias_not_donated_is_an_error(client, rng):
    exe = client.compile(MUST)
    x = f32(rng, 4)
    p = client.buffer_from_pyval(x)
    for kw in ({}, {"donate": [0], "non_donatable": [0]}):
        with pytest.raises(
            DonationError, match=r"parameter 0 must alias output \{\} \(must-alias\)"
        ):
            run(exe, client, [p], **kw)
    assert not p.is_deleted
    np.testing.assert_array_equal(p.to_numpy(), x)
    [out] = run(exe, client, [p], donate=[0])
    np.testing.assert_array_equal(out.to_numpy(), -x)


def test_non_donatable_vetoes(client, rng):
    exe = client.compile(AXPY)
    vals = [np.float32(rng.standard_normal()), f32(rng, 4), f32(rng, 4)]
    bufs = [client.buffer_from_pyval(v) for v in vals]
    [out] = run(exe, client, bufs, donate=[1], non_donatable=[1])
    assert not bufs[1].is_deleted
    np.testing.assert_allclose(out.to_numpy(), vals[0] * vals[1] + vals[2], rtol=1e-6)


@pytest.mark.parametrize(
    ("args", "donate", "message"),
    [
        ("x x", [0, 0], "parameter 0 is donated twice in one call"),
        ("x x", [0, 1], "is donated twice"),
        ("x x", [0], "is donated and also passed again"),
        ("x y", [5], "donate names parameter 5, which does not exist"),
    ],
)
def test_donation_misuse_modifies_nothing(client, rng, args, donate, message):
    exe = client.compile(
        TWO_OUT.replace(
            "{0}: (0, {}, may-alias)", "{0}: (0, {}, may-alias), {1}: (1, {}, may-alias)"
        )
    )
    x, y = f32(rng, 4), f32(rng, 4)
    bx, by = client.buffer_from_pyval(x), client.buffer_from_pyval(y)
    named = {"x": bx, "y": by}
    bytes_before = client.memory_stats(0).bytes_in_use
    with pytest.raises(DonationError, match=message):
        run(exe, client, [named[n] for n in args.split()], donate=donate)
    assert not bx.is_deleted and not by.is_deleted
    np.testing.assert_array_equal(bx.to_numpy(), x)
    np.testing.assert_array_equal(by.to_numpy(), y)
    assert client.memory_stats(0).bytes_in_use == bytes_before


def test_donation_blocked_by_external_reference(client, rng):
    exe = client.compile(INCREMENT)
    host = np.float32(rng.standard_normal())
    p = client.buffer_from_pyval(host)
    with p.external_reference():
        with pytest.raises(DonationError, match="external reference"):
            run(exe, client, [p], donate=[0])
        assert not p.is_deleted
        [copy_protected] = run(exe, client, [p])  # not donated: allowed
    np.testing.assert_allclose(copy_protected.to_numpy(), host + 1, rtol=1e-6)
    np.testing.assert_array_equal(p.to_numpy(), host)
    run(exe, client, [p], donate=[0])  # released: donation works
    assert p.is_donated


def test_unusable_donation_warns_or_fails_when_strict(client, rng):
    exe = client.compile(AXPY)
    bufs = [client.buffer_from_pyval(v) for v in (np.float32(2), f32(rng, 4), f32(rng, 4))]
    with pytest.warns(DonationWarning, match="parameter 2 was donated but no output aliases it"):
        run(exe, client, bufs, donate=[2])
    assert not bufs[2].is_deleted
    with pytest.raises(DonationError, match="strict_donation is on"):
        run(exe, client, bufs, donate=[2], strict_donation=True)
    strict = client.compile(AXPY, CompileOptions.make(strict_donation=True))
    with pytest.raises(DonationError, match="strict_donation"):
        run(strict, client, bufs, donate=[2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(strict, client, bufs, donate=[1])
    assert bufs[1].is_donated and not bufs[2].is_deleted


def test_partial_alias_outputs(client, rng):
    exe = client.compile(TWO_OUT)
    x, y = f32(rng, 4), f32(rng, 4)
    bx, by = client.buffer_from_pyval(x), client.buffer_from_pyval(y)
    memory = bx.device_array()
    s, d = run(exe, client, [bx, by], donate=[0])
    np.testing.assert_allclose(s.to_numpy(), x + y, rtol=1e-6)
    np.testing.assert_allclose(d.to_numpy(), x - y, rtol=1e-6)
    with s.external_reference() as sv, d.external_reference() as dv:
        assert np.shares_memory(sv, memory) and not np.shares_memory(dv, memory)
    assert bx.is_donated and not by.is_deleted


def test_tuple_parameter_donated_whole(client, rng):
    exe = client.compile(TUPLE_PARAM)
    a, b = f32(rng, 3), rng.integers(-5, 5, 2).astype(np.int32)
    ba, bb = client.buffer_from_pyval(a), client.buffer_from_pyval(b)
    [out] = run(exe, client, [(ba, bb)])
    np.testing.assert_allclose(out.to_numpy(), a * a, rtol=1e-6)
    assert not ba.is_deleted and not bb.is_deleted
    memory = ba.device_array()
    [out2] = run(exe, client, [(ba, bb)], donate=[0])
    np.testing.assert_allclose(out2.to_numpy(), a * a, rtol=1e-6)
    with out2.external_reference() as view:
        assert np.shares_memory(view, memory)
    assert ba.is_donated and bb.is_donated  # the whole parameter
    gc.collect()
    del out
    assert client.memory_stats(0).bytes_in_use == 12  # only out2, in a's memory


def test_buffer_donor_module(client, rng):
    exe = client.compile(DONOR)
    assert "input_output_alias" in exe.hlo_text()
    x = f32(rng, 2, 3)
    p = client.buffer_from_pyval(x)
    memory = p.device_array()
    [out] = run(exe, client, [p], donate=[0])
    np.testing.assert_allclose(out.to_numpy(), np.exp(x), rtol=1e-6)
    with out.external_reference() as view:
        assert np.shares_memory(view, memory)
    assert p.is_donated


def test_zero_copy_buffer_donation_never_writes_caller_memory(client, rng):
    exe = client.compile(AXPY)
    x = f32(rng, 4)
    keep = x.copy()
    bx = client.buffer_from_pyval(x, semantics=HostBufferSemantics.IMMUTABLE_ZERO_COPY)
    a, y = client.buffer_from_pyval(np.float32(3)), client.buffer_from_pyval(f32(rng, 4))
    [out] = run(exe, client, [a, bx, y], donate=[1])
    out.block_until_ready()
    np.testing.assert_array_equal(x, keep)
    assert bx.is_donated


def test_deleted_and_donated_free_memory(client, rng):
    exe = client.compile(AXPY)
    stats = client.devices()[0].memory_stats
    a, x, y = (client.buffer_from_pyval(v) for v in (np.float32(2), f32(rng, 4), f32(rng, 4)))
    assert stats().bytes_in_use == 36
    [out] = run(exe, client, [a, x, y], donate=[1])
    out.block_until_ready()
    assert stats().bytes_in_use == 36  # the output lives in x's memory
    [fresh] = run(exe, client, [a, out, y])  # copy-protection: a new 16 bytes
    fresh.block_until_ready()
    assert stats().bytes_in_use == 52
    for b in (a, out, y):
        b.delete()
    del fresh
    gc.collect()
    assert stats().bytes_in_use == 0


RETURNED_TWICE = """HloModule returned_twice, input_output_alias={ {1}: (0, {}, may-alias) }
ENTRY e {
  p = f32[4] parameter(0)
  ROOT t = (f32[4], f32[4]) tuple(p, p)
}"""

BLOCK = """HloModule block
ENTRY e {
  x = f32[4] parameter(0)
  ROOT c = f32[4] custom-call(x), custom_call_target="block"
}"""


@pytest.mark.parametrize("drop", [(1,), (0, 1)])
def test_output_taking_donated_memory_deleted_before_the_run(client, rng, drop):
    """A donated parameter returned twice (`main(%p {tf.aliasing_output = 1}) -> (%p, %p)`,
    what JAX makes of `x_ref[...]`): output 1 takes over the parameter's memory, output 0
    is a copy. When the caller deletes output 1 before the queued run has read the
    parameter (JAX drops the old ref buffer at once), the run still reads it: the
    run holds its own reference, so the memory is freed only after the run (it used to
    be freed under the run: "parameter 0 expects f32[], got object[]")."""
    import threading

    gate, started = threading.Event(), threading.Event()

    def block(ins, opaque):
        started.set()
        assert gate.wait(60), "gate never opened"
        return ins[0]

    client.register_custom_call("block", block)
    blocker, twice = client.compile(BLOCK), client.compile(RETURNED_TWICE)
    host = f32(rng, 4)
    [held] = run(blocker, client, [client.buffer_from_pyval(f32(rng, 4))])
    assert started.wait(60)  # the device's worker is busy: the next run is queued
    p = client.buffer_from_pyval(host)
    outs = run(twice, client, [p], donate=[0])
    assert p.is_donated and not outs[0].ready().done()
    for i in drop:
        outs[i].delete()
    gate.set()
    held.block_until_ready()
    for i, out in enumerate(outs):
        if i not in drop:
            np.testing.assert_array_equal(out.to_numpy(), host)
    twice_again = run(twice, client, [client.buffer_from_pyval(host)], donate=[0])
    for out in twice_again:  # the device is still sound
        np.testing.assert_array_equal(out.to_numpy(), host)
    del held, twice_again, out
    gc.collect()
    assert client.memory_stats(0).bytes_in_use == 16 * (2 - len(drop))
