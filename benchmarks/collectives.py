"""All-reduce bandwidth between xlapy's in-process devices, against memcpy and XLA:CPU, and
across two MPI processes against mpi4py's own Allreduce.

    .venv/bin/python benchmarks/collectives.py [--devices 4] [--max-mib 64]
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/collectives.py --mpi
    .venv/bin/python benchmarks/collectives.py --latency [--devices 2,4,8]
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/collectives.py --mpi --latency

In-process: one program `all-reduce(f32[n])` (sum over every device) on N devices of one
client; per size the best of several executions (dispatch, the rendezvous and the
reduction; inputs already on the devices). Bandwidth is the all-reduced bytes per second
(one device's buffer size / time), next to np.copyto's bandwidth for a buffer of that size
and to XLA:CPU running `psum` over N host devices (JAX in a subprocess with
--xla_force_host_platform_device_count). With --mpi: one device per process, xlapy's
distributed client against comm.Allreduce on NumPy buffers of the same size.

--latency: small messages, 4 bytes to 4 MiB per device, over each device count given (or
across the MPI processes): the best and the median of many executions, xlapy against XLA:CPU
(in-process) or mpi4py's Allreduce (MPI). The median says more than the best on a shared
machine, where a thread hand-off waits for a core.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from xlapy.runtime import Client  # noqa: E402
from xlapy.runtime.options import CompileOptions  # noqa: E402

PROGRAM = """HloModule ar, num_partitions={n}
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] add(a, b)
}}
ENTRY e {{
  x = f32[{k}] parameter(0)
  ROOT s = f32[{k}] all-reduce(x), channel_id=1, replica_groups={{}},
    use_global_device_ids=true, to_apply=add
}}
"""


def sizes(max_mib: int) -> list[int]:
    out, size = [], 1024
    while size <= max_mib << 20:
        out.append(size)
        size *= 4
    return out


def best(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def reps_for(nbytes: int) -> int:
    return max(3, min(50, (64 << 20) // max(nbytes, 1) // 4))


def xlapy_in_process(devices: int, nbytes: int) -> float:
    k = nbytes // 4
    client = Client("cpu", device_count=devices)
    exe = client.compile(
        PROGRAM.format(n=devices, k=k), CompileOptions.make(num_partitions=devices)
    )
    bufs = [
        [client.buffer_from_pyval(np.full(k, d + 1, np.float32), dev)]
        for d, dev in enumerate(client.devices())
    ]

    def once():
        for (out,) in exe.execute(bufs):
            out.block_until_ready()

    return best(once, reps_for(nbytes))


def memcpy(nbytes: int) -> float:
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    return best(lambda: np.copyto(dst, src), reps_for(nbytes))


XLA_SCRIPT = """
import os, sys, time, json
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count={n}"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P, NamedSharding
try:
    from jax import shard_map
except ImportError:
    from jax.experimental.shard_map import shard_map
mesh = Mesh(np.array(jax.devices()[:{n}]), ("x",))
f = jax.jit(shard_map(lambda x: jax.lax.psum(x, "x"), mesh=mesh, in_specs=P("x"),
            out_specs=P("x")))
