"""While loops that run as one native function (codegen/emit_loop.py): JAX loop programs
(fori_loop, scan, data-dependent while, nested loops, mixed-dtype tuple carries, zero-trip
loops) on fresh random inputs, bit-equal to the same program with its loops in Python, equal
to the interpreter (integers exactly, floats within the native math's last-bit slack) and
close to XLA."""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from xlapy.backends.cpu import CpuBackend
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.runtime.control_flow_thunk import NativeLoop, WhileThunk
from xlapy.backends.cpu.runtime.thunk import ThunkSequence
from xlapy.backends.interpreter import evaluate
from xlapy.errors import XlapyError
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("kernel_cache")


def while_thunks(seq: ThunkSequence) -> list[WhileThunk]:
    found = []
    for t in seq.thunks:
        if isinstance(t, WhileThunk):
            found += [t, *while_thunks(t.condition), *while_thunks(t.body)]
        for nested in getattr(t, "branches", ()):
            found += while_thunks(nested)
    return found


def leaves(v) -> list[np.ndarray]:
    return [x for e in v for x in leaves(e)] if isinstance(v, tuple) else [np.asarray(v)]


def fori_tiny(x):
    return lax.fori_loop(0, 37, lambda i, v: v * 0.999 + jnp.sin(v), x)


def scan_rows(x):
    def step(c, row):
        c = jnp.tanh(c + row)
        return c, c * 2.0

    return lax.scan(step, jnp.zeros_like(x[0]), x)


