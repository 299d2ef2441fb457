"""Decoding loops: while loops whose body attends over a KV cache with batched dots (gemm
lists), writes the cache and the generated token in place (dynamic-update-slice) and picks
the token with an argmax, run as one native function (runtime/control_flow_thunk.py's
NativeLoop). Against the Python-driven loop (the same kernels: bit for bit), the interpreter
and, for a JAX program, XLA; 0, 1 and many trips, fresh random inputs."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hlo_snippets import ARGMAX_REDUCER, counted_loop_hlo
from jax import lax

from xlapy.backends.cpu import CpuBackend
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.runtime.control_flow_thunk import WhileThunk
from xlapy.backends.cpu.runtime.dot_thunk import DotThunk
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("kernel_cache")

B, T, H, E = 3, 9, 2, 8  # batch, cache length (at least the most trips), heads, head width
D = H * E


def kv_loop_hlo(trips: int) -> str:
    """Per step i: k = x @ Wk written into row i of the [batch, time, heads, E] cache;
    scores = x . cache per batch item and head (a batched dot over strided items: one gemm
    each); ctx = tanh(scores) @ cache (batched again); x <- tanh(ctx + x / 2); the argmax
    of ctx over the width written as token i."""
    x4, s4, c4 = f"f32[{B},1,{H},{E}]", f"f32[{B},{H},1,{T}]", f"f32[{B},{H},1,{E}]"
    by_item = "lhs_batch_dims={0,2}, rhs_batch_dims={0,2}"
    by_head = "lhs_batch_dims={0,1}, rhs_batch_dims={0,2}"
    body = f"""  k = f32[{B},{D}] dot(x, wk), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  k4 = {x4} reshape(k)
  z = s32[] constant(0)
  cache1 = f32[{B},{T},{H},{E}] dynamic-update-slice(cache, k4, z, i, z, z)
  q = {x4} reshape(x)
  scores = {s4} dot(q, cache1), {by_item}, lhs_contracting_dims={{3}}, rhs_contracting_dims={{3}}
  p = {s4} tanh(scores)
  ctx = {c4} dot(p, cache1), {by_head}, lhs_contracting_dims={{3}}, rhs_contracting_dims={{1}}
  c2 = f32[{B},{D}] reshape(ctx)
  half = f32[] constant(0.5)
  halves = f32[{B},{D}] broadcast(half), dimensions={{}}
  xh = f32[{B},{D}] multiply(x, halves)
  sum = f32[{B},{D}] add(c2, xh)
  x1 = f32[{B},{D}] tanh(sum)
  ids = s32[{B},{D}] iota(), iota_dimension=1
  ninf = f32[] constant(-inf)
  zi = s32[] constant(0)
  best = (f32[{B}], s32[{B}]) reduce(c2, ids, ninf, zi), dimensions={{1}}, to_apply=argmax
  tok = s32[{B}] get-tuple-element(best), index=1
  tok2 = s32[{B},1] reshape(tok)
  tokens1 = s32[{B},{T}] dynamic-update-slice(tokens, tok2, z, i)"""
    carried = [
        ("x", f"f32[{B},{D}]"),
        ("wk", f"f32[{D},{D}]"),
        ("cache", f"f32[{B},{T},{H},{E}]"),
        ("tokens", f"s32[{B},{T}]"),
    ]
    updates = ["x1", "wk", "cache1", "tokens1"]
    return counted_loop_hlo(
        "kv_loop", trips, carried, body, updates, ["x", "cache", "tokens"], ARGMAX_REDUCER
    )


def compile_text(text: str, **options) -> CpuProgram:
    return CpuBackend().compile(parse_module(text), options)


def while_thunks(program: CpuProgram) -> list[WhileThunk]:
    return [t for t in program.compiled.entry.thunks if isinstance(t, WhileThunk)]


def leaves(v) -> list[np.ndarray]:
    return [np.asarray(x) for x in (v if isinstance(v, (list, tuple)) else [v])]


@pytest.mark.parametrize("trips", [0, 1, 7])
def test_kv_cache_loop_with_batched_dots_is_native(trips):
    """The batched dots run as gemm lists inside the native loop: the Python loop's bits,
    the interpreter's numbers, the cache and tokens written only at rows 0..trips-1."""
    rng = np.random.default_rng(1127 + trips)
    text = kv_loop_hlo(trips)
    native = compile_text(text)
    (loop,) = while_thunks(native)
    assert loop.native is not None and not native.python_loops, native.thunk_listing()
    listed = [t for t in loop.body.thunks if isinstance(t, DotThunk)]
    assert any(t.native_gemm_list() is not None for t in listed), native.thunk_listing()
    python = compile_text(text, native_loops=False)
    assert while_thunks(python)[0].native is None

    args = [
        rng.standard_normal((B, D)).astype(np.float32),
        (rng.standard_normal((D, D)) / math.sqrt(D)).astype(np.float32),
        rng.standard_normal((B, T, H, E)).astype(np.float32),
        rng.integers(-5, 5, (B, T)).astype(np.int32),
    ]
    got = leaves(native.run(args))
    for g, p in zip(got, leaves(python.run(args)), strict=True):
        np.testing.assert_array_equal(g, p)
    want = leaves(evaluate(parse_module(text), args))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    # a token is an argmax: compare where the interpreter's maximum is not a near tie
    np.testing.assert_array_equal(got[1][:, trips:], args[2][:, trips:])
    np.testing.assert_array_equal(got[2][:, trips:], args[3][:, trips:])
    np.testing.assert_array_equal(got[2], want[2])


