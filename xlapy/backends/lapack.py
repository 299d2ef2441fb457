"""The LAPACK custom calls JAX emits on the CPU, as typed FFI handlers over SciPy's LAPACK.

`jnp.linalg` lowers to custom calls named `lapack_<p><routine>_ffi`, p in s/d/c/z (f32, f64,
c64, c128), with api_version=API_VERSION_TYPED_FFI, the operand aliased to the first result,
column-major layouts (`{0,1}`, `{1,2,0}` with batch dimensions leading), and LAPACK's
character options as ui8 attributes (`uplo = 76` is 'L'). The handlers see logical
row-major NumPy arrays (the interpreter's values; layouts only say how a backend stores
them), loop over the leading batch dimensions and call the routine per matrix; SciPy's
wrappers take care of the column-major calls. Results follow LAPACK's conventions exactly
as JAX expects them: the untouched triangle of potrf's output keeps the input, getrf's
pivots are 1-based s32, and each routine reports LAPACK's `info` per matrix.

Routines: potrf (cholesky), trsm (triangular solve), getrf (lu), geqrf + orgqr/ungqr (qr),
syevd/heevd (eigh), gesdd and gesvd (svd), geev (eig).
"""

from __future__ import annotations

import numpy as np

from xlapy.backends.ffi import Attr, Buffer, handler

TYPES = {"s": "f32", "d": "f64", "c": "c64", "z": "c128"}
REAL_TYPES = {"s": "f32", "d": "f64", "c": "f32", "z": "f64"}
COMPLEX_TYPES = {"s": "c64", "d": "c128", "c": "c64", "z": "c128"}


def _routine(name: str):
    from scipy.linalg import blas, lapack

    return getattr(lapack, name, None) or getattr(blas, name)


def _char(code: int) -> str:
    return chr(code).upper()


def _batches(a: np.ndarray):
    return np.ndindex(a.shape[:-2])


def _matrix(p: str, min_rank: int = 2) -> Buffer:
    return Buffer(TYPES[p], min_rank=min_rank)


def _potrf(p: str):
    @handler(
        args=[_matrix(p)],
        results=[_matrix(p), Buffer("s32")],
        attrs={"uplo": Attr(int)},
    )
    def potrf(a, out, info, *, uplo):
        fn = _routine(p + "potrf")
        for b in _batches(a):
            factor, code = fn(a[b], lower=_char(uplo) == "L", clean=0)
            out[b] = factor
            info[b] = code

    return potrf


def _trsm(p: str):
    @handler(
        args=[_matrix(p), _matrix(p)],
        results=[_matrix(p)],
        attrs={k: Attr(int) for k in ("side", "uplo", "trans_x", "diag")},
    )
    def trsm(a, b, x, *, side, uplo, trans_x, diag):
        fn = _routine(p + "trsm")
        options = dict(
            side=int(_char(side) == "R"),
            lower=int(_char(uplo) == "L"),
            trans_a="NTC".index(_char(trans_x)),
            diag=int(_char(diag) == "U"),
        )
        for i in _batches(b):
            x[i] = fn(1.0, a[i], b[i], **options)

    return trsm


def _getrf(p: str):
    @handler(args=[_matrix(p)], results=[_matrix(p), Buffer("s32"), Buffer("s32")])
    def getrf(a, lu, pivots, info):
        fn = _routine(p + "getrf")
        for b in _batches(a):
            factors, piv, code = fn(a[b])
            lu[b] = factors
            pivots[b] = piv + 1
            info[b] = code

    return getrf


def _geqrf(p: str):
    @handler(args=[_matrix(p)], results=[_matrix(p), Buffer(TYPES[p], min_rank=1)])
    def geqrf(a, qr, tau):
        fn = _routine(p + "geqrf")
        for b in _batches(a):
            factors, t, _, _ = fn(a[b])
            qr[b] = factors
            tau[b] = t

    return geqrf


def _orgqr(p: str):
    name = p + ("ungqr" if p in "cz" else "orgqr")

    @handler(args=[_matrix(p), Buffer(TYPES[p], min_rank=1)], results=[_matrix(p)])
    def orgqr(a, tau, q):
        fn = _routine(name)
        for b in _batches(a):
            q[b] = fn(a[b], tau[b])[0]

    return orgqr


