"""xlapy's CPU backend against XLA (through JAX) on JAX programs of benchmark size.

Each program is lowered by JAX to HLO text; xlapy compiles that text with its runtime
(`Client("cpu")`, its own pass pipeline, kernels and thunks) and XLA compiles the same
lowering. Both run in this process on the same inputs, already on the device, with warm-up
runs first, then in alternating blocks of runs (so both see the same load on a shared
machine); times are medians (--stat min: the best run, the fairer figure for scaling on a
loaded machine). Per program the table gives

  run      xlapy run time / XLA run time
  cold     xlapy compile time with an empty kernel cache / XLA compile time (the kernel
           library, jit/kernel_library.py, is built once per machine outside the cache, as
           XLA's precompiled kernels are in its binary: its build cost is printed at the end)
  warm     xlapy compile time from a filled kernel cache / XLA compile time
  fb       instructions xlapy runs with the interpreter's rule (its fallbacks; -v lists them)
  ok       whether xlapy's outputs match XLA's (loose tolerance; "MISMATCH" otherwise)

then the geometric means, and for memory-bound elementwise programs the bytes moved per
second as a fraction of this machine's copy bandwidth (a large np.copyto), for both.

  .venv/bin/python benchmarks/cpu_vs_xla.py                  # everything
  .venv/bin/python benchmarks/cpu_vs_xla.py -p softmax -p mlp  # names containing these
  .venv/bin/python benchmarks/cpu_vs_xla.py --small --runs 3   # tiny shapes (harness check)
  .venv/bin/python benchmarks/cpu_vs_xla.py --list
  .venv/bin/python benchmarks/cpu_vs_xla.py --threads 1,2,4,8,16   # scaling table

Programs belong to the families of issue 17 (FAMILIES: by name prefix); the report ends with
per-family geometric means. --threads reruns the whole selection once per thread count T,
pinned with `taskset -c 0-(T-1)` (XLA:CPU sizes its pools by the cores it may use) and with
XLAPY_NUM_THREADS=T (xlapy's pool, kernel.pool_size()); counts above the machine's cores are
skipped; a second table gives each program's own speedup from the first thread count to
each other one, for xlapy and for XLA side by side (a kernel that does not speed up from 1 to
2 threads will not scale to 16). benchmarks/device_run.sh runs it on a many-core machine
without network access.
"""

from __future__ import annotations

import argparse
import functools
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

