"""Every collective on several in-process devices, in each of XLA's group modes, on the
CPU backend and the reference interpreter; faults (a failing device, a device that never
arrives, devices that disagree on shapes) end every device's execution with a clear error.

Expected values are computed here with NumPy the way XLA's CPU runtime does (an all-reduce
starts from the reduction's identity and takes the participants in group order)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from xlapy.backends import collectives
from xlapy.backends.collectives import CollectiveError, CollectiveRun, DeviceGrid
from xlapy.errors import XlapyError
from xlapy.ir.parser import parse_module
from xlapy.runtime import Client
from xlapy.runtime.options import CompileOptions

PLATFORMS = ["cpu", "interpreter"]


@pytest.fixture(autouse=True, params=["led", "parallel"])
def way(request, monkeypatch):
    """Run every test both ways: small collectives computed by the last device to arrive,
    and every device computing its own part (what large ones do)."""
    if request.param == "parallel":
        monkeypatch.setattr(collectives, "LEAD_MAX_BYTES", -1)
    return request.param


REGIONS = """
add {
  a0 = f32[] parameter(0)
  b0 = f32[] parameter(1)
  ROOT r0 = f32[] add(a0, b0)
}
maxs {
  a1 = s32[] parameter(0)
  b1 = s32[] parameter(1)
  ROOT r1 = s32[] maximum(a1, b1)
}
land {
  a2 = pred[] parameter(0)
  b2 = pred[] parameter(1)
  ROOT r2 = pred[] and(a2, b2)
}
blend {
  a3 = f32[] parameter(0)
  b3 = f32[] parameter(1)
  h3 = f32[] constant(0.5)
  m3 = f32[] multiply(a3, h3)
  ROOT r3 = f32[] add(m3, b3)
}
"""


def module(header: str, params: str, body: str) -> str:
    return f"HloModule m{header}\n{REGIONS}\nENTRY e {{\n{params}\n{body}\n}}\n"


def run(platform, text, args, replicas=1, partitions=1, timeout=20.0, client=None):
    """Outputs per device (replica-major) as NumPy arrays."""
    n = replicas * partitions
    client = client or Client(platform, device_count=n)
    options = CompileOptions.make(
        num_replicas=replicas,
        num_partitions=partitions,
        backend_options={"collective_timeout": timeout},
    )
    exe = client.compile(text, options)
    devices = exe.addressable_devices
    buffers = [[client.buffer_from_pyval(a, devices[d]) for a in row] for d, row in enumerate(args)]
    return [[np.asarray(b) for b in row] for row in exe.execute(buffers)]


def xla_sum(xs):
    acc = np.zeros_like(xs[0])
    for x in xs:
        acc = acc + x
    return acc


def rand(seed, shape, dtype=np.float32):
    return np.random.default_rng(seed).normal(size=shape).astype(dtype)


X = [rand(i, (4, 6)) for i in range(9)]
P = "  x = f32[4,6] parameter(0)"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(
    "name,header,attrs,replicas,partitions,groups",
    [
        ("cross-replica", "", "replica_groups={{0,2},{1,3}}", 4, 1, [[0, 2], [1, 3]]),
        ("cross-replica all", "", "replica_groups={}", 4, 1, [[0, 1, 2, 3]]),
        ("cross-replica iota", "", "replica_groups=[2,2]<=[4]", 4, 1, [[0, 1], [2, 3]]),
        (
            "flattened ids, transposed iota",
            ", num_partitions=2",
            "channel_id=1, replica_groups=[2,2]<=[2,2]T(1,0), use_global_device_ids=true",
            2,
            2,
            [[0, 2], [1, 3]],
        ),
        (
            "cross-replica-and-partition",
            "",
            "channel_id=1, replica_groups={{0},{1}}",
            2,
            2,
            [[0, 1], [2, 3]],
        ),
        (
            "cross-replica, partitions apart",
            "",
            "replica_groups={{0,1}}",
            2,
            2,
            [[0, 2], [1, 3]],
        ),
    ],
)
def test_all_reduce_modes(platform, name, header, attrs, replicas, partitions, groups):
    text = module(header, P, f"  ROOT r = f32[4,6] all-reduce(x), {attrs}, to_apply=add")
    n = replicas * partitions
    got = run(platform, text, [[X[d]] for d in range(n)], replicas, partitions)
    for group in groups:
        want = xla_sum([X[d] for d in group])
        for d in group:
            assert got[d][0].tobytes() == want.tobytes(), (name, d)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_tuple_all_reduce_and_other_reductions(platform):
    ints = [np.arange(5, dtype=np.int32) * (d - 1) for d in range(3)]
    flags = [np.array([True, d != 1, True]) for d in range(3)]
    text = module(
        "",
        "  x = f32[4,6] parameter(0)\n  i = s32[5] parameter(1)\n  f = pred[3] parameter(2)",
        "  t = (f32[4,6], s32[5]) all-reduce(x, i), replica_groups={}, to_apply=maxs\n"
        "  b = f32[4,6] all-reduce(x), replica_groups={}, to_apply=blend\n"
        "  l = pred[3] all-reduce(f), replica_groups={}, to_apply=land\n"
        "  i1 = s32[5] get-tuple-element(t), index=1\n"
        "  ROOT r = (s32[5], f32[4,6], pred[3]) tuple(i1, b, l)",
    )
    # the tuple all-reduce's first operand is f32 with an s32 computation: XLA rejects it,
    # so give it s32 data instead
    text = text.replace("(f32[4,6], s32[5]) all-reduce(x, i)", "(s32[5], s32[5]) all-reduce(i, i)")
    text = text.replace("get-tuple-element(t), index=1", "get-tuple-element(t), index=0")
    got = run(platform, text, [[X[d], ints[d], flags[d]] for d in range(3)], 3)
    blend = X[0]
    for d in (1, 2):
        blend = blend * np.float32(0.5) + X[d]
    for d in range(3):
        np.testing.assert_array_equal(got[d][0], np.max(ints, axis=0))
        assert got[d][1].tobytes() == blend.tobytes()
        np.testing.assert_array_equal(got[d][2], [True, False, True])


@pytest.mark.parametrize("platform", PLATFORMS)
def test_gather_scatter_all_to_all_broadcast(platform):
    text = module(
        ", num_partitions=4",
        P,
        "  g = f32[4,24] all-gather(x), channel_id=1, replica_groups={{0,1,2,3}}, "
        "dimensions={1}, use_global_device_ids=true\n"
        "  s = f32[1,6] reduce-scatter(x), channel_id=2, replica_groups={{3,2,1,0}}, "
        "dimensions={0}, use_global_device_ids=true, to_apply=add\n"
        "  a = f32[4,6] all-to-all(x), channel_id=3, replica_groups={{0,1,2,3}}, dimensions={0}\n"
        "  b = f32[4,6] collective-broadcast(x), channel_id=4, replica_groups={{1,0},{3,2}}\n"
        "  ROOT r = (f32[4,24], f32[1,6], f32[4,6], f32[4,6]) tuple(g, s, a, b)",
    )
    got = run(platform, text, [[X[d]] for d in range(4)], 1, 4)
    order = [3, 2, 1, 0]
    for d in range(4):
        g, s, a, b = got[d]
        assert g.tobytes() == np.concatenate(X[:4], axis=1).tobytes()
        rank = order.index(d)
        want_s = xla_sum([X[j][rank : rank + 1] for j in order])
        assert s.tobytes() == want_s.tobytes()
        assert a.tobytes() == np.concatenate([X[j][d : d + 1] for j in range(4)]).tobytes()
        assert b.tobytes() == X[1 if d < 2 else 3].tobytes()


@pytest.mark.parametrize("platform", PLATFORMS)
def test_tuple_all_to_all_and_permute(platform):
    text = module(
        ", num_partitions=3",
        "  x = f32[4,6] parameter(0)\n  y = f32[4,6] parameter(1)\n  z = f32[4,6] parameter(2)",
        "  t = (f32[4,6], f32[4,6], f32[4,6]) all-to-all(x, y, z), channel_id=1, "
        "replica_groups={{0,1,2}}\n"
        "  p = f32[4,6] collective-permute(x), channel_id=2, source_target_pairs={{0,1},{1,2}}\n"
        "  t0 = f32[4,6] get-tuple-element(t), index=0\n"
        "  t2 = f32[4,6] get-tuple-element(t), index=2\n"
        "  ROOT r = (f32[4,6], f32[4,6], f32[4,6]) tuple(t0, t2, p)",
    )
    args = [[X[3 * d], X[3 * d + 1], X[3 * d + 2]] for d in range(3)]
    got = run(platform, text, args, 1, 3)
    for d in range(3):
        t0, t2, p = got[d]
        np.testing.assert_array_equal(t0, args[0][d])
        np.testing.assert_array_equal(t2, args[2][d])
        np.testing.assert_array_equal(p, np.zeros((4, 6)) if d == 0 else args[d - 1][0])


@pytest.mark.parametrize("platform", PLATFORMS)
def test_async_pairs_and_ids(platform):
    text = module(
        ", num_partitions=2",
        P,
        "  s = f32[4,6] all-reduce-start(x), channel_id=1, replica_groups={}, "
        "use_global_device_ids=true, to_apply=add\n"
        "  d = f32[4,6] all-reduce-done(s)\n"
        "  gs = (f32[4,6], f32[16,6]) all-gather-start(x), channel_id=2, replica_groups={}, "
        "dimensions={0}, use_global_device_ids=true\n"
        "  g = f32[16,6] all-gather-done(gs)\n"
        "  ps = (f32[4,6], f32[4,6], u32[], u32[]) collective-permute-start(x), channel_id=3, "
        "source_target_pairs={{0,1},{1,0}}\n"
        "  p = f32[4,6] collective-permute-done(ps)\n"
        "  rid = u32[] replica-id()\n"
        "  pid = u32[] partition-id()\n"
        "  ROOT r = (f32[4,6], f32[16,6], f32[4,6], u32[], u32[]) tuple(d, g, p, rid, pid)",
    )
    got = run(platform, text, [[X[0]], [X[1]], [X[2]], [X[3]]], 2, 2)
    for d in range(4):
        r, q = divmod(d, 2)
        mine = [2 * r, 2 * r + 1]
        ar, ag, cp, rid, pid = got[d]
        assert ar.tobytes() == xla_sum([X[j] for j in range(4)]).tobytes()
        np.testing.assert_array_equal(ag, np.concatenate([X[j] for j in range(4)]))
        np.testing.assert_array_equal(cp, X[mine[1 - q]])
        assert (int(rid), int(pid)) == (r, q)


ALL_REDUCE = module(", num_partitions=2", P, "  ROOT r = f32[4,6] all-reduce(x), channel_id=1, "
                    "replica_groups={}, use_global_device_ids=true, to_apply=add")  # fmt: skip


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_device_that_never_arrives_is_named(platform):
    client = Client(platform, device_count=2)
    options = CompileOptions.make(num_partitions=2, backend_options={"collective_timeout": 0.5})
    exe = client.compile(ALL_REDUCE, options)
    device = client.devices()[0]
    (out,) = exe.execute_sharded([client.buffer_from_pyval(X[0], device)], device)
    with pytest.raises(XlapyError, match=r"all-reduce r on device 0: devices \[1\] did not arrive"):
        np.asarray(out)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_failing_custom_call_fails_every_device(platform):
    client = Client(platform, device_count=4)

    def check(ins, opaque):
        if ins[0][0, 0] < -100:
            raise ValueError("bad input on this device")
        return ins[0]

    client.register_custom_call("check", check)
    text = module(
        ", num_partitions=4",
        P,
        '  c = f32[4,6] custom-call(x), custom_call_target="check"\n'
        "  ROOT r = f32[4,6] all-reduce(c), channel_id=1, replica_groups={}, "
        "use_global_device_ids=true, to_apply=add",
    )
    bad = X[2].copy()
    bad[0, 0] = -1000
    args = [[X[0]], [X[1]], [bad], [X[3]]]
    # Timed from after the compile (seconds on a loaded machine), against half a collective
    # timeout long enough that no healthy run on a loaded machine comes near it.
    timeout = 120
    options = CompileOptions.make(num_partitions=4, backend_options={"collective_timeout": timeout})
    exe = client.compile(text, options)
    devices = exe.addressable_devices
    start = time.perf_counter()
    outs = exe.execute([[client.buffer_from_pyval(a[0], devices[d])] for d, a in enumerate(args)])
    for (out,) in outs:
        with pytest.raises(XlapyError, match="bad input on this device"):
            np.asarray(out)
    assert time.perf_counter() - start < timeout / 2, "the failure must not wait for the timeout"


def test_devices_that_disagree_on_shapes_get_a_clear_error():
    from xlapy.backends.interpreter.backend import InterpreterBackend

    texts = [
        ALL_REDUCE,
        ALL_REDUCE.replace("f32[4,6]", "f32[2,6]"),
    ]
    programs = [InterpreterBackend().compile(parse_module(t)) for t in texts]
    run_ = CollectiveRun("r", DeviceGrid(((0, 1),)), timeout=120)
    errors: list[BaseException] = []

    def device(p):
        try:
            programs[p].run([X[p][: 4 - 2 * p]], collectives=run_.for_device(0, p))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=device, args=(p,)) for p in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(errors) == 2
    for e in errors:
        assert isinstance(e, CollectiveError)
        assert "disagree on the operands" in str(e) and "f32[2, 6]" not in str(e)
        assert "float32[4, 6]" in str(e) and "float32[2, 6]" in str(e)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_send_recv_between_devices(platform):
    pairs = 'frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1},{1,2},{2,0}}"}'
    text = module(
        ", num_partitions=4",
        P,
        "  t = token[] after-all()\n"
        f"  s = (f32[4,6], u32[], token[]) send(x, t), channel_id=5, {pairs}\n"
        f"  r = (f32[4,6], u32[], token[]) recv(t), channel_id=5, {pairs}\n"
        "  sd = token[] send-done(s), channel_id=5\n"
        "  rd = (f32[4,6], token[]) recv-done(r), channel_id=5\n"
        "  ROOT o = f32[4,6] get-tuple-element(rd), index=0",
    )
    got = run(platform, text, [[X[d]] for d in range(4)], 1, 4)
    for d, source in enumerate([2, 0, 1, None]):
        want = np.zeros((4, 6), np.float32) if source is None else X[source]
        np.testing.assert_array_equal(got[d][0], want)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_execute_sharded_calls_of_one_step_meet(platform):
    """Calls made one after the other from one thread meet, also once the program is known
    to be cheap (a lone execute_sharded call never runs inline: its peers start later)."""
    client = Client(platform, device_count=2)
    options = CompileOptions.make(num_partitions=2, backend_options={"collective_timeout": 120})
    exe = client.compile(ALL_REDUCE, options)
    outs = []
    for step in range(4):
        for d, device in enumerate(client.devices()):
            x = client.buffer_from_pyval(X[d] + step, device)
            outs.append(exe.execute_sharded([x], device)[0])
    for i, out in enumerate(outs):
        step = i // 2
        assert np.asarray(out).tobytes() == xla_sum([X[0] + step, X[1] + step]).tobytes()


def test_compile_without_options_takes_the_module_counts():
    client = Client("cpu", device_count=2)
    exe = client.compile(ALL_REDUCE)  # the header says num_partitions=2
    assert (exe.num_replicas, exe.num_partitions) == (1, 2)
    devices = exe.addressable_devices
    outs = exe.execute([[client.buffer_from_pyval(X[d], devices[d])] for d in range(2)])
    assert np.asarray(outs[1][0]).tobytes() == xla_sum(X[:2]).tobytes()


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("size", [3, collectives.CHUNK_MIN_ELEMENTS + 5])
def test_all_reduce_sizes_keep_xla_bits(platform, size):
    """Small all-reduces (reduced whole, once for everyone when led) and large ones (split
    into one chunk per member) give XLA's bits: `0 + x0 + x1 + x2`, so -0.0 sums to +0.0."""
    rng = np.random.default_rng(size)
    xs = [rng.normal(size=size).astype(np.float32) * 1e3**d for d in range(3)]
    for x in xs:
        x[::7] = -0.0
    text = module(
        ", num_partitions=3",
        f"  x = f32[{size}] parameter(0)",
        f"  ROOT r = f32[{size}] all-reduce(x), channel_id=1, replica_groups={{}},\n"
        "    use_global_device_ids=true, to_apply=add",
    )
    got = run(platform, text, [[x] for x in xs], partitions=3)
    want = xla_sum(xs)
    assert np.signbit(want[::7]).sum() == 0
    for d in range(3):
        assert got[d][0].tobytes() == want.tobytes(), d