out = {{}}
for nbytes in {sizes}:
    x = jax.device_put(jnp.ones({n} * (nbytes // 4), jnp.float32), NamedSharding(mesh, P("x")))
    for _ in range({warmup}):
        f(x).block_until_ready()
    times = []
    for _ in range({reps}):
        t = time.perf_counter(); f(x).block_until_ready(); times.append(time.perf_counter() - t)
    times.sort()
    out[nbytes] = (times[0], times[len(times) // 2])
print(json.dumps(out))
"""


def xla_times(devices: int, sizes: list[int], warmup: int, reps: str) -> dict[int, list[float]]:
    """XLA:CPU's (best, median) seconds per all-reduce size, in a child process with
    `devices` host devices; `reps` is an expression in `nbytes`."""
    script = XLA_SCRIPT.format(n=devices, sizes=sizes, warmup=warmup, reps=reps)
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
        )
        return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}
    except Exception as e:  # JAX missing or failing: report without it
        print(f"(XLA:CPU not measured: {e})")
        return {}


def xla_in_process(devices: int, all_sizes: list[int]) -> dict[int, float]:
    times = xla_times(devices, all_sizes, 1, "max(3, min(50, (64 << 20) // nbytes // 4))")
    return {k: v[0] for k, v in times.items()}


LATENCY_SIZES = [4, 64, 1 << 10, 16 << 10, 256 << 10, 4 << 20]


def spread(fn, reps: int) -> tuple[float, float]:
    """(best, median) seconds of `reps` calls after a warm-up."""
    for _ in range(10):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[0], times[len(times) // 2]


def latency(devices: list[int], reps: int) -> None:
    print("all-reduce (sum, f32) latency, in-process devices: best / median us")
    print(
        f"{'devices':>7} {'size':>8} {'xlapy best':>11} {'median':>8} {'XLA best':>9} {'median':>8}"
    )
    for n in devices:
        xla = xla_times(n, LATENCY_SIZES, 10, f"{reps} if nbytes < (1 << 20) else 30")
        client = Client("cpu", device_count=n)
        for nbytes in LATENCY_SIZES:
            k = nbytes // 4
            exe = client.compile(PROGRAM.format(n=n, k=k), CompileOptions.make(num_partitions=n))
            bufs = [
                [client.buffer_from_pyval(np.full(k, d + 1, np.float32), dev)]
                for d, dev in enumerate(client.devices())
            ]

            def once(exe=exe, bufs=bufs):
                for (out,) in exe.execute(bufs):
                    out.block_until_ready()

            best_us, median_us = (t * 1e6 for t in spread(once, reps if k < 1 << 18 else 30))
            theirs = xla.get(nbytes)
            cols = (
                f"{theirs[0] * 1e6:9.0f} {theirs[1] * 1e6:8.0f}" if theirs else f"{'-':>9} {'-':>8}"
            )
            print(f"{n:>7} {nbytes:>8} {best_us:11.0f} {median_us:8.0f} {cols}", flush=True)


def mpi_latency(reps: int) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    client = Client("cpu", device_count=1, distributed="mpi")
    n = comm.Get_size()
    me = client.process_index
    device = client.addressable_devices()[0]
    rows = []
    for nbytes in LATENCY_SIZES:
        k = nbytes // 4
        exe = client.compile(PROGRAM.format(n=n, k=k), CompileOptions.make(num_partitions=n))
        buf = [[client.buffer_from_pyval(np.full(k, me + 1, np.float32), device)]]
        src = np.full(k, me + 1, np.float32)
        dst = np.empty_like(src)

        def ours(exe=exe, buf=buf):
            exe.execute(buf)[0][0].block_until_ready()

        def theirs(src=src, dst=dst):
            comm.Allreduce(src, dst, op=MPI.SUM)

        count = reps if k < 1 << 18 else 30
        comm.Barrier()
        a = spread(ours, count)
        comm.Barrier()
        b = spread(theirs, count)
        rows.append((nbytes, a, b))
    if me == 0:
        print(f"all-reduce (sum, f32) latency across {n} MPI processes: best / median us")
        print(f"{'size':>8} {'xlapy best':>11} {'median':>8} {'mpi4py best':>12} {'median':>8}")
        for nbytes, a, b in rows:
            print(
                f"{nbytes:>8} {a[0] * 1e6:11.0f} {a[1] * 1e6:8.0f} "
                f"{b[0] * 1e6:12.0f} {b[1] * 1e6:8.0f}"
            )


def human(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def in_process(devices: int, max_mib: int) -> None:
    all_sizes = sizes(max_mib)
    xla = xla_in_process(devices, all_sizes)
    print(f"all-reduce (sum, f32) over {devices} in-process devices; GB/s = buffer bytes / time")
    print(
        f"{'size':>8} {'xlapy us':>10} {'GB/s':>7} {'XLA us':>10} {'GB/s':>7} {'memcpy GB/s':>12}"
    )
    for nbytes in all_sizes:
        ours = xlapy_in_process(devices, nbytes)
        copy = memcpy(nbytes)
        theirs = xla.get(nbytes)
        xla_cols = (
            f"{theirs * 1e6:10.1f} {nbytes / theirs / 1e9:7.2f}"
            if theirs
            else f"{'-':>10} {'-':>7}"
        )
        print(
            f"{human(nbytes):>8} {ours * 1e6:10.1f} {nbytes / ours / 1e9:7.2f} {xla_cols} "
            f"{nbytes / copy / 1e9:12.2f}"
        )


def mpi(max_mib: int) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    client = Client("cpu", device_count=1, distributed="mpi")
    n = comm.Get_size()
    me = client.process_index
    device = client.addressable_devices()[0]
    rows = []
    for nbytes in sizes(max_mib):
        k = nbytes // 4
        exe = client.compile(PROGRAM.format(n=n, k=k), CompileOptions.make(num_partitions=n))
        buf = [[client.buffer_from_pyval(np.full(k, me + 1, np.float32), device)]]

        def ours(exe=exe, buf=buf):
            comm.Barrier()
            exe.execute(buf)[0][0].block_until_ready()

        src = np.full(k, me + 1, np.float32)
        dst = np.empty_like(src)

        def theirs(src=src, dst=dst):
            comm.Barrier()
            comm.Allreduce(src, dst, op=MPI.SUM)

        reps = reps_for(nbytes)
        rows.append((nbytes, best(ours, reps), best(theirs, reps)))
    if me == 0:
        print(f"all-reduce (sum, f32) across {n} MPI processes, one device each")
        print(f"{'size':>8} {'xlapy us':>10} {'GB/s':>7} {'mpi4py us':>10} {'GB/s':>7}")
        for nbytes, a, b in rows:
            print(
                f"{human(nbytes):>8} {a * 1e6:10.1f} {nbytes / a / 1e9:7.2f} "
                f"{b * 1e6:10.1f} {nbytes / b / 1e9:7.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", default="4", help="a count, or counts like 2,4,8")
    parser.add_argument("--max-mib", type=int, default=64)
    parser.add_argument("--mpi", action="store_true")
    parser.add_argument("--latency", action="store_true")
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    counts = [int(c) for c in args.devices.split(",")]
    if args.mpi and args.latency:
        mpi_latency(args.reps)
    elif args.mpi:
        mpi(args.max_mib)
    elif args.latency:
        latency(counts, args.reps)
    else:
        for count in counts:
            in_process(count, args.max_mib)


if __name__ == "__main__":
    main()
