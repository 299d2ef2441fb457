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

    with pytest.raises(XlapyError, match="denormals must be one of"):
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


DOT = """HloModule dot_denormals
ENTRY e {
  a = f32[8,8] parameter(0)
  b = f32[8,8] parameter(1)
  ROOT r = f32[8,8] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}"""


@pytest.mark.parametrize("mode", ["flush", "ieee"])
def test_blas_dots_keep_subnormals_in_either_mode_as_documented(mode, kernel_cache):
    """docs/runtime.md: BLAS dots run in IEEE arithmetic whatever `denormals` says (XLA:CPU's
    Eigen dot flushes: a known difference, not a silent one)."""
    rng = np.random.default_rng(8)
    a = (rng.uniform(1, 2, (8, 8)) * 1e-20).astype(np.float32)
    b = (rng.uniform(1, 2, (8, 8)) * 1e-20).astype(np.float32)
    client = Client("cpu")
    exe = client.compile(DOT, CompileOptions.make(backend_options={"denormals": mode}))
    out = exe.execute([[client.buffer_from_pyval(a), client.buffer_from_pyval(b)]])[0][0]
    got = out.to_numpy()
    client.close()
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    assert np.all(want != 0) and np.all(np.abs(want) < np.finfo(np.float32).tiny)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=0)


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