def greedy_decode(params, prompt, steps: int, heads: int = 2):
    """Greedy decoding with a KV cache in a lax.while_loop: one attention layer with heads
    (batched dots over batch and heads), an MLP, tied logits and an argmax per step."""
    emb, wqkv, wo, w1, w2 = params
    batch, start = prompt.shape
    width = emb.shape[1]
    dh = width // heads
    total = start + steps
    tokens = jnp.zeros((batch, total), jnp.int32).at[:, :start].set(prompt)
    cache = jnp.zeros((2, batch, heads, total, dh), emb.dtype)

    def body(state):
        t, tokens, cache = state
        x = emb[lax.dynamic_slice_in_dim(tokens, t, 1, axis=1)[:, 0]]
        q, k, v = jnp.moveaxis((x @ wqkv).reshape(batch, 3, heads, dh), 1, 0)
        kv = jnp.stack([k, v])[:, :, :, None, :]
        cache = lax.dynamic_update_slice(cache, kv, (0, 0, 0, t, 0))
        s = jnp.einsum("bhd,bhtd->bht", q, cache[0]) / math.sqrt(dh)
        s = jnp.where(jnp.arange(total) <= t, s, -1e30)
        ctx = jnp.einsum("bht,bhtd->bhd", jax.nn.softmax(s, axis=-1), cache[1])
        x = x + ctx.reshape(batch, width) @ wo
        x = x + jax.nn.gelu(x @ w1) @ w2
        nxt = jnp.argmax(x @ emb.T, axis=-1).astype(jnp.int32)
        written = lax.dynamic_update_slice(tokens, nxt[:, None], (0, t + 1))
        return t + 1, jnp.where(t + 1 < start, tokens, written), cache

    return lax.while_loop(lambda s: s[0] < total - 1, body, (0, tokens, cache))[1]


@pytest.mark.parametrize("steps", [0, 1, 6])
def test_jax_greedy_decoding_loop_is_native_and_matches_xla(steps):
    rng = np.random.default_rng(20261127 + steps)
    vocab, width, batch, start = 97, 16, 3, 4

    def w(*shape):
        return (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32)

    params = (w(vocab, width) * 4, w(width, 3 * width), w(width, width), w(width, 64), w(64, width))
    prompt = rng.integers(0, vocab, (batch, start)).astype(np.int32)
    fn = jax.jit(lambda p, x: greedy_decode(p, x, steps))
    text = fn.lower(params, prompt).as_text(dialect="hlo")
    native = compile_text(text)
    loops = while_thunks(native)
    assert loops and all(t.native is not None for t in loops), native.thunk_listing()
    assert not native.python_loops
    flat = [*params, prompt]
    (got,) = leaves(native.run(flat))
    (python,) = leaves(compile_text(text, native_loops=False).run(flat))
    np.testing.assert_array_equal(got, python)
    np.testing.assert_array_equal(got[:, :start], prompt)
    (want,) = leaves(evaluate(parse_module(text), flat))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, np.asarray(fn(params, prompt)))
