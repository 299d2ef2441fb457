"""Regression tests for failures found by running JAX's own test files on xlapy
(benchmarks/jax_suite.py), sixth session: each runs the JAX program on "cpu" and on "xlapy"
in one process and compares."""

import mmap

import jax
import jax.numpy as jnp
import numpy as np

from xlapy.backends.cpu.runtime.host_memory import MAPPED_BYTES, empty_bytes

XLAPY = jax.devices("xlapy")[0]
CPU = jax.devices("cpu")[0]


def run_both(fn, *args):
    """fn jitted on cpu and on xlapy with the same host arguments; both results (host)."""
    results = []
    for device in (CPU, XLAPY):
        out = jax.jit(fn)(*jax.device_put(args, device))
        results.append(jax.tree_util.tree_map(np.asarray, out))
    return results


def test_large_buffers_are_plain_mappings_and_small_ones_numpy_arrays():
    small = empty_bytes(1000)
    assert small.dtype == np.uint8 and small.shape == (1000,) and small.flags.writeable
    assert small.base is None  # NumPy's own allocation
    large = empty_bytes(MAPPED_BYTES + 12345)
    assert large.shape == (MAPPED_BYTES + 12345,) and large.flags.writeable
    assert isinstance(large.base, memoryview) and isinstance(large.base.obj, mmap.mmap)
    values = np.random.default_rng(1).integers(0, 256, large.size, dtype=np.uint8)
    large[:] = values
    np.testing.assert_array_equal(large.view(np.uint8), values)


def test_big_rng_program_on_mapped_arenas_matches_cpu_bit_for_bit():
    """JAX's random_lax_test testBernoulliSmallProbabilty draws 1e8 samples; a smaller draw
    whose threefry temporaries and outputs (tens of MB) live in mapped memory must give the
    cpu's exact bits."""
    n = 3_000_000
    key = jax.random.key(7)

    def draw(k):
        u = jax.random.uniform(k, (n,), jnp.float32)
        b = jax.random.bernoulli(k, p=jnp.float32(0.3), shape=(n,), mode="high")
        return u, b, jnp.sum(b)

    want, got = run_both(draw, key)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_array_equal(g, w)
    assert 0.29 * n < int(got[2]) < 0.31 * n