def _syevd(p: str):
    name = p + ("heevd" if p in "cz" else "syevd")

    @handler(
        args=[_matrix(p)],
        results=[_matrix(p), Buffer(REAL_TYPES[p], min_rank=1), Buffer("s32")],
        attrs={"mode": Attr(int), "uplo": Attr(int)},
    )
    def syevd(a, vectors, values, info, *, mode, uplo):
        fn = _routine(name)
        compute_v = int(_char(mode) == "V")
        for b in _batches(a):
            w, v, code = fn(a[b], compute_v=compute_v, lower=int(_char(uplo) == "L"))
            if compute_v:
                vectors[b] = v
            values[b] = w
            info[b] = code

    return syevd


def _svd(p: str, routine: str):
    real, full = REAL_TYPES[p], _matrix(p)

    @handler(
        args=[full],
        results=[full, Buffer(real, min_rank=1), full, full, Buffer("s32")],
        attrs={"mode": Attr(int)},
    )
    def svd(a, a_out, s, u, vt, info, *, mode):
        fn = _routine(p + routine)
        job = _char(mode)
        for b in _batches(a):
            left, values, right, code = fn(
                a[b], compute_uv=int(job != "N"), full_matrices=int(job == "A")
            )
            s[b] = values
            info[b] = code
            if job != "N":
                u[b] = left
                vt[b] = right

    return svd


def _real_eigenvectors(wi: np.ndarray, v: np.ndarray) -> np.ndarray:
    """LAPACK's packed real eigenvectors (a conjugate pair j, j+1 stored as the real and
    imaginary parts in columns j and j+1) as complex columns."""
    out = v.astype(np.result_type(v.dtype, np.complex64))
    j = 0
    while j < len(wi):
        if wi[j] != 0 and j + 1 < len(wi):
            out[:, j] = v[:, j] + 1j * v[:, j + 1]
            out[:, j + 1] = v[:, j] - 1j * v[:, j + 1]
            j += 2
        else:
            j += 1
    return out


def _geev(p: str):
    cplx, attrs = COMPLEX_TYPES[p], {"compute_left": Attr(int), "compute_right": Attr(int)}
    vectors = [Buffer(cplx, min_rank=2), Buffer(cplx, min_rank=2), Buffer("s32")]
    if p in "sd":
        values = [Buffer(TYPES[p], min_rank=1), Buffer(TYPES[p], min_rank=1)]
    else:
        values = [Buffer(cplx, min_rank=1)]

    @handler(args=[_matrix(p)], results=values + vectors, attrs=attrs)
    def geev(a, *outs, compute_left, compute_right):
        fn = _routine(p + "geev")
        *value_outs, vl, vr, info = outs
        left, right = _char(compute_left) == "V", _char(compute_right) == "V"
        for b in _batches(a):
            found = fn(a[b], compute_vl=int(left), compute_vr=int(right))
            *w, lv, rv, code = found
            for out, part in zip(value_outs, w, strict=True):
                out[b] = part
            if p in "sd":
                lv, rv = _real_eigenvectors(w[1], lv), _real_eigenvectors(w[1], rv)
            if left:
                vl[b] = lv
            if right:
                vr[b] = rv
            info[b] = code

    return geev


def _build() -> dict:
    handlers = {}
    for p in "sdcz":
        handlers[f"lapack_{p}potrf_ffi"] = _potrf(p)
        handlers[f"lapack_{p}trsm_ffi"] = _trsm(p)
        handlers[f"lapack_{p}getrf_ffi"] = _getrf(p)
        handlers[f"lapack_{p}geqrf_ffi"] = _geqrf(p)
        handlers[f"lapack_{p}{'ungqr' if p in 'cz' else 'orgqr'}_ffi"] = _orgqr(p)
        handlers[f"lapack_{p}{'heevd' if p in 'cz' else 'syevd'}_ffi"] = _syevd(p)
        handlers[f"lapack_{p}gesdd_ffi"] = _svd(p, "gesdd")
        handlers[f"lapack_{p}gesvd_ffi"] = _svd(p, "gesvd")
        handlers[f"lapack_{p}geev_ffi"] = _geev(p)
    return handlers


LAPACK_HANDLERS = _build()
