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
