"""Stretches of the entry's thunks run as one native function each (lowering.native_run_plans,
runtime/control_flow_thunk.NativeRun): kernels, copies, single gemms and batched gemm lists
called in order with no Python between them. Programs of the outside transformer models'
kind (attention with batched head dots, a layer norm, an MLP training step with an Adam-like
update) on fresh random inputs: the same bits as the program run thunk by thunk
(`native_runs=False`), equal to the interpreter within tolerance, and timed thunk by thunk
under the profiler (test_cpu_program_image.py has one in a program image). Also the kernels
that may run in place through a reshape ([3,16] read where [3,16,1] is written)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.codegen.emitter import in_place_reason
from xlapy.backends.cpu.lowering import MIN_NATIVE_RUN, native_run_plans
from xlapy.backends.cpu.runtime.control_flow_thunk import NativeRun
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module
from xlapy.runtime.profiler import profile_program

pytestmark = pytest.mark.usefixtures("kernel_cache")


def _layernorm(x):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)


def attention_block(x, wqkv, wo):
    b, t, d = x.shape
    q, k, v = jnp.split(_layernorm(x) @ wqkv, 3, axis=-1)
    heads = lambda a: a.reshape(b, t, 2, d // 2)  # noqa: E731
    scores = jnp.einsum("bqhd,bkhd->bhqk", heads(q), heads(k)) / np.sqrt(d // 2)
    probs = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9))
    att = jnp.einsum("bhqk,bkhd->bqhd", probs, heads(v)).reshape(b, t, d)
    return x + jax.nn.gelu(att @ wo)


def adam_like_step(w1, w2, m1, m2, x):
    def loss(w1, w2):
        return jnp.mean(jnp.tanh(_layernorm(x @ w1)) @ w2) ** 2

    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
    m1, m2 = 0.9 * m1 + 0.1 * g1, 0.9 * m2 + 0.1 * g2
    return w1 - 1e-2 * m1 / (jnp.abs(m1) + 1e-4), w2 - 1e-2 * m2 / (jnp.abs(m2) + 1e-4), m1, m2


def _normal(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


PROGRAMS = {
    "attention_block": (
        attention_block,
        lambda rng: (
            _normal(rng, 3, 16, 32),
            _normal(rng, 32, 96, scale=0.2),
            _normal(rng, 32, 32, scale=0.2),
        ),
    ),
    "adam_like_step": (
        adam_like_step,
        lambda rng: (
            _normal(rng, 24, 40, scale=0.2),
            _normal(rng, 40, 8, scale=0.2),
            _normal(rng, 24, 40, scale=0.01),
            _normal(rng, 40, 8, scale=0.01),
            _normal(rng, 6, 24),
        ),
    ),
}


def _program(name: str):
    fn, make = PROGRAMS[name]
    args = make(np.random.default_rng(len(name)))
    text = jax.jit(fn).lower(*args).as_text(dialect="hlo")
    return text, list(args)


def _leaves(v) -> list[np.ndarray]:
    return [x for e in v for x in _leaves(e)] if isinstance(v, tuple) else [np.asarray(v)]


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_native_runs_give_the_same_bits_as_thunk_by_thunk(name):
    text, args = _program(name)
    native = CpuProgram(parse_module(text))
    python = CpuProgram(parse_module(text), {"native_runs": False})
    runs = [s for s in native.compiled.entry.steps or () if isinstance(s, NativeRun)]
    assert runs and all(len(r.thunks) >= MIN_NATIVE_RUN for r in runs)
    assert python.compiled.entry.steps is None
    assert "native runs" in native.compiled.thunk_listing()
    covered = sum(len(r.thunks) for r in runs)
    assert covered >= 0.8 * len(native.compiled.entry.thunks)  # kernels, gemms, gemm lists
    want = _leaves(evaluate(parse_module(text), args))
    for _ in range(2):  # the first run binds the tables
        got, same = _leaves(native.run(args)), _leaves(python.run(args))
        for g, s, w in zip(got, same, want, strict=True):
            np.testing.assert_array_equal(g, s)
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


def test_native_runs_cover_batched_dots():
    text, _ = _program("attention_block")
    program = CpuProgram(parse_module(text))
    listing = program.compiled.thunk_listing()
    assert "cblas gemm per batch item" in listing
    steps = [type(s).__name__ for r in native_run_plans(program.compiled.entry)
             for s in r.plan.plan.before]  # fmt: skip
    assert "LoopGemmList" in steps and "LoopGemm" in steps and "LoopCall" in steps


def test_profiler_times_every_thunk_of_a_native_run():
    text, args = _program("attention_block")
    program = CpuProgram(parse_module(text))
    rows = profile_program(program, args, runs=2).rows()
    assert {r.name for r in rows} == {t.instr.name for t in program.compiled.entry.thunks}
    assert all(r.calls == 2 for r in rows)


RESHAPED_IN_PLACE = """HloModule m
ENTRY e {
  p = f32[3,16] parameter(0)
  q = f32[3,16] parameter(1)
  r = f32[3,16,1] reshape(p)
  s = f32[3,16,1] reshape(q)
  ROOT o = f32[3,16,1] add(r, s)
}
"""

TRANSPOSED = """HloModule m
ENTRY e {
  p = f32[4,4] parameter(0)
  t = f32[4,4] transpose(p), dimensions={1,0}
  ROOT o = f32[4,4] negate(t)
}
"""


def test_in_place_through_a_reshape_but_not_a_transpose():
    assert in_place_reason(parse_module(RESHAPED_IN_PLACE).entry, 0, 0) is None
    assert in_place_reason(parse_module(TRANSPOSED).entry, 0, 0) is not None


def _deep_tanh_grad(ws, x):
    """jax.grad of a scan over layers of 256x256 dots: dots big enough to split over the
    cores keep both loops in Python (lowering.native_loop_plan says why)."""

    def loss(ws, x):
        def layer(c, w):
            c = jnp.tanh(c @ w) * 0.9 + 0.05 * c
            return c, jnp.sum(c * c)

        c, sums = jax.lax.scan(layer, x, ws)
        return jnp.sum(c * c) + jnp.sum(sums)

    return jax.grad(loss)(ws, x)


def test_loops_left_to_python_run_their_native_stretches_natively():
    rng = np.random.default_rng(61127)
    args = [_normal(rng, 3, 256, 256, scale=0.06), _normal(rng, 256, 256)]
    text = jax.jit(_deep_tanh_grad).lower(*args).as_text(dialect="hlo")
    native = CpuProgram(parse_module(text))
    python = CpuProgram(parse_module(text), {"native_runs": False})
    loops = [t for t in native.compiled.entry.thunks if t.kind == "while"]
    in_python = [w for w in loops if w.native is None]
    if not in_python:  # a one-thread pool: nothing splits, every loop is native
        assert native.python_loops == []
    runs = [s for w in in_python for s in w.body.steps or () if isinstance(s, NativeRun)]
    assert all(len(r.thunks) >= MIN_NATIVE_RUN for r in runs)
    assert runs or not in_python  # the forward body: a split dot, then a stretch of kernels
    for loop in python.compiled.entry.thunks:
        if loop.kind == "while":
            assert loop.body.steps is None
    want = evaluate(parse_module(text), args)
    for _ in range(2):  # the first run binds the tables
        got, same = native.run(args), python.run(args)
        np.testing.assert_array_equal(got, same)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
