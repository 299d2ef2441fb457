"""Subnormals: CPU kernels flush them to zero by default, as XLA:CPU does (checked against
jax.jit), keep them with backend option denormals="ieee", and leave the caller's
floating-point mode as they found it."""

import jax
import numpy as np
import pytest

from xlapy.runtime import Client, CompileOptions

TINY = np.float32(1e-40)  # a float32 subnormal

CASES = {
    "eq_zero": ("pred[64]", "compare(x, z), direction=EQ", lambda x: x == 0),
    "add_self": ("f32[64]", "add(x, x)", lambda x: x + x),
    "mul_two": ("f32[64]", "multiply(x, t)", lambda x: x * 2.0),
    "sub_normals": ("f32[64]", "subtract(n, m)", None),
}


def program(result: str, op: str) -> str:
    return f"""HloModule denormals
ENTRY e {{
  x = f32[64] parameter(0)
  c0 = f32[] constant(0)
  z = f32[64] broadcast(c0), dimensions={{}}
  c2 = f32[] constant(2)
  t = f32[64] broadcast(c2), dimensions={{}}
  c15 = f32[] constant(1.5e-38)
  n = f32[64] broadcast(c15), dimensions={{}}
  m = f32[64] multiply(x, t)
  ROOT r = {result} {op}
}}"""


def run(text, x, **backend):
    client = Client("cpu")
    exe = client.compile(text, CompileOptions.make(backend_options=backend))
    out = exe.execute([[client.buffer_from_pyval(x)]])[0][0].to_numpy()
    client.close()
    return out


@pytest.mark.parametrize("case", CASES)
def test_subnormals_are_flushed_like_xla(case, kernel_cache):
    result, op, reference = CASES[case]
    x = np.full(64, TINY)
    if case == "sub_normals":  # 1.5e-38 - 1.2e-38: a subnormal result
        x = np.full(64, np.float32(0.6e-38))
    got = run(program(result, op), x)
    if reference is not None:
        np.testing.assert_array_equal(got, np.asarray(jax.jit(reference)(x)))
    ieee = run(program(result, op), x, denormals="ieee")
    assert not np.array_equal(got, ieee)  # the two modes differ on every case


def test_flush_is_what_jax_jit_does(kernel_cache):
    assert bool(jax.jit(lambda x: x == 0)(TINY))
    got = run(program("pred[64]", "compare(x, z), direction=EQ"), np.full(64, TINY))
    assert got.all()


def test_the_callers_floating_point_mode_is_restored(kernel_cache):
    run(program("f32[64]", "add(x, x)"), np.full(64, TINY))
    client = Client("cpu")
    exe = client.compile(program("f32[64]", "add(x, x)"))
    buf = client.buffer_from_pyval(np.full(64, TINY))
    for _ in range(3):  # the later runs are inline, on this thread
        exe.execute([[buf]])[0][0].block_until_ready()
    client.close()
    tiny = 5e-324  # a float64 subnormal, computed by Python on this thread
    assert tiny * 1.0 != 0.0
    assert np.float32(1e-40) * np.float32(1.0) != 0


def test_bad_mode_is_an_error(kernel_cache):
    from xlapy.errors import XlapyError

    with pytest.raises(XlapyError, match=r"denormals.*one of flush, ieee"):
        run(program("f32[64]", "add(x, x)"), np.full(64, TINY), denormals="maybe")


SCATTER_ADD = """HloModule scatter_denormals
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY e {
  o = f32[8] parameter(0)
  i = s32[4,1] parameter(1)
  u = f32[4] parameter(2)
  ROOT r = f32[8] scatter(o, i, u), update_window_dims={}, inserted_window_dims={0},
    scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
}"""


def test_scatter_kernels_follow_the_denormals_option(kernel_cache):
    """Issue 16 item 7: the scatter kernel flushed subnormals whatever the option said. It
    flushes by default (as jax.jit's scatter does) and keeps them with denormals="ieee"."""
    rng = np.random.default_rng(7)
    operand = (rng.uniform(1, 2, 8) * 1e-39).astype(np.float32)  # subnormals
    index = np.array([[1], [3], [3], [6]], np.int32)
    updates = (rng.uniform(1, 2, 4) * 1e-40).astype(np.float32)

    def run_scatter(**backend):
        client = Client("cpu")
        exe = client.compile(SCATTER_ADD, CompileOptions.make(backend_options=backend))
        bufs = [client.buffer_from_pyval(a) for a in (operand, index, updates)]
        out = exe.execute([bufs])[0][0].to_numpy()
        client.close()
        return out

    on_xla = [jax.device_put(a, jax.devices("cpu")[0]) for a in (operand, updates)]
    want = jax.jit(lambda o, u: o.at[index[:, 0]].add(u))(*on_xla)  # XLA:CPU, not xlapy
    np.testing.assert_array_equal(run_scatter(), np.asarray(want))
    exact = operand.copy()
    np.add.at(exact, index[:, 0], updates)  # IEEE float32 arithmetic, subnormals kept
    np.testing.assert_array_equal(run_scatter(denormals="ieee"), exact)


