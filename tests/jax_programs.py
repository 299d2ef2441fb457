"""A table of JAX programs that together exercise every opcode a single-device program can
contain: training steps, attention, convolutions, loops, conditionals, sorting, gathers and
scatters, random numbers, mixed precision, integer bit tricks, FFTs and special functions.

Each entry names a function, an argument generator (fresh random NumPy data from a seeded
Generator), per-dtype tolerance overrides and the arguments to donate. `hlo_texts(program)`
lowers it once and caches both the lowered HLO and XLA's optimized HLO; `jax_outputs(program)`
runs XLA's compiled executable on the same arguments. The end-to-end tests, the opcode
coverage report and the benchmarks all read this table.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import warnings
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

Args = list[np.ndarray]


@dataclass(frozen=True)
class JaxProgram:
    """One program of the table.

    `tol` maps a dtype name ("float32") to (rtol, atol) overriding DEFAULT_TOL; `exact` makes
    every output leaf compare bit for bit; `x64` lowers and runs it with 64-bit types on.
    """

    name: str
    fn: Callable
    make_args: Callable[[np.random.Generator], Args]
    tol: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    donate_argnums: tuple[int, ...] = ()
    x64: bool = False
    exact: bool = False

    def args(self, seed: int = 0) -> Args:
        """Fresh arguments from a Generator seeded by `seed` and the program's name."""
        rng = np.random.default_rng([seed, zlib.crc32(self.name.encode())])
        return [np.asarray(a) for a in self.make_args(rng)]

    def context(self):
        """The JAX configuration context the program must be lowered and run in."""
        return jax.enable_x64(True) if self.x64 else contextlib.nullcontext()

    def jitted(self):
        return jax.jit(self.fn, donate_argnums=self.donate_argnums, keep_unused=True)


# (rtol, atol); atol is relative to the largest magnitude of the expected leaf.
DEFAULT_TOL: dict[str, tuple[float, float]] = {
    "float64": (1e-10, 1e-12),
    "complex128": (1e-10, 1e-12),
    "float32": (5e-5, 5e-6),
    "complex64": (5e-5, 5e-6),
    "float16": (5e-3, 2e-3),
    "bfloat16": (2e-2, 1e-2),
}

PROGRAMS: dict[str, JaxProgram] = {}


def program(make_args, *, name=None, tol=None, donate=(), x64=False, exact=False):
    """Register the decorated function as a program of the table."""

    def register(fn):
        key = name or fn.__name__
        if key in PROGRAMS:
            raise RuntimeError(f"two programs named {key}")
        PROGRAMS[key] = JaxProgram(key, fn, make_args, dict(tol or {}), tuple(donate), x64, exact)
        return fn

    return register


# -- argument generators ---------------------------------------------------------------------


def normal(*shape, dtype=np.float32, scale=1.0):
    return lambda rng: (rng.standard_normal(shape) * scale).astype(dtype)


def uniform(lo, hi, *shape, dtype=np.float32):
    return lambda rng: rng.uniform(lo, hi, shape).astype(dtype)


def ints(lo, hi, *shape, dtype=np.int32):
    return lambda rng: rng.integers(lo, hi, shape, endpoint=False).astype(dtype)


def gen(*makers):
    """An argument generator calling each maker on the Generator in turn."""
    return lambda rng: [m(rng) for m in makers]


