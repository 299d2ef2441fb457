"""Memory of compiled programs, xlapy against XLA.

Each program is a JAX function with arguments big enough for the numbers to mean something
(an MLP 512-1024-1024-10 at batch 128, transformer blocks, convolution nets, scans,
attention, ...). XLA's figures come from
`jax.jit(f, donate_argnums=...).lower(*args).compile().memory_analysis()`; xlapy parses the
same lowered HLO and takes the buffer assignment its CPU backend executes
(`get_backend("cpu").plan_memory`: the default CPU pipeline, fusion included, copy
insertion and buffer assignment, without code generation). Both count argument, output,
alias and temp bytes the same way (peak = argument + output - alias + temp). The last column
is xlapy's temp over XLA's; the geometric mean is over the programs where XLA's temp is not zero.

    .venv/bin/python benchmarks/memory_vs_xla.py [--only NAME ...] [--markdown]
    .venv/bin/python benchmarks/memory_vs_xla.py --write-test-programs tests/memory
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from jax_programs import _attention, _conv_net_loss, _layer_norm, _mlp_loss

from xlapy.backends import get_backend
from xlapy.ir.parser import parse_module


@dataclass(frozen=True)
class Bench:
    name: str
    fn: Callable
    args: Callable[[np.random.Generator], list]
    donate: tuple[int, ...] = ()


BENCHES: list[Bench] = []


def bench(args, donate=(), name=None):
    def register(fn):
        BENCHES.append(Bench(name or fn.__name__, fn, args, tuple(donate)))
        return fn

    return register


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def ints(rng, hi, *shape):
    return rng.integers(0, hi, shape).astype(np.int32)


# -- MLPs -------------------------------------------------------------------------------------
def mlp_params(rng, sizes):
    out = []
    for a, b in itertools.pairwise(sizes):
        out += [f32(rng, a, b, scale=1 / math.sqrt(a)), f32(rng, b, scale=0.1)]
    return out


MLP = [512, 1024, 1024, 10]


def mlp_args(rng, batch=128):
    return [*mlp_params(rng, MLP), f32(rng, batch, MLP[0]), ints(rng, MLP[-1], batch)]


def sgd(*a):
    *params, x, y = a
    loss, grads = jax.value_and_grad(_mlp_loss)(list(params), x, y)
    return loss, [p - 0.01 * g for p, g in zip(params, grads, strict=True)]


bench(mlp_args, donate=range(6), name="mlp_sgd_donated")(sgd)
bench(mlp_args, name="mlp_sgd")(sgd)
bench(lambda rng: mlp_args(rng, 512), donate=range(6), name="mlp_sgd_batch512_donated")(sgd)


@bench(lambda rng: [*mlp_params(rng, MLP), f32(rng, 256, MLP[0])])
def mlp_inference(*a):
    *params, x = a
    h = x
    for i in range(0, len(params), 2):
        h = h @ params[i] + params[i + 1]
        if i + 2 < len(params):
            h = jax.nn.relu(h)
    return jax.nn.softmax(h)


def adam_args(rng):
    p = mlp_params(rng, MLP)
    return [*p, *[np.zeros_like(x) + 1e-3 for x in p], *[np.ones_like(x) * 1e-4 for x in p],
            f32(rng, 128, MLP[0]), ints(rng, MLP[-1], 128)]  # fmt: skip


@bench(adam_args, donate=range(18))
def mlp_adam_donated(*a):
    p, m, v, (x, y) = list(a[0:6]), list(a[6:12]), list(a[12:18]), a[18:]
    loss, g = jax.value_and_grad(_mlp_loss)(p, x, y)
    m = [0.9 * mi + 0.1 * gi for mi, gi in zip(m, g, strict=True)]
    v = [0.999 * vi + 0.001 * gi * gi for vi, gi in zip(v, g, strict=True)]
    p = [pi - 1e-3 * mi / (jnp.sqrt(vi) + 1e-8) for pi, mi, vi in zip(p, m, v, strict=True)]
    return loss, p, m, v


# -- transformers and attention ---------------------------------------------------------------
D, SEQ, BATCH, HEADS = 256, 128, 4, 4


def block_args(rng):
    return [
        f32(rng, D, 3 * D, scale=D**-0.5),
        f32(rng, D, D, scale=D**-0.5),
        f32(rng, D, 4 * D, scale=D**-0.5),
        f32(rng, 4 * D, D, scale=(4 * D) ** -0.5),
        np.ones(D, np.float32),
        np.zeros(D, np.float32),
        f32(rng, BATCH, SEQ, D),
    ]


def block_loss(wqkv, wo, w1, w2, g, b, x):
    return jnp.mean((x + _block_out((wqkv, wo, w1, w2, g, b), x)) ** 2)


@bench(block_args)
def transformer_block_grad(*a):
    return jax.grad(block_loss, argnums=(0, 1, 2, 3, 4, 5))(*a)


@bench(block_args, donate=range(6))
def transformer_sgd_donated(*a):
    loss, grads = jax.value_and_grad(block_loss, argnums=(0, 1, 2, 3, 4, 5))(*a)
    return loss, [p - 0.01 * gr for p, gr in zip(a[:6], grads, strict=True)]


@bench(block_args)
def transformer_forward(*a):
    return block_loss(*a)


def two_blocks(params, x):
    for layer in params:
        x = x + _block_out(layer, x)
    return jnp.mean(x * x)


def _block_out(p, x):
    wqkv, wo, w1, w2, g, b = p
    h = _layer_norm(x, g, b)
    q, k, v = jnp.split(h @ wqkv, 3, axis=-1)
    sh = (x.shape[0], x.shape[1], HEADS, D // HEADS)
    att = _attention(q.reshape(sh), k.reshape(sh), v.reshape(sh), True).reshape(x.shape)
    x = x + att @ wo
    return jax.nn.gelu(_layer_norm(x, g, b) @ w1) @ w2


@bench(lambda rng: [block_args(rng)[:6], block_args(rng)[:6], f32(rng, BATCH, SEQ, D)])
def transformer_two_layer_grad(p1, p2, x):
    return jax.grad(two_blocks)([p1, p2], x)


def qkv_args(rng, b=4, s=256, h=8, d=64):
    return [f32(rng, b, s, h, d), f32(rng, b, s, h, d), f32(rng, b, s, h, d)]


@bench(qkv_args)
def attention_causal(q, k, v):
    return _attention(q, k, v, True)


@bench(qkv_args)
def attention_full(q, k, v):
    return _attention(q, k, v, False)


@bench(qkv_args)
def attention_grad(q, k, v):
    return jax.grad(lambda q, k, v: jnp.sum(_attention(q, k, v, True) ** 2), (0, 1, 2))(q, k, v)


@bench(lambda rng: [f32(rng, 512, 256), f32(rng, 256, 256), f32(rng, 256, 256),
                    f32(rng, 256, 256), (rng.uniform(size=(512, 512)) > 0.1)])  # fmt: skip
def attention_masked_self(x, wq, wk, wv, keep):
    s = (x @ wq) @ (x @ wk).T / 16.0
    s = jnp.where(keep, s, -1e9)
    return jax.nn.softmax(s, axis=-1) @ (x @ wv)


# -- convolutions -----------------------------------------------------------------------------
def conv_net_args(rng, batch=32):
    return [
        f32(rng, 3, 3, 3, 32, scale=0.2),
        f32(rng, 3, 3, 32, 64, scale=0.05),
        f32(rng, 14 * 14 * 64, 3, scale=0.01),
        f32(rng, batch, 32, 32, 3),
        ints(rng, 3, batch),
    ]


@bench(conv_net_args, donate=(0, 1, 2))
def convnet_sgd_donated(k1, k2, w, x, labels):
    loss, grads = jax.value_and_grad(_conv_net_loss)((k1, k2, w), x, labels)
    return loss, [p - 0.01 * g for p, g in zip((k1, k2, w), grads, strict=True)]


@bench(conv_net_args)
def convnet_forward(k1, k2, w, x, labels):
    return _conv_net_loss((k1, k2, w), x, labels)


def conv(x, k, stride=1):
    return lax.conv_general_dilated(
        x, k, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def conv_stack_args(rng):
    kernels = [(16, 32), (32, 32), (32, 64)]
    return [f32(rng, 16, 64, 64, 16), *[f32(rng, 3, 3, i, o, scale=0.1) for i, o in kernels]]


@bench(conv_stack_args)
def conv_stack_forward(x, k1, k2, k3):
    h = jax.nn.relu(conv(x, k1))
    h = jax.nn.relu(conv(h, k2, 2))
    return jnp.mean(jax.nn.relu(conv(h, k3, 2)), axis=(1, 2))


@bench(lambda rng: [f32(rng, 16, 32, 32, 32), f32(rng, 3, 3, 32, 32, scale=0.1)])
def conv_grads(x, k):
    return jax.grad(lambda x, k: jnp.sum(jnp.tanh(conv(x, k)) ** 2), (0, 1))(x, k)


@bench(lambda rng: [f32(rng, 16, 32, 32, 32), f32(rng, 3, 3, 32, 32, scale=0.1),
                    f32(rng, 3, 3, 32, 32, scale=0.1)])  # fmt: skip
def resnet_block_grad(x, k1, k2):
    def loss(x, k1, k2):
        h = jax.nn.relu(conv(x, k1))
        return jnp.mean(jax.nn.relu(x + conv(h, k2)) ** 2)

    return jax.grad(loss, (1, 2))(x, k1, k2)


# -- loops ------------------------------------------------------------------------------------
@bench(lambda rng: [f32(rng, 256, 256, scale=0.05), f32(rng, 64, 256), f32(rng, 200, 64, 256)])
def rnn_scan_grad(w, h0, xs):
    def loss(w, h0):
        def step(h, x):
            h = jnp.tanh(h @ w + x)
            return h, jnp.sum(h * h)

        _, ys = lax.scan(step, h0, xs)
        return jnp.sum(ys)

    return jax.grad(loss, (0, 1))(w, h0)


@bench(lambda rng: [f32(rng, 1024, 256), f32(rng, 500, 1024, 256)])
def scan_cumulative(c0, xs):
    return lax.scan(lambda c, x: (c + jnp.sin(x), c * 2.0), c0, xs)


@bench(lambda rng: [f32(rng, 512, 512, scale=0.04), f32(rng, 512, 512)], donate=(1,))
def fori_matmul_donated(w, x):
    return lax.fori_loop(0, 20, lambda i, x: jnp.tanh(x @ w), x)


@bench(lambda rng: [np.abs(f32(rng, 1024, 1024)) + 1.0])
def while_newton_sqrt(a):
    def body(s):
        x, i = s
        return 0.5 * (x + a / x), i + 1

    return lax.while_loop(lambda s: s[1] < 30, body, (a, 0))[0]


@bench(lambda rng: [np.zeros((8, 1024, 512), np.float32), f32(rng, 64, 512)], donate=(0,))
def kv_cache_update_donated(cache, new):
    def body(i, c):
        return lax.dynamic_update_slice(c, (new * i)[None, :64], (i % 8, i * 64, 0))

    return lax.fori_loop(0, 16, body, cache)


# -- elementwise, reductions, indexing --------------------------------------------------------
@bench(lambda rng: [f32(rng, 1024, 1024), np.ones(1024, np.float32), np.zeros(1024, np.float32)])
def layer_norm_gelu(x, g, b):
    return jax.nn.gelu(_layer_norm(x, g, b))


@bench(lambda rng: [f32(rng, 2048, 1024), ints(rng, 1024, 2048)])
def softmax_cross_entropy_grad(logits, labels):
    def loss(z):
        logp = jax.nn.log_softmax(z)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    return jax.grad(loss)(logits)


@bench(lambda rng: [f32(rng, 512, 512), f32(rng, 512, 512), f32(rng, 512, 512),
                    f32(rng, 512, 512)])  # fmt: skip
def matmul_chain(a, b, c, d):
    return jnp.tanh(a @ b) @ jnp.tanh(c @ d) + a


@bench(lambda rng: [f32(rng, 2048, 2048)])
def elementwise_chain(x):
    return jnp.sin(jnp.exp(-(x**2)) * 3.0) + jnp.cos(x) * jnp.tanh(x)


@bench(lambda rng: [f32(rng, 32, 128, 256)])
def moments(x):
    return jnp.mean(x, axis=(0, 1)), jnp.var(x, axis=(0, 1)), jnp.max(x, axis=2)


@bench(lambda rng: [f32(rng, 30000, 128, scale=0.1), ints(rng, 30000, 4096)])
def embedding_grad(table, ids):
    return jax.grad(lambda t: jnp.sum(jnp.tanh(t[ids]) ** 2))(table)


@bench(lambda rng: [f32(rng, 100000, 64), ints(rng, 1000, 100000)])
def segment_sum(data, seg):
    return jax.ops.segment_sum(data, seg, num_segments=1000)


@bench(lambda rng: [f32(rng, 64, 32, 32, 64), np.ones(64, np.float32), np.zeros(64, np.float32)])
def batchnorm_grad(x, g, b):
    def loss(x, g, b):
        mean = jnp.mean(x, axis=(0, 1, 2))
        var = jnp.var(x, axis=(0, 1, 2))
        return jnp.sum(jax.nn.relu((x - mean) * lax.rsqrt(var + 1e-5) * g + b))

    return jax.grad(loss, (0, 1, 2))(x, g, b)


@bench(lambda rng: [f32(rng, 256, 1024), f32(rng, 1024, 1024, scale=0.03)])
def remat_mlp_grad(x, w):
    layer = jax.checkpoint(lambda h: jnp.tanh(h @ w))

    def loss(x, w):
        h = x
        for _ in range(4):
            h = layer(h)
        return jnp.sum(h)

    return jax.grad(loss, (0, 1))(x, w)


@bench(lambda rng: [f32(rng, 4096, 256)])
def cumsum_sort(x):
    return jnp.cumsum(x, axis=0), jnp.sort(x, axis=0)


@bench(lambda rng: [f32(rng, 1024, 1000)])
def argmax_argmin_rows(x):
    return jnp.argmax(x, axis=1), jnp.argmin(x, axis=0)


@bench(lambda rng: [f32(rng, 256, 1024)])
def argsort_rows(x):
    return jnp.argsort(x, axis=1)


@bench(lambda rng: [f32(rng, 256, 1024)])
def top_k_rows(x):
    return lax.top_k(x, 16)


@bench(lambda rng: [f32(rng, 256, 1024), ints(rng, 1024, 256, 1024)])
def sort_key_value(k, v):
    return lax.sort((k, v), dimension=1, num_keys=1)


# -- the families of the third memory session: `make demo`'s step, an LSTM, a conv + pool --
DEMO = (64, 256, 256, 10)


def demo_args(rng):
    p = mlp_params(rng, DEMO)
    return [np.int32(3), *p, *[x * 0.01 for x in p], *[np.abs(x) * 1e-3 for x in p],
            f32(rng, 256, DEMO[0]), ints(rng, DEMO[-1], 256)]  # fmt: skip


@bench(demo_args, donate=range(19))
def demo_mlp_adam_step(count, *a):
    """examples/jax_on_xlapy.py's step: a gelu MLP 64-256-256-10 at batch 256, Adam over
    its parameters, parameters and optimizer state donated."""
    p, m, v, (x, y) = list(a[0:6]), list(a[6:12]), list(a[12:18]), a[18:]

    def loss_fn(p):
        h = x
        for i in range(0, 4, 2):
            h = jax.nn.gelu(h @ p[i] + p[i + 1])
        logp = jax.nn.log_softmax(h @ p[4] + p[5])
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    loss, g = jax.value_and_grad(loss_fn)(p)
    count = count + 1
    m = [0.9 * mi + 0.1 * gi for mi, gi in zip(m, g, strict=True)]
    v = [0.999 * vi + 0.001 * gi * gi for vi, gi in zip(v, g, strict=True)]
    t = count.astype(jnp.float32)
    scale = 1e-3 * jnp.sqrt(1 - 0.999**t) / (1 - 0.9**t)
    p = [pi - scale * mi / (jnp.sqrt(vi) + 1e-8) for pi, mi, vi in zip(p, m, v, strict=True)]
    return count, p, m, v, loss


def lstm_args(rng, vocab=1000, emb=128, hidden=256, steps=16, batch=32):
    return [f32(rng, vocab, emb), ints(rng, vocab, steps, batch),
            f32(rng, emb + hidden, 4 * hidden, scale=0.05), f32(rng, 4 * hidden, scale=0.1),
            f32(rng, 2 * hidden, 4 * hidden, scale=0.05), f32(rng, 4 * hidden, scale=0.1),
            f32(rng, hidden, vocab, scale=0.05)]  # fmt: skip


@bench(lstm_args)
def lstm_unrolled_forward(emb, tokens, w1, b1, w2, b2, wo):
    """Two LSTM layers unrolled over 16 steps after an embedding lookup (hk.static_unroll)."""
    x = emb[tokens]
    for w, b in ((w1, b1), (w2, b2)):
        h = c = jnp.zeros((x.shape[1], w.shape[1] // 4), x.dtype)
        outs = []
        for t in range(x.shape[0]):
            i, f, g, o = jnp.split(jnp.concatenate([x[t], h], axis=1) @ w + b, 4, axis=1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            outs.append(h)
        x = jnp.stack(outs)
    return x @ wo


@bench(lambda rng: [f32(rng, 64, 3, 5, 5, scale=0.1), f32(rng, 64, 1, 1), f32(rng, 8, 3, 32, 32)])
def conv_pool_vmapped(w, b, x):
    """equinox's Conv2d + relu + AvgPool2d, vmapped: the pooling runs channels-last."""

    def one(image):
        y = jax.nn.relu(lax.conv_general_dilated(image[None], w, (1, 1), ((2, 2), (2, 2)))[0] + b)
        pooled = lax.reduce_window(
            y.transpose(1, 2, 0)[None], 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"
        )
        return pooled[0].transpose(2, 0, 1) / 4

    return jax.vmap(one)(x)


