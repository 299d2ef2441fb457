"""The built-in LAPACK targets: jnp.linalg programs lowered by JAX run through xlapy's
interpreter and match JAX, in f32, f64 (x64 mode) and complex. Factors that are unique only
up to sign or phase (eigenvectors, singular vectors) are compared through reconstructions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlapy.backends.custom_calls import GLOBAL_REGISTRY, check_custom_calls
from xlapy.backends.interpreter import evaluate
from xlapy.backends.lapack import LAPACK_HANDLERS
from xlapy.ir.parser import parse_module

TOL = {np.float32: 2e-4, np.complex64: 2e-4, np.float64: 1e-10, np.complex128: 1e-10}
REQUIRED = ["potrf", "trsm", "getrf", "geqrf", "orgqr", "syevd", "gesdd"]


def random_matrix(rng, shape, dtype):
    a = rng.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def spd(rng, shape, dtype):
    a = random_matrix(rng, shape, dtype)
    n = shape[-1]
    return (a @ np.conj(np.swapaxes(a, -1, -2)) + n * np.eye(n)).astype(dtype)


def ours_and_jax(fn, *args):
    text = jax.jit(fn).lower(*args).as_text(dialect="hlo")
    module = parse_module(text)
    check_custom_calls(module, "Host")
    ours = evaluate(module, list(args))
    return jax.tree.leaves(ours), [np.asarray(r) for r in jax.tree.leaves(jax.jit(fn)(*args))]


def close(a, b, dtype):
    tol = TOL[dtype]
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.max(np.abs(b)))))


def check_program(name, dtype, seed):
    rng = np.random.default_rng(seed)
    a = random_matrix(rng, (2, 4, 4), dtype)
    tall = random_matrix(rng, (2, 5, 3), dtype)
    rhs = random_matrix(rng, (2, 4, 2), dtype)
    if name == "cholesky":
        (ours,), (ref,) = ours_and_jax(jnp.linalg.cholesky, spd(rng, (2, 4, 4), dtype))
        close(ours, ref, dtype)
    elif name in ("solve", "inv", "det", "slogdet"):
        fn = {"solve": jnp.linalg.solve, "inv": jnp.linalg.inv}.get(name) or getattr(
            jnp.linalg, name
        )
        ours, ref = ours_and_jax(fn, *((a, rhs) if name == "solve" else (a,)))
        for o, r in zip(ours, ref, strict=True):
            close(o, r, dtype)
    elif name == "qr":
        (q, r), (q_ref, r_ref) = ours_and_jax(jnp.linalg.qr, tall)
        close(q, q_ref, dtype)
        close(r, r_ref, dtype)
        close(q @ r, tall, dtype)
    elif name == "eigh":
        h = spd(rng, (2, 4, 4), dtype)
        (w, v), (w_ref, _) = ours_and_jax(jnp.linalg.eigh, h)
        close(w, w_ref, dtype)
        close(v @ (w[..., None] * np.conj(np.swapaxes(v, -1, -2))), h, dtype)
    elif name == "svd":
        (u, s, vh), (_, s_ref, _) = ours_and_jax(
            lambda x: jnp.linalg.svd(x, full_matrices=False), tall
        )
        close(s, s_ref, dtype)
        close((u * s[..., None, :]) @ vh, tall, dtype)
        (s_only,), _ = ours_and_jax(lambda x: jnp.linalg.svd(x, compute_uv=False), tall)
        close(s_only, s_ref, dtype)
    elif name == "lstsq":
        (x,), (x_ref,) = ours_and_jax(
            lambda m, b: jnp.linalg.lstsq(m, b)[0], tall[0], tall[0, :, :2]
        )
        close(x, x_ref, dtype)
    elif name == "eig":
        (w, v), (w_ref, _) = ours_and_jax(jnp.linalg.eig, a)
        close(np.sort_complex(w.ravel()), np.sort_complex(w_ref.ravel()), dtype)
        close(a @ v, v * w[..., None, :], dtype)
    elif name == "triangular":
        fn = lambda m, b: jax.scipy.linalg.solve_triangular(m, b, lower=False, trans=1)  # noqa: E731
        (ours,), (ref,) = ours_and_jax(fn, a + 4 * np.eye(4, dtype=dtype), rhs)
        close(ours, ref, dtype)
    else:
        raise AssertionError(name)


PROGRAMS = ["cholesky", "solve", "inv", "det", "slogdet", "qr", "eigh", "svd", "lstsq", "eig"]
PROGRAMS += ["triangular"]


@pytest.mark.parametrize("name", PROGRAMS)
def test_f32_programs_match_jax(name):
    check_program(name, np.float32, seed=len(name))


@pytest.mark.parametrize("name", ["cholesky", "solve", "qr", "eigh", "svd", "complex"])
def test_f64_and_complex128_programs_match_jax(x64_mode, name):
    if name == "complex":
        for program in ("cholesky", "solve", "qr", "eigh", "svd"):
            check_program(program, np.complex128, seed=7)
        return
    check_program(name, np.float64, seed=3 + len(name))


@pytest.mark.parametrize("name", ["cholesky", "solve", "qr", "eigh", "svd", "eig"])
def test_complex64_programs_match_jax(name):
    check_program(name, np.complex64, seed=11 + len(name))


def test_every_required_routine_is_registered_for_every_type():
    names = set(GLOBAL_REGISTRY.names("Host"))
    for p in "sdcz":
        for routine in REQUIRED:
            if p in "cz":
                routine = {"orgqr": "ungqr", "syevd": "heevd"}.get(routine, routine)
            assert f"lapack_{p}{routine}_ffi" in names
    assert set(LAPACK_HANDLERS) <= names


def test_getrf_pivots_are_one_based_and_info_reports_singularity():
    rng = np.random.default_rng(5)
    a = random_matrix(rng, (3, 3), np.float32)
    a[:, 2] = 0.0  # singular: U[2, 2] == 0
    text = """HloModule m