def dot_program(t: str, lhs: str, rhs: str, out: str, dims: str) -> str:
    return f"""HloModule dot_denormals
ENTRY e {{
  a = {t}[{lhs}] parameter(0)
  b = {t}[{rhs}] parameter(1)
  ROOT r = {t}[{out}] dot(a, b), {dims}
}}"""


MATRIX = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
BATCHED = (
    "lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={1}"
)
FIRST = "lhs_contracting_dims={0}, rhs_contracting_dims={0}"
DOTS = {  # name: (element type, lhs, rhs, out, dims): planned gemm, matmul, split, complex
    "gemm_f32": ("f32", "8,8", "8,8", "8,8", MATRIX),
    "gemm_f64": ("f64", "8,8", "8,8", "8,8", MATRIX),
    "transposed_f32": ("f32", "8,6", "8,5", "6,5", FIRST),
    "batched_f32": ("f32", "3,8,8", "3,8,8", "3,8,8", BATCHED),
    "large_f32": ("f32", "256,256", "256,256", "256,256", MATRIX),
    "batched_large_f64": ("f64", "4,128,128", "4,128,128", "4,128,128", BATCHED),
    "complex64": ("c64", "8,8", "8,8", "8,8", MATRIX),
}
NP_TYPES = {"f32": np.float32, "f64": np.float64, "c64": np.complex64}


def dot_operands(t: str, lhs: str, rhs: str, kind: str, rng):
    """`kind` "tiny": normal operands whose products are subnormal; "subnormal": subnormal
    lhs times a large rhs (IEEE gives normal results, flushing gives 0)."""
    npt = NP_TYPES[t]
    real = np.float64 if t == "f64" else np.float32
    tiny = float(np.finfo(real).tiny)
    shape = lambda s: tuple(int(d) for d in s.split(","))  # noqa: E731
    draw = lambda s: rng.uniform(1, 2, shape(s))  # noqa: E731
    if kind == "tiny":
        a, b = draw(lhs) * np.sqrt(tiny) * 0.05, draw(rhs) * np.sqrt(tiny) * 0.05
    else:
        a, b = draw(lhs) * tiny * 0.5, draw(rhs) * 1e10
    if t == "c64":
        a, b = a * (0.6 + 0.8j), b * (0.8 - 0.6j)
    return a.astype(npt), b.astype(npt)


def on_xla(text_dims: str, a, b):
    import jax.numpy as jnp

    cpu = jax.devices("cpu")[0]
    lc, rc = (1, 0) if "={1}, rhs_contracting_dims={0}" in text_dims else (0, 0)
    if "batch" in text_dims:
        fn = lambda x, y: jnp.matmul(x, y)  # noqa: E731
    else:
        fn = lambda x, y: jnp.tensordot(x, y, axes=([lc], [rc]))  # noqa: E731
    with jax.enable_x64(a.dtype == np.float64):
        return np.asarray(jax.jit(fn)(jax.device_put(a, cpu), jax.device_put(b, cpu)))


@pytest.mark.parametrize("kind", ["tiny", "subnormal"])
@pytest.mark.parametrize("case", DOTS)
def test_dots_flush_subnormals_like_xla_and_keep_them_with_ieee(case, kind, kernel_cache):
    """Issue 16 (item 7, left over): BLAS dots kept subnormals whatever `denormals` said,
    while XLA:CPU's dots flush them. By default they flush (as jax.jit's dot), with
    denormals="ieee" they keep them (as float64 NumPy), on every dot path."""
    t, lhs, rhs, out, dims = DOTS[case]
    a, b = dot_operands(t, lhs, rhs, kind, np.random.default_rng(8))
    text = dot_program(t, lhs, rhs, out, dims)
    client = Client("cpu")
    got = {}
    for mode in ("flush", "ieee"):
        exe = client.compile(text, CompileOptions.make(backend_options={"denormals": mode}))
        for _ in range(2):  # the first run on the worker, the second inline on this thread
            ins = [client.buffer_from_pyval(a), client.buffer_from_pyval(b)]
            got[mode] = exe.execute([ins])[0][0].to_numpy()
    client.close()
    xla = on_xla(dims, a, b)
    assert np.all(xla == 0)  # XLA:CPU flushes
    np.testing.assert_array_equal(got["flush"], xla)
    wide = np.complex128 if t == "c64" else np.float64
    lc, rc = (0, 0) if "={0}, rhs_contracting_dims={0}" in dims else (-1, -2)
    exact = np.matmul(np.moveaxis(a, lc, -1).astype(wide), np.moveaxis(b, rc, -2).astype(wide))
    assert np.all(exact != 0)
    np.testing.assert_allclose(got["ieee"], exact.astype(a.dtype), rtol=2e-3, atol=0)
    # the caller's mode is restored after inline runs
    assert 5e-324 * 1.0 != 0.0