# -- programs of the fourth session, added untuned: a U-Net, an attention backward pass, a
# scan with a large carry, a gather-heavy embedding step. Each takes a size `n` (1: the
# benchmark; tests/memory/*.hlo holds the same programs lowered small).
def unet_args(rng, n=1):
    c = 16 // n
    return [f32(rng, 8 // n, 64 // n, 64 // n, 4),
            f32(rng, 3, 3, 4, c, scale=0.2), f32(rng, 3, 3, c, 2 * c, scale=0.1),
            f32(rng, 3, 3, 2 * c, 4 * c, scale=0.1), f32(rng, 3, 3, 4 * c, 2 * c, scale=0.1),
            f32(rng, 3, 3, 4 * c, c, scale=0.1), f32(rng, 3, 3, 2 * c, 4, scale=0.1)]  # fmt: skip


def _up(x):
    b, h, w, c = x.shape
    return jnp.broadcast_to(x[:, :, None, :, None, :], (b, h, 2, w, 2, c)).reshape(
        b, 2 * h, 2 * w, c
    )


@bench(unet_args)
def unet_forward(x, k1, k2, k3, k4, k5, k6):
    """A U-Net-like encoder/decoder: two stride-2 convolutions down, nearest upsampling and
    skip concatenations up, relu between."""
    e1 = jax.nn.relu(conv(x, k1))
    e2 = jax.nn.relu(conv(e1, k2, 2))
    mid = jax.nn.relu(conv(e2, k3, 2))
    d2 = jax.nn.relu(conv(_up(mid), k4))
    d1 = jax.nn.relu(conv(jnp.concatenate([d2, e2], axis=-1), k5))
    return conv(jnp.concatenate([_up(d1), e1], axis=-1), k6) + x


def mha_args(rng, n=1):
    d, s, b = 256 // n, 128 // n, 4 // min(n, 4)
    return [f32(rng, d, d, scale=d**-0.5) for _ in range(4)] + [f32(rng, b, s, d)]


@bench(mha_args)
def attention_backward(wq, wk, wv, wo, x):
    """Gradients of causal multi-head self-attention (4 heads) with its four projections."""

    def loss(wq, wk, wv, wo, x):
        heads = 4
        sh = (*x.shape[:-1], heads, x.shape[-1] // heads)
        q, k, v = ((x @ w).reshape(sh) for w in (wq, wk, wv))
        y = _attention(q, k, v, True).reshape(x.shape) @ wo
        return jnp.mean(jnp.tanh(y) ** 2)

    return jax.grad(loss, (0, 1, 2, 3, 4))(wq, wk, wv, wo, x)


def big_carry_args(rng, n=1):
    return [f32(rng, 1024 // n, 1024 // n), f32(rng, 256 // n, 256 // n, scale=0.05),
            f32(rng, 12, 256 // n)]  # fmt: skip


@bench(big_carry_args)
def scan_large_carry(state, w, xs):
    """A scan whose carry (a 4 MiB state and a small vector) is rewritten in slices each
    step; the per-step output is a scalar."""

    def step(carry, x):
        big, h = carry
        h = jnp.tanh(h @ w + x)
        big = big * 0.9 + jnp.tile(h, big.shape[0] * big.shape[1] // h.shape[0]).reshape(big.shape)
        return (big, h), jnp.sum(big[0])

    (big, h), ys = lax.scan(step, (state, xs[0]), xs)
    return big, h, ys


def embed_step_args(rng, n=1):
    vocab, dim, batch, seq = 20000 // n, 128 // n, 64 // n, 32
    return [f32(rng, vocab, dim, scale=0.1), f32(rng, 2 * dim, dim, scale=0.1),
            f32(rng, dim, 16, scale=0.1), ints(rng, vocab, batch, seq),
            ints(rng, vocab, batch, seq), ints(rng, 16, batch)]  # fmt: skip


@bench(embed_step_args, donate=(0, 1, 2))
def embedding_gather_step(table, w, head, words, context, labels):
    """An SGD step of a bag-of-embeddings classifier: two gathers from one table (words
    and context), mean pooling, two dense layers; the table update is a scatter-add."""

    def loss(table, w, head):
        a = jnp.mean(table[words], axis=1)
        b = jnp.mean(table[context], axis=1)
        h = jax.nn.relu(jnp.concatenate([a, b], axis=-1) @ w)
        logp = jax.nn.log_softmax(h @ head)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    value, grads = jax.value_and_grad(loss, (0, 1, 2))(table, w, head)
    return value, [p - 0.1 * g for p, g in zip((table, w, head), grads, strict=True)]


# -- sixth session: four programs added untuned (their figures were first read in the table) --
@bench(
    lambda rng: [f32(rng, 16, 128, 64), f32(rng, 64, 192, scale=0.1), f32(rng, 64, 64, scale=0.1)]
)
def attention_vmapped_grad(x, wqkv, wo):
    """Single-head self-attention written per example and vmapped over a batch of 16, with
    its gradient in every weight."""

    def one(x, wqkv, wo):
        q, k, v = jnp.split(x @ wqkv, 3, axis=-1)
        p = jax.nn.softmax(q @ k.T / 8.0, axis=-1)
        return jnp.sum(jnp.tanh(p @ v @ wo))

    def loss(wqkv, wo):
        return jnp.sum(jax.vmap(one, (0, None, None))(x, wqkv, wo))

    return jax.grad(loss, (0, 1))(wqkv, wo)


@bench(lambda rng: [f32(rng, 64, 256), f32(rng, 32, 64, 128), f32(rng, 128, 768, scale=0.05),
                    f32(rng, 256, 768, scale=0.05), f32(rng, 768)])  # fmt: skip
def gru_scan_grad(h0, xs, wx, wh, b):
    """A GRU over 32 steps (batch 64, input 128, hidden 256) as one lax.scan with its
    carry, differentiated through the scan in its input and recurrent weights."""

    def loss(wx, wh):
        def cell(h, x):
            gx, gh = x @ wx + b, h @ wh
            r = jax.nn.sigmoid(gx[:, :256] + gh[:, :256])
            z = jax.nn.sigmoid(gx[:, 256:512] + gh[:, 256:512])
            n = jnp.tanh(gx[:, 512:] + r * gh[:, 512:])
            h = (1 - z) * n + z * h
            return h, jnp.sum(h * h)

        h, ys = lax.scan(cell, h0, xs)
        return jnp.sum(ys) + jnp.sum(h)

    return jax.grad(loss, (0, 1))(wx, wh)


def depthwise_args(rng):
    return [f32(rng, 16, 32, 32, 32), f32(rng, 3, 3, 1, 32, scale=0.3),
            f32(rng, 1, 1, 32, 64, scale=0.2), f32(rng, 3, 3, 1, 64, scale=0.3)]  # fmt: skip


@bench(depthwise_args)
def depthwise_separable_forward(x, dw1, pw, dw2):
    """A MobileNet-style block in NHWC: depthwise 3x3, relu6, pointwise 1x1 to 64 channels,
    relu6, depthwise 3x3 at stride 2, global average pool."""
    dn = ("NHWC", "HWIO", "NHWC")

    def depthwise(x, k, stride):
        return lax.conv_general_dilated(x, k, (stride, stride), "SAME", dimension_numbers=dn,
                                        feature_group_count=x.shape[-1])  # fmt: skip

    h = jnp.clip(depthwise(x, dw1, 1), 0, 6)
    h = jnp.clip(lax.conv_general_dilated(h, pw, (1, 1), "SAME", dimension_numbers=dn), 0, 6)
    h = depthwise(h, dw2, 2)
    return jnp.mean(h, axis=(1, 2))


@bench(lambda rng: [f32(rng, 512, 512), f32(rng, 512, 512, scale=0.04), f32(rng, 20, 512)])
def scan_carry_residual(h, w, xs):
    """A scan over 20 steps whose carry (a 1 MiB activation) goes through a residual tanh
    layer each step; the step's output is the carry's row sums."""

    def step(h, x):
        h = h + jnp.tanh(h @ w + x)
        return h, jnp.sum(h, axis=1)

    return lax.scan(step, h, xs)


# -- measuring --------------------------------------------------------------------------------
FIELDS = ("argument", "output", "alias", "temp")


def xla_figures(b: Bench, args) -> dict[str, int]:
    compiled = jax.jit(b.fn, donate_argnums=b.donate).lower(*args).compile()
    m = compiled.memory_analysis()
    return {f: int(getattr(m, f"{f}_size_in_bytes")) for f in FIELDS}


UNFUSED_XLA_FLAGS = "--xla_cpu_experimental_ynn_fusion_type="
"""XLA:CPU with no library (YNNPACK) fusions: every buffer it holds is in its figures (a
YNNPACK fusion's own scratch, e.g. a convolution's output pooled inside it, is not)."""


def xla_temp(b: Bench) -> int:
    args = jax.tree_util.tree_map(np.asarray, b.args(np.random.default_rng(0)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xla_figures(b, args)["temp"]


def unfused_xla_temps(names: list[str]) -> dict[str, int]:
    """XLA's temp bytes per program with UNFUSED_XLA_FLAGS (a fresh process: XLA reads its
    flags once)."""
    env = dict(os.environ, XLA_FLAGS=UNFUSED_XLA_FLAGS)
    argv = [sys.executable, __file__, "--xla-temps-json", "--only", *names]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def xlapy_figures(b: Bench, args) -> tuple[dict[str, int], str, float]:
    text = jax.jit(b.fn, donate_argnums=b.donate).lower(*args).as_text(dialect="hlo")
    start = time.perf_counter()
    plan = get_backend("cpu").plan_memory(parse_module(text))  # the plan the CPU runs
    elapsed = time.perf_counter() - start
    s = plan.memory_analysis()
    return {f: getattr(s, f"{f}_bytes") for f in FIELDS}, plan.scheduler, elapsed


def ratio(ours: int, theirs: int) -> float:
    if theirs == 0:
        return 1.0 if ours == 0 else math.inf
    return ours / theirs


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    name = info.get("Model name", "unknown CPU").strip()
    return f"{name}, {info.get('CPU(s)', '?').strip()} CPUs"


def kib(n: int) -> str:
    return f"{n / 1024:,.1f}"


TEST_PROGRAMS = {  # name -> the size divisor of its small version in tests/memory/
    "unet_forward": 4,
    "attention_backward": 8,
    "scan_large_carry": 16,
    "embedding_gather_step": 8,
}


def write_test_programs(directory: Path) -> None:
    """Lower the small versions of TEST_PROGRAMS (and a small mlp_sgd) to HLO text files."""
    directory.mkdir(parents=True, exist_ok=True)
    small = {name: (b, n) for b in BENCHES for name, n in TEST_PROGRAMS.items() if b.name == name}
    for name, (b, n) in small.items():
        signature = b.args.__code__.co_varnames[: b.args.__code__.co_argcount]
        assert "n" in signature, f"{name}: its argument maker takes no size"
        args = b.args(np.random.default_rng(0), n)
        text = jax.jit(b.fn, donate_argnums=b.donate).lower(*args).as_text(dialect="hlo")
        (directory / f"{name}.hlo").write_text(text)
    rng = np.random.default_rng(0)
    mlp = [*mlp_params(rng, [16, 32, 32, 8]), f32(rng, 8, 16), ints(rng, 8, 8)]
    (directory / "mlp_sgd.hlo").write_text(jax.jit(sgd).lower(*mlp).as_text(dialect="hlo"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="program names to run")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument(
        "--write-test-programs", metavar="DIR", help="write the small HLO programs and stop"
    )
    parser.add_argument(
        "--unfused-xla",
        action="store_true",
        help="add a column: XLA's temp with its library (YNNPACK) fusions off, whose scratch "
        "memory_analysis() does not count",
    )
    parser.add_argument("--xla-temps-json", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.write_test_programs:
        write_test_programs(Path(opts.write_test_programs))
        return 0
    chosen = [b for b in BENCHES if not opts.only or b.name in opts.only]
    if opts.xla_temps_json:
        print(json.dumps({b.name: xla_temp(b) for b in chosen}))
        return 0
    unfused = unfused_xla_temps([b.name for b in chosen]) if opts.unfused_xla else {}
    rows = []
    for b in chosen:
        args = jax.tree_util.tree_map(np.asarray, b.args(np.random.default_rng(0)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = xla_figures(b, args)
            ours, scheduler, seconds = xlapy_figures(b, args)
        r = ratio(ours["temp"], theirs["temp"])
        rows.append((b.name, ours, theirs, r, scheduler, seconds))
        plain = (
            f"; XLA unfused {kib(unfused[b.name])} KiB, ratio "
            f"{ratio(ours['temp'], unfused[b.name]):.3f}"
            if b.name in unfused
            else ""
        )
        print(
            f"{b.name:<28} temp {kib(ours['temp']):>10} KiB vs XLA {kib(theirs['temp']):>10}"
            f" KiB  ratio {r:6.3f}{plain}  (arg {kib(ours['argument'])}/{kib(theirs['argument'])},"
            f" out {kib(ours['output'])}/{kib(theirs['output'])}, alias "
            f"{kib(ours['alias'])}/{kib(theirs['alias'])}; {scheduler}, {seconds:.1f}s)",
            file=sys.stderr if opts.markdown else sys.stdout,
            flush=True,
        )
    finite = [r for *_, r, _, _ in rows if math.isfinite(r) and r > 0]
    geo = math.exp(sum(math.log(r) for r in finite) / len(finite)) if finite else float("nan")
    wins = sum(1 for *_, r, _, _ in rows if r <= 1.0)
    if opts.markdown:
        print(f"Machine: {machine()}; jax {jax.__version__}; {time.strftime('%Y-%m-%d')}\n")
        extra = " temp KiB XLA unfused | ratio unfused |" if unfused else ""
        print(
            "| program | argument KiB (xlapy / XLA) | output KiB | alias KiB | temp KiB xlapy |"
            f" temp KiB XLA | temp ratio |{extra} scheduler |"
        )
        print("|---|---|---|---|---:|---:|---:|" + ("---:|---:|" if unfused else "") + "---|")
        for name, ours, theirs, r, scheduler, _ in rows:
            pair = {f: f"{kib(ours[f])} / {kib(theirs[f])}" for f in FIELDS}
            cells = (
                f" {kib(unfused[name])} | {ratio(ours['temp'], unfused[name]):.3f} |"
                if unfused
                else ""
            )
            print(
                f"| {name} | {pair['argument']} | {pair['output']} | {pair['alias']} | "
                f"{kib(ours['temp'])} | {kib(theirs['temp'])} | {r:.3f} |{cells} {scheduler} |"
            )
        print()
    print(
        f"geometric mean of xlapy temp / XLA temp over {len(finite)} programs: {geo:.3f}; "
        f"xlapy <= XLA on {wins} of {len(rows)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
