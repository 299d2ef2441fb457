"""xlapy's CPU backend against XLA (through JAX) on JAX programs of benchmark size.

Each program is lowered by JAX to HLO text; xlapy compiles that text with its runtime
(`Client("cpu")`, its own pass pipeline, kernels and thunks) and XLA compiles the same
lowering. Both run in this process on the same inputs, already on the device, with warm-up
runs first, then in alternating blocks of runs (so both see the same load on a shared
machine); times are medians. Per program the table gives

  run      xlapy run time / XLA run time
  cold     xlapy compile time with an empty kernel cache / XLA compile time
  warm     xlapy compile time from a filled kernel cache / XLA compile time
  ok       whether xlapy's outputs match XLA's (loose tolerance; "MISMATCH" otherwise)

then the geometric means, and for memory-bound elementwise programs the bytes moved per
second as a fraction of this machine's copy bandwidth (a large np.copyto), for both.

  .venv/bin/python benchmarks/cpu_vs_xla.py                  # everything
  .venv/bin/python benchmarks/cpu_vs_xla.py -p softmax -p mlp  # names containing these
  .venv/bin/python benchmarks/cpu_vs_xla.py --small --runs 3   # tiny shapes (harness check)
  .venv/bin/python benchmarks/cpu_vs_xla.py --list
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from xlapy.tools.bench import (
    clear_process_kernel_cache,
    kernel_cache_dir,
    time_compile,
)


@dataclass(frozen=True)
class Sizes:
    """The shapes programs are built with (benchmark size, or tiny with --small)."""

    elems: tuple[int, int] = (1024, 1024)  # 1M elements
    mat: int = 512
    batch: int = 64
    seq: int = 256
    model: int = 256
    image: int = 32
    sort: int = 1 << 20
    steps: int = 64


BIG = Sizes()
SMALL = Sizes((16, 32), 16, 4, 8, 16, 8, 256, 4)


@dataclass(frozen=True)
class Program:
    name: str
    fn: Callable
    make_args: Callable[[np.random.Generator, Sizes], tuple]
    memory_bound: bool = False


PROGRAMS: dict[str, Program] = {}


def program(name: str, memory_bound: bool = False):
    def register(make):
        fn, make_args = make()
        PROGRAMS[name] = Program(name, fn, make_args, memory_bound)
        return make

    return register


def normal(rng, shape, dtype=np.float32, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def one(shape_of):
    return lambda rng, s: (normal(rng, shape_of(s)),)


def two(shape_of):
    return lambda rng, s: (normal(rng, shape_of(s)), normal(rng, shape_of(s)))


# -- elementwise (memory-bound) -------------------------------------------------------------


@program("add", memory_bound=True)
def _():
    return (lambda x, y: x + y), two(lambda s: s.elems)


@program("axpy", memory_bound=True)
def _():
    return (lambda x, y: 2.5 * x + y), two(lambda s: s.elems)


@program("relu", memory_bound=True)
def _():
    return (lambda x: jnp.maximum(x, 0.0)), one(lambda s: s.elems)


@program("leaky_relu_select", memory_bound=True)
def _():
    return (lambda x: jnp.where(x > 0, x, 0.01 * x)), one(lambda s: s.elems)


@program("bias_add_broadcast", memory_bound=True)
def _():
    return (lambda x, b: x + b), lambda rng, s: (
        normal(rng, s.elems),
        normal(rng, s.elems[1:]),
    )


@program("convert_f32_to_bf16", memory_bound=True)
def _():
    return (lambda x: x.astype(jnp.bfloat16)), one(lambda s: s.elems)


@program("exp", memory_bound=True)
def _():
    return jnp.exp, one(lambda s: s.elems)


@program("tanh")
def _():
    return jnp.tanh, one(lambda s: s.elems)


@program("sigmoid")
def _():
    return jax.nn.sigmoid, one(lambda s: s.elems)


@program("gelu_tanh")
def _():
    return (lambda x: jax.nn.gelu(x, approximate=True)), one(lambda s: s.elems)


@program("trig_chain")
def _():
    return (lambda x, y: jnp.sin(x) * jnp.cos(y) + x * y - jnp.log1p(jnp.abs(y))), two(
        lambda s: s.elems
    )


# -- reductions -------------------------------------------------------------------------------


@program("row_sum")
def _():
    return (lambda x: jnp.sum(x, axis=1)), one(lambda s: s.elems)


@program("column_sum")
def _():
    return (lambda x: jnp.sum(x, axis=0)), one(lambda s: s.elems)


@program("full_sum")
def _():
    return jnp.sum, one(lambda s: s.elems)


@program("row_max")
def _():
    return (lambda x: jnp.max(x, axis=1)), one(lambda s: s.elems)


@program("column_mean_var")
def _():
    return (lambda x: (jnp.mean(x, axis=0), jnp.var(x, axis=0))), one(lambda s: s.elems)


@program("middle_axis_sum")
def _():
    return (lambda x: jnp.sum(x, axis=1)), one(lambda s: (s.batch, s.seq, s.model // 4))


@program("argmax_rows")
def _():
    return (lambda x: jnp.argmax(x, axis=1)), one(lambda s: s.elems)


# -- normalizations -----------------------------------------------------------------------------


@program("softmax")
def _():
    return (lambda x: jax.nn.softmax(x, axis=-1)), one(lambda s: s.elems)


@program("log_softmax")
def _():
    return (lambda x: jax.nn.log_softmax(x, axis=-1)), one(lambda s: s.elems)


def layernorm(x, g, b):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + 1e-5) * g + b


@program("layernorm")
def _():
    return layernorm, lambda rng, s: (
        normal(rng, s.elems),
        normal(rng, s.elems[1:]),
        normal(rng, s.elems[1:]),
    )


# -- matmuls, attention ----------------------------------------------------------------------


@program("matmul")
def _():
    return (lambda a, b: a @ b), two(lambda s: (s.mat, s.mat))


@program("batched_matmul")
def _():
    return (lambda a, b: jnp.einsum("bij,bjk->bik", a, b)), two(
        lambda s: (16, s.mat // 4, s.mat // 4)
    )


@program("matmul_bias_relu")
def _():
    return (lambda x, w, b: jax.nn.relu(x @ w + b)), lambda rng, s: (
        normal(rng, (s.mat, s.mat)),
        normal(rng, (s.mat, s.mat), scale=0.05),
        normal(rng, (s.mat,)),
    )


def attention(q, k, v):
    d = q.shape[-1]
    scores = jnp.einsum("hqd,hkd->hqk", q, k) / math.sqrt(d)
    return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(scores, axis=-1), v)


@program("attention")
def _():
    def args(rng, s):
        shape = (8, s.seq, s.model // 4)
        return normal(rng, shape), normal(rng, shape), normal(rng, shape)

    return attention, args


# -- MLP and transformer: forward and training steps -----------------------------------------


def mlp_params(rng, sizes):
    return [
        (normal(rng, (m, n), scale=1 / math.sqrt(m)), np.zeros((n,), np.float32))
        for m, n in itertools.pairwise(sizes)
    ]


def mlp(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def mlp_loss(params, x, y):
    logits = mlp(params, x)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * y, axis=-1))


def sgd_step(loss):
    def step(params, *data):
        grads = jax.grad(loss)(params, *data)
        return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)

    return step


def mlp_data(rng, s):
    widths = [784, 512, 512, 10] if s is BIG else [32, 16, 16, 10]
    x = normal(rng, (s.batch, widths[0]))
    y = np.eye(10, dtype=np.float32)[rng.integers(0, 10, s.batch)]
    return mlp_params(rng, widths), x, y


@program("mlp_forward")
def _():
    return mlp, lambda rng, s: mlp_data(rng, s)[:2]


@program("mlp_train_step")
def _():
    return sgd_step(mlp_loss), mlp_data


def transformer_params(rng, d):
    def dense(m, n):
        return normal(rng, (m, n), scale=1 / math.sqrt(m))

    return {
        "qkv": dense(d, 3 * d),
        "out": dense(d, d),
        "ff1": dense(d, 4 * d),
        "ff2": dense(4 * d, d),
        "g1": np.ones((d,), np.float32),
        "b1": np.zeros((d,), np.float32),
        "g2": np.ones((d,), np.float32),
        "b2": np.zeros((d,), np.float32),
    }


def transformer_block(p, x, heads=4):
    t, d = x.shape[-2:]
    h = layernorm(x, p["g1"], p["b1"])
    q, k, v = jnp.split(h @ p["qkv"], 3, axis=-1)

    def split(a):
        return a.reshape(*a.shape[:-1], heads, d // heads).swapaxes(-2, -3)

    scores = jnp.einsum("...hqd,...hkd->...hqk", split(q), split(k)) / math.sqrt(d // heads)
    mask = jnp.tril(jnp.ones((t, t), bool))
    scores = jnp.where(mask, scores, -1e9)
    att = jnp.einsum("...hqk,...hkd->...hqd", jax.nn.softmax(scores, axis=-1), split(v))
    x = x + att.swapaxes(-2, -3).reshape(x.shape) @ p["out"]
    h = layernorm(x, p["g2"], p["b2"])
    return x + jax.nn.gelu(h @ p["ff1"]) @ p["ff2"]


def transformer_data(rng, s):
    batch = 4 if s is BIG else 2
    return transformer_params(rng, s.model // 2), normal(rng, (batch, s.seq // 2, s.model // 2))


@program("transformer_forward")
def _():
    return transformer_block, transformer_data


@program("transformer_train_step")
def _():
    def loss(p, x):
        return jnp.mean(transformer_block(p, x) ** 2)

    return sgd_step(loss), transformer_data


# -- convolutions --------------------------------------------------------------------------------


def conv(x, w):
    return lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


@program("conv2d_3x3")
def _():
    return conv, lambda rng, s: (
        normal(rng, (8, s.image, s.image, 16)),
        normal(rng, (3, 3, 16, 32), scale=0.1),
    )


def convnet(p, x):
    h = jax.nn.relu(conv(x, p["c1"]))
    h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    h = jax.nn.relu(conv(h, p["c2"]))
    h = jnp.mean(h, axis=(1, 2))
    return h @ p["dense"]


def convnet_data(rng, s):
    p = {
        "c1": normal(rng, (3, 3, 3, 16), scale=0.2),
        "c2": normal(rng, (3, 3, 16, 32), scale=0.1),
        "dense": normal(rng, (32, 10), scale=0.2),
    }
    return p, normal(rng, (16 if s is BIG else 2, s.image, s.image, 3))


@program("convnet_forward")
def _():
    return convnet, convnet_data


@program("convnet_train_step")
def _():
    return sgd_step(lambda p, x: jnp.mean(convnet(p, x) ** 2)), convnet_data


# -- scans and loops -----------------------------------------------------------------------------


@program("cumsum_rows")
def _():
    return (lambda x: jnp.cumsum(x, axis=1)), one(lambda s: s.elems)


@program("rnn_scan")
def _():
    def rnn(w, u, xs):
        def cell(h, x):
            h = jnp.tanh(h @ w + x @ u)
            return h, h

        h0 = jnp.zeros((xs.shape[1], w.shape[0]), xs.dtype)
        return lax.scan(cell, h0, xs)[1]

    def args(rng, s):
        hidden = s.model
        return (
            normal(rng, (hidden, hidden), scale=1 / math.sqrt(hidden)),
            normal(rng, (hidden // 2, hidden), scale=0.1),
            normal(rng, (s.steps, 32 if s is BIG else 2, hidden // 2)),
        )

    return rnn, args


@program("fori_loop_update")
def _():
    def loop(x):
        return lax.fori_loop(0, 100, lambda i, v: v * 0.99 + jnp.sin(v), x)

    return loop, one(lambda s: (s.elems[0] * 64,))


@program("fori_dus_rows")
def _():
    def loop(x):
        def body(i, buf):
            return lax.dynamic_update_slice(buf, jnp.sin(x + i.astype(x.dtype))[None], (i, 0))

        return lax.fori_loop(0, 1000, body, jnp.zeros((1000, x.shape[0]), x.dtype))

    return loop, one(lambda s: (16,))


@program("while_data_dependent")
def _():
    def loop(a):
        def cond(state):
            i, x = state
            return (i < 2000) & (jnp.max(jnp.abs(x - a)) < 1e30)

        return lax.while_loop(cond, lambda s: (s[0] + 1, 0.5 * (s[1] + a / s[1])), (0, a + 1.0))[1]

    return loop, lambda rng, s: (rng.uniform(1.0, 4.0, 64).astype(np.float32),)


# -- sort ---------------------------------------------------------------------------------------


@program("sort")
def _():
    return jnp.sort, one(lambda s: (s.sort,))


@program("argsort_rows")
def _():
    return (lambda x: jnp.argsort(x, axis=1)), one(lambda s: (s.elems[0] // 4, s.elems[1]))


@program("top_k")
def _():
    return (lambda x: lax.top_k(x, 8)), one(lambda s: (s.elems[0] // 4, s.elems[1]))


# -- gather / scatter ----------------------------------------------------------------------------


@program("gather_rows")
def _():
    def args(rng, s):
        table = normal(rng, (s.elems[0] * 4, s.model))
        return table, rng.integers(0, table.shape[0], s.elems[0]).astype(np.int32)

    return (lambda t, i: t[i]), args


@program("embedding_sum")
def _():
    def args(rng, s):
        table = normal(rng, (s.elems[0] * 4, s.model // 2))
        ids = rng.integers(0, table.shape[0], (s.batch, 32)).astype(np.int32)
        return table, ids

    return (lambda t, i: jnp.sum(t[i], axis=1)), args


@program("scatter_add")
def _():
    def args(rng, s):
        n = s.elems[0] * 16
        return (
            normal(rng, (s.elems[0], 64)),
            rng.integers(0, s.elems[0], n).astype(np.int32),
            normal(rng, (n, 64)),
        )

    return (lambda x, i, u: x.at[i].add(u)), args


@program("segment_sum")
def _():
    def args(rng, s):
        n = s.elems[0] * s.elems[1] // 16
        return normal(rng, (n, 16)), np.sort(rng.integers(0, 1024, n)).astype(np.int32)

    return (lambda d, ids: jax.ops.segment_sum(d, ids, num_segments=1024)), args


# -- the harness ---------------------------------------------------------------------------------


@dataclass
class Row:
    name: str
    xla_run_us: float
    xla_compile_ms: float
    run_us: float = math.nan
    cold_ms: float = math.nan
    warm_ms: float = math.nan
    moved_bytes: int = 0
    memory_bound: bool = False
    status: str = "ok"


def median_seconds(fn, runs: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def interleaved_medians(
    fns, runs: int, warmup: int, block: int = 5, min_seconds: float = 0.3
) -> list[float]:
    """Median seconds of each of `fns`, timed in alternating blocks (`block` timed runs of
    one, then of the next, ...) so that every side sees the same load on a shared machine.
    Each block starts with one untimed run: thread pools that spin after their work (XLA's,
    OpenBLAS's) would otherwise slow the first run of the other side. At least `runs` timed
    runs each, more (up to 50 * runs) until every side has run for `min_seconds` in total,
    so short programs get enough samples for a stable median. Each function drops its
    outputs before returning: neither side keeps results alive during the next run."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    while True:
        for fn, samples in zip(fns, times, strict=True):
            fn()
            for _ in range(block):
                t = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t)
        done = len(times[0])
        if done >= runs and (done >= 50 * runs or all(sum(s) >= min_seconds for s in times)):
            return [statistics.median(s) for s in times]