from xlapy.backends.cpu.jit import kernel_library
from xlapy.backends.cpu.jit.disk_cache import library_dir
from xlapy.ir.parser import parse_module
from xlapy.tools.bench import (
    clear_process_kernel_cache,
    kernel_cache_dir,
    program_fallbacks,
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
    family: str = "other"
    atol: float = 2e-3  # of the output's largest magnitude (see matches)


PROGRAMS: dict[str, Program] = {}

# The slow families named in issue 17, by the program-name prefixes that belong to each
# (programs added for a family that nobody tuned on count like the others).
FAMILIES: dict[str, tuple[str, ...]] = {
    "scans": ("cum",),
    "loops": ("fori_", "while_", "lstm_", "gru_", "rnn_", "scan_"),
    "linalg": ("eig", "svd", "qr", "cholesky"),
    "fft": ("fft", "rfft"),
    "dots": ("matmul", "batched_matmul"),
    "pooling": ("maxpool", "avgpool"),
    "conv": ("conv2d", "convnet"),
    "rng": ("rng_", "threefry"),
    "f16": ("f16_",),
    "int_bits": ("int_",),
    "rows": ("softmax", "log_softmax", "row_", "layernorm"),
    "transformer": ("transformer",),
}


def family_of(name: str) -> str:
    for family, prefixes in FAMILIES.items():
        if name.startswith(prefixes):
            return family
    return "other"


def program(name: str, memory_bound: bool = False, atol: float = 2e-3):
    def register(make):
        fn, make_args = make()
        PROGRAMS[name] = Program(name, fn, make_args, memory_bound, family_of(name), atol)
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


# Added in the seventh session (transformer programs of the outside models' sizes, where the
# per-step cost and bf16 dots decide, not the big dots): a bf16 forward pass, and a small
# two-layer training step with an Adam update over its many small parameters. The bf16 pass
# is compared with atol 2e-2 of the largest output: XLA keeps f32 inside its fusions (excess
# precision), xlapy rounds every bf16 result, as the interpreter does; they land ~6e-3 apart.
@program("transformer_forward_bf16", atol=2e-2)
def _():
    def f(p, x):
        return transformer_block(p, x).astype(jnp.float32)

    def data(rng, s):
        p, x = transformer_data(rng, s)
        bf16 = jnp.bfloat16
        return jax.tree_util.tree_map(lambda a: np.asarray(a).astype(bf16), (p, x))

    return f, data


def adam_step(loss, lr=1e-3, b1=0.9, b2=0.999, eps=1e-4):
    def step(params, m, v, *data):
        grads = jax.grad(loss)(params, *data)
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        params = jax.tree_util.tree_map(
            lambda p, m, v: (
                p - lr * (m / (1 - b1)) / (jnp.sqrt(v / (1 - b2)) + eps) - lr * 1e-2 * p
            ),
            params,
            m,
            v,
        )
        return params, m, v

    return step


@program("transformer_small_adam_step")
def _():
    def loss(layers, x):
        for p in layers:
            x = transformer_block(p, x, heads=2)
        return jnp.mean(x**2)

    def data(rng, s):
        d = max(s.model // 4, 8)
        layers = [transformer_params(rng, d) for _ in range(2)]
        moments = [jax.tree_util.tree_map(lambda a: 0.01 * np.abs(a), p) for p in layers]
        return layers, moments, moments, normal(rng, (2, max(s.seq // 8, 4), d))

    return adam_step(loss), data


# Added in the eighth session (branch xformer2): attention written as flax.nnx writes it,
# projections as einsums with [model, heads, head] kernels, in a training step with Adam. Its
# gradients contract [batch, heads, tokens, head] values over (heads, head) and keep (heads,
# head) free, which no BLAS matrix reads in place (passes/dot_operands.py transposes them).
def mha_block(p, x, heads):
    h = layernorm(x, p["g1"], p["b1"])
    q, k, v = (jnp.einsum("btm,mhd->bthd", h, p[w]) for w in ("wq", "wk", "wv"))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    t = x.shape[1]
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
    att = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    x = x + jnp.einsum("bqhd,hdm->bqm", att, p["wo"])
    h = layernorm(x, p["g2"], p["b2"])
    return x + jax.nn.relu(h @ p["ff1"]) @ p["ff2"]


@program("transformer_mha_adam_step")
def _():
    heads = 4

    def loss(layers, x):
        for p in layers:
            x = mha_block(p, x, heads)
        return jnp.mean(x**2)

    def data(rng, s):
        d = max(s.model // 4, 8)
        hd = d // heads

        def layer():
            def w(*shape):
                return normal(rng, shape, scale=1 / math.sqrt(d))

            return {
                "wq": w(d, heads, hd), "wk": w(d, heads, hd), "wv": w(d, heads, hd),
                "wo": w(heads, hd, d), "ff1": w(d, 2 * d), "ff2": w(2 * d, d),
                "g1": normal(rng, (d,)), "b1": normal(rng, (d,), scale=0.1),
                "g2": normal(rng, (d,)), "b2": normal(rng, (d,), scale=0.1),
            }  # fmt: skip

        layers = [layer() for _ in range(2)]
        moments = [jax.tree_util.tree_map(lambda a: 0.01 * np.abs(a), p) for p in layers]
        return layers, moments, moments, normal(rng, (3, max(s.seq // 8, 4), d))

    return adam_step(loss), data


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


# -- issue 17 families: scans, loops, linalg, FFT, pooling, RNG, f16, integer bits -----------


@program("cumsum_reverse")
def _():
    return (lambda x: lax.cumsum(x, axis=1, reverse=True)), one(lambda s: s.elems)


@program("cumprod_cols")
def _():
    return (lambda x: jnp.cumprod(1 + 0.001 * x, axis=0)), one(lambda s: s.elems)


@program("cummax_1d")
def _():
    return lax.cummax, one(lambda s: (s.elems[0] * s.elems[1] // 16,))


@program("cumlogsumexp_rows")
def _():
    return (lambda x: lax.cumlogsumexp(x, axis=1)), one(lambda s: (s.elems[0] // 8, s.elems[1]))


@program("cumsum_grad")
def _():
    return jax.grad(lambda x: jnp.sum(jnp.cumsum(x, axis=1) ** 2)), one(lambda s: s.elems)


@program("fori_dynamic_update_slice")
def _():
    def loop(x):
        def body(i, acc):
            row = jnp.tanh(lax.dynamic_index_in_dim(acc, i, keepdims=True) * 0.5 + 1.0)
            return lax.dynamic_update_index_in_dim(acc, row, i + 1, axis=0)

        return lax.fori_loop(0, x.shape[0] - 1, body, x)

    return loop, one(lambda s: (s.steps * 4, s.model))


@program("while_converge")
def _():
    def newton_sqrt(a):
        def cond(state):
            y, prev, i = state
            return (jnp.max(jnp.abs(y - prev)) > 1e-6) & (i < 100)

        def body(state):
            y, _, i = state
            return 0.5 * (y + a / y), y, i + 1

        return lax.while_loop(cond, body, (a, a + 1.0, 0))[0]

    return newton_sqrt, lambda rng, s: (1.0 + np.abs(normal(rng, (s.elems[0] * 16,))),)


def lstm_data(rng, s, gates):
    hidden = s.model // 2
    return (
        normal(rng, (hidden, gates * hidden), scale=1 / math.sqrt(hidden)),
        normal(rng, (hidden, gates * hidden), scale=1 / math.sqrt(hidden)),
        normal(rng, (s.steps // 2, 8 if s is BIG else 2, hidden)),
    )


def lstm_loss(w, u, xs):
    def cell(carry, x):
        h, c = carry
        i, f, g, o = jnp.split(x @ w + h @ u, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    h0 = jnp.zeros(xs.shape[1:], xs.dtype)
    return jnp.mean(lax.scan(cell, (h0, h0), xs)[1] ** 2)


def gru_loss(w, u, xs):
    def cell(h, x):
        zr = x @ w[:, : 2 * h.shape[-1]] + h @ u[:, : 2 * h.shape[-1]]
        z, r = jnp.split(jax.nn.sigmoid(zr), 2, axis=-1)
        n = jnp.tanh(x @ w[:, 2 * h.shape[-1] :] + (r * h) @ u[:, 2 * h.shape[-1] :])
        h = (1 - z) * n + z * h
        return h, h

    h0 = jnp.zeros(xs.shape[1:], xs.dtype)
    return jnp.mean(lax.scan(cell, h0, xs)[1] ** 2)


@program("lstm_bptt")
def _():
    return jax.grad(lstm_loss, argnums=(0, 1)), lambda rng, s: lstm_data(rng, s, 4)


@program("gru_bptt")
def _():
    return jax.grad(gru_loss, argnums=(0, 1)), lambda rng, s: lstm_data(rng, s, 3)


# Loop programs added in the fifth session, not tuned on: a cell written another way, a
# while loop around a matrix-vector product, a scan over stacked layers.


def lstm_concat_loss(w, b, xs):
    """An LSTM cell as one product of [x, h] with a bias, the forget gate biased by +1 and
    the gates in another order (i, g, f, o), over a longer sequence than lstm_bptt."""

    def cell(carry, x):
        h, c = carry
        z = jnp.concatenate([x, h], axis=-1) @ w + b
        i, g, f, o = jnp.split(z, 4, axis=-1)
        c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    h0 = jnp.zeros((xs.shape[1], w.shape[1] // 4), xs.dtype)
    return jnp.mean(lax.scan(cell, (h0, h0), xs)[1][-8:] ** 2)


@program("lstm_concat_bptt")
def _():
    def args(rng, s):
        hidden, features = 3 * s.model // 8, s.model // 4
        return (
            normal(rng, (features + hidden, 4 * hidden), scale=1 / math.sqrt(hidden)),
            normal(rng, (4 * hidden,), scale=0.1),
            normal(rng, (s.steps, 16 if s is BIG else 2, features)),
        )

    return jax.grad(lstm_concat_loss, argnums=(0, 1)), args


@program("while_power_iteration")
def _():
    def top_eigenvalue(a, v):
        def cond(state):
            _, _, change, i = state
            return (change > 1e-5) & (i < 300)

        def body(state):
            v, _, _, i = state
            w = a @ v
            nv = w / jnp.linalg.norm(w)
            return nv, v, jnp.max(jnp.abs(nv - v)), i + 1

        v, _, _, i = lax.while_loop(cond, body, (v, v, jnp.float32(1.0), 0))
        return v @ (a @ v), i

    def args(rng, s):
        m = normal(rng, (s.mat, s.mat)) / math.sqrt(s.mat)
        return (m @ m.T + np.diag(np.linspace(0.0, 2.0, s.mat, dtype=np.float32)),
                normal(rng, (s.mat,)))  # fmt: skip

    return top_eigenvalue, args


@program("scan_layers_grad")
def _():
    def loss(ws, bs, x):
        def layer(h, wb):
            w, b = wb
            return jnp.tanh(h @ w + b) + h, None

        return jnp.mean(lax.scan(layer, x, (ws, bs))[0] ** 2)

    def args(rng, s):
        d = s.model
        return (
            normal(rng, (8, d, d), scale=0.5 / math.sqrt(d)),
            normal(rng, (8, d), scale=0.1),
            normal(rng, (s.batch, d)),
        )

    return jax.grad(loss, argnums=(0, 1)), args


# Seventh session (branch rnn): the outside models' recurrent cells, forward, on a batch of
# a few rows (dots of 3-5 rows: small matrix-matrix products), scanned or unrolled.


def lstm_cell_concat(w, b, carry, x):
    h, c = carry
    i, g, f, o = jnp.split(jnp.concatenate([x, h], axis=-1) @ w + b, 4, axis=-1)
    c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h, c), h


def lstm_forward_args(rng, s, steps):
    hidden, features = s.model // 2, s.model // 4
    return (
        normal(rng, (features + hidden, 4 * hidden), scale=1 / math.sqrt(hidden)),
        normal(rng, (4 * hidden,), scale=0.1),
        normal(rng, (hidden, features), scale=1 / math.sqrt(hidden)),
        normal(rng, (steps, 3 if s is BIG else 2, features)),
    )


@program("lstm_forward_small_batch")
def _():
    def forward(w, b, proj, xs):
        h0 = jnp.zeros((xs.shape[1], w.shape[1] // 4), xs.dtype)
        hs = lax.scan(functools.partial(lstm_cell_concat, w, b), (h0, h0), xs)[1]
        return hs @ proj

    return forward, lambda rng, s: lstm_forward_args(rng, s, s.steps // 4)


@program("lstm_unrolled_forward")
def _():
    def forward(w, b, proj, xs):
        h = c = jnp.zeros((xs.shape[1], w.shape[1] // 4), xs.dtype)
        hs = []
        for t in range(xs.shape[0]):  # a static unroll: one straight-line cell per step
            (h, c), _ = lstm_cell_concat(w, b, (h, c), xs[t])
            hs.append(h)
        return jnp.stack(hs) @ proj

    return forward, lambda rng, s: lstm_forward_args(rng, s, 8)


@program("gru_bidirectional_forward")
def _():
    def gru(ws, h0, xs):
        wi, wh, bi, bh = ws

        def cell(h, x):
            r = jax.nn.sigmoid(x @ wi[0] + bi[0] + h @ wh[0])
            z = jax.nn.sigmoid(x @ wi[1] + bi[1] + h @ wh[1])
            n = jnp.tanh(x @ wi[2] + bi[2] + r * (h @ wh[2] + bh))
            h = (1 - z) * n + z * h
            return h, h

        return lax.scan(cell, h0, xs)[1]

    def forward(fwd, bwd, xs):
        h0 = jnp.zeros((xs.shape[1], fwd[1].shape[-1]), xs.dtype)
        both = jnp.concatenate([gru(fwd, h0, xs), gru(bwd, h0, xs[::-1])[::-1]], axis=-1)
        return jnp.mean(both, axis=0)

    def args(rng, s):
        hidden, features = 3 * s.model // 8, s.model // 8

        def direction():
            return (
                normal(rng, (3, features, hidden), scale=1 / math.sqrt(features)),
                normal(rng, (3, hidden, hidden), scale=1 / math.sqrt(hidden)),
                normal(rng, (3, hidden), scale=0.1),
                normal(rng, (hidden,), scale=0.1),
            )

        return direction(), direction(), normal(rng, (s.steps // 4, 5 if s is BIG else 2, features))

    return forward, args


def spd(rng, n):
    a = normal(rng, (n, n))
    return a @ a.T / n + np.eye(n, dtype=np.float32)


@program("scan_weight_norm")
def _():
    """An RNN scan whose step re-normalizes its weights (weight normalization written in
    the step function, as a model library does): the normalized matrix is the same on
    every step, so XLA's loop-invariant code motion computes it once."""

    def forward(v, g, xs):
        def step(h, x):
            w = g * v / jnp.sqrt(jnp.sum(v * v, axis=0, keepdims=True))
            h = jnp.tanh(h @ w + x)
            return h, h

        h0 = jnp.zeros((xs.shape[1], v.shape[1]), xs.dtype)
        return lax.scan(step, h0, xs)[1]

    def args(rng, s):
        width = s.model // 2
        return (
            normal(rng, (width, width)),
            normal(rng, (1, width), scale=0.5),
            normal(rng, (s.steps, s.batch // 4, width)),
        )

    return forward, args


# Ninth session (branch loops2): decoding and recurrent loops whose bodies hold batched dots
# (one gemm per batch item and head) and write a cache in place; not tuned on.


@program("while_greedy_decode")
def _():
    """GPT-style greedy decoding with a KV cache in a lax.while_loop: per step, one
    attention layer over the cache (batched dots over batch and heads), an MLP, tied
    logits and an argmax; the new key/value and token written in place."""

    def decode(emb, wqkv, wo, w1, w2, prompt):
        batch, start = prompt.shape
        width, heads, steps = emb.shape[1], 4, prompt.shape[1] * 3
        dh, total = width // heads, start + steps
        tokens = jnp.zeros((batch, total), jnp.int32).at[:, :start].set(prompt)
        cache = jnp.zeros((2, batch, total, heads, dh), emb.dtype)

        def body(state):
            t, tokens, cache = state
            x = emb[lax.dynamic_slice_in_dim(tokens, t, 1, axis=1)[:, 0]]
            q, k, v = jnp.moveaxis((x @ wqkv).reshape(batch, 3, heads, dh), 1, 0)
            cache = lax.dynamic_update_slice(cache, jnp.stack([k, v])[:, :, None], (0, 0, t, 0, 0))
            s = jnp.einsum("bhd,bthd->bht", q, cache[0]) / math.sqrt(dh)
            s = jnp.where(jnp.arange(total) <= t, s, -1e30)
            ctx = jnp.einsum("bht,bthd->bhd", jax.nn.softmax(s, axis=-1), cache[1])
            x = x + ctx.reshape(batch, width) @ wo
            x = x + jax.nn.gelu(x @ w1) @ w2
            nxt = jnp.argmax(x @ emb.T, axis=-1).astype(jnp.int32)
            written = lax.dynamic_update_slice(tokens, nxt[:, None], (0, t + 1))
            return t + 1, jnp.where(t + 1 < start, tokens, written), cache

        return lax.while_loop(lambda s: s[0] < total - 1, body, (0, tokens, cache))[1]

    def args(rng, s):
        width, vocab = s.model // 2, 8 * s.model
        return (
            normal(rng, (vocab, width), scale=2 / math.sqrt(width)),
            normal(rng, (width, 3 * width), scale=1 / math.sqrt(width)),
            normal(rng, (width, width), scale=1 / math.sqrt(width)),
            normal(rng, (width, 4 * width), scale=1 / math.sqrt(width)),
            normal(rng, (4 * width, width), scale=1 / math.sqrt(4 * width)),
            rng.integers(0, vocab, (4 if s is BIG else 2, s.steps // 8 or 1)).astype(np.int32),
        )

    return decode, args


@program("scan_rnn_attention")
def _():
    """A GRU-like scan whose step attends over an encoder memory (batched dots per batch
    item: scores and context), as a sequence-to-sequence decoder's cell does."""

    def decoder(wx, wh, wc, memory, xs):
        def cell(h, x):
            scores = jnp.einsum("bh,bmh->bm", h, memory) / math.sqrt(h.shape[-1])
            ctx = jnp.einsum("bm,bmh->bh", jax.nn.softmax(scores, axis=-1), memory)
            z = jax.nn.sigmoid(x @ wx[0] + h @ wh[0] + ctx @ wc[0])
            n = jnp.tanh(x @ wx[1] + (z * h) @ wh[1] + ctx @ wc[1])
            h = (1 - z) * h + z * n
            return h, h

        h0 = jnp.mean(memory, axis=1)
        return lax.scan(cell, h0, xs)[1]

    def args(rng, s):
        hidden, features, batch = s.model // 2, s.model // 4, 8 if s is BIG else 2
        return (
            normal(rng, (2, features, hidden), scale=1 / math.sqrt(features)),
            normal(rng, (2, hidden, hidden), scale=1 / math.sqrt(hidden)),
            normal(rng, (2, hidden, hidden), scale=1 / math.sqrt(hidden)),
            normal(rng, (batch, s.steps // 2, hidden)),
            normal(rng, (s.steps, batch, features)),
        )

    return decoder, args


@program("eigh")
def _():
    return jnp.linalg.eigh, lambda rng, s: (spd(rng, s.mat // 4),)


@program("eig_values")
def _():
    return (lambda a: jnp.linalg.eigvals(a)), lambda rng, s: (
        normal(rng, (s.mat // 8, s.mat // 8)),
    )


@program("svd")
def _():
    return (lambda a: jnp.linalg.svd(a, full_matrices=False)), one(
        lambda s: (s.mat // 2, s.mat // 4)
    )


@program("qr")
def _():
    return jnp.linalg.qr, one(lambda s: (s.mat, s.mat // 4))


@program("cholesky_solve")
def _():
    def solve(a, b):
        return jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(a), b)

    return solve, lambda rng, s: (spd(rng, s.mat), normal(rng, (s.mat, 16)))


@program("fft_complex")
def _():
    return (lambda x: jnp.fft.fft(x.astype(jnp.complex64), axis=-1)), one(lambda s: s.elems)


@program("rfft_irfft")
def _():
    return (lambda x: jnp.fft.irfft(jnp.fft.rfft(x, axis=-1), axis=-1)), one(lambda s: s.elems)


def maxpool(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")


@program("maxpool")
def _():
    return maxpool, one(lambda s: (16, s.image * 2, s.image * 2, 16))


@program("maxpool_grad")
def _():
    return jax.grad(lambda x: jnp.sum(maxpool(x) ** 2)), one(
        lambda s: (16, s.image * 2, s.image * 2, 16)
    )


@program("avgpool_grad")
def _():
    def avgpool(x):
        return lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4

    return jax.grad(lambda x: jnp.sum(avgpool(x) ** 2)), one(
        lambda s: (16, s.image * 2, s.image * 2, 16)
    )


@program("conv2d_strided_5x5")
def _():
    def strided(x, w):
        return lax.conv_general_dilated(
            x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    return strided, lambda rng, s: (
        normal(rng, (8, s.image * 2, s.image * 2, 8)),
        normal(rng, (5, 5, 8, 32), scale=0.1),
    )


# untuned conv / pooling programs (added with the direct kernels; not used to tune them)
@program("conv2d_depthwise_3x3")
def _():
    def depthwise(x, w):
        return lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=x.shape[-1],
        )  # fmt: skip

    return depthwise, lambda rng, s: (
        normal(rng, (8, s.image, s.image, 64)),
        normal(rng, (3, 3, 1, 64), scale=0.3),
    )


@program("conv2d_1x1_wide")
def _():
    return conv, lambda rng, s: (
        normal(rng, (8, s.image // 2, s.image // 2, 256)),
        normal(rng, (1, 1, 256, 256), scale=0.05),
    )


@program("avgpool_strided_3x3")
def _():
    def avgpool(x):
        return lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME") / 9

    return avgpool, one(lambda s: (16, s.image * 2, s.image * 2, 32))


@program("conv2d_resnet_block")
def _():
    def block(p, x):
        h = jax.nn.relu(conv(x, p["a"]))
        h = conv(h, p["b"])
        return jax.nn.relu(h + x)

    def args(rng, s):
        p = {
            "a": normal(rng, (3, 3, 32, 32), scale=0.06),
            "b": normal(rng, (3, 3, 32, 32), scale=0.06),
        }
        return p, normal(rng, (4, s.image, s.image, 32))

    return block, args


# untuned conv programs (added with the direct kernels on the arena, third conv session):
# the many small convolutions of a haiku-style ResNet forward, and equinox's layout (NCHW /
# OIHW, vmapped over images) in a training step
@program("convnet_small_resnet_forward")
def _():
    def bn(h, p):
        return h * p[0] + p[1]

    def nhwc(x, w, strides=(1, 1), padding="SAME"):
        dims = ("NHWC", "HWIO", "NHWC")
        return lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=dims)

    def forward(p, x):
        h = jax.nn.relu(bn(nhwc(x, p["stem"], (2, 2), ((2, 3), (2, 3))), p["bn0"]))
        for i in range(3):
            r = jax.nn.relu(bn(nhwc(h, p[f"a{i}"]), p["bn1"]))
            r = jax.nn.relu(nhwc(r, p[f"b{i}"]))
            h = h + nhwc(r, p[f"c{i}"])
        return jnp.mean(h, axis=(1, 2)) @ p["dense"]

    def args(rng, s):
        p = {"stem": normal(rng, (7, 7, 3, 32), scale=0.1), "dense": normal(rng, (32, 8))}
        p["bn0"] = (normal(rng, (32,)), normal(rng, (32,)))
        p["bn1"] = (normal(rng, (8,)), normal(rng, (8,)))
        for i in range(3):
            p[f"a{i}"] = normal(rng, (1, 1, 32, 8), scale=0.2)
            p[f"b{i}"] = normal(rng, (3, 3, 8, 8), scale=0.1)
            p[f"c{i}"] = normal(rng, (1, 1, 8, 32), scale=0.2)
        return p, normal(rng, (4, s.image, s.image, 3))

    return forward, args


@program("convnet_nchw_vmap_train_step")
def _():
    def one(p, image):  # [C, H, W], as an equinox Conv2d sees it
        dims = ("NCHW", "OIHW", "NCHW")
        h = lax.conv_general_dilated(image[None], p["c1"], (1, 1), ((2, 2), (2, 2)),
                                     dimension_numbers=dims)[0]  # fmt: skip
        h = jax.nn.relu(h + p["b1"][:, None, None])
        h = lax.reduce_window(h, 0.0, lax.add, (1, 2, 2), (1, 2, 2), "VALID") / 4
        h = lax.conv_general_dilated(h[None], p["c2"], (1, 1), ((2, 2), (2, 2)),
                                     dimension_numbers=dims)[0]  # fmt: skip
        return jnp.ravel(jax.nn.relu(h)) @ p["dense"]

    def loss(p, x):
        return jnp.mean(jax.vmap(lambda im: one(p, im))(x) ** 2)

    def args(rng, s):
        half = s.image // 2
        p = {
            "c1": normal(rng, (16, 3, 5, 5), scale=0.1),
            "b1": normal(rng, (16,)),
            "c2": normal(rng, (16, 16, 5, 5), scale=0.05),
            "dense": normal(rng, (16 * half * half, 10), scale=0.02),
        }
        return p, normal(rng, (8, 3, s.image, s.image))

    return sgd_step(loss), args


@program("threefry_normal")
def _():
    def normals(key, like):
        return jax.random.normal(jax.random.wrap_key_data(key), like.shape)

    return normals, lambda rng, s: (np.array([0, 42], np.uint32), np.zeros(s.elems, np.float32))


@program("rng_bit_generator")
def _():
    def bits(key, like):
        return lax.rng_bit_generator(key, like.shape, dtype=jnp.uint32)

    return bits, lambda rng, s: (np.arange(4, dtype=np.uint32) + 7, np.zeros(s.elems, np.float32))


# Added in session 5 without tuning on them: RNG families beyond normal, a bf16 dot, a 2-D
# FFT, a batched gemm of large matrices.
@program("rng_bernoulli")
def _():
    def coins(key, like):
        return jax.random.bernoulli(jax.random.wrap_key_data(key), 0.3, like.shape)

    return coins, lambda rng, s: (np.array([0, 7], np.uint32), np.zeros(s.elems, np.float32))


@program("rng_categorical")
def _():
    def draw(key, logits):
        return jax.random.categorical(jax.random.wrap_key_data(key), logits, axis=-1)

    return draw, lambda rng, s: (
        np.array([0, 9], np.uint32),
        normal(rng, (s.elems[0] * 4, s.elems[1] // 16)),
    )


@program("matmul_bf16")
def _():
    def f(a, b):
        return (a.astype(jnp.bfloat16) @ b.astype(jnp.bfloat16)).astype(jnp.float32)

    return f, two(lambda s: (s.mat, s.mat))


@program("fft2_complex")
def _():
    return (lambda x: jnp.fft.fft2(x.astype(jnp.complex64))), one(lambda s: (s.mat, s.mat))


# FFT programs added with the DUCC path (branch fft) and not tuned on: a 2-D rfft
# convolution round trip (rfft2 of a batch of images and of a small kernel, product,
# irfft2), an FFT over a non-minor axis (JAX transposes around the minor-axis fft), and a
# large batch of short complex FFTs (65536 of length 16).
@program("rfft2_convolution")
def _():
    def conv(x, k):
        spectrum = jnp.fft.rfft2(x) * jnp.fft.rfft2(k, s=x.shape[-2:])
        return jnp.fft.irfft2(spectrum, s=x.shape[-2:])

    return conv, lambda rng, s: (
        normal(rng, (4, s.mat // 2, s.mat // 2)),
        normal(rng, (9, 9)),
    )


@program("fft_axis0")
def _():
    return (lambda x: jnp.fft.fft(x.astype(jnp.complex64), axis=0)), one(lambda s: s.elems)


@program("fft_batched_small")
def _():
    return (lambda x: jnp.fft.fft(x.astype(jnp.complex64), axis=-1)), one(
        lambda s: (s.elems[0] * s.elems[1] // 16, 16)
    )


@program("batched_matmul_big")
def _():
    return (lambda a, b: jnp.einsum("bij,bjk->bik", a, b)), two(lambda s: (8, s.mat, s.mat))


@program("f16_arith")
def _():
    def f(x, y):
        x, y = x.astype(jnp.float16), y.astype(jnp.float16)
        return (x * y + jnp.tanh(x) - y * 0.5).astype(jnp.float32)

    return f, two(lambda s: s.elems)


@program("int_bit_ops")
def _():
    def f(x, y):
        return ((x ^ (y << 3)) & 0x0F0F0F0F) | ((x >> 5) + lax.population_count(y))

    def args(rng, s):
        return tuple(
            rng.integers(0, 2**31, s.elems, dtype=np.int64).astype(np.uint32) for _ in "xy"
        )

    return f, args


@program("row_softmax_wide")
def _():
    return (lambda x: jax.nn.softmax(x, axis=-1)), one(lambda s: (s.elems[0] // 4, s.elems[1] * 4))


# Matrix-vector programs added in the sixth session (matrix-vector dots as native kernels),
# not tuned on: a large product both ways, a batched vector-matrix product, and two
# iterative solvers whose loop bodies are matrix-vector products.


@program("matmul_vec")
def _():
    def f(a, x):
        return a @ x, x @ a  # both loop orders of the kernel

    def args(rng, s):
        n = 4 * s.mat
        return normal(rng, (n, n), scale=1 / math.sqrt(n)), normal(rng, (n,))

    return f, args


@program("batched_matmul_vecmat")
def _():
    def f(x, w):
        return jnp.einsum("bk,bkn->bn", x, w)

    return f, lambda rng, s: (
        normal(rng, (s.batch, s.mat)),
        normal(rng, (s.batch, s.mat, s.mat // 2)),
    )


@program("while_conjugate_gradient")
def _():
    def solve(a, b):
        def cond(state):
            *_, rr, i = state
            return (rr > 1e-10) & (i < 200)

        def body(state):
            x, r, p, rr, i = state
            ap = a @ p
            alpha = rr / jnp.dot(p, ap)
            x = x + alpha * p
            r = r - alpha * ap
            rr_new = jnp.dot(r, r)
            return x, r, r + (rr_new / rr) * p, rr_new, i + 1

        x0 = jnp.zeros_like(b)
        x, _, _, rr, i = lax.while_loop(cond, body, (x0, b, b, jnp.dot(b, b), 0))
        return x, rr, i

    return solve, lambda rng, s: (spd(rng, s.mat), normal(rng, (s.mat,)))


@program("fori_jacobi")
def _():
    def solve(a, b):
        d = jnp.diagonal(a)
        off = a - jnp.diag(d)

        def step(_, x):
            return (b - off @ x) / d

        return lax.fori_loop(0, 100, step, jnp.zeros_like(b))

    def args(rng, s):
        n = s.mat
        a = normal(rng, (n, n)) / n + np.diag(np.full(n, 4.0, np.float32))
        return a.astype(np.float32), normal(rng, (n,))

    return solve, args


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
    fallbacks: int = 0


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
            return [STAT[0](s) for s in times]


STAT: list[Callable[[list[float]], float]] = [statistics.median]
"""The statistic of a program's timed runs (--stat: median, or min)."""


def copy_bandwidth() -> float:
    """Bytes per second (read + write) of a large np.copyto."""
    src = np.ones(64 * 1024 * 1024 // 4, np.float32)
    dst = np.empty_like(src)
    return 2 * src.nbytes / median_seconds(lambda: np.copyto(dst, src), 9, 2)


def leaves_of(value) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(value)]


def flat_args(args) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(args)]


def matches(got: list[np.ndarray], want: list[np.ndarray], atol: float = 2e-3) -> bool:
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape:
            return False
        if w.dtype.kind in "biu":
            if not np.array_equal(g, w) and np.mean(g != w) > 0.001:
                return False
            continue
        if w.dtype.kind == "c":  # compare real and imaginary parts as one real array
            g, w = np.stack([g.real, g.imag]), np.stack([w.real, w.imag])
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        scale = max(float(np.max(np.abs(w64), initial=0.0)), 1e-6)
        if not np.allclose(g64, w64, rtol=2e-2, atol=atol * scale, equal_nan=True):
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
            fallbacks = program_fallbacks("cpu", parse_module(text))
            row.fallbacks = len(fallbacks)
            if "-v" in sys.argv and fallbacks:
                print("\n".join(f"  {prog.name}: {f}" for f in fallbacks), file=sys.stderr)
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
    if not matches(got, want, prog.atol):
        row.status = "MISMATCH"
    return row


def geomean(values) -> float:
    values = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def report(rows: list[Row], bandwidth: float) -> None:
    head = (
        f"{'program':24s} {'xla us':>10s} {'xlapy us':>10s} {'run':>6s} "
        f"{'xla ms':>8s} {'cold ms':>8s} {'warm ms':>8s} {'cold':>6s} {'warm':>6s} {'fb':>3s}"
        "  status"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.name:24s} {r.xla_run_us:10.1f} {r.run_us:10.1f} {r.run_us / r.xla_run_us:6.2f} "
            f"{r.xla_compile_ms:8.1f} {r.cold_ms:8.1f} {r.warm_ms:8.1f} "
            f"{r.cold_ms / r.xla_compile_ms:6.2f} {r.warm_ms / r.xla_compile_ms:6.2f} "
            f"{r.fallbacks:3d}  {r.status}"
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
    with_fallbacks = [r for r in rows if r.fallbacks]
    print(
        f"{len(with_fallbacks)} of {len(rows)} programs have fallbacks, "
        f"{sum(r.fallbacks for r in rows)} instructions in all"
    )

    families: dict[str, list[float]] = {}
    for r in good:
        families.setdefault(family_of(r.name), []).append(r.run_us / r.xla_run_us)
    print("\nrun-time ratio xlapy/XLA per family (geometric mean; worst program)")
    for family, ratios in sorted(families.items()):
        print(
            f"  {family:12s} {geomean(ratios):6.2f}  over {len(ratios):2d}; "
            f"worst {max(ratios):6.2f}"
        )
    print(f"  {'overall':12s} {geomean(r.run_us / r.xla_run_us for r in good):6.2f}")
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


def summary(rows: list[Row]) -> dict[str, dict]:
    """Per-family and overall geometric means of the run-time ratio, and each program's
    (XLA us, xlapy us) (ok programs only)."""
    good = [r for r in rows if r.status == "ok"]
    families = {"overall": geomean(r.run_us / r.xla_run_us for r in good)}
    for family in {family_of(r.name) for r in good}:
        ratios = (r.run_us / r.xla_run_us for r in good if family_of(r.name) == family)
        families[family] = geomean(ratios)
    return {"families": families, "programs": {r.name: [r.xla_run_us, r.run_us] for r in good}}


def scaling(threads: list[int], argv: list[str]) -> None:
    """Rerun this script once per thread count T, pinned to cores 0..T-1 with `taskset`
    (XLA:CPU sizes its thread pools by the cores the process may use) and with
    $XLAPY_NUM_THREADS=T (xlapy's pool, kernel.pool_size()); print the geometric means."""
    import json
    import os
    import subprocess

    cores = len(os.sched_getaffinity(0))
    results: dict[int, dict[str, float]] = {}
    programs: dict[int, dict[str, list[float]]] = {}
    for t in [t for t in threads if t <= cores]:
        env = dict(os.environ, XLAPY_NUM_THREADS=str(t))
        cmd = ["taskset", "-c", f"0-{t - 1}", sys.executable, __file__, *argv, "--json-summary"]
        print(f"[scaling] {t} threads: {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("SUMMARY ")]
        if not lines:
            print(f"[scaling] {t} threads failed:\n{done.stderr[-2000:]}", file=sys.stderr)
            continue
        found = json.loads(lines[-1][len("SUMMARY ") :])
        results[t], programs[t] = found["families"], found["programs"]
        print(done.stdout.split("SUMMARY ")[0], flush=True)
    skipped = [t for t in threads if t > cores]
    print(f"\nscaling: run-time ratio xlapy/XLA by thread count (machine has {cores} cores)")
    if skipped:
        print(f"  (not run: {skipped}, more threads than cores)")
    names = sorted({k for r in results.values() for k in r}, key=lambda k: (k == "overall", k))
    print(f"  {'family':12s} " + " ".join(f"{t:>6d}" for t in results))
    for name in names:
        cells = " ".join(f"{results[t].get(name, math.nan):6.2f}" for t in results)
        print(f"  {name:12s} {cells}")
    if len(programs) < 2:
        return
    first, *others = programs
    print(
        f"\nscaling: each side's own speedup from {first} thread(s) (time at {first} / time at"
        " T), xlapy | XLA"
    )
    print(f"  {'program':26s} " + " ".join(f"{f'T={t}':>13s}" for t in others))
    for name in sorted(programs[first]):
        base_xla, base_ours = programs[first][name]
        cells = []
        for t in others:
            xla, ours = programs[t].get(name, (math.nan, math.nan))
            cells.append(f"{base_ours / ours:5.2f} |{base_xla / xla:5.2f}")
        print(f"  {name:26s} " + " ".join(f"{c:>13s}" for c in cells))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-p", "--program", action="append", default=[], help="run programs whose name contains this"
    )
    parser.add_argument("--runs", type=int, default=20, help="timed runs per program")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first")
    parser.add_argument("--small", action="store_true", help="tiny shapes (checks the harness)")
    parser.add_argument("--list", action="store_true", help="list the programs and exit")
    parser.add_argument(
        "--stat", choices=("median", "min"), default="median", help="statistic of the timed runs"
    )
    parser.add_argument("-v", action="store_true", help="print tracebacks of failures")
    parser.add_argument(
        "--threads",
        default="",
        help="comma-separated thread counts (e.g. 1,2,4,8,16): one pinned run per count "
        "(see scaling()) and a table of geometric means",
    )
    parser.add_argument("--json-summary", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.threads:
        raw = list(sys.argv[1:] if argv is None else argv)
        rest = [
            a for i, a in enumerate(raw) if a != "--threads" and raw[i - 1 : i] != ["--threads"]
        ]
        rest = [a for a in rest if not a.startswith("--threads=")]
        scaling([int(t) for t in opts.threads.split(",")], rest)
        return
    STAT[0] = min if opts.stat == "min" else statistics.median
    names = [n for n in PROGRAMS if not opts.program or any(p in n for p in opts.program)]
    if opts.list:
        print("\n".join(names))
        return
    sizes = SMALL if opts.small else BIG
    bandwidth = copy_bandwidth()
    kernel_library.build()  # once per machine, like XLA's precompiled kernels: not in "cold"
    rows = []
    for name in names:
        row = run_program(PROGRAMS[name], sizes, opts.runs, opts.warmup)
        ratio = row.run_us / row.xla_run_us
        print(f"  {name}: {row.status} (run {ratio:.2f} of XLA)", file=sys.stderr, flush=True)
        rows.append(row)
    report(rows, bandwidth)
    kernels, build_ms = kernel_library.build_cost_ms()
    print(
        f"kernel library ({library_dir()}): the cold compiles read it; building it from "
        f"nothing, once per machine: {kernels} kernels, {build_ms:.0f} ms process CPU"
    )
    if opts.json_summary:
        import json

        print("SUMMARY " + json.dumps(summary(rows)), flush=True)


if __name__ == "__main__":
    main()
