"""Prefix scans on the CPU backend (window_thunk): forward and reverse, one-ufunc reducers
and lifted reducers (cumlogsumexp), against the interpreter and XLA:CPU, and no fallback."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xlapy
from xlapy.backends.interpreter import evaluate

CASES = {
    "cumsum": lambda x: jnp.cumsum(x, axis=1),
    "cumsum_reverse": lambda x: jax.lax.cumsum(x, axis=1, reverse=True),
    "cumsum_reverse_axis0": lambda x: jax.lax.cumsum(x, axis=0, reverse=True),
    "cummax_reverse": lambda x: jax.lax.cummax(x, axis=1, reverse=True),
    "cummin": lambda x: jax.lax.cummin(x, axis=0),
    "cumprod_reverse": lambda x: jax.lax.cumprod(1 + x / 8, axis=1, reverse=True),
    "cumlogsumexp": lambda x: jax.lax.cumlogsumexp(x, axis=1),
    "cumlogsumexp_reverse": lambda x: jax.lax.cumlogsumexp(x, axis=0, reverse=True),
    "cumsum_grad": jax.grad(lambda x: jnp.sum(jnp.cumsum(x, axis=1) ** 2)),
    "int_cumsum_reverse": lambda x: jax.lax.cumsum((x * 10).astype(jnp.int32), 1, reverse=True),
}


@pytest.mark.parametrize("shape", [(3, 7), (1, 1), (4, 67)])
@pytest.mark.parametrize("name", sorted(CASES))
def test_scan_matches_interpreter_and_xla(name, shape):
    fn = CASES[name]
    x = np.random.default_rng(hash((name, shape)) % 2**32).standard_normal(shape)
    x = x.astype(np.float32)
    text = jax.jit(fn).lower(x).as_text()
    module = xlapy.load(text)
    client = xlapy.Client("cpu")
    executable = client.compile(text)
    assert not executable._programs[executable._devices[0].id].fallbacks
    ((out,),) = executable.execute([[client.buffer_from_pyval(x)]])
    got = np.asarray(out)
    want = np.asarray(evaluate(module, [x]))
    xla = np.asarray(jax.jit(fn)(jax.device_put(x, jax.devices("cpu")[0])))
    if got.dtype.kind in "iu" or "max" in name or "min" in name:
        np.testing.assert_array_equal(got, want)  # exact: no rounding involved
        np.testing.assert_array_equal(got, xla)
    else:
        scale = float(np.max(np.abs(want))) + 1.0
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * scale)
        np.testing.assert_allclose(got, xla, rtol=1e-5, atol=1e-6 * scale)