def _with_specials(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`x` (float) with a few zeros of both signs, infinities and NaNs planted in it."""
    flat = x.reshape(-1).copy()
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], dtype=x.dtype)
    pos = rng.choice(flat.size, size=len(specials), replace=False)
    flat[pos] = specials
    return flat.reshape(x.shape)


def specials(*shape, dtype=np.float32, scale=3.0):
    return lambda rng: _with_specials((rng.standard_normal(shape) * scale).astype(dtype), rng)


def _tree_size(tree) -> int:
    return sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(tree))


# =============================================================================================
# Training steps and models
# =============================================================================================


def _mlp_init(rng, sizes):
    params = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        params.append((rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32))
        params.append((0.1 * rng.standard_normal(fan_out)).astype(np.float32))
    return params


def _mlp_loss(params, x, labels):
    h = x
    n_layers = len(params) // 2
    for i in range(n_layers):
        h = h @ params[2 * i] + params[2 * i + 1]
        if i < n_layers - 1:
            h = jax.nn.relu(h)
    logp = jax.nn.log_softmax(h)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


def _mlp_args(rng):
    return [*_mlp_init(rng, [16, 32, 32, 5]), normal(8, 16)(rng), ints(0, 5, 8)(rng)]


@program(_mlp_args, donate=(0, 1, 2, 3, 4, 5))
def mlp_train_step(w0, b0, w1, b1, w2, b2, x, y):
    params = [w0, b0, w1, b1, w2, b2]
    loss, grads = jax.value_and_grad(_mlp_loss)(params, x, y)
    return loss, [p - 0.1 * g for p, g in zip(params, grads)]


def _layer_norm(x, gamma, beta, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * gamma + beta


def _attention(q, k, v, causal):
    scores = jnp.einsum("...qhd,...khd->...hqk", q, k) / np.sqrt(q.shape[-1]).astype(np.float32)
    if causal:
        n = scores.shape[-1]
        mask = jnp.tril(jnp.ones((n, n), bool))
        scores = jnp.where(mask, scores, -1e9)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("...hqk,...khd->...qhd", weights, v)


def _block_loss(params, x):
    wq, wk, wv, wo, w1, w2, g1, b1, g2, b2 = params
    _seq, dim = x.shape[-2:]
    heads = 2
    h = _layer_norm(x, g1, b1)
    q, k, v = (jnp.reshape(h @ w, (*h.shape[:-1], heads, dim // heads)) for w in (wq, wk, wv))
    a = _attention(q, k, v, causal=True).reshape(x.shape) @ wo
    x = x + a
    h = _layer_norm(x, g2, b2)
    x = x + jax.nn.gelu(h @ w1) @ w2
    return jnp.mean(x**2)


def _block_args(rng):
    d, f = 8, 16
    mats = [normal(d, d, scale=0.3)(rng) for _ in range(4)]
    mats += [normal(d, f, scale=0.3)(rng), normal(f, d, scale=0.3)(rng)]
    norms = [uniform(0.5, 1.5, d)(rng), normal(d, scale=0.1)(rng)] * 2
    return [*mats, *norms, normal(2, 4, d)(rng)]


@program(_block_args, tol={"float32": (2e-4, 2e-5)})
def transformer_block_grad(*args):
    params, x = list(args[:-1]), args[-1]
    loss, grads = jax.value_and_grad(_block_loss)(params, x)
    return loss, grads


def _conv_net_loss(params, x, labels):
    k1, k2, w = params
    dn = ("NHWC", "HWIO", "NHWC")
    h = lax.conv_general_dilated(x, k1, (1, 1), "SAME", dimension_numbers=dn)
    h = jax.nn.relu(h)
    h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    h = lax.conv_general_dilated(h, k2, (1, 1), "VALID", dimension_numbers=dn)
    h = jnp.tanh(h)
    h = lax.reduce_window(h, 0.0, lax.add, (1, 2, 2, 1), (1, 1, 1, 1), "SAME") / 4.0
    logits = h.reshape(h.shape[0], -1) @ w
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.sum(jax.nn.one_hot(labels, 3) * logp, axis=-1))


def _conv_net_args(rng):
    return [
        normal(3, 3, 2, 4, scale=0.4)(rng),
        normal(2, 2, 4, 3, scale=0.4)(rng),
        normal(27, 3, scale=0.3)(rng),
        normal(2, 8, 8, 2)(rng),
        ints(0, 3, 2)(rng),
    ]


@program(_conv_net_args, donate=(0, 1, 2), tol={"float32": (2e-4, 2e-5)})
def convnet_train_step(k1, k2, w, x, labels):
    loss, grads = jax.value_and_grad(_conv_net_loss)((k1, k2, w), x, labels)
    return loss, tuple(p - 0.05 * g for p, g in zip((k1, k2, w), grads))


@program(gen(normal(2, 6, 2, 4), normal(2, 6, 2, 4), normal(2, 6, 2, 4)))
def attention_causal(q, k, v):
    return _attention(q, k, v, causal=True)


@program(gen(normal(5, 8), normal(8, 8), normal(8, 8), normal(8, 8), uniform(0, 1, 5, 5)))
def attention_masked_self(x, wq, wk, wv, keep):
    q, k, v = x @ wq, x @ wk, x @ wv
    scores = q @ k.T / jnp.sqrt(8.0)
    scores = jnp.where(keep > 0.3, scores, -jnp.inf)
    scores = jnp.where(jnp.all(keep <= 0.3, axis=-1, keepdims=True), 0.0, scores)
    return jax.nn.softmax(scores) @ v


@program(
    gen(
        normal(2, 6, 16, dtype=ml_dtypes.bfloat16),
        normal(16, 48, scale=0.3, dtype=ml_dtypes.bfloat16),
        normal(2, dtype=ml_dtypes.bfloat16),
    )
)
def attention_heads_bf16(x, w, scale):
    """bf16 dots (batched per head, f32 after dot-upcast) and an outer-product dot with no
    contracting dims (BERT's scaled probabilities: a multiply after the simplifier)."""
    q, k, v = jnp.split((x @ w).reshape(2, 6, 3, 2, 8), 3, axis=2)
    q, k, v = q[:, :, 0], k[:, :, 0], v[:, :, 0]
    probs = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k), axis=-1)
    probs = jnp.einsum("b,bhqk->bhqk", scale, probs)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(2, 6, 16)


def _rnn_loss(w, h0, xs):
    def cell(h, x):
        h = jnp.tanh(h @ w + x)
        return h, jnp.sum(h)

    h, ys = lax.scan(cell, h0, xs)
    return jnp.sum(ys) + jnp.sum(h**2)


@program(gen(normal(4, 4, scale=0.5), normal(4), normal(6, 4)), tol={"float32": (1e-4, 1e-5)})
def rnn_scan_grad(w, h0, xs):
    return jax.value_and_grad(_rnn_loss, argnums=(0, 1))(w, h0, xs)


@program(gen(normal(3, 4), normal(4, 4, scale=0.3)))
def remat_checkpoint_grad(x, w):
    @jax.checkpoint
    def layer(x):
        return jnp.sin(x @ w) * jnp.exp(-(x**2))

    return jax.grad(lambda x: jnp.sum(layer(layer(x))))(x)


@program(gen(normal(4, 6), normal(6, 3), normal(3)))
def nested_jit_call(x, w, b):
    inner = jax.jit(lambda a, m, c: jnp.tanh(a @ m + c), inline=False)
    return inner(x, w, b) + inner(x * 2, w, b)


@program(gen(normal(3, 4), normal(3, 4)))
def optimization_barrier(x, y):
    a, b = lax.optimization_barrier((x * 2, y + 1))
    return a * b


@program(gen(normal(4, 8), uniform(0.5, 1.5, 8), normal(8)))
def layer_norm_and_gelu(x, g, b):
    return jax.nn.gelu(_layer_norm(x, g, b), approximate=False), jax.nn.silu(x)


# =============================================================================================
# Convolutions
# =============================================================================================


def _conv(lhs_spec, rhs_spec, **kw):
    return lambda x, k: lax.conv_general_dilated(
        x, k, dimension_numbers=(lhs_spec, rhs_spec, lhs_spec), **kw
    )


program(gen(normal(2, 9, 9, 3), normal(3, 3, 3, 4)), name="conv2d_strided_same")(
    _conv("NHWC", "HWIO", window_strides=(2, 2), padding="SAME")
)
program(gen(normal(1, 3, 10, 9), normal(4, 3, 3, 3)), name="conv2d_dilated_valid")(
    _conv("NCHW", "OIHW", window_strides=(1, 1), padding="VALID", rhs_dilation=(2, 2))
)
program(gen(normal(1, 4, 6, 6), normal(6, 2, 3, 3)), name="conv2d_grouped_explicit_pad")(
    _conv("NCHW", "OIHW", window_strides=(1, 2), padding=((2, 1), (0, 3)), feature_group_count=2)
)
program(gen(normal(2, 7, 7, 4), normal(3, 3, 1, 4)), name="conv2d_depthwise")(
    _conv("NHWC", "HWIO", window_strides=(1, 1), padding="SAME", feature_group_count=4)
)
program(gen(normal(2, 5, 5, 3), normal(3, 3, 3, 2)), name="conv2d_transposed_lhs_dilation")(
    _conv("NHWC", "HWIO", window_strides=(1, 1), padding=((2, 2), (1, 2)), lhs_dilation=(2, 2))
)
program(gen(normal(2, 12, 3), normal(5, 3, 4)), name="conv1d_strided")(
    _conv("NWC", "WIO", window_strides=(2,), padding=((1, 1),))
)
program(gen(normal(1, 2, 5, 6, 4), normal(3, 2, 2, 3, 2)), name="conv3d")(
    _conv("NCDHW", "OIDHW", window_strides=(1, 2, 1), padding="SAME")
)
program(gen(normal(4, 5, 5, 2), normal(3, 3, 2, 6)), name="conv2d_batch_group")(
    _conv("NHWC", "HWIO", window_strides=(1, 1), padding="VALID", batch_group_count=2)
)
program(gen(normal(2, 4, 4, 3), normal(3, 3, 3, 5)), name="conv2d_negative_padding")(
    _conv("NHWC", "HWIO", window_strides=(1, 1), padding=((-1, 2), (1, -1)))
)