def copy_bandwidth() -> float:
    """Bytes per second (read + write) of a large np.copyto."""
    src = np.ones(64 * 1024 * 1024 // 4, np.float32)
    dst = np.empty_like(src)
    return 2 * src.nbytes / median_seconds(lambda: np.copyto(dst, src), 9, 2)


def leaves_of(value) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(value)]


def flat_args(args) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(args)]


def matches(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape:
            return False
        if w.dtype.kind in "biu":
            if not np.array_equal(g, w) and np.mean(g != w) > 0.001:
                return False
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        scale = max(float(np.max(np.abs(w64), initial=0.0)), 1e-6)
        if not np.allclose(g64, w64, rtol=2e-2, atol=2e-3 * scale, equal_nan=True):
            return False
    return True


def run_program(prog: Program, sizes: Sizes, runs: int, warmup: int) -> Row:
    rng = np.random.default_rng(0)
    args = prog.make_args(rng, sizes)
    jitted = jax.jit(prog.fn, keep_unused=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lowered = jitted.lower(*args)
    text = lowered.as_text(dialect="hlo")
    t = time.perf_counter()
    compiled = lowered.compile()
    xla_compile = time.perf_counter() - t
    device_args = jax.device_put(args)
    want = leaves_of(compiled(*device_args))

    def run_xla():
        jax.block_until_ready(compiled(*device_args))

    leaves = flat_args(args)
    row = Row(prog.name, math.nan, 1e3 * xla_compile, memory_bound=prog.memory_bound)
    row.moved_bytes = sum(a.nbytes for a in leaves) + sum(w.nbytes for w in want)
    try:
        with tempfile.TemporaryDirectory(prefix="xlapy-bench-") as tmp, kernel_cache_dir(tmp):
            cold_ms, _ = time_compile("cpu", text)
            warm_ms, executable = time_compile("cpu", text)
            buffers = [executable.client.buffer_from_pyval(a) for a in leaves]

            def run_xlapy():
                for out in executable.execute([buffers])[0]:
                    out.block_until_ready()

            xla_run, xlapy_run = interleaved_medians((run_xla, run_xlapy), runs, warmup)
            row.xla_run_us = 1e6 * xla_run
            got = [b.to_numpy() for b in executable.execute([buffers])[0]]
    except Exception as e:
        if math.isnan(row.xla_run_us):
            row.xla_run_us = 1e6 * median_seconds(run_xla, runs, warmup)
        row.status = f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:90]}"
        if "-v" in sys.argv:
            traceback.print_exc()
        return row
    finally:
        clear_process_kernel_cache()
    row.cold_ms, row.warm_ms = cold_ms, warm_ms
    row.run_us = 1e6 * xlapy_run
    if not matches(got, want):
        row.status = "MISMATCH"
    return row