def collatz_steps(x):
    def cond(s):
        return jnp.any(s[0] != 1)

    def body(s):
        v, n = s
        nxt = jnp.where(v % 2 == 0, v // 2, 3 * v + 1)
        return jnp.where(v == 1, v, nxt), n + (v != 1).astype(jnp.int32)

    return lax.while_loop(cond, body, (x, jnp.zeros_like(x)))


def nested(x):
    def outer(i, v):
        inner = lax.fori_loop(0, 5, lambda j, w: w * 0.5 + jnp.cos(w + j.astype(w.dtype)), v)
        return inner + i.astype(v.dtype)

    return lax.fori_loop(0, 4, outer, x)


def mixed_carry(x, k, h):
    def body(i, s):
        a, b, c, flag = s
        return (
            a + i,
            b * 0.75 + jnp.float32(0.25) * jnp.sin(b),
            (c ^ (c >> 1)) + jnp.int16(3),
            jnp.logical_xor(flag, a % 3 == 0),
        )

    return lax.fori_loop(0, 23, body, (k, x, h, jnp.array(True)))


def zero_trip(x, n):
    def cond(s):
        return s[0] < n

    return lax.while_loop(cond, lambda s: (s[0] + 1, jnp.exp(s[1])), (jnp.int32(0), x))


def dus_rows(x):
    def body(i, buf):
        return lax.dynamic_update_slice(buf, jnp.sin(x + i.astype(x.dtype))[None], (i, 0))

    return lax.fori_loop(0, 12, body, jnp.zeros((12, x.shape[0]), x.dtype))


def rnn(w, x):
    return lax.fori_loop(0, 6, lambda i, h: jnp.tanh(h @ w + x[i % 4]), x)


def lstm_grad(params, xs):
    def loss(params, xs):
        wx, wh = params

        def cell(carry, x):
            h, c = carry
            i, f, g, o = jnp.split(x @ wx + h @ wh, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h

        zeros = jnp.zeros((xs.shape[1], wh.shape[0]), xs.dtype)
        return jnp.mean(lax.scan(cell, (zeros, zeros), xs)[1] ** 2)

    return jax.value_and_grad(loss)(params, xs)


def branchy(x):
    def body(i, v):
        v = lax.cond(jnp.sum(v) > 0, lambda u: u * 0.5 - 1.0, lambda u: jnp.cos(u) + 0.25, v)
        return lax.switch(i % 3, [jnp.sin, lambda u: u + 1.0, lambda u: u * -0.75], v)

    return lax.fori_loop(0, 11, body, x)


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


CASES = {
    "fori_tiny": (fori_tiny, lambda r: (f32(r, 8),)),
    "scan_rows": (scan_rows, lambda r: (f32(r, 9, 6),)),
    "collatz": (collatz_steps, lambda r: (r.integers(1, 200, 16).astype(np.int32),)),
    "nested": (nested, lambda r: (f32(r, 5),)),
    "mixed_carry": (
        mixed_carry,
        lambda r: (
            f32(r, 4),
            np.int32(r.integers(-50, 50)),
            r.integers(-1000, 1000, 3).astype(np.int16),
        ),
    ),
    "zero_trip": (zero_trip, lambda r: (f32(r, 3), np.int32(0))),
    "some_trips": (zero_trip, lambda r: (f32(r, 3) * 0.1, np.int32(2))),
    "dus_rows": (dus_rows, lambda r: (f32(r, 7),)),
    "conditionals": (branchy, lambda r: (f32(r, 6),)),
    "rnn_gemm": (rnn, lambda r: (f32(r, 16, 16) * 0.25, f32(r, 4, 16))),
    "lstm_grad": (
        lstm_grad,
        lambda r: ((f32(r, 6, 32) * 0.3, f32(r, 8, 32) * 0.3), f32(r, 5, 3, 6)),
    ),
}


def lowered(fn, args) -> str:
    return jax.jit(fn).lower(*args).as_text(dialect="hlo")


def compile_text(text: str, **options) -> CpuProgram:
    return CpuBackend().compile(parse_module(text), options)


@pytest.mark.parametrize("name", list(CASES))
def test_native_loop_matches_python_loop_interpreter_and_xla(name):
    fn, make = CASES[name]
    args = make(np.random.default_rng(zlib.crc32(name.encode())))
    text = lowered(fn, args)
    native = compile_text(text)
    loops = while_thunks(native.compiled.entry)
    assert loops and all(w.native is not None for w in loops), native.thunk_listing()
    assert "(native loop)" in native.thunk_listing()
    python = compile_text(text, native_loops=False)
    assert all(w.native is None for w in while_thunks(python.compiled.entry))

    flat = [np.asarray(a) for a in jax.tree_util.tree_leaves(args)]
    got = leaves(native.run(flat))
    for g, p in zip(got, leaves(python.run(flat)), strict=True):
        np.testing.assert_array_equal(g, p)  # the same kernels in the same order
    want = leaves(evaluate(parse_module(text), flat))
    xla = [np.asarray(x) for x in jax.tree_util.tree_leaves(jax.jit(fn)(*args))]
    assert len(got) == len(want) == len(xla)
    for g, w, x in zip(got, want, xla, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        if g.dtype.kind == "f":  # native sine/exp may differ from NumPy's in the last bit
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(g, x, rtol=1e-4, atol=1e-5)
        else:
            np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(g, x)


def test_nested_native_loops_call_each_other():
    args = (f32(np.random.default_rng(3), 5),)
    program = compile_text(lowered(nested, args))
    loops = while_thunks(program.compiled.entry)
    assert len(loops) == 2 and all(w.native is not None for w in loops)


def test_native_loop_respects_max_while_iterations():
    rng = np.random.default_rng(5)
    text = lowered(zero_trip, (f32(rng, 3), np.int32(0)))
    program = compile_text(text, max_while_iterations=3)
    assert all(w.native is not None for w in while_thunks(program.compiled.entry))
    x = f32(rng, 3) * 0.1
    program.run([x, np.array(3, np.int32)])
    with pytest.raises(XlapyError, match="ran past 3 iterations"):
        program.run([x, np.array(4, np.int32)])


def test_nested_native_loop_limit_reaches_the_inner_loop():
    args = (f32(np.random.default_rng(4), 5),)
    program = compile_text(lowered(nested, args), max_while_iterations=4)
    with pytest.raises(XlapyError, match="ran past 4 iterations"):
        program.run([np.asarray(args[0])])  # the inner loop runs 5 times


def test_loop_with_a_mid_sized_dot_is_native_with_one_blas_thread():
    """A dot above OpenBLAS's own one-thread size but below the split size (72^3 x2 flops)
    is a gemm the native loop calls itself, with OpenBLAS limited to the calling thread
    around the loop, as the runtime does around the dot."""
    rng = np.random.default_rng(6)
    args = (f32(rng, 72, 72) * 0.1, f32(rng, 72, 72))
    text = lowered(rnn, args)
    program = compile_text(text)
    (loop,) = while_thunks(program.compiled.entry)
    assert loop.native is not None and loop.native.thread_setter is not None
    assert program.python_loops == []
    inputs = [np.asarray(a) for a in args]
    want = evaluate(parse_module(text), inputs)
    np.testing.assert_allclose(program.run(inputs), want, rtol=1e-5, atol=1e-6)
    in_python = compile_text(text, native_loops=False)
    np.testing.assert_array_equal(program.run(inputs), in_python.run(inputs))
    assert [str(f) for f in in_python.python_loops] == [
        f"{loop.instr.name} (while): native_loops=False"
    ]


def test_loop_with_a_dot_that_may_split_stays_in_python_and_says_why():
    rng = np.random.default_rng(7)
    args = (f32(rng, 256, 256) * 0.05, f32(rng, 256, 256))  # 2 * 256^3 flops: may split
    text = lowered(rnn, args)
    program = compile_text(text)
    (loop,) = while_thunks(program.compiled.entry)
    dots = [t for t in loop.body.thunks if t.kind == "blas"]
    assert len(dots) == 1
    if dots[0].split_choice is None:  # a one-thread pool: nothing splits, the loop is native
        assert loop.native is not None and program.python_loops == []
    else:
        assert loop.native is None
        (why,) = program.python_loops
        assert why.name == loop.instr.name and dots[0].instr.name in why.reason
        assert "not one cblas gemm or gemm list run whole" in why.reason
    inputs = [np.asarray(a) for a in args]
    want = evaluate(parse_module(text), inputs)
    np.testing.assert_allclose(program.run(inputs), want, rtol=1e-4, atol=1e-5)


def test_native_loop_resumes_between_rounds(monkeypatch):
    """A loop run in rounds of a few iterations (as it is in rounds of ROUND, so that Ctrl-C
    reaches Python) gives the same bits and still honours max_while_iterations."""
    rng = np.random.default_rng(7)
    args = (f32(rng, 5),)
    text = lowered(nested, args)
    whole = compile_text(text).run([np.asarray(args[0])])
    monkeypatch.setattr(NativeLoop, "ROUND", 3)
    program = compile_text(text)
    np.testing.assert_array_equal(program.run([np.asarray(args[0])]), whole)
    text = lowered(zero_trip, (f32(rng, 3), np.int32(0)))
    program = compile_text(text, max_while_iterations=7)
    x = f32(rng, 3) * 0.01
    program.run([x, np.array(7, np.int32)])
    with pytest.raises(XlapyError, match="ran past 7 iterations"):
        program.run([x, np.array(8, np.int32)])


SWITCH_ANY_INDEX = """HloModule switch_any_index
b0 {
  p = f32[4] parameter(0)
  ROOT r = f32[4] sine(p)
}
b1 {
  p = f32[4] parameter(0)
  c = f32[] constant(0.5)
  h = f32[4] broadcast(c), dimensions={}
  ROOT r = f32[4] add(p, h)
}
b2 {
  p = f32[4] parameter(0)
  ROOT r = f32[4] negate(p)
}
cond {
  s = (s32[], s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(9)
  ROOT lt = pred[] compare(i, n), direction=LT
}
body {
  s = (s32[], s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  k = s32[] get-tuple-element(s), index=1
  x = f32[4] get-tuple-element(s), index=2
  y = f32[4] conditional(k, x, x, x), branch_computations={b0, b1, b2}
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  k1 = s32[] add(k, one)
  ROOT t = (s32[], s32[], f32[4]) tuple(i1, k1, y)
}
ENTRY e {
  k = s32[] parameter(0)
  x = f32[4] parameter(1)
  zero = s32[] constant(0)
  init = (s32[], s32[], f32[4]) tuple(zero, k, x)
  w = (s32[], s32[], f32[4]) while(init), condition=cond, body=body
  ROOT r = f32[4] get-tuple-element(w), index=2
}"""


@pytest.mark.parametrize("start", [-5, 0, 1, 2])
def test_native_switch_with_out_of_range_indices_runs_the_last_branch(start):
    """Indices walk from `start` through negatives, 0..2 and past the end: outside [0, 3)
    the last branch runs, as XLA's conditional does."""
    program = compile_text(SWITCH_ANY_INDEX)
    assert all(w.native is not None for w in while_thunks(program.compiled.entry))
    x = f32(np.random.default_rng(start + 10), 4)
    args = [np.array(start, np.int32), x]
    got = program.run(args)
    np.testing.assert_array_equal(got, compile_text(SWITCH_ANY_INDEX, native_loops=False).run(args))
    want = evaluate(parse_module(SWITCH_ANY_INDEX), args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_loop_whose_kernel_may_split_runs_it_on_the_native_pool():
    """A body kernel big enough to split over the cores: the loop is still one native
    function, which hands that kernel to the native pool's parallel-for (in the runtime's
    number of blocks); the results equal the Python-driven loop's bit for bit."""
    from xlapy.backends.cpu.lowering import native_loop_plan
    from xlapy.backends.cpu.runtime.native_pool import native_pool

    rng = np.random.default_rng(8)
    x = f32(rng, 3, 40000)  # 120,000 elements a kernel
    text = lowered(fori_tiny, (x,))
    program = compile_text(text)
    (loop,) = while_thunks(program.compiled.entry)
    split = [t for t in loop.body.thunks if getattr(t, "split_choice", None) is not None]
    assert loop.native is not None and program.python_loops == []
    plan = native_loop_plan(loop)
    assert not isinstance(plan, str)
    blocks = [s.blocks for s in plan.plan.after if hasattr(s, "blocks")]
    if split and native_pool() is not None:  # a machine with several cores
        assert max(blocks) == split[0].chunks > 1
    else:
        assert blocks and set(blocks) == {1}
    got = program.run([x])
    np.testing.assert_array_equal(got, compile_text(text, native_loops=False).run([x]))
    np.testing.assert_allclose(got, evaluate(parse_module(text), [x]), rtol=1e-5, atol=1e-5)