@program(gen(normal(2, 6, 6, 3), normal(3, 3, 3, 5)))
def conv_transpose_api(x, k):
    return lax.conv_transpose(x, k, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


@program(
    gen(normal(1, 6, 6, 4, dtype=ml_dtypes.bfloat16), normal(3, 3, 4, 4, dtype=ml_dtypes.bfloat16))
)
def conv2d_bf16_f32_accumulate(x, k):
    return lax.conv_general_dilated(
        x,
        k,
        (1, 1),
        "SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        preferred_element_type=jnp.float32,
    )


@program(gen(normal(2, 8, 8, 3), normal(3, 3, 3, 4)), tol={"float32": (2e-4, 2e-5)})
def conv2d_grads(x, k):
    def f(x, k):
        y = lax.conv_general_dilated(
            x, k, (2, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), rhs_dilation=(1, 2)
        )
        return jnp.sum(jnp.sin(y))

    return jax.grad(f, argnums=(0, 1))(x, k)


@program(gen(normal(13), normal(4)))
def numpy_convolve(a, b):
    return jnp.convolve(a, b, mode="full"), jnp.convolve(a, b, mode="same")


# =============================================================================================
# Loops and conditionals
# =============================================================================================


@program(gen(normal(4), normal(7, 4)))
def scan_cumulative(c0, xs):
    def step(c, x):
        c = c * 0.9 + x
        return c, (c.sum(), jnp.max(c))

    return lax.scan(step, c0, xs)


@program(gen(normal(4), normal(7, 4)))
def scan_reverse_unrolled(c0, xs):
    return lax.scan(lambda c, x: (jnp.sin(c) + x, c * x), c0, xs, reverse=True, unroll=2)


@program(gen(ints(3, 9), normal(5)))
def fori_loop_dynamic_trip(n, x):
    return lax.fori_loop(0, n, lambda i, acc: acc * 1.1 + jnp.float32(i), x)


@program(gen(normal(3, 3, scale=0.5)))
def fori_loop_static_nested(a):
    def outer(i, acc):
        return lax.fori_loop(0, 3, lambda j, m: m @ a * 0.5 + (i * j), acc)

    return lax.fori_loop(0, 4, outer, jnp.eye(3, dtype=a.dtype))


@program(gen(ints(1, 200, 6)))
def while_collatz_steps(x):
    def cond(s):
        v, _ = s
        return jnp.any(v > 1)

    def body(s):
        v, n = s
        nxt = jnp.where(v % 2 == 0, v // 2, 3 * v + 1)
        done = v <= 1
        return jnp.where(done, v, nxt), n + jnp.where(done, 0, 1)

    return lax.while_loop(cond, body, (x, jnp.zeros_like(x)))


@program(gen(uniform(0.5, 4.0, 6)))
def while_newton_sqrt(a):
    def cond(s):
        x, i = s
        return (jnp.max(jnp.abs(x * x - a)) > 1e-5) & (i < 30)

    def body(s):
        x, i = s
        return 0.5 * (x + a / x), i + 1

    return lax.while_loop(cond, body, (a, 0))


@program(gen(normal(), normal(4), normal(4)))
def cond_on_data(p, x, y):
    return lax.cond(p > 0, lambda a, b: (a * b, jnp.sin(a)), lambda a, b: (a - b, b), x, y)


@program(gen(ints(0, 3), normal(4)))
def switch_in_range(i, x):
    return lax.switch(i, [jnp.sin, jnp.cos, lambda v: v * v], x)


@program(lambda rng: [np.array(rng.choice([-7, -1, 3, 9]), np.int32), normal(4)(rng)])
def switch_out_of_range_clamped(i, x):
    return lax.switch(i, [jnp.sin, jnp.cos, jnp.exp], x)


@program(gen(ints(-2, 5, 6), normal(6)))
def switch_vmapped_to_select(i, x):
    return jax.vmap(lambda j, v: lax.switch(j, [jnp.sin, jnp.cos, jnp.tanh], v))(i, x)


@program(gen(normal(5), normal(5)))
def cond_inside_scan(xs, ys):
    def step(c, xy):
        x, y = xy
        c = lax.cond(x > y, lambda: c + x, lambda: c * 0.5 - y)
        return c, c

    return lax.scan(step, jnp.float32(0), (xs, ys))


# =============================================================================================
# Sorting
# =============================================================================================


@program(gen(specials(12)))
def sort_floats_with_nans(x):
    return jnp.sort(x), jnp.sort(-x, descending=True)


@program(gen(ints(-5, 5, 3, 9)))
def argsort_stable_ints(x):
    return jnp.argsort(x, axis=1, stable=True), jnp.argsort(x, axis=0, descending=True)


@program(gen(ints(0, 3, 10), ints(0, 3, 10), normal(10)))
def lax_sort_multi_operand(k1, k2, v):
    return lax.sort((k1, k2, v), num_keys=2)


@program(gen(normal(3, 10)))
def top_k(x):
    return lax.top_k(x, 4)


@program(gen(ints(0, 100, 4, 6, dtype=np.uint8)))
def sort_uint8_axis0(x):
    return jnp.sort(x, axis=0)


@program(gen(normal(9), normal(5)))
def searchsorted_and_median(a, v):
    s = jnp.sort(a)
    return (
        jnp.searchsorted(s, v),
        jnp.searchsorted(s, v, side="right", method="sort"),
        jnp.median(a),
    )


@program(gen(ints(0, 2**16, 8, dtype=np.int32)))
def random_permutation_via_sort(seed):
    key = jax.random.PRNGKey(seed[0])
    return jax.random.permutation(key, seed)


# =============================================================================================
# Gather and scatter
# =============================================================================================


@program(gen(normal(6, 5), ints(-6, 6, 4), ints(0, 5, 3)))
def fancy_indexing(x, i, j):
    return x[i], x[:, j], x[i[:3], j], x[1:5:2, ::-2], x[None, 2, ..., 1]


@program(gen(normal(4, 7), ints(0, 7, 4, 3)))
def take_along_axis(x, idx):
    return jnp.take_along_axis(x, idx, axis=1)


@program(gen(normal(5, 3), ints(-3, 8, 6), normal(6, 3)))
def scatter_add_duplicates_and_drop(x, idx, upd):
    return x.at[idx].add(upd, mode="drop"), x.at[jnp.clip(idx, 0, 4)].add(upd)


@program(gen(normal(6), ints(0, 6, 4), normal(4)))
def scatter_set_unique(x, idx, upd):
    return x.at[idx].set(upd, unique_indices=False), x.at[2:5].set(7.0)


@program(gen(normal(5, 2), ints(0, 5, 7), normal(7, 2)))
def scatter_max_min(x, idx, upd):
    return x.at[idx].max(upd), x.at[idx].min(upd)


@program(gen(uniform(0.5, 1.5, 5), ints(0, 5, 6), uniform(0.5, 2.0, 6)))
def scatter_mul(x, idx, upd):
    return x.at[idx].multiply(upd)


@program(gen(normal(10, 3), ints(0, 4, 10)))
def segment_sum_and_max(data, seg):
    return (
        jax.ops.segment_sum(data, seg, num_segments=4),
        jax.ops.segment_max(data, seg, num_segments=4),
    )


@program(gen(ints(-1, 6, 7)))
def one_hot(labels):
    return jax.nn.one_hot(labels, 5), jax.nn.one_hot(labels, 5, dtype=jnp.int32)


@program(gen(normal(6, 4), ints(-9, 9, 5)))
def gather_modes_clip_fill(x, idx):
    return (
        jnp.take(x, idx, axis=0, mode="clip"),
        jnp.take(x, idx, axis=0, mode="fill", fill_value=-1.0),
        x.at[idx, 1].get(mode="fill", fill_value=np.nan),
    )


@program(gen(normal(8, 4), ints(0, 8, 2, 3), normal(2, 3, 4)))
def embedding_lookup_grad(table, ids, gy):
    y, vjp = jax.vjp(lambda t: t[ids], table)
    return y, vjp(gy)[0]


@program(gen(normal(3, 6, 4), ints(0, 4, 3)))
def vmapped_dynamic_slice(x, starts):
    return jax.vmap(lambda r, s: lax.dynamic_slice(r, (s, 1), (2, 3)))(x, starts)


@program(gen(ints(-10, 10, 4, 5), ints(0, 4, 5), ints(0, 5, 5)))
def int_gather_scatter_2d(x, r, c):
    return x[r, c], x.at[r, c].add(100)


# =============================================================================================
# Random numbers
# =============================================================================================


def _seed():
    return lambda rng: np.array(rng.integers(0, 2**31 - 1), np.int32)


@program(gen(_seed()), exact=True)
def threefry_random_bits(seed):
    key = jax.random.PRNGKey(seed)
    k1, k2 = jax.random.split(key)
    return jax.random.bits(k1, (5, 3)), jax.random.key_data(k2)


@program(gen(_seed()), exact=True)
def threefry_uniform_randint(seed):
    key = jax.random.PRNGKey(seed)
    ka, kb, kc = jax.random.split(key, 3)
    return (
        jax.random.uniform(ka, (4, 4)),
        jax.random.randint(kb, (6,), -20, 20),
        jax.random.bernoulli(kc, 0.3, (8,)),
    )


@program(gen(_seed()), tol={"float32": (1e-4, 1e-5)})
def threefry_normal_and_gumbel(seed):
    key = jax.random.PRNGKey(seed)
    ka, kb = jax.random.split(key)
    return jax.random.normal(ka, (6, 3)), jax.random.gumbel(kb, (5,))


@program(gen(_seed(), normal(4, 6)), exact=True)
def threefry_dropout(seed, x):
    keep = jax.random.bernoulli(jax.random.PRNGKey(seed), 0.7, x.shape)
    return jnp.where(keep, x / 0.7, 0.0)


def _rbg_key():
    return ints(0, 2**32, 4, dtype=np.uint32)


def _rbg(algorithm, shape=(3, 5), dtype=np.uint32):
    def fn(key):
        return lax.rng_bit_generator(key, shape, dtype, algorithm=algorithm)

    return fn


program(gen(_rbg_key()), name="rng_bit_generator_default", exact=True)(
    _rbg(lax.RandomAlgorithm.RNG_DEFAULT)
)
program(gen(_rbg_key()), name="rng_bit_generator_three_fry", exact=True)(
    _rbg(lax.RandomAlgorithm.RNG_THREE_FRY, (7,))
)
program(gen(_rbg_key()), name="rng_bit_generator_philox", exact=True)(
    _rbg(lax.RandomAlgorithm.RNG_PHILOX, (2, 3, 3))
)
program(gen(_rbg_key()), name="rng_bit_generator_philox_u8", exact=True)(
    _rbg(lax.RandomAlgorithm.RNG_PHILOX, (9,), np.uint8)
)
program(gen(_rbg_key()), name="rng_bit_generator_three_fry_u64", exact=True, x64=True)(
    _rbg(lax.RandomAlgorithm.RNG_THREE_FRY, (2, 3), np.uint64)
)


# =============================================================================================
# Mixed precision
# =============================================================================================


@program(gen(normal(4, 16, dtype=ml_dtypes.bfloat16), normal(16, 8, dtype=ml_dtypes.bfloat16)))
def bf16_matmul_f32_accumulate(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32), (a @ b)


@program(gen(normal(5, 6, dtype=np.float16), normal(6, dtype=np.float16)))
def f16_elementwise_and_reduce(x, b):
    y = jnp.tanh(x * b + 1) + jnp.exp(x * 0.5)
    return y, jnp.sum(y, axis=1), jnp.max(x, axis=0)


@program(gen(specials(24, scale=50.0)), exact=True)
def f8_convert_round_trips(x):
    return (
        x.astype(ml_dtypes.float8_e4m3fn).astype(jnp.float32),
        x.astype(ml_dtypes.float8_e5m2).astype(jnp.float32),
        x.astype(jnp.bfloat16),
        x.astype(jnp.float16),
        x.astype(ml_dtypes.float8_e5m2).astype(jnp.bfloat16),
    )


@program(gen(normal(3, 8, dtype=ml_dtypes.bfloat16), normal(8, dtype=ml_dtypes.bfloat16)))
def bf16_layer_norm(x, g):
    xf = x.astype(jnp.float32)
    y = (xf - xf.mean(-1, keepdims=True)) * lax.rsqrt(xf.var(-1, keepdims=True) + 1e-5)
    return (y * g.astype(jnp.float32)).astype(jnp.bfloat16), x * g


@program(gen(uniform(-300, 300, 12)), exact=True)
def float_to_int_conversions(x):
    return (
        x.astype(jnp.int32),
        x.astype(jnp.int8),
        x.astype(jnp.uint8),
        jnp.abs(x).astype(jnp.uint32),
        x.astype(jnp.int32).astype(jnp.int8),
        x.astype(jnp.int32).astype(jnp.uint16),
    )


@program(gen(ints(-(2**31), 2**31 - 1, 10), ints(0, 2**32, 10, dtype=np.uint32)))
def int_to_float_conversions(a, b):
    return (
        a.astype(jnp.float32),
        b.astype(jnp.float32),
        a.astype(jnp.bfloat16),
        b.astype(jnp.float16),
    )


# =============================================================================================
# Integer bit tricks
# =============================================================================================


@program(gen(ints(-(2**31), 2**31 - 1, 12), ints(-3, 40, 12)))
def shifts_out_of_range(x, s):
    u = lax.convert_element_type(x, jnp.uint32)
    su = lax.convert_element_type(s, jnp.uint32)
    return (
        lax.shift_left(x, s),
        lax.shift_right_arithmetic(x, s),
        lax.shift_right_logical(x, s),
        lax.shift_left(u, su),
        lax.shift_right_logical(u, su),
        lax.shift_right_arithmetic(u, su),
    )


@program(gen(ints(-(2**31), 2**31 - 1, 10), ints(-128, 128, 10, dtype=np.int8)))
def popcount_and_clz(x, y):
    u = lax.bitcast_convert_type(x, jnp.uint32)
    return (
        lax.population_count(x),
        lax.clz(x),
        lax.population_count(u),
        lax.clz(u),
        lax.clz(y),
        lax.population_count(y),
        lax.clz(x & 0),
    )


@program(gen(specials(4, 6), ints(0, 256, 3, 4, dtype=np.uint8)), exact=True)
def bitcast_convert_widths(x, b):
    return (
        lax.bitcast_convert_type(x, jnp.uint32),
        lax.bitcast_convert_type(x, jnp.uint16),
        lax.bitcast_convert_type(x, jnp.int8),
        lax.bitcast_convert_type(b, jnp.float32),
        lax.bitcast_convert_type(lax.bitcast_convert_type(x, jnp.bfloat16), jnp.int32),
    )


def _div_args(rng):
    a = rng.integers(-50, 50, 16).astype(np.int32)
    b = rng.integers(-6, 7, 16).astype(np.int32)
    a[:3] = [np.iinfo(np.int32).min, np.iinfo(np.int32).min, 7]
    b[:4] = [-1, 0, 0, 0]
    return [a, b]


@program(_div_args)
def int_div_rem_signs_and_zero(a, b):
    ua = lax.convert_element_type(a, jnp.uint32)
    ub = lax.convert_element_type(b, jnp.uint32)
    return lax.div(a, b), lax.rem(a, b), lax.div(ua, ub), lax.rem(ua, ub)


@program(_div_args)
def int_floor_divide_and_mod(a, b):
    safe = jnp.where(b == 0, 3, b)
    return jnp.floor_divide(a, safe), jnp.mod(a, safe), jnp.divmod(a + 1, safe)


@program(
    gen(
        ints(-(2**31), 2**31 - 1, 10),
        ints(-(2**31), 2**31 - 1, 10),
        ints(-128, 128, 10, dtype=np.int8),
    )
)
def int_overflow_wraparound(a, b, c):
    u = lax.convert_element_type(a, jnp.uint32)
    return a + b, a * b, a - b, -a, c * c, c + jnp.int8(100), u * u, -u, jnp.abs(a)


@program(gen(ints(-100, 100, 12), ints(0, 2, 12, dtype=bool), ints(0, 2**16, 12, dtype=np.uint16)))
def bitwise_logic(a, p, u):
    q = a > 0
    return (a & 7, a | -8, a ^ 0x55, ~a, p & q, p | q, p ^ q, ~p, u ^ 0xFFFF, ~u, u >> 3)


@program(gen(ints(-1000, 1000, 10), ints(0, 2**32, 10, dtype=np.uint32), normal(10)))
def compare_int_unsigned_float(a, u, f):
    return (
        a < 0,
        a >= 3,
        a == a[::-1],
        a != 7,
        u > jnp.uint32(2**31),
        u <= jnp.uint32(2**20),
        f < 0.5,
        f == f[::-1],
        jnp.maximum(a, 3),
        jnp.minimum(u, jnp.uint32(2**31)),
    )


@program(gen(specials(10), uniform(-3, 3, 10)), exact=True)
def frexp_ldexp_copysign(x, y):
    m, e = jnp.frexp(x)
    return m, e, jnp.ldexp(y, e), jnp.copysign(y, x), jnp.signbit(x)


# =============================================================================================
# Cumulative ops, reductions, windows
# =============================================================================================


@program(gen(normal(5, 6)))
def cumsum_cumprod_cummax(x):
    return (
        jnp.cumsum(x, axis=0),
        jnp.cumprod(x * 0.5 + 1, axis=1),
        lax.cummax(x, axis=1),
        lax.cummin(x, axis=0, reverse=True),
    )


@program(gen(ints(-5, 5, 4, 6)))
def int_cumsum_and_logcumsumexp(x):
    return jnp.cumsum(x, axis=1), lax.cumlogsumexp(x.astype(jnp.float32), axis=0)


@program(gen(normal(1, 7, 8, 2)))
def reduce_window_pools(x):
    maxp = lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
    avgp = lax.reduce_window(
        x, 0.0, lax.add, (1, 2, 3, 1), (1, 1, 2, 1), ((0, 0), (1, 1), (2, 0), (0, 0))
    )
    dil = lax.reduce_window(
        x, jnp.inf, lax.min, (1, 2, 2, 1), (1, 1, 1, 1), "VALID", window_dilation=(1, 2, 2, 1)
    )
    base = lax.reduce_window(
        x, 0.0, lax.add, (1, 2, 2, 1), (1, 1, 1, 1), "VALID", base_dilation=(1, 2, 1, 1)
    )
    return maxp, avgp, dil, base


@program(gen(normal(1, 6, 6, 2)), tol={"float32": (1e-4, 1e-5)})
def max_pool_grad_select_and_scatter(x):
    def f(x):
        return jnp.sum(
            jnp.sin(lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"))
        )

    return jax.grad(f)(x)


@program(gen(normal(3, 4, 5), ints(0, 2, 3, 4, 5, dtype=bool)))
def reductions_over_axes(x, m):
    return (
        x.sum(),
        x.sum(axis=(0, 2)),
        x.mean(axis=1),
        x.max(axis=0),
        x.min(axis=(1, 2)),
        jnp.prod(x * 0.3 + 1, axis=2),
        m.all(axis=0),
        m.any(axis=(1, 2)),
        m.sum(axis=2),
        jnp.var(x, axis=-1),
        jnp.linalg.norm(x, axis=0),
    )


@program(
    lambda rng: [
        np.where(rng.random((4, 7)) < 0.2, 1.0, rng.integers(-2, 3, (4, 7))).astype(np.float32),
        _with_specials(rng.standard_normal((3, 5)).astype(np.float32), rng),
    ]
)
def argmax_argmin_ties_nans(x, y):
    return (
        jnp.argmax(x, axis=1),
        jnp.argmin(x, axis=0),
        jnp.argmax(y, axis=1),
        jnp.argmin(y, axis=1),
    )


@program(gen(ints(-50, 50, 3, 6)))
def int_reductions_and_argmax(x):
    return (
        x.sum(axis=0),
        x.prod(axis=1),
        x.max(axis=1),
        jnp.argmax(x, axis=0),
        jnp.argmin(x, axis=1),
    )


@program(gen(normal(4, 6, scale=5.0)))
def logsumexp_softmax(x):
    return jax.nn.logsumexp(x, axis=1), jax.nn.softmax(x, axis=0), jax.nn.log_softmax(x)


@program(gen(normal(4, 5), normal(4, 5)))
def variadic_reduce_custom(x, y):
    def reducer(a, b):
        (av, ai), (bv, bi) = a, b
        pick = av * ai >= bv * bi
        return jnp.where(pick, av, bv), jnp.where(pick, ai, bi)

    return lax.reduce((x, y), (jnp.float32(-jnp.inf), jnp.float32(1.0)), reducer, (1,))


# =============================================================================================
# Complex numbers and FFT
# =============================================================================================


def _complex(*shape):
    return lambda rng: (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(
        np.complex64
    )


@program(gen(normal(6), normal(6), _complex(6)))
def complex_arithmetic(re, im, z):
    w = lax.complex(re, im)
    return (
        w * z,
        w / z,
        w + z,
        jnp.conj(w),
        jnp.abs(z),
        jnp.angle(z),
        jnp.real(z * z),
        jnp.imag(z),
        jnp.exp(z),
        jnp.sqrt(z),
        z == w,
        jnp.log(z),
    )


@program(gen(_complex(3, 4), _complex(4, 2)))
def complex_matmul_and_sum(a, b):
    return a @ b, a.sum(axis=1), jnp.abs(a).max()


@program(gen(_complex(4, 8)), tol={"complex64": (1e-4, 1e-5)})
def fft_and_ifft(z):
    return jnp.fft.fft(z), jnp.fft.ifft(z, axis=0), jnp.fft.fft2(z)


@program(gen(normal(3, 10)), tol={"complex64": (1e-4, 1e-5), "float32": (1e-4, 1e-5)})
def rfft_and_irfft(x):
    spec = jnp.fft.rfft(x)
    return spec, jnp.fft.irfft(spec, n=10), jnp.fft.irfft(spec * 2)


@program(gen(normal(2, 4, 6)), tol={"complex64": (1e-4, 1e-5), "float32": (1e-4, 1e-5)})
def rfftn_3d_and_back(x):
    spec = jnp.fft.rfftn(x)
    return spec, jnp.fft.irfftn(spec, s=x.shape), jnp.fft.ifftn(spec, axes=(0, 1))


@program(gen(_complex(4, 4)), x64=True, tol={"complex64": (1e-4, 1e-5)})
def complex128_fft(z):
    return jnp.fft.fft(z.astype(jnp.complex128)), jnp.fft.ifft2(z)


# =============================================================================================
# Elementwise math
# =============================================================================================


@program(gen(specials(10, scale=1e3), uniform(-5, 5, 10)), exact=True)
def reduce_precision(x, y):
    return (
        lax.reduce_precision(x, exponent_bits=5, mantissa_bits=10),
        lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7),
        lax.reduce_precision(y, exponent_bits=4, mantissa_bits=3),
        lax.reduce_precision(y, exponent_bits=2, mantissa_bits=1),
    )


@program(
    gen(uniform(-0.9, 3.0, 12), uniform(0.2, 6.0, 12), uniform(-0.99, 0.99, 12)),
    tol={"float32": (3e-4, 3e-5)},
)
def special_functions(x, p, q):
    sp = jax.scipy.special
    return (
        jnp.expm1(x),
        jnp.log1p(x),
        lax.erf(x),
        sp.erfc(x),
        sp.gammaln(p),
        sp.digamma(p),
        sp.erfinv(q),
        sp.ndtri(q * 0.5 + 0.5),
    )


@program(gen(specials(12), uniform(-2, 2, 12), uniform(-2, 2, 12)))
def clamp_and_select(x, lo, hi):
    lo2, hi2 = jnp.minimum(lo, hi), jnp.maximum(lo, hi)
    return (
        lax.clamp(-1.0, x, 1.0),
        lax.clamp(lo2, x, hi2),
        jnp.where(x > lo, x, hi),
        jnp.clip(x, max=0.5),
    )


@program(gen(ints(-10, 10, 5), ints(-10, 10, 5), ints(-10, 10, 5)))
def int_clamp_select(x, lo, hi):
    return lax.clamp(jnp.int32(-3), x, jnp.int32(4)), lax.select(x > lo, hi, lo)


@program(gen(normal(3, 4)))
def iota_eye_tril(x):
    return (
        jnp.arange(12, dtype=jnp.int32).reshape(3, 4),
        lax.broadcasted_iota(jnp.float32, (2, 3, 4), 2),
        jnp.eye(4, 3, k=-1),
        jnp.tril(x),
        jnp.triu(x, 1),
        jnp.arange(0.5, 3.0, 0.5),
    )


@program(gen(normal(4, 5)))
def pad_negative_and_interior(x):
    return (
        lax.pad(x, 0.0, ((1, 2, 0), (-1, 3, 1))),
        lax.pad(x, -1.0, ((-2, -1, 2), (2, -3, 0))),
        jnp.pad(x, ((1, 0), (2, 2)), mode="reflect"),
        jnp.pad(x, 1, mode="edge"),
    )


@program(gen(normal(3, 4, 5)))
def reverse_and_roll(x):
    return jnp.flip(x, axis=(0, 2)), lax.rev(x, (1,)), jnp.roll(x, 2, axis=2), jnp.rot90(x[0])


@program(gen(normal(6, 7), ints(-4, 10), ints(-4, 10), normal(3, 4)))
def dynamic_slice_out_of_range_starts(x, i, j, u):
    return (
        lax.dynamic_slice(x, (i, j), (3, 4)),
        lax.dynamic_update_slice(x, u, (i, j)),
        lax.dynamic_slice_in_dim(x, i, 2, axis=1),
        lax.dynamic_update_slice(x, u[:1, :2], (jnp.int32(100), jnp.int32(-100))),
    )


@program(gen(normal(2, 3), normal(4, 3), normal(2, 5)))
def concatenate_and_stack(a, b, c):
    return (
        jnp.concatenate([a, b, a], axis=0),
        jnp.concatenate([a, c], axis=1),
        jnp.stack([a, a * 2]),
        jnp.hstack([c, a]),
    )


@program(gen(normal(2, 3, 4, 5)))
def transpose_and_reshape(x):
    return (
        jnp.transpose(x, (3, 1, 0, 2)),
        x.reshape(6, 20).T,
        jnp.swapaxes(x, 1, 3).reshape(-1, 3),
        jnp.moveaxis(x, 0, -1)[..., 1],
    )


@program(gen(normal(3), normal(4, 1)))
def broadcast(a, b):
    return (
        jnp.broadcast_to(a, (2, 4, 3)),
        lax.broadcast_in_dim(b, (4, 2, 5), (0, 1)),
        a + b,
        lax.broadcast(a, (2,)),
    )


@program(gen(normal(3, 8), normal(8)))
def slice_strided_and_reshape(x, v):
    return x[:, 1:7:3], x[::2, ::-1], lax.slice(x, (0, 2), (3, 8), (2, 3)), v.reshape(2, 2, 2)[1]


@program(gen(specials(10), normal(10)), exact=True)
def nextafter(x, y):
    return (
        jnp.nextafter(x, y),
        jnp.nextafter(y, jnp.float32(jnp.inf)),
        jnp.nextafter(jnp.zeros_like(y), y),
    )


@program(gen(specials(12), specials(12, dtype=np.float16)))
def is_finite_isnan_isinf(x, h):
    return (
        jnp.isfinite(x),
        jnp.isnan(x),
        jnp.isinf(x),
        jnp.isfinite(h),
        jnp.isneginf(x),
        jnp.nan_to_num(x),
    )


@program(
    lambda rng: [np.concatenate([np.arange(-3, 3.5, 0.5), rng.normal(0, 4, 6)]).astype(np.float32)]
)
def round_floor_ceil(x):
    return (
        jnp.round(x),
        lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO),
        jnp.floor(x),
        jnp.ceil(x),
        jnp.trunc(x),
        jnp.round(x, 1),
        jnp.rint(x * 3),
    )


@program(gen(specials(10), ints(-3, 4, 10), ints(0, 3, 10, dtype=np.uint8)), exact=True)
def sign(x, i, u):
    return jnp.sign(x), jnp.sign(i), jnp.sign(u), lax.sign(x * 0.0), jnp.abs(x), jnp.abs(i)


@program(gen(specials(12), specials(12)))
def atan2(y, x):
    return jnp.arctan2(y, x), jnp.arctan2(jnp.zeros_like(y), x), jnp.arctan2(y, jnp.zeros_like(x))


@program(gen(normal(10, scale=5.0), uniform(0.5, 3.0, 10)))
def float_rem_and_fmod(x, y):
    y = jnp.where(jnp.arange(10) % 2 == 0, y, -y)
    return lax.rem(x, y), jnp.fmod(x, y), jnp.remainder(x, y), lax.rem(x, jnp.zeros_like(y))


@program(gen(uniform(0.1, 3.0, 8), normal(8), ints(-3, 4, 8), ints(0, 7, 8)))
def pow_float_and_int(x, y, i, e):
    return (
        jnp.power(x, y),
        x**2.5,
        lax.integer_pow(y, 3),
        lax.integer_pow(x, -2),
        jnp.power(i, e),
        lax.pow(y, i),
        lax.pow(x, jnp.float32(0.5)),
        jnp.power(y, 0),
    )


@program(gen(uniform(0.0, 10.0, 10), normal(10, scale=5.0)))
def sqrt_rsqrt_cbrt(x, y):
    return jnp.sqrt(x), lax.rsqrt(x + 0.01), jnp.cbrt(y), jnp.sqrt(y), jnp.hypot(x, y)


@program(gen(normal(12, scale=4.0)))
def logistic_tanh_softplus(x):
    return (
        lax.logistic(x),
        jax.nn.sigmoid(x),
        jnp.tanh(x),
        jax.nn.softplus(x),
        jax.nn.log_sigmoid(x),
        jax.nn.elu(x),
        jax.nn.celu(x),
    )


@program(
    gen(uniform(-3, 3, 12), uniform(-0.99, 0.99, 12), uniform(1.01, 5.0, 12)),
    tol={"float32": (1e-4, 1e-5)},
)
def trig_and_hyperbolic(x, u, g):
    return (
        jnp.sin(x),
        jnp.cos(x),
        jnp.tan(x),
        jnp.arcsin(u),
        jnp.arccos(u),
        jnp.arctan(x),
        jnp.sinh(x),
        jnp.cosh(x),
        jnp.arcsinh(x),
        jnp.arccosh(g),
        jnp.arctanh(u),
    )


@program(gen(uniform(0.01, 20.0, 12), normal(12, scale=3.0)))
def exp_log_family(x, y):
    return jnp.exp(y), jnp.log(x), jnp.exp2(y), jnp.log2(x), jnp.log10(x), jnp.logaddexp(y, x)


@program(gen(specials(12), specials(12)))
def min_max_nan_propagation(x, y):
    return (
        jnp.maximum(x, y),
        jnp.minimum(x, y),
        jnp.fmax(x, y),
        jnp.fmin(x, y),
        jnp.nanmax(x),
        jnp.nanmin(y),
    )


@program(gen(specials(12), specials(12)))
def float_compare_total_order(x, y):
    return x < y, x >= y, x == y, x != y, lax.sort(x), jnp.isclose(x, y)


@program(gen(ints(0, 256, 4, 4, 3, dtype=np.uint8)))
def uint8_image_normalize(img):
    f = img.astype(jnp.float32) / 255.0
    f = (f - jnp.array([0.5, 0.4, 0.3])) * 1.7
    back = jnp.clip(jnp.round(f * 100 + 128), 0, 255).astype(jnp.uint8)
    return f, back, img.mean(axis=(0, 1))


@program(gen(normal(2, 3, 4), normal(2, 4, 5), ints(-5, 5, 3, 4), ints(-5, 5, 4, 2)))
def dot_general_batch_and_int(a, b, i, j):
    return (
        jnp.einsum("bij,bjk->bik", a, b),
        jnp.einsum("bij,bjk->ik", a, b),
        i @ j,
        jnp.tensordot(a, b[0], axes=([2], [0])),
        jnp.outer(a[0, 0], b[0, 0]),
        jnp.vdot(a, a),
    )


@program(gen(normal(3, 3), normal(4)))
def misc_numpy_api(a, p):
    return (
        jnp.trace(a),
        jnp.diag(a),
        jnp.kron(a[:2, :2], a[1:, 1:]),
        jnp.diff(p, n=2),
        jnp.polyval(p, a),
        jnp.interp(a, jnp.arange(4.0), p),
    )


@program(gen(normal(5), normal(5)))
def custom_jvp_and_vjp(x, t):
    @jax.custom_jvp
    def f(x):
        return jnp.sin(x) * x

    f.defjvp(lambda primals, tangents: (f(primals[0]), tangents[0] * jnp.cos(primals[0]) * 2))

    @jax.custom_vjp
    def g(x):
        return jnp.exp(x)

    g.defvjp(lambda x: (jnp.exp(x), x), lambda res, ct: (ct * res,))
    return jax.jvp(f, (x,), (t,)), jax.grad(lambda v: g(v).sum())(x)


@program(gen(normal(4, 3), normal(3), normal(4, 3)))
def vmap_of_grad(x, w, y):
    per_example = jax.vmap(
        jax.grad(lambda w, a, b: jnp.sum((jnp.tanh(a * w) - b) ** 2)), (None, 0, 0)
    )
    return per_example(w, x, y)


@program(gen(normal(4, 6), normal(6, 3)), donate=(0,))
def donated_inplace_update(x, w):
    return x.at[1:3].set(0.5), x @ w


@program(gen(normal(2, 2), normal(2)))
def jacfwd_and_hessian(a, x):
    f = lambda v: jnp.sum(jnp.tanh(a @ v) ** 2)  # noqa: E731
    return jax.jacfwd(jax.grad(f))(x), jax.jacrev(lambda v: a @ jnp.sin(v))(x)


@program(gen(normal(4, 6)))
def shard_map_collectives_one_device(x):
    mesh = jax.make_mesh((1,), ("i",))

    def body(x):
        total = lax.psum(x, "i")
        gathered = lax.all_gather(x, "i")[0]
        shifted = lax.ppermute(x, "i", [(0, 0)])
        scattered = lax.psum_scatter(x, "i", scatter_dimension=0, tiled=True)
        swapped = lax.all_to_all(x, "i", 0, 0, tiled=True)
        biggest = lax.pmax(x, "i")
        return total + gathered + shifted + scattered + swapped + biggest + lax.axis_index("i")

    spec = jax.sharding.PartitionSpec()
    return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)(x)


# =============================================================================================
# 64-bit programs
# =============================================================================================


@program(
    gen(
        normal(5, dtype=np.float64),
        ints(-(2**40), 2**40, 5, dtype=np.int64),
        ints(0, 2**63, 5, dtype=np.uint64),
    ),
    x64=True,
)
def x64_float_and_int_arithmetic(x, i, u):
    return (
        jnp.exp(x) * jnp.sin(x),
        i * 12345,
        i // 7,
        i % 7,
        u >> 3,
        lax.clz(i),
        lax.population_count(u),
        x.astype(jnp.float32),
        i.astype(jnp.float64),
        jnp.cumsum(x),
        lax.bitcast_convert_type(x, jnp.int64),
        lax.bitcast_convert_type(x, jnp.uint32),
    )


@program(gen(normal(3, 4, dtype=np.float64), normal(4, 2, dtype=np.float64)), x64=True)
def x64_matmul_and_special(a, b):
    return (
        a @ b,
        jax.scipy.special.gammaln(jnp.abs(a) + 0.5),
        jnp.argsort(a, axis=1),
        jnp.nextafter(a, b[0, 0]),
    )


# =============================================================================================
# helpers used by the tests, the coverage report and the benchmarks
# =============================================================================================


@dataclass(frozen=True)
class HloTexts:
    """A program's HLO as lowered by JAX and after XLA's optimizations."""

    lowered: str
    optimized: str


_TEXTS: dict[str, HloTexts] = {}
_OUTPUTS: dict[str, list[np.ndarray]] = {}


def hlo_texts(prog: JaxProgram) -> HloTexts:
    """The lowered and optimized HLO text of `prog` (computed once per process)."""
    if prog.name not in _TEXTS:
        with prog.context(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lowered = prog.jitted().lower(*prog.args())
            _TEXTS[prog.name] = HloTexts(
                lowered.as_text(dialect="hlo"), lowered.compile().as_text()
            )
    return _TEXTS[prog.name]


def jax_outputs(prog: JaxProgram, seed: int = 0) -> list[np.ndarray]:
    """The leaves of XLA's result for `prog` on `prog.args(seed)`, as NumPy arrays."""
    key = f"{prog.name}/{seed}"
    if key not in _OUTPUTS:
        with prog.context(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = prog.jitted()(*prog.args(seed))
            _OUTPUTS[key] = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(out)]
    return _OUTPUTS[key]


@functools.cache
def program_names() -> tuple[str, ...]:
    return tuple(PROGRAMS)
