"""Per-iteration cost of loops with a small body: xlapy's CPU backend against XLA (jax.jit)
in one process, on the same inputs, min of many runs for both.

Programs (each at N iterations):
  fori_tiny      fori_loop whose body is one fused multiply-add on 8 floats
  dus_rows       fori_loop writing row i of a carried (N, 16) buffer (dynamic-update-slice)
  while_converge while_loop with a data-dependent test (a reduce in the condition) and a counter
  lstm_bptt      jax.lax.scan LSTM (batch 8, hidden 32), forward + backward (value_and_grad)
  lstm_wide      the same cell at batch 8, hidden 128 (cpu_vs_xla's lstm_bptt), grad
  fori_wide      fori_loop of v * 0.99 + sin(v) on 64Ki floats (cpu_vs_xla's fori_loop_update)

The table gives per-iteration microseconds for both and their ratio.

  PYTHONPATH=. .venv/bin/python benchmarks/loops.py            # N = 1000 and 10000
  PYTHONPATH=. .venv/bin/python benchmarks/loops.py -n 100 --runs 5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from xlapy.tools.bench import clear_process_kernel_cache, kernel_cache_dir, time_compile


def fori_tiny(n: int):
    def f(x):
        return lax.fori_loop(0, n, lambda i, v: v * 0.999 + 0.5, x)

    return f, lambda rng: (rng.standard_normal(8).astype(np.float32),)


def dus_rows(n: int):
    def f(x):
        def body(i, buf):
            row = jnp.sin(x + i.astype(x.dtype))
            return lax.dynamic_update_slice(buf, row[None], (i, 0))

        return lax.fori_loop(0, n, body, jnp.zeros((n, x.shape[0]), x.dtype))

    return f, lambda rng: (rng.standard_normal(16).astype(np.float32),)


def while_converge(n: int):
    def f(a):
        def cond(state):
            i, x = state
            return (i < n) & (jnp.max(jnp.abs(x - a)) < 1e30)

        def body(state):
            i, x = state
            return i + 1, 0.5 * (x + a / x)

        return lax.while_loop(cond, body, (0, a + 1.0))[1]

    return f, lambda rng: (rng.uniform(1.0, 4.0, 64).astype(np.float32),)


def lstm_bptt(n: int):
    hidden, batch, features = 32, 8, 16

    def loss(params, xs):
        wx, wh, b = params

        def cell(carry, x):
            h, c = carry
            z = x @ wx + h @ wh + b
            i, f, g, o = jnp.split(z, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h

        zeros = jnp.zeros((batch, hidden), xs.dtype)
        _, hs = lax.scan(cell, (zeros, zeros), xs)
        return jnp.mean(hs**2)

    def args(rng):
        s = 1 / np.sqrt(hidden)
        return (
            (
                (rng.standard_normal((features, 4 * hidden)) * s).astype(np.float32),
                (rng.standard_normal((hidden, 4 * hidden)) * s).astype(np.float32),
                (rng.standard_normal(4 * hidden) * 0.1).astype(np.float32),
            ),
            rng.standard_normal((n, batch, features)).astype(np.float32),
        )

    return jax.value_and_grad(loss), args


def lstm_wide(n: int):
    """cpu_vs_xla's LSTM cell (batch 8, hidden 128: its 8x128x512 products are above
    OpenBLAS's own one-thread size), forward and backward over n steps."""
    hidden, batch = 128, 8

    def loss(w, u, xs):
        def cell(carry, x):
            h, c = carry
            i, f, g, o = jnp.split(x @ w + h @ u, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h

        zeros = jnp.zeros((batch, hidden), xs.dtype)
        return jnp.mean(lax.scan(cell, (zeros, zeros), xs)[1] ** 2)

    def args(rng):
        s = 1 / np.sqrt(hidden)
        return (
            (rng.standard_normal((hidden, 4 * hidden)) * s).astype(np.float32),
            (rng.standard_normal((hidden, 4 * hidden)) * s).astype(np.float32),
            rng.standard_normal((n, batch, hidden)).astype(np.float32),
        )

    return jax.grad(loss, argnums=(0, 1)), args


def fori_wide(n: int):
    """cpu_vs_xla's fori_loop_update body (v * 0.99 + sin(v) on 64Ki floats: a kernel the
    runtime may split over the cores)."""

    def f(x):
        return lax.fori_loop(0, n, lambda i, v: v * 0.99 + jnp.sin(v), x)

    return f, lambda rng: (rng.standard_normal(1 << 16).astype(np.float32),)


PROGRAMS: dict[str, Callable] = {
    "fori_tiny": fori_tiny,
    "dus_rows": dus_rows,
    "while_converge": while_converge,
    "lstm_bptt": lstm_bptt,
    "lstm_wide": lstm_wide,
    "fori_wide": fori_wide,
}


def min_seconds(fns: list[Callable[[], object]], runs: int) -> list[float]:
    """The min over `runs` runs of each of `fns`, run in alternation (after one warm-up)."""
    best = [float("inf")] * len(fns)
    for fn in fns:
        fn()
    for _ in range(runs):
        for k, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def measure(name: str, n: int, runs: int) -> tuple[float, float, float, float, bool]:
    """(xlapy us/iter, XLA us/iter, xlapy warm compile ms, XLA compile ms, outputs close)."""
    fn, make_args = PROGRAMS[name](n)
    args = make_args(np.random.default_rng(0))
    jitted = jax.jit(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lowered = jitted.lower(*args)
    text = lowered.as_text(dialect="hlo")
    t = time.perf_counter()
    compiled = lowered.compile()
    xla_compile = time.perf_counter() - t
    device_args = jax.device_put(args)
    want = [np.asarray(w) for w in jax.tree_util.tree_leaves(compiled(*device_args))]
    leaves = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
    with tempfile.TemporaryDirectory(prefix="xlapy-loops-") as tmp, kernel_cache_dir(tmp):
        time_compile("cpu", text)
        warm_ms, executable = time_compile("cpu", text)
        buffers = [executable.client.buffer_from_pyval(a) for a in leaves]

        def run_xlapy():
            for out in executable.execute([buffers])[0]:
                out.block_until_ready()

        def run_xla():
            jax.block_until_ready(compiled(*device_args))

        xlapy_s, xla_s = min_seconds([run_xlapy, run_xla], runs)
        got = [b.to_numpy() for b in executable.execute([buffers])[0]]
    clear_process_kernel_cache()
    ok = len(got) == len(want) and all(
        np.allclose(g, w, rtol=2e-3, atol=2e-4) for g, w in zip(got, want, strict=True)
    )
    return 1e6 * xlapy_s / n, 1e6 * xla_s / n, warm_ms, 1e3 * xla_compile, ok


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, action="append", help="iterations (default 1000, 10000)")
    parser.add_argument("-p", action="append", help="programs whose names contain this")
    parser.add_argument("--runs", type=int, default=20)
    opts = parser.parse_args(argv)
    names = [k for k in PROGRAMS if not opts.p or any(p in k for p in opts.p)]
    print(
        f"{'program':<16} {'N':>6} {'xlapy us/it':>11} {'XLA us/it':>10} {'ratio':>6} "
        f"{'warm ms':>8} {'XLA ms':>7}  ok"
    )
    for name in names:
        for n in opts.n or [1000, 10000]:
            ours, theirs, warm, xla_ms, ok = measure(name, n, opts.runs)
            print(
                f"{name:<16} {n:>6} {ours:>11.3f} {theirs:>10.3f} {ours / theirs:>6.2f} "
                f"{warm:>8.1f} {xla_ms:>7.1f}  {'ok' if ok else 'MISMATCH'}",
                flush=True,
            )


if __name__ == "__main__":
    main()
