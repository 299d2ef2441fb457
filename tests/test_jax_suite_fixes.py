"""Regression tests for failures found by running JAX's own test files on xlapy
(benchmarks/jax_suite.py), sixth session: each runs the JAX program on "cpu" and on "xlapy"
in one process and compares."""

import mmap
import warnings

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


def test_perturbed_tridiagonal_solve_runs_jaxlibs_handler():
    """eigh_test (QDWH eigh's inverse iteration): `tridiagonal_solve_perturbed_ffi`, jaxlib's
    one LAPACK-family target not named lapack_*, had no handler on xlapy."""
    from jax._src.lax import linalg

    rng = np.random.default_rng(3)
    solve = jax.jit(lambda *a: linalg.tridiagonal_solve_p.bind(*a, perturb_singular=True))
    for dtype in (np.float32, np.float64, np.complex64):
        for batch in ((), (3,)):
            parts = [rng.standard_normal((*batch, 6, k)) for k in (1, 1, 1, 2)]
            if dtype is np.complex64:
                parts = [p + 1j * rng.standard_normal(p.shape) for p in parts]
            dl, d, du, b = [p.astype(dtype) for p in parts]
            dl, d, du = dl[..., 0], d[..., 0], du[..., 0]
            d[..., 2] = 0  # a zero pivot: the perturbed solve's reason to exist
            want, got = (
                np.asarray(solve(*jax.device_put((dl, d, du, b), dev))) for dev in (CPU, XLAPY)
            )
            np.testing.assert_array_equal(got, want)
            assert np.all(np.isfinite(got))


def test_a_program_of_eleven_parameters_keeps_its_native_execute():
    """nn_test testSquareplusGrad (order-4 derivatives: 11 parameters): the native Execute's
    LLVM IR named argument 1's check %ok1 + "0" and argument 10's %ok + "10" alike, so it
    failed to build (a warning, an error under JAX's pytest settings)."""
    values = np.random.default_rng(5).standard_normal(12).astype(np.float32)

    def weighted(*xs):
        return sum(x * (i + 1) for i, x in enumerate(xs))

    for n in (10, 11, 12):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            want, got = run_both(weighted, *values[:n])
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_complex_constants_with_nan_and_inf_parts_match_cpu():
    """linalg_test testEigHandlesNanInputs: eig of a NaN matrix returned zeros, not NaN. JAX
    prints a c64 NaN as dense<(0x7FC00000,0x7FC00000)>; the importer read each hex part as
    the bits of an f64 (a denormal: 0), and built re + 1j*im, which makes (inf, x) a NaN."""
    parts = [complex(np.nan, np.nan), complex(np.inf, -np.inf), complex(2.5, np.inf)]
    pick = np.array([True, False, False])
    for dtype in (np.complex64,):  # complex128 needs x64, off in this suite
        for value in parts:
            const = np.asarray(value, dtype)

            def fill(p, const=const):
                return jnp.where(p, jnp.ones(3, const.dtype), const)

            want, got = run_both(fill, pick)
            for part in (np.real, np.imag):
                np.testing.assert_array_equal(part(got), part(want))
                np.testing.assert_array_equal(part(got[1:]), part(const))


def test_eig_of_a_nan_matrix_is_nan_as_on_cpu():
    from jax import lax

    for dtype in (np.float32, np.complex64):
        a = np.full((4, 4), np.nan, dtype)
        want, got = run_both(lambda m: lax.linalg.eig(m, compute_left_eigenvectors=False), a)
        for w, g in zip(want, got, strict=True):
            assert np.all(np.isnan(w)) and np.all(np.isnan(g))


def test_large_buffers_are_private_to_the_process():
    """A mapped buffer is a private anonymous mapping (a fork()ed child's writes would not
    reach the parent): its line in /proc/self/maps says `p`, not `s`. (Read from the maps
    rather than by forking: a fork in this multithreaded JAX process may deadlock.)"""
    buf = empty_bytes(MAPPED_BYTES)
    buf[:] = 7
    address = buf.__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                assert perms.startswith("rw") and perms[3] == "p", line
                assert address + MAPPED_BYTES <= hi, line
                break
        else:
            raise AssertionError(f"no mapping holds {address:#x}")
    assert int(buf.min()) == int(buf.max()) == 7


def test_released_mappings_are_reused_and_bounded():
    """A program run again gets its large buffers back with their pages mapped (a fresh
    mapping per run cost ~2 ms of page faults per 4 MiB); one still viewed is not reused."""
    import gc

    from xlapy.backends.cpu.runtime import host_memory

    a = empty_bytes(MAPPED_BYTES)
    a[:] = 5
    address = a.__array_interface__["data"][0]
    del a
    gc.collect()
    b = empty_bytes(MAPPED_BYTES)
    assert b.__array_interface__["data"][0] == address
    view = b[10:20]
    del b
    gc.collect()
    c = empty_bytes(MAPPED_BYTES)
    assert c.__array_interface__["data"][0] != address
    view[:] = 1
    assert c.size == MAPPED_BYTES and int(view.max()) == 1
    assert host_memory._free_bytes <= host_memory.RECYCLED_BYTES
