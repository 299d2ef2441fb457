"""The built-in LAPACK targets: jnp.linalg programs lowered by JAX run through xlapy's
interpreter and match JAX, in f32, f64 (x64 mode) and complex. Factors that are unique only
up to sign or phase (eigenvectors, singular vectors) are compared through reconstructions."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlapy.backends import execute
from xlapy.backends.custom_calls import GLOBAL_REGISTRY, check_custom_calls
from xlapy.backends.interpreter import evaluate
from xlapy.backends.lapack import LAPACK_HANDLERS
from xlapy.errors import CustomCallError
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


# -- every routine, every type, batch dims, both backends ------------------------------------

BACKENDS = ["interpreter", "cpu"]
DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


def run_lowered(fn, args, backend):
    """(ours, JAX's) output leaves of `fn` on `args`: JAX's CPU lowering run by `backend`."""
    text = jax.jit(fn).lower(*args).as_text(dialect="hlo")
    module = parse_module(text)
    check_custom_calls(module, "Host")
    ours = execute(module, list(args), backend)
    ours = list(ours) if isinstance(ours, tuple) else [ours]
    ref = [np.asarray(r) for r in jax.tree.leaves(jax.jit(fn)(*args))]
    assert [o.dtype for o in ours] == [r.dtype for r in ref]
    assert [o.shape for o in ours] == [r.shape for r in ref]
    return ours, ref


def hermitian_t(x):
    return np.conj(np.swapaxes(x, -1, -2))


def check_cholesky(rng, dtype, batch, backend):
    a = spd(rng, (*batch, 5, 5), dtype)
    (ours,), (ref,) = run_lowered(jnp.linalg.cholesky, [a], backend)
    close(ours, ref, dtype)


def check_qr(rng, dtype, batch, backend):
    for shape in ((6, 4), (4, 6)):
        for mode in ("reduced", "complete"):
            a = random_matrix(rng, (*batch, *shape), dtype)
            (q, r), (q_ref, r_ref) = run_lowered(
                lambda x, m=mode: jnp.linalg.qr(x, mode=m), [a], backend
            )
            close(q, q_ref, dtype)
            close(r, r_ref, dtype)


def check_eigh(rng, dtype, batch, backend):
    h = spd(rng, (*batch, 6, 6), dtype)
    (w, v), (w_ref, _) = run_lowered(jnp.linalg.eigh, [h], backend)
    close(w, w_ref, dtype)
    close(v @ (w[..., None] * hermitian_t(v)), h, dtype)
    (w_only,), (w_only_ref,) = run_lowered(jnp.linalg.eigvalsh, [h], backend)
    close(w_only, w_only_ref, dtype)


def check_svd(rng, dtype, batch, backend):
    for shape in ((6, 4), (4, 6)):
        a = random_matrix(rng, (*batch, *shape), dtype)
        for full in (False, True):
            (u, s, vh), (_, s_ref, _) = run_lowered(
                lambda x, f=full: jnp.linalg.svd(x, full_matrices=f), [a], backend
            )
            close(s, s_ref, dtype)
            k = min(shape)
            close((u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :], a, dtype)
            gram = hermitian_t(u) @ u
            close(gram, np.broadcast_to(np.eye(u.shape[-1]), gram.shape), dtype)
        (s_only,), (s_only_ref,) = run_lowered(
            lambda x: jnp.linalg.svd(x, compute_uv=False), [a], backend
        )
        close(s_only, s_only_ref, dtype)
        qr_svd = lambda x: jax.lax.linalg.svd(  # noqa: E731 (gesvd)
            x, full_matrices=False, algorithm=jax.lax.linalg.SvdAlgorithm.QR
        )
        (u, s, vh), (_, s_ref, _) = run_lowered(qr_svd, [a], backend)
        close(s, s_ref, dtype)
        close((u * s[..., None, :]) @ vh, a, dtype)


def check_eig(rng, dtype, batch, backend):
    a = random_matrix(rng, (*batch, 5, 5), dtype)
    (w, v), (w_ref, _) = run_lowered(jnp.linalg.eig, [a], backend)
    close(np.sort_complex(w.reshape(-1, 5)), np.sort_complex(w_ref.reshape(-1, 5)), dtype)
    close(a @ v, v * w[..., None, :], dtype)
    left = lambda x: jax.lax.linalg.eig(x, compute_left_eigenvectors=True)  # noqa: E731
    (w, vl, vr), _ = run_lowered(left, [a], backend)
    close(hermitian_t(vl) @ a, w[..., :, None] * hermitian_t(vl), dtype)
    close(a @ vr, vr * w[..., None, :], dtype)
    (w_only,), _ = run_lowered(jnp.linalg.eigvals, [a], backend)
    close(np.sort_complex(w_only.reshape(-1, 5)), np.sort_complex(w_ref.reshape(-1, 5)), dtype)


def check_lu(rng, dtype, batch, backend):
    for shape in ((5, 5), (6, 4), (4, 6)):
        a = random_matrix(rng, (*batch, *shape), dtype)
        ours, ref = run_lowered(jax.lax.linalg.lu, [a], backend)
        close(ours[0], ref[0], dtype)
        np.testing.assert_array_equal(ours[1], ref[1])  # pivots
        np.testing.assert_array_equal(ours[2], ref[2])  # permutation


def check_triangular(rng, dtype, batch, backend):
    a = random_matrix(rng, (*batch, 4, 4), dtype) + 4 * np.eye(4, dtype=dtype)
    # (left side, lower, transpose: none / plain / conjugate, unit diagonal): each value of
    # each option, and every pair of sides and triangles
    options = [(1, 1, 0, 0), (1, 0, 1, 1), (0, 1, 2, 0), (0, 0, 0, 1), (1, 1, 2, 1), (0, 0, 1, 0)]
    for left, lower, trans, unit in options:
        b = random_matrix(rng, (*batch, 4, 3) if left else (*batch, 3, 4), dtype)
        fn = functools.partial(
            jax.lax.linalg.triangular_solve,
            left_side=left, lower=lower, transpose_a=trans > 0, conjugate_a=trans == 2,
            unit_diagonal=unit,
        )  # fmt: skip
        (ours,), (ref,) = run_lowered(fn, [a, b], backend)
        close(ours, ref, dtype)


def check_solve(rng, dtype, batch, backend):
    a = random_matrix(rng, (*batch, 5, 5), dtype)
    b = random_matrix(rng, (*batch, 5, 2), dtype)
    (ours,), (ref,) = run_lowered(jnp.linalg.solve, [a, b], backend)
    close(ours, ref, dtype)
    cho = lambda m, r: jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(m), r)  # noqa: E731
    (ours,), (ref,) = run_lowered(cho, [spd(rng, (*batch, 5, 5), dtype), b], backend)
    close(ours, ref, dtype)


ROUTINE_CHECKS = {
    "cholesky": check_cholesky,
    "qr": check_qr,
    "eigh": check_eigh,
    "svd": check_svd,
    "eig": check_eig,
    "lu": check_lu,
    "triangular": check_triangular,
    "solve": check_solve,
}


# Every type on both backends is opt-in ($XLAPY_SLOW_LINALG=1: ~4 minutes on a loaded 2-core
# machine); by default each type runs on one backend, each backend sees two types.
SLOW = os.environ.get("XLAPY_SLOW_LINALG", "") not in ("", "0")
TYPE_BACKENDS = [
    (dtype, backend)
    for dtype in DTYPES
    for backend in BACKENDS
    if SLOW or (backend == "cpu") == (dtype in (np.float32, np.complex128))
]


@pytest.mark.parametrize(
    "dtype,backend", TYPE_BACKENDS, ids=lambda v: v if isinstance(v, str) else np.dtype(v).name
)
@pytest.mark.parametrize("name", list(ROUTINE_CHECKS))
def test_routine_matches_jax_for_every_type_batched(x64_mode, name, dtype, backend):
    rng = np.random.default_rng(100 + len(name) + 7 * DTYPES.index(dtype))
    ROUTINE_CHECKS[name](rng, dtype, (2, 3), backend)


@pytest.mark.parametrize("name", list(ROUTINE_CHECKS))
def test_routine_matches_jax_unbatched_on_the_cpu_backend(name):
    ROUTINE_CHECKS[name](np.random.default_rng(len(name)), np.float32, (), "cpu")


@pytest.mark.parametrize("backend", BACKENDS)
def test_cholesky_of_a_matrix_that_is_not_positive_definite_is_nan_as_in_jax(backend):
    rng = np.random.default_rng(3)
    a = spd(rng, (3, 4, 4), np.float32)
    a[1] = -a[1]  # negative definite: potrf reports info = 1 for this one
    (ours,), (ref,) = run_lowered(jnp.linalg.cholesky, [a], backend)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(ref))
    assert np.isnan(ours[1][np.tril_indices(4)]).all() and not np.isnan(ours[[0, 2]]).any()
    close(ours[[0, 2]], ref[[0, 2]], np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_inputs_give_nans_where_jax_does(backend):
    rng = np.random.default_rng(4)
    h = spd(rng, (2, 4, 4), np.float32)
    h[0, 1, 2] = h[0, 2, 1] = np.nan
    for fn in (jnp.linalg.eigh, jnp.linalg.cholesky, lambda x: jnp.linalg.svd(x)[1]):
        ours, ref = run_lowered(fn, [h], backend)
        for o, r in zip(ours, ref, strict=True):
            np.testing.assert_array_equal(np.isnan(o), np.isnan(r))
            keep = ~np.isnan(r)
            assert np.isnan(o[0]).any() and not np.isnan(o[1]).any()
            assert np.isfinite(o[keep]).all()


def test_handlers_work_in_place_on_column_major_results_and_strided_vectors():
    """A result whose matrices are already column-major (the CPU backend's `{1,2,0}` arena
    views) is factored in place; one whose vectors are strided is written through a copy."""
    rng = np.random.default_rng(6)
    a = spd(rng, (3, 5, 5), np.float64)
    plain_out, plain_w, plain_info = a.copy(), np.zeros((3, 5)), np.zeros(3, np.int32)
    fn = LAPACK_HANDLERS["lapack_dsyevd_ffi"].fn
    fn(a, plain_out, plain_w, plain_info, mode=ord("V"), uplo=ord("L"))
    column_major = np.swapaxes(np.ascontiguousarray(np.swapaxes(a, -1, -2)), -1, -2)
    strided_w = np.zeros((3, 10))[:, ::2]
    info = np.full(6, 7, np.int32)[::2]
    fn(column_major, column_major, strided_w, info, mode=ord("V"), uplo=ord("L"))
    np.testing.assert_array_equal(column_major, plain_out)
    np.testing.assert_array_equal(strided_w, plain_w)
    assert info.tolist() == [0, 0, 0]
    np.testing.assert_allclose(plain_w, np.linalg.eigvalsh(a), rtol=1e-12)


def test_empty_batches_and_empty_matrices():
    fn = LAPACK_HANDLERS["lapack_spotrf_ffi"].fn
    a, out, info = (
        np.zeros((0, 3, 3), np.float32),
        np.zeros((0, 3, 3), np.float32),
        np.zeros(0, np.int32),
    )
    fn(a, out, info, uplo=ord("L"))
    a, out, info = (
        np.zeros((2, 0, 0), np.float32),
        np.zeros((2, 0, 0), np.float32),
        np.ones(2, np.int32),
    )
    fn(a, out, info, uplo=ord("L"))
    assert info.tolist() == [0, 0]


def test_mismatched_operands_are_custom_call_errors():
    fn = LAPACK_HANDLERS["lapack_strsm_ffi"].fn
    a, b = np.eye(3, dtype=np.float32), np.ones((4, 2), np.float32)
    with pytest.raises(CustomCallError, match="needs 4x4"):
        fn(a, b, np.zeros_like(b), side=ord("L"), uplo=ord("L"), trans_x=ord("N"), diag=ord("N"))
    svd = LAPACK_HANDLERS["lapack_sgesdd_ffi"].fn
    x = np.ones((3, 3), np.float32)
    with pytest.raises(CustomCallError, match="mode 'O'"):
        svd(
            x,
            x.copy(),
            np.zeros(3, np.float32),
            x.copy(),
            x.copy(),
            np.zeros((), np.int32),
            mode=ord("O"),
        )


def test_a_batch_is_one_native_loop_matching_one_call_per_matrix():
    rng = np.random.default_rng(8)
    a = spd(rng, (40, 6, 6), np.float32)
    out, info = a.copy(), np.zeros(40, np.int32)
    LAPACK_HANDLERS["lapack_spotrf_ffi"].fn(a, out, info, uplo=ord("L"))
    for i in (0, 17, 39):
        one, code = a[i : i + 1].copy(), np.zeros(1, np.int32)
        LAPACK_HANDLERS["lapack_spotrf_ffi"].fn(a[i : i + 1], one, code, uplo=ord("L"))
        np.testing.assert_array_equal(out[i], one[0])
    np.testing.assert_allclose(np.tril(out), np.linalg.cholesky(a), rtol=2e-5, atol=2e-5)
