"""reduce-window-rewriter: prefix-scan reduce-windows against the interpreter's window rule,
through JAX's own lowerings (cumsum, cumprod, cummax, cummin, cumlogsumexp, reverse, the
gradient of cumsum), variadic reducers, and windows that are not scans (left alone)."""

# ruff: noqa: E501  (HLO lines read best one per line)

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from xlapy.backends.interpreter import evaluate
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.verifier import verify
from xlapy.passes.scan_rewriter import ReduceWindowRewriter

WINDOW = """HloModule m
red {
  a = %(t)s[] parameter(0)
  b = %(t)s[] parameter(1)
  ROOT c = %(t)s[] %(op)s(a, b)
}
ENTRY e {
  x = %(t)s[%(dims)s] parameter(0)
  z = %(t)s[] constant(%(init)s)
  ROOT r = %(t)s[%(out)s] reduce-window(x, z), window={size=%(size)s pad=%(pad)s}, to_apply=red
}
"""

INITS = {"add": "0", "multiply": "1", "maximum": "-inf", "minimum": "inf"}
INT_INITS = {"add": "0", "multiply": "1", "maximum": "-2147483648", "minimum": "2147483647"}


def window_module(t, op, dims, axis, low, high, init=None):
    n = dims[axis]
    out = list(dims)
    out[axis] = n + low + high - n + 1
    size = "x".join(str(n if a == axis else 1) for a in range(len(dims)))
    pad = "x".join(f"{low}_{high}" if a == axis else "0_0" for a in range(len(dims)))
    if init is None:
        init = (INT_INITS if t.startswith("s") else INITS)[op]
    text = WINDOW % dict(
        t=t,
        op=op,
        dims=",".join(map(str, dims)),
        out=",".join(map(str, out)),
        size=size,
        pad=pad,
        init=init,
    )
    return parse_module(text)


def random_input(rng, t, dims, op):
    if t.startswith("s"):
        hi = 3 if op == "multiply" else 1000
        return rng.integers(-hi, hi, dims).astype(np.int32)
    dtype = {"f32": np.float32, "f64": np.float64}[t]
    if op == "multiply":
        return (1 + 0.05 * rng.standard_normal(dims)).astype(dtype)
    return rng.standard_normal(dims).astype(dtype)


def rewrite(module, block=8):
    p = ReduceWindowRewriter(block)
    changed = p.run(module)
    verify(module)
    assert not any(i.opcode is Opcode.REDUCE_WINDOW for i in module.entry.instructions)
    return changed, p


def check_close(got, want, x, t):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    if t.startswith("s"):
        np.testing.assert_array_equal(got, want)
        return
    # re-associated sums differ by rounding only: bound by the sum of magnitudes
    eps = np.finfo(got.dtype).eps
    finite = np.abs(want[np.isfinite(want)])
    scale = np.sum(np.abs(x)) + np.max(finite, initial=1.0)
    np.testing.assert_allclose(got, want, rtol=64 * eps, atol=64 * eps * scale)


CASES = [
    # (type, op, dims, axis)
    ("f32", "add", (1000,), 0),
    ("f32", "add", (3, 37, 2), 1),
    ("f32", "add", (9, 4), 0),
    ("f64", "add", (5, 129), 1),
    ("f32", "multiply", (4, 70), 1),
    ("f32", "maximum", (2, 3, 65), 2),
    ("f32", "minimum", (64, 3), 0),
    ("s32", "add", (4, 300), 1),
    ("s32", "multiply", (2, 33), 1),
    ("s32", "maximum", (17, 5), 0),
    ("s32", "minimum", (3, 2, 11), 1),
    ("f32", "add", (2, 2), 1),
    ("f32", "add", (3, 8), 1),
    ("f32", "add", (3, 9), 1),
]


@pytest.mark.parametrize("form", ["forward", "reverse", "exclusive", "reverse-exclusive"])
@pytest.mark.parametrize(("t", "op", "dims", "axis"), CASES)
def test_scan_matches_window_rule(t, op, dims, axis, form):
    n = dims[axis]
    low, high = {
        "forward": (n - 1, 0),
        "reverse": (0, n - 1),
        "exclusive": (n, 0),
        "reverse-exclusive": (0, n),
    }[form]
    module = window_module(t, op, dims, axis, low, high)
    rng = np.random.default_rng(abs(hash((t, op, dims, form))) % 2**32)
    x = random_input(rng, t, dims, op)
    want = evaluate(module, [x])
    changed, p = rewrite(module)
    assert changed and p.rewritten == 1
    check_close(evaluate(module, [x]), want, x, t)
    assert not ReduceWindowRewriter().run(module)


@pytest.mark.parametrize("block", [2, 3, 16])
def test_block_lengths_and_recursion(block):
    module = window_module("f32", "add", (2, 301), 1, 300, 0)
    x = np.random.default_rng(block).standard_normal((2, 301)).astype(np.float32)
    want = evaluate(module, [x])
    rewrite(module, block)
    check_close(evaluate(module, [x]), want, x, "f32")