ENTRY e {
  a = f32[3,3]{0,1} parameter(0)
  ROOT lu = (f32[3,3]{0,1}, s32[3]{0}, s32[]) custom-call(a),
      custom_call_target="lapack_sgetrf_ffi", output_to_operand_aliasing={{0}: (0, {})},
      api_version=API_VERSION_TYPED_FFI, backend_config={}
}"""
    lu, pivots, info = evaluate(parse_module(text), [a])
    assert pivots.dtype == np.int32 and pivots.min() >= 1 and pivots.max() <= 3
    assert int(info) == 3
    perm = np.arange(3)
    for i, p in enumerate(pivots - 1):
        perm[[i, p]] = perm[[p, i]]
    lower = np.tril(lu, -1) + np.eye(3)
    np.testing.assert_allclose(lower @ np.triu(lu), a[perm], atol=1e-5)


def test_potrf_reports_a_matrix_that_is_not_positive_definite():
    text = """HloModule m
ENTRY e {
  a = f64[2,2,2]{1,2,0} parameter(0)
  ROOT c = (f64[2,2,2]{1,2,0}, s32[2]{0}) custom-call(a), custom_call_target="lapack_dpotrf_ffi",
      api_version=API_VERSION_TYPED_FFI, backend_config={uplo = 76 : ui8}
}"""
    a = np.array([[[4.0, 1.0], [1.0, 3.0]], [[1.0, 2.0], [2.0, 1.0]]])
    factor, info = evaluate(parse_module(text), [a])
    assert info.tolist() == [0, 2]
    np.testing.assert_allclose(np.tril(factor[0]), np.linalg.cholesky(a[0]), rtol=1e-12)
    assert factor[0, 0, 1] == 1.0  # the upper triangle keeps the input, as LAPACK leaves it
