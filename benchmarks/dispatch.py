"""Dispatch overhead: the time to run a trivial compiled module from Python.

These paths run the same module (negate of an f32[4] and an add, so one small kernel):

  runtime   xlapy.runtime: LoadedExecutable.execute([[buffer]]) then block_until_ready
            (the device is idle, so the run is inline on the calling thread)
  +host     the same, plus reading the result back with to_numpy()
  worker    the runtime path with inline execution off: the run is handed to the device's
            worker thread and the caller waits for it
  backend   the backend's direct call: CompiledProgram.run([array])
  xla       the same lowering compiled by XLA through JAX, called on a device array

Then two programs on a 4 MiB input (f32[1024,1024]): a row sum (4 KiB out) and a negate
(4 MiB out), through the runtime and through the backend directly.

Times are medians of many calls. The goals are <= 20 us for the runtime path and the
4 MiB runtime path within ~10% of the backend's. With --profile, cProfile runs the runtime
path and prints where the time goes.

  .venv/bin/python benchmarks/dispatch.py [--calls N] [--backend cpu] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from xlapy.backends import get_backend
from xlapy.ir.parser import parse_module
from xlapy.runtime import Client


def trivial(x):
    return -x + 1.0


def per_call_us(fn, calls: int, repeats: int = 7) -> float:
    """Median over `repeats` batches of the mean time of one call in a batch of `calls`."""
    return per_call_wall_and_cpu_us(fn, calls, repeats)[0]


def per_call_wall_and_cpu_us(fn, calls: int, repeats: int = 7) -> tuple[float, float, float]:
    """(wall, calling thread's CPU) microseconds per call, each the median over `repeats`
    batches, and the CPU time of the quietest batch. CPU time leaves out the time the thread
    waits or is descheduled, so it moves less with the load of other processes; it misses
    work done on other threads."""
    for _ in range(max(10, calls // 10)):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.thread_time()
        for _ in range(calls):
            fn()
        wall.append((time.perf_counter() - t) / calls)
        cpu.append((time.thread_time() - c) / calls)
    return 1e6 * statistics.median(wall), 1e6 * statistics.median(cpu), 1e6 * min(cpu)


def large_inputs(client: Client, calls: int) -> None:
    """Runtime against backend on a 4 MiB input (rounds of the two alternate, so that load
    from other processes hits both alike)."""
    x = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    buf = client.buffer_from_pyval(x)
    calls = max(10, calls // 40)
    for name, fn in [("row sum", lambda v: jnp.sum(v, axis=1)), ("negate", lambda v: -v)]:
        executable = client.compile(jax.jit(fn).lower(x).as_text(dialect="hlo"))
        program = executable._programs[client.devices()[0].id]

        def runtime(executable=executable):
            for out in executable.execute([[buf]])[0]:
                out.block_until_ready()

        def backend(program=program):
            program.run([x])

        times: dict[str, list[float]] = {"runtime": [], "backend": []}
        for _ in range(5):
            times["runtime"].append(per_call_us(runtime, calls, repeats=3))
            times["backend"].append(per_call_us(backend, calls, repeats=3))
        rt, be = (statistics.median(times[k]) for k in ("runtime", "backend"))
        print(
            f"4 MiB {name:8s} runtime {rt:8.1f} us  backend {be:8.1f} us  "
            f"(+{100 * (rt - be) / be:.0f}%)"
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--profile", action="store_true", help="cProfile the runtime path")
    opts = parser.parse_args(argv)

    x = np.arange(4, dtype=np.float32)
    lowered = jax.jit(trivial).lower(x)
    text = lowered.as_text(dialect="hlo")

    client = Client(opts.backend)
    executable = client.compile(text)
    buf = client.buffer_from_pyval(x)

    def runtime():
        for out in executable.execute([[buf]])[0]:
            out.block_until_ready()

    def runtime_host():
        return [out.to_numpy() for out in executable.execute([[buf]])[0]]

    worker_client = Client(opts.backend, inline_execution=False)
    worker_executable = worker_client.compile(text)
    worker_buf = worker_client.buffer_from_pyval(x)

    def worker():
        for out in worker_executable.execute([[worker_buf]])[0]:
            out.block_until_ready()

    program = get_backend(client.backend.name).compile(parse_module(text))

    def backend():
        return program.run([x])

    compiled = lowered.compile()
    xa = jnp.asarray(x)

    def xla():
        compiled(xa).block_until_ready()

    np.testing.assert_allclose(runtime_host()[0], np.asarray(compiled(xa)))
    print(f"backend: {client.backend.name}; {opts.calls} calls per batch, median of 7 batches")
    for name, fn in [
        ("runtime", runtime),
        ("+host", runtime_host),
        ("worker", worker),
        ("backend", backend),
        ("xla", xla),
    ]:
        wall, cpu, quietest = per_call_wall_and_cpu_us(fn, opts.calls)
        print(
            f"{name:10s} {wall:8.1f} us   (calling thread CPU {cpu:6.1f} us, "
            f"quietest batch {quietest:6.1f} us)"
        )
    worker_client.close()
    large_inputs(client, opts.calls)
    if not opts.profile:
        return
    for name, fn in [("runtime", runtime), ("backend", backend)]:
        print(f"\n== cProfile of the {name} path (main thread only) ==")
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(opts.calls):
            fn()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
