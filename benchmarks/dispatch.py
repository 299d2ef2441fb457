"""Dispatch overhead: the time to run a trivial compiled module from Python.

Three paths run the same module (negate of an f32[4] and an add, so one small kernel):

  runtime   xlapy.runtime: LoadedExecutable.execute([[buffer]]) then block_until_ready
  +host     the same, plus reading the result back with to_numpy()
  backend   the backend's direct call: CompiledProgram.run([array])
  xla       the same lowering compiled by XLA through JAX, called on a device array

Times are medians of many calls. The goal is <= 20 us for the runtime path. With
--profile, cProfile runs the runtime path and prints where the time goes.

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
    for _ in range(max(10, calls // 10)):
        fn()
    batches = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        batches.append((time.perf_counter() - t) / calls)
    return 1e6 * statistics.median(batches)


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
        ("backend", backend),
        ("xla", xla),
    ]:
        print(f"{name:10s} {per_call_us(fn, opts.calls):8.1f} us")
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
