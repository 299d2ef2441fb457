"""One process of a 2-process MPI job (tests/test_collectives_mpi.py starts it with
`mpiexec -n 2`): a distributed client with 2 devices per process runs 4-device programs
that XLA partitioned (tests/collectives/*.hlo), each process giving its own devices' shards.
Every output must equal, bit for bit, what one process with 4 devices computes (and JAX's
outputs where the program is exact). Prints "ok NAME" per program, or raises.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from xlapy.runtime import Client
from xlapy.runtime.options import CompileOptions

HERE = Path(__file__).resolve().parent
CASES = ["all_to_all_4", "reduce_scatter_4", "tp_matmul_4", "dp_train_step_4"]
EXACT = {"all_to_all_4", "reduce_scatter_4"}


# A collective waits for the other process, which may still be compiling (this case's
# program, or the one-process run of the case before): seconds each on a loaded machine.
TIMEOUT = 300


def run(client: Client, text: str, n: int, args, devices):
    options = CompileOptions.make(num_partitions=n, backend_options={"collective_timeout": TIMEOUT})
    exe = client.compile(text, options)
    assert [d.id for d in exe.addressable_devices] == devices, exe.addressable_devices
    outs = exe.execute(
        [[client.buffer_from_pyval(a, client.lookup_device(d)) for a in args[d]] for d in devices]
    )
    return {d: [np.asarray(b) for b in row] for d, row in zip(devices, outs, strict=True)}


FAULT = """HloModule fault, num_partitions=4
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] add(a, b)
}
ENTRY e {
  x = f32[8] parameter(0)
  c = f32[8] custom-call(x), custom_call_target="check"
  ROOT s = f32[8] all-reduce(c), channel_id=1, replica_groups={}, use_global_device_ids=true,
    to_apply=add
}
"""


def fault(client: Client) -> None:
    """Device 3 (process 1) fails in a custom call before an all-reduce over all four: every
    device fails with its error, well before the collective timeout."""

    def check(ins, opaque):
        if ins[0][0] < 0:
            raise ValueError("device 3 was given a bad input")
        return ins[0]

    client.register_custom_call("check", check)
    # The time counts both processes' compiles (seconds each on a loaded machine): it is
    # checked against half a collective timeout that no healthy run comes near.
    start = time.monotonic()
    args = {d: [np.full(8, -1.0 if d == 3 else 1.0, np.float32)] for d in range(4)}
    mine = [d.id for d in client.addressable_devices()]
    options = CompileOptions.make(num_partitions=4, backend_options={"collective_timeout": TIMEOUT})
    exe = client.compile(FAULT, options)
    bufs = [[client.buffer_from_pyval(a, client.lookup_device(d)) for a in args[d]] for d in mine]
    for d, (out,) in zip(mine, exe.execute(bufs), strict=True):
        try:
            np.asarray(out)
        except Exception as e:
            assert "device 3 was given a bad input" in str(e), e
        else:
            raise AssertionError(f"device {d} did not fail")
    assert time.monotonic() - start < TIMEOUT / 2, "the failure waited for the timeout"
    print(f"ok fault process {client.process_index}", flush=True)


def one_device_each() -> None:
    """One device per process: every call of a 2-device program meets the other process
    (a call on one local device must not take the single-device fast path)."""
    client = Client("cpu", device_count=1, distributed="mpi")
    me = client.process_index
    text = (
        FAULT.replace("num_partitions=4", "num_partitions=2")
        .replace('  c = f32[8] custom-call(x), custom_call_target="check"\n', "")
        .replace("all-reduce(c)", "all-reduce(x)")
    )
    options = CompileOptions.make(num_partitions=2, backend_options={"collective_timeout": TIMEOUT})
    exe = client.compile(text, options)
    device = client.addressable_devices()[0]
    other = client.devices()[1 - me]
    try:
        client.buffer_from_pyval(np.zeros(8, np.float32), other)
    except Exception as e:
        assert f"belongs to process {1 - me}" in str(e), e
    else:
        raise AssertionError("a buffer went onto another process's device")
    for call in range(3):
        x = np.full(8, me + call, np.float32)
        (out,) = exe.execute([[client.buffer_from_pyval(x, device)]])[0]
        assert np.asarray(out).tolist() == [2.0 * call + 1] * 8, (call, np.asarray(out))
    print(f"ok one-device process {me}", flush=True)


SEND_RECV = """HloModule send_recv, num_partitions=4
ENTRY e {
  x = f32[4,6] parameter(0)
  t = token[] after-all()
  s = (f32[4,6], u32[], token[]) send(x, t), channel_id=5, PAIRS
  r = (f32[4,6], u32[], token[]) recv(t), channel_id=5, PAIRS
  sd = token[] send-done(s), channel_id=5
  rd = (f32[4,6], token[]) recv-done(r), channel_id=5
  ROOT o = f32[4,6] get-tuple-element(rd), index=0
}
""".replace(
    "PAIRS",
    'frontend_attributes={_xla_send_recv_source_target_pairs="{{0,2},{2,1},{1,3},{3,0}}"}',
)


def sliced(distributed: Client) -> None:
    """Send/recv with channels, ragged-all-to-all and the in-place collective-permute over
    devices of both processes: the same bits as one process with 4 devices (and, for
    send/recv, what each device's source sent)."""
    from tests.test_collectives_sliced import IN_PLACE, RAGGED, in_place_args, ragged_inputs

    rng = np.random.default_rng(5)
    ragged = RAGGED.format(n=4, t="f32", rows=34, out_rows=35, count=8, groups="{{0,1,2,3}}")
    in_place = IN_PLACE.format(
        body="""  is = (s32[], s32[]) tuple(a, one)
  os = (s32[], s32[]) tuple(b, c)
  ROOT r = f32[7,5] collective-permute(x, o, is, os), channel_id=1,
    source_target_pairs={{0,2},{2,1},{1,3},{3,0}}, slice_sizes={{3,2}}"""
    )
    big = FAULT.replace('  c = f32[8] custom-call(x), custom_call_target="check"\n', "")
    big = big.replace("all-reduce(c)", "all-reduce(x)").replace("f32[8]", "f32[20000]")
    cases = {
        "large_all_reduce": (  # operands past SMALL_MESSAGE_BYTES: header, then raw bytes
            big,
            [[rng.normal(size=20000).astype(np.float32)] for _ in range(4)],
        ),
        "send_recv": (SEND_RECV, [[rng.normal(size=(4, 6)).astype(np.float32)] for _ in range(4)]),
        "ragged": (ragged, ragged_inputs(rng, [[0, 1, 2, 3]], 34, 35, 2, np.float32)),
        "in_place_permute": (in_place, in_place_args(6)),
    }
    mine = [d.id for d in distributed.addressable_devices()]
    for name, (text, args) in cases.items():
        got = run(distributed, text, 4, args, mine)
        alone = run(Client("cpu", device_count=4), text, 4, args, list(range(4)))
        for d in mine:
            assert got[d][0].tobytes() == alone[d][0].tobytes(), (name, d)
            if name == "send_recv":
                source = {2: 0, 1: 2, 3: 1, 0: 3}[d]
                assert got[d][0].tobytes() == args[source][0].tobytes(), (name, d)
        print(f"ok {name} process {distributed.process_index} devices {mine}", flush=True)


def main() -> None:
    cases = sys.argv[1:] or CASES
    if cases == ["one-device"]:
        one_device_each()
        return
    distributed = Client("cpu", device_count=2, distributed="mpi")
    me = distributed.process_index
    if cases == ["fault"]:
        fault(distributed)
        return
    if cases == ["sliced"]:
        sliced(distributed)
        return
    for name in cases:
        text = (HERE / f"{name}.hlo").read_text()
        data = np.load(HERE / f"{name}.npz")
        n = int(data["num_partitions"])
        count = len({k.split("_")[0] for k in data.files if k.startswith("arg")})
        args = [[data[f"arg{i}_{p}"] for i in range(count)] for p in range(n)]
        mine = [d.id for d in distributed.addressable_devices()]
        got = run(distributed, text, n, args, mine)
        alone = run(Client("cpu", device_count=n), text, n, args, list(range(n)))
        for d in mine:
            for i, g in enumerate(got[d]):
                assert g.tobytes() == alone[d][i].tobytes(), (name, d, i)
                if name in EXACT:
                    assert g.tobytes() == data[f"out{i}_{d}"].tobytes(), (name, d, i, "jax")
        print(f"ok {name} process {me} devices {mine}", flush=True)


if __name__ == "__main__":
    main()