LOOP_DOT = """HloModule loop_dot
cond {
  cs = (s32[], f32[4,4], f32[4,4]) parameter(0)
  ci = s32[] get-tuple-element(cs), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(ci, n), direction=LT
}
body {
  bs = (s32[], f32[4,4], f32[4,4]) parameter(0)
  bi = s32[] get-tuple-element(bs), index=0
  bx = f32[4,4] get-tuple-element(bs), index=1
  bw = f32[4,4] get-tuple-element(bs), index=2
  one = s32[] constant(1)
  j = s32[] add(bi, one)
  by = f32[4,4] dot(bx, bw), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (s32[], f32[4,4], f32[4,4]) tuple(j, by, bw)
}
ENTRY e {
  x = f32[4,4] parameter(0)
  w = f32[4,4] parameter(1)
  z = s32[] constant(0)
  s = (s32[], f32[4,4], f32[4,4]) tuple(z, x, w)
  r = (s32[], f32[4,4], f32[4,4]) while(s), condition=cond, body=body
  ROOT y = f32[4,4] get-tuple-element(r), index=1
}"""


def test_dots_in_native_loops_flush_too(kernel_cache):
    """A small dot in a while loop runs as a gemm call inside the loop's native code: it
    flushes like the others (x @ w three times: 1e-13 -> ~1e-39, subnormal)."""
    rng = np.random.default_rng(9)
    x = (rng.uniform(1, 2, (4, 4)) * 1e-13).astype(np.float32)
    w = (rng.uniform(1, 2, (4, 4)) * 5e-10).astype(np.float32)
    client = Client("cpu")
    got = {}
    for mode in ("flush", "ieee"):
        exe = client.compile(LOOP_DOT, CompileOptions.make(backend_options={"denormals": mode}))
        loops = [t for t in exe.backend_program().compiled.entry.thunks if t.kind == "while"]
        assert [w.native is not None for w in loops] == [True]  # the gemm runs in native code
        got[mode] = exe.execute([[client.buffer_from_pyval(x), client.buffer_from_pyval(w)]])
        got[mode] = got[mode][0][0].to_numpy()
    client.close()
    exact = x.astype(np.float64)
    for _ in range(3):
        exact = (exact @ w.astype(np.float64)).astype(np.float32).astype(np.float64)
    assert np.all(exact != 0) and np.all(np.abs(exact) < np.finfo(np.float32).tiny)
    np.testing.assert_array_equal(got["flush"], np.zeros((4, 4), np.float32))
    np.testing.assert_allclose(got["ieee"], exact, rtol=1e-2, atol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sort_comparator_reads_subnormals_as_zero(dtype, kernel_cache):
    """JAX's stable argsort with subnormals: XLA:CPU's comparator reads them as zero, so
    they tie with both zeros and keep their input order; the values sorted keep their bits."""
    rng = np.random.default_rng(21)
    tiny = np.finfo(dtype).smallest_normal / 4
    x = rng.standard_normal(48).astype(dtype)
    x[rng.choice(48, 8, replace=False)] = [0.0, -0.0, tiny, -tiny, 2 * tiny, -3 * tiny, 0.0, tiny]
    fn = jax.jit(lambda v: jax.numpy.argsort(v, stable=True))
    with jax.enable_x64(dtype == np.float64):
        text = fn.lower(x).as_text(dialect="hlo")
        want = np.asarray(fn(x))
    client = Client("cpu")
    exe = client.compile(text)
    got = exe.execute([[client.buffer_from_pyval(x)]])[0][0].to_numpy()
    np.testing.assert_array_equal(got, want)
    ieee = client.compile(text, CompileOptions.make(backend_options={"denormals": "ieee"}))
    kept = ieee.execute([[client.buffer_from_pyval(x)]])[0][0].to_numpy()
    np.testing.assert_array_equal(kept, np.argsort(x, kind="stable"))  # IEEE order
    assert not np.array_equal(kept, got)
    client.close()