def geomean(values) -> float:
    values = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def report(rows: list[Row], bandwidth: float) -> None:
    head = (
        f"{'program':24s} {'xla us':>10s} {'xlapy us':>10s} {'run':>6s} "
        f"{'xla ms':>8s} {'cold ms':>8s} {'warm ms':>8s} {'cold':>6s} {'warm':>6s}  status"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.name:24s} {r.xla_run_us:10.1f} {r.run_us:10.1f} {r.run_us / r.xla_run_us:6.2f} "
            f"{r.xla_compile_ms:8.1f} {r.cold_ms:8.1f} {r.warm_ms:8.1f} "
            f"{r.cold_ms / r.xla_compile_ms:6.2f} {r.warm_ms / r.xla_compile_ms:6.2f}  {r.status}"
        )
    good = [r for r in rows if r.status == "ok"]
    print("-" * len(head))
    print(
        f"geometric means over {len(good)} of {len(rows)} programs (ok only): "
        f"run {geomean(r.run_us / r.xla_run_us for r in good):.2f}, "
        f"cold compile {geomean(r.cold_ms / r.xla_compile_ms for r in good):.2f}, "
        f"warm compile {geomean(r.warm_ms / r.xla_compile_ms for r in good):.2f}; "
        f"median warm compile {statistics.median([r.warm_ms for r in good] or [math.nan]):.1f} ms"
    )
    bound = [r for r in rows if r.memory_bound and r.status == "ok"]
    if not bound:
        return
    print(f"\nmemory-bound elementwise programs (copy bandwidth {bandwidth / 1e9:.1f} GB/s)")
    print(f"{'program':24s} {'xlapy GB/s':>11s} {'of copy':>8s} {'xla GB/s':>9s} {'of copy':>8s}")
    for r in bound:
        ours = r.moved_bytes / (r.run_us * 1e-6)
        xla = r.moved_bytes / (r.xla_run_us * 1e-6)
        print(
            f"{r.name:24s} {ours / 1e9:11.1f} {ours / bandwidth:8.2f} "
            f"{xla / 1e9:9.1f} {xla / bandwidth:8.2f}"
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-p", "--program", action="append", default=[], help="run programs whose name contains this"
    )
    parser.add_argument("--runs", type=int, default=20, help="timed runs per program")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first")
    parser.add_argument("--small", action="store_true", help="tiny shapes (checks the harness)")
    parser.add_argument("--list", action="store_true", help="list the programs and exit")
    parser.add_argument("-v", action="store_true", help="print tracebacks of failures")
    opts = parser.parse_args(argv)
    names = [n for n in PROGRAMS if not opts.program or any(p in n for p in opts.program)]
    if opts.list:
        print("\n".join(names))
        return
    sizes = SMALL if opts.small else BIG
    bandwidth = copy_bandwidth()
    rows = []
    for name in names:
        row = run_program(PROGRAMS[name], sizes, opts.runs, opts.warmup)
        print(f"  {name}: {row.status}", file=sys.stderr, flush=True)
        rows.append(row)
    report(rows, bandwidth)


if __name__ == "__main__":
    main()