def test_not_a_scan_is_left_alone():
    pooling = """HloModule m
mx {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] maximum(a, b)
}
ENTRY e {
  x = f32[8,8] parameter(0)
  z = f32[] constant(-inf)
  pool = f32[4,4] reduce-window(x, z), window={size=2x2 stride=2x2}, to_apply=mx
  short = f32[8,8] reduce-window(x, z), window={size=1x3 pad=0_0x2_0}, to_apply=mx
  two = f32[8,8] reduce-window(x, z), window={size=8x8 pad=7_0x7_0}, to_apply=mx
  ROOT t = (f32[4,4], f32[8,8], f32[8,8]) tuple(pool, short, two)
}
"""
    module = parse_module(pooling)
    assert not ReduceWindowRewriter().run(module)


@pytest.mark.parametrize("init", ["1", "2"])
def test_init_that_is_not_an_identity_is_left_alone(init):
    module = window_module("f32", "add", (4, 10), 1, 9, 0, init=init)
    assert not ReduceWindowRewriter().run(module)


def test_init_from_a_parameter_is_left_alone():
    text = """HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY e {
  x = f32[10] parameter(0)
  z = f32[] parameter(1)
  ROOT r = f32[10] reduce-window(x, z), window={size=10 pad=9_0}, to_apply=add
}
"""
    assert not ReduceWindowRewriter().run(parse_module(text))


def test_variadic_running_max_with_index():
    # (value, index) running max, ties to the lower index: associative, not commutative.
    text = """HloModule m
argmax {
  va = f32[] parameter(0)
  ia = s32[] parameter(1)
  vb = f32[] parameter(2)
  ib = s32[] parameter(3)
  gt = pred[] compare(vb, va), direction=GT
  v = f32[] select(gt, vb, va)
  i = s32[] select(gt, ib, ia)
  ROOT t = (f32[], s32[]) tuple(v, i)
}
ENTRY e {
  x = f32[3,50] parameter(0)
  k = s32[3,50] iota(), iota_dimension=1
  lo = f32[] constant(-inf)
  zero = s32[] constant(0)
  ROOT r = (f32[3,50], s32[3,50]) reduce-window(x, k, lo, zero), window={size=1x50 pad=0_0x49_0}, to_apply=argmax
}
"""
    module = parse_module(text)
    x = np.random.default_rng(3).integers(-5, 5, (3, 50)).astype(np.float32)
    want = evaluate(module, [x])
    rewrite(module)
    got = evaluate(module, [x])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def jax_hlo(fn, *args) -> str:
    return jax.jit(fn).lower(*args).as_text(dialect="hlo")


JAX_SCANS = {
    "cumsum": lambda x: jnp.cumsum(x, axis=1),
    "cumsum_axis0": lambda x: jnp.cumsum(x, axis=0),
    "cumsum_reverse": lambda x: lax.cumsum(x, axis=1, reverse=True),
    "cumprod": lambda x: jnp.cumprod(1 + 0.01 * x, axis=1),
    "cummax": lambda x: lax.cummax(x, axis=1),
    "cummin_reverse": lambda x: lax.cummin(x, axis=0, reverse=True),
    "cumlogsumexp": lambda x: lax.cumlogsumexp(x, axis=1),
    "cumsum_int": lambda x: jnp.cumsum((100 * x).astype(jnp.int32), axis=1),
    "cumsum_grad": jax.grad(lambda x: jnp.sum(jnp.cumsum(x, axis=1) ** 2)),
}


@pytest.mark.parametrize("shape", [(5, 1), (3, 7), (4, 67)])
@pytest.mark.parametrize("name", sorted(JAX_SCANS))
def test_jax_scans_against_jax(name, shape):
    from xlapy.passes.pipelines import build

    fn = JAX_SCANS[name]
    x = np.random.default_rng(len(name) * 31 + shape[1]).standard_normal(shape).astype(np.float32)
    module = parse_module(jax_hlo(fn, x))
    want_interp = evaluate(module, [x])
    build("t", ["call-inliner", "reduce-window-rewriter", "dce"]).run(module)
    left = any(i.opcode is Opcode.REDUCE_WINDOW for i in module.entry.instructions)
    assert not left or 1 in shape  # only a scan of one element is left as it is
    got = evaluate(module, [x])
    want_jax = np.asarray(jax.jit(fn)(x))
    if want_jax.dtype.kind == "i":
        np.testing.assert_array_equal(got, want_jax)
        np.testing.assert_array_equal(got, want_interp)
        return
    check_close(got, want_interp, x, "f32")
    np.testing.assert_allclose(got, want_jax, rtol=1e-5, atol=1e-5 * np.sum(np.abs(x)))


def test_cpu_backend_reverse_cumsum_matches_jax():
    from xlapy.runtime.client import Client

    fn = JAX_SCANS["cumsum_reverse"]
    x = np.random.default_rng(9).standard_normal((6, 300)).astype(np.float32)
    client = Client("cpu")
    exe = client.compile(jax_hlo(fn, x))
    (out,) = exe.execute([[client.buffer_from_pyval(x)]])[0]
    want = np.asarray(jax.jit(fn)(x))
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-5, atol=1e-4)
