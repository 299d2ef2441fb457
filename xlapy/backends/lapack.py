"""The LAPACK custom calls JAX emits on the CPU, as typed FFI handlers over LAPACK's C
entry points.

`jnp.linalg` lowers to custom calls named `lapack_<p><routine>_ffi`, p in s/d/c/z (f32, f64,
c64, c128), with api_version=API_VERSION_TYPED_FFI, the operand aliased to the first result,
column-major layouts (`{0,1}`, `{1,2,0}` with batch dimensions leading), and LAPACK's
character options as ui8 attributes (`uplo = 76` is 'L').

The routines are the ones XLA:CPU calls (jaxlib's kernels take them from the same place):
the Fortran entry points of the LAPACK that SciPy loads, found through the PyCapsules of
`scipy.linalg.cython_lapack` / `cython_blas`. Every Fortran argument is an address, and
character options are followed by their hidden lengths (1 each). A single call goes
through cffi with every argument declared `uintptr_t` (a pointer and an integer travel
alike in the C calling convention, so plain Python ints pass without conversion objects).
A batch is one call of a small native loop, JIT-compiled once per argument count with
llvmlite, that calls the routine once per matrix with each address advanced by its own
step (0 for the scalar arguments and the shared workspace): no Python per matrix.

Threads. OpenBLAS's own threads spin-wait for each other; on a machine whose cores are busy
a 64x64 trsm with OpenBLAS's default threads took 27 ms, XLA's call of the same routine as
long, and 30 us with one thread (2 cores, load 8). So a routine runs with one OpenBLAS
thread (`openblas_set_num_threads_local` of the library that holds the routine, set around
the batch and restored) unless the process has at least 4 cores and one matrix is worth
`THREADED_MIN_FLOPS`.

Memory. A handler sees logical row-major NumPy arrays (the interpreter's values, or views
of the CPU backend's arena). LAPACK wants each matrix column-major, which is the logical
array's last two axes swapped and C-contiguous: where an array already is such a view (a
`{1,2,0}` layout) LAPACK works on its bytes in place; otherwise one transposing copy in and
one out (O(n^2) beside the routine's O(n^3)). Vector results (tau, eigenvalues, pivots,
info) are written by LAPACK straight into the result arrays. Workspace sizes are asked of
LAPACK once per routine and shape (lwork = -1) and remembered; one workspace serves the
whole batch.

Results follow LAPACK's conventions exactly as JAX expects them: the untouched triangle of
potrf's output keeps the input, getrf's pivots are LAPACK's own 1-based s32, each routine
reports LAPACK's `info` per matrix (JAX turns a nonzero info into NaNs), and geev's packed
real eigenvectors (a conjugate pair stored as real and imaginary parts in two columns) are
unpacked into complex columns, as jaxlib's kernel does.

Routines: potrf (cholesky), trsm (triangular solve), getrf (lu), geqrf + orgqr/ungqr (qr),
syevd/heevd (eigh), gesdd and gesvd (svd), geev (eig).
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import cffi
import numpy as np

from xlapy.backends.ffi import Attr, Buffer, handler
from xlapy.backends.host import available_cores
from xlapy.errors import CustomCallError

TYPES = {"s": "f32", "d": "f64", "c": "c64", "z": "c128"}
REAL_TYPES = {"s": "f32", "d": "f64", "c": "f32", "z": "f64"}
COMPLEX_TYPES = {"s": "c64", "d": "c128", "c": "c64", "z": "c128"}
DTYPES: dict[str, np.dtype] = {
    "s": np.dtype(np.float32),
    "d": np.dtype(np.float64),
    "c": np.dtype(np.complex64),
    "z": np.dtype(np.complex128),
}
REAL_DTYPES = {p: np.dtype(d.char.lower()) if d.kind == "c" else d for p, d in DTYPES.items()}

_FFI = cffi.FFI()
_LENGTHS = (1, 1, 1, 1)  # hidden Fortran lengths of character arguments
_JIT_LOCK = threading.Lock()


# -- finding and calling the routines -----------------------------------------------------


def _capsule_pointer(capsule) -> int:
    name_of = ctypes.pythonapi.PyCapsule_GetName
    name_of.restype, name_of.argtypes = ctypes.c_char_p, [ctypes.py_object]
    pointer_of = ctypes.pythonapi.PyCapsule_GetPointer
    pointer_of.restype = ctypes.c_void_p
    pointer_of.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return int(pointer_of(capsule, name_of(capsule)))


@dataclass(frozen=True, slots=True)
class Routine:
    """A LAPACK or BLAS routine: its address, its argument count and how many of those are
    character options (their hidden lengths follow the arguments)."""

    name: str
    address: int
    nargs: int
    nchars: int
    call: Callable = field(repr=False, compare=False)

    def __call__(self, *addresses: int) -> None:
        """One call on `addresses` (one per argument)."""
        self.call(*addresses, *_LENGTHS[: self.nchars])

    def batch(self, count: int, *args: tuple[int, int], flops: float = 0.0) -> None:
        """`count` calls; argument k of call i is `address + i * step` for args[k] =
        (address, step). `flops`: the work of one call, which decides the threads."""
        if len(args) != self.nargs:
            raise CustomCallError(f"{self.name}: {len(args)} arguments for {self.nargs}")
        if count <= 0:
            return
        setter = None
        if flops < THREADED_MIN_FLOPS or available_cores() < 4:
            setter = _thread_setter(self.address)
        previous = setter(1) if setter is not None else 0
        try:
            if count == 1:
                self(*(a for a, _ in args))
            else:
                table = np.array(args, np.int64)  # [nargs, 2]: address, step
                _batch_caller(self.nargs, self.nchars)(self.address, count, table.ctypes.data)
        finally:
            if setter is not None:
                setter(previous)


THREADED_MIN_FLOPS = 2.0 * 384**3
"""Work of one routine call (about a 384x384 factorization) from which OpenBLAS may use
its own threads, where the process has at least 4 cores."""


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


@functools.cache
def _thread_setter(address: int) -> Callable[[int], int] | None:
    """`openblas_set_num_threads_local(n) -> previous` of the library holding the code at
    `address`, or None (not OpenBLAS, or no dladdr)."""
    try:
        dladdr = ctypes.CDLL(None).dladdr
    except (OSError, AttributeError):
        return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    info = _DlInfo()
    if not dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return None
    try:
        found = ctypes.CDLL(info.dli_fname.decode()).openblas_set_num_threads_local
    except (OSError, AttributeError):
        return None
    fn = ctypes.cast(found, ctypes.c_void_p).value
    return _FFI.cast("int (*)(int)", fn) if fn else None


@functools.cache
def routine(name: str, nargs: int, nchars: int = 0) -> Routine:
    """LAPACK or BLAS routine `name` (e.g. "dpotrf") taking `nargs` arguments, `nchars` of
    them characters. Raises CustomCallError when SciPy's LAPACK does not have it."""
    from scipy.linalg import cython_blas, cython_lapack

    for module in (cython_lapack, cython_blas):
        capsule = module.__pyx_capi__.get(name)
        if capsule is not None:
            address = _capsule_pointer(capsule)
            params = ", ".join(["uintptr_t"] * nargs + ["size_t"] * nchars)
            call = _FFI.cast(f"void (*)({params})", address)
            return Routine(name, address, nargs, nchars, call)
    raise CustomCallError(f"SciPy's LAPACK has no routine {name!r}")


@functools.cache
def _batch_caller(nargs: int, nchars: int) -> Callable:
    """A native `loop(routine, count, table)`: calls routine(table[k][0] + i * table[k][1]
    for each argument k, then nchars lengths of 1) for i in [0, count)."""
    import llvmlite.binding as llvm
    from llvmlite import ir

    i64 = ir.IntType(64)
    callee_type = ir.FunctionType(ir.VoidType(), [i64] * (nargs + nchars))
    module = ir.Module(name=f"lapack_batch_{nargs}_{nchars}")
    loop = ir.Function(module, ir.FunctionType(ir.VoidType(), [i64, i64, i64]), name="loop")
    target, count, table_address = loop.args
    entry, head, body, done = map(loop.append_basic_block, ("entry", "head", "body", "done"))
    b = ir.IRBuilder(entry)
    callee = b.inttoptr(target, callee_type.as_pointer())
    table = b.inttoptr(table_address, i64.as_pointer())
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    b.cbranch(b.icmp_signed(">=", i, count), done, body)
    b.position_at_end(body)
    values = []
    for k in range(nargs):
        base = b.load(b.gep(table, [ir.Constant(i64, 2 * k)]))
        step = b.load(b.gep(table, [ir.Constant(i64, 2 * k + 1)]))
        values.append(b.add(base, b.mul(i, step)))
    b.call(callee, values + [ir.Constant(i64, 1)] * nchars)
    i.add_incoming(b.add(i, ir.Constant(i64, 1)), body)
    b.branch(head)
    b.position_at_end(done)
    b.ret_void()
    with _JIT_LOCK:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        parsed = llvm.parse_assembly(str(module), context=llvm.create_context())
        parsed.verify()
        machine = llvm.Target.from_default_triple().create_target_machine(opt=2)
        engine = llvm.create_mcjit_compiler(parsed, machine)
        engine.finalize_object()
        fn = _FFI.cast(
            "void (*)(uintptr_t, int64_t, uintptr_t)", engine.get_function_address("loop")
        )
    _ENGINES.append(engine)  # the code lives as long as its engine
    return fn


_ENGINES: list = []


class _Args:
    """Fortran scalar arguments in one small array: `addrs[i]` is the address of the i-th
    int32 (the array lives as long as this object)."""

    def __init__(self, *ints: int):
        self.ints = np.array(ints, np.int32)
        base = self.ints.ctypes.data
        self.addrs = [base + 4 * i for i in range(len(ints))]


def _char(code: int) -> str:
    return chr(code).upper()


@functools.cache
def _letters(*codes: str) -> int:
    """The address of the characters `codes`, in memory kept for the process."""
    _CONSTANTS.append(np.frombuffer("".join(codes).encode(), np.uint8).copy())
    return _address(_CONSTANTS[-1])


@functools.cache
def _one(p: str) -> int:
    """The address of a 1 of type `p`, in memory kept for the process."""
    _CONSTANTS.append(np.ones(1, DTYPES[p]))
    return _address(_CONSTANTS[-1])


_CONSTANTS: list[np.ndarray] = []


def _address(a: np.ndarray) -> int:
    return a.ctypes.data


_WORKSPACE: dict[tuple, tuple[int, ...]] = {}


def _workspace(key: tuple, query: Callable[[], tuple[float, ...]]) -> tuple[int, ...]:
    """The workspace sizes LAPACK asked for (`query()` runs the routine with lwork = -1)
    for routine and shape `key`, asked once. The sizes come back as floats; they are rounded
    up so an f32 that cannot hold a large size exactly never makes the workspace too small."""
    sizes = _WORKSPACE.get(key)
    if sizes is None:
        sizes = tuple(max(1, math.ceil(float(s) * (1 + 2**-20))) for s in query())
        _WORKSPACE[key] = sizes
    return sizes


class _Memory:
    """The arrays LAPACK works on for one call, and the copies back into the results."""

    def __init__(self):
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []

    def matrices(self, out: np.ndarray, source: np.ndarray | None = None) -> np.ndarray:
        """Column-major bytes for the logical (..., m, n) result `out`: a C-contiguous
        (..., n, m) array holding `source` (None: contents that do not matter). It is
        `out` itself where its layout already is that, else a copy stored back by
        `finish`."""
        work = np.swapaxes(out, -1, -2)
        if not work.flags.c_contiguous:
            work = np.empty(work.shape, out.dtype)
            self.pending.append((out, np.swapaxes(work, -1, -2)))
        if source is not None and not _same(work, np.swapaxes(source, -1, -2)):
            np.copyto(np.swapaxes(work, -1, -2), source)
        return work

    def dense(self, out: np.ndarray) -> np.ndarray:
        """`out`, or a C-contiguous stand-in stored back by `finish`."""
        if out.flags.c_contiguous:
            return out
        work = np.empty(out.shape, out.dtype)
        self.pending.append((out, work))
        return work

    def finish(self) -> None:
        for out, value in self.pending:
            np.copyto(out, value)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return _address(a) == _address(b) and a.strides == b.strides and a.shape == b.shape


def _batch(a: np.ndarray) -> int:
    return math.prod(a.shape[:-2])


def _step(a: np.ndarray, rank: int) -> int:
    """Bytes from one matrix (rank 2) or vector (rank 1) of a batch to the next."""
    return math.prod(a.shape[a.ndim - rank :]) * a.itemsize


def _check_batches(name: str, *arrays: tuple[np.ndarray, int]) -> None:
    """Each (array, kept dims) has the same leading batch dims."""
    shapes = [a.shape[: a.ndim - k] for a, k in arrays]
    if any(s != shapes[0] for s in shapes):
        raise CustomCallError(f"{name}: the operands' batch dimensions differ: {shapes}")


def _matrix(p: str, min_rank: int = 2) -> Buffer:
    return Buffer(TYPES[p], min_rank=min_rank)


# -- the routines --------------------------------------------------------------------------


def _each(a: np.ndarray, rank: int) -> tuple[int, int]:
    """The (address, step) of a batch of matrices (rank 2) or vectors (rank 1)."""
    return _address(a), _step(a, rank)


def _fixed(address: int) -> tuple[int, int]:
    """The (address, step) of an argument every call of a batch shares."""
    return address, 0


def _info(codes: np.ndarray) -> tuple[int, int]:
    return _address(codes), 4


def _potrf(p: str):
    @handler(
        args=[_matrix(p)],
        results=[_matrix(p), Buffer("s32")],
        attrs={"uplo": Attr(int)},
    )
    def potrf(a, out, info, *, uplo):
        memory = _Memory()
        work, codes = memory.matrices(out, a), memory.dense(info)
        n = a.shape[-1]
        args, letters = _Args(n, max(1, n)), _letters(_char(uplo))
        nn, lda = map(_fixed, args.addrs)
        routine(p + "potrf", 5, 1).batch(
            _batch(a),
            _fixed(letters),
            nn,
            _each(work, 2),
            lda,
            _info(codes),
            flops=n**3 / 3,
        )
        memory.finish()

    return potrf


def _trsm(p: str):
    @handler(
        args=[_matrix(p), _matrix(p)],
        results=[_matrix(p)],
        attrs={k: Attr(int) for k in ("side", "uplo", "trans_x", "diag")},
    )
    def trsm(a, b, x, *, side, uplo, trans_x, diag):
        _check_batches(f"lapack_{p}trsm", (a, 2), (b, 2))
        m, n = b.shape[-2:]
        k = n if _char(side) == "R" else m
        if a.shape[-2:] != (k, k):
            raise CustomCallError(
                f"lapack_{p}trsm: the triangular matrix is {list(a.shape[-2:])}, "
                f"side {_char(side)} of a {m}x{n} right-hand side needs {k}x{k}"
            )
        memory = _Memory()
        tri = np.ascontiguousarray(np.swapaxes(a, -1, -2))
        work = memory.matrices(x, b)
        if m and n:
            args = _Args(m, n, max(1, k), max(1, m))
            letters = _letters(_char(side), _char(uplo), _char(trans_x), _char(diag))
            options = [_fixed(letters + i) for i in range(4)]
            mm, nn, lda, ldb = map(_fixed, args.addrs)
            routine(p + "trsm", 11, 4).batch(
                _batch(b), *options, mm, nn, _fixed(_one(p)), _each(tri, 2), lda,
                _each(work, 2), ldb, flops=m * n * k,
            )  # fmt: skip
        memory.finish()

    return trsm


def _getrf(p: str):
    @handler(args=[_matrix(p)], results=[_matrix(p), Buffer("s32"), Buffer("s32")])
    def getrf(a, lu, pivots, info):
        memory = _Memory()
        work, piv, codes = memory.matrices(lu, a), memory.dense(pivots), memory.dense(info)
        m, n = a.shape[-2:]
        args = _Args(m, n, max(1, m))
        mm, nn, lda = map(_fixed, args.addrs)
        routine(p + "getrf", 6).batch(
            _batch(a),
            mm,
            nn,
            _each(work, 2),
            lda,
            _each(piv, 1),
            _info(codes),
            flops=m * n * min(m, n),
        )
        memory.finish()

    return getrf


def _query_size(fn: Routine, arguments: list[tuple[int, int]], probes: list[np.ndarray]):
    """Run one call with lwork = -1 (the caller's arguments say so); the sizes LAPACK
    wrote into the first element of each probe."""
    fn.batch(1, *arguments)
    return tuple(float(np.real(probe[0])) for probe in probes)


def _geqrf(p: str):
    @handler(args=[_matrix(p)], results=[_matrix(p), Buffer(TYPES[p], min_rank=1)])
    def geqrf(a, qr, tau):
        memory = _Memory()
        work, taus = memory.matrices(qr, a), memory.dense(tau)
        m, n = a.shape[-2:]
        fn = routine(p + "geqrf", 8)
        args = _Args(m, n, max(1, m), -1, 0)
        mm, nn, lda, lwork, inf = map(_fixed, args.addrs)
        probe = np.zeros(1, DTYPES[p])

        def arguments(scratch):
            return [mm, nn, _each(work, 2), lda, _each(taus, 1), scratch, lwork, inf]

        query = arguments(_fixed(_address(probe)))
        (size,) = _workspace(("geqrf", p, m, n), lambda: _query_size(fn, query, [probe]))
        scratch = np.empty(size, DTYPES[p])
        args.ints[3] = size
        fn.batch(_batch(a), *arguments(_fixed(_address(scratch))), flops=2 * m * n * min(m, n))
        memory.finish()

    return geqrf


def _orgqr(p: str):
    name = p + ("ungqr" if p in "cz" else "orgqr")

    @handler(args=[_matrix(p), Buffer(TYPES[p], min_rank=1)], results=[_matrix(p)])
    def orgqr(a, tau, q):
        _check_batches(f"lapack_{name}", (a, 2), (tau, 1))
        m, n = a.shape[-2:]
        k = tau.shape[-1]
        if not k <= n <= m:
            raise CustomCallError(
                f"lapack_{name}: needs k <= n <= m, got a {m}x{n} matrix and {k} reflectors"
            )
        memory = _Memory()
        work, taus = memory.matrices(q, a), np.ascontiguousarray(tau)
        fn = routine(name, 9)
        args = _Args(m, n, k, max(1, m), -1, 0)
        mm, nn, kk, lda, lwork, inf = map(_fixed, args.addrs)
        probe = np.zeros(1, DTYPES[p])

        def arguments(scratch):
            return [mm, nn, kk, _each(work, 2), lda, _each(taus, 1), scratch, lwork, inf]

        query = arguments(_fixed(_address(probe)))
        (size,) = _workspace((name, m, n, k), lambda: _query_size(fn, query, [probe]))
        scratch = np.empty(size, DTYPES[p])
        args.ints[4] = size
        fn.batch(_batch(a), *arguments(_fixed(_address(scratch))), flops=2 * m * n * k)
        memory.finish()

    return orgqr


def _syevd(p: str):
    cplx = p in "cz"
    name = p + ("heevd" if cplx else "syevd")

    @handler(
        args=[_matrix(p)],
        results=[_matrix(p), Buffer(REAL_TYPES[p], min_rank=1), Buffer("s32")],
        attrs={"mode": Attr(int), "uplo": Attr(int)},
    )
    def syevd(a, vectors, values, info, *, mode, uplo):
        memory = _Memory()
        work = memory.matrices(vectors, a)
        w_out, codes = memory.dense(values), memory.dense(info)
        n = a.shape[-1]
        job = "V" if _char(mode) == "V" else "N"
        letters = _letters(job, _char(uplo))
        jz, up = _fixed(letters), _fixed(letters + 1)
        args = _Args(n, max(1, n), -1, -1, -1)
        nn, lda, lwork, lrwork, liwork = map(_fixed, args.addrs)
        fn = routine(name, 13 if cplx else 11, 2)

        def arguments(scratch, rscratch, iscratch, inf):
            head = [jz, up, nn, _each(work, 2), lda, _each(w_out, 1), scratch, lwork]
            if cplx:
                return [*head, rscratch, lrwork, iscratch, liwork, inf]
            return [*head, iscratch, liwork, inf]

        probes = [np.zeros(1, DTYPES[p]), np.zeros(1, REAL_DTYPES[p]), np.zeros(1, np.int32)]
        query = arguments(*(_fixed(_address(x)) for x in probes), _fixed(_address(codes)))
        sizes = _workspace((name, job, n), lambda: _query_size(fn, query, probes))
        scratch = np.empty(sizes[0], DTYPES[p])
        rscratch = np.empty(sizes[1] if cplx else 1, REAL_DTYPES[p])
        iscratch = np.empty(sizes[2], np.int32)
        args.ints[2:5] = sizes
        scratches = (_fixed(_address(x)) for x in (scratch, rscratch, iscratch))
        fn.batch(_batch(a), *arguments(*scratches, _info(codes)), flops=9 * n**3)
        memory.finish()

    return syevd


def _svd_rwork(routine_name: str, job: str, m: int, n: int) -> int:
    """The real workspace complex gesdd / gesvd take (LAPACK gives no query for it)."""
    mn, mx = min(m, n), max(m, n)
    if routine_name == "gesvd":
        return max(1, 5 * mn)
    if job == "N":
        return max(1, 7 * mn)
    return max(1, 5 * mn * mn + 5 * mn, 2 * mx * mn + 2 * mn * mn + mn)


def _svd(p: str, routine_name: str):
    cplx, full = p in "cz", _matrix(p)

    @handler(
        args=[full],
        results=[full, Buffer(REAL_TYPES[p], min_rank=1), full, full, Buffer("s32")],
        attrs={"mode": Attr(int)},
    )
    def svd(a, a_out, s, u, vt, info, *, mode):
        job = _char(mode)
        if job not in "ASN":
            raise CustomCallError(
                f"lapack_{p}{routine_name}: mode {job!r} is not supported (A, S or N)"
            )
        _check_batches(f"lapack_{p}{routine_name}", (a, 2), (s, 1), (u, 2), (vt, 2))
        m, n = a.shape[-2:]
        memory = _Memory()
        work = memory.matrices(a_out, a)
        sv, codes = memory.dense(s), memory.dense(info)
        if job == "N":  # LAPACK does not touch U and VT: one scratch matrix stands for each
            spare = np.empty(1, DTYPES[p])
            left = right = _fixed(_address(spare))
            ldu = ldvt = 1
        else:
            uw, vw = memory.matrices(u), memory.matrices(vt)
            left, right = _each(uw, 2), _each(vw, 2)
            ldu, ldvt = max(1, u.shape[-2]), max(1, vt.shape[-2])
        mn = min(m, n)
        rscratch = np.empty(_svd_rwork(routine_name, job, m, n) if cplx else 1, REAL_DTYPES[p])
        iscratch = np.empty(max(1, 8 * mn), np.int32)
        args = _Args(m, n, max(1, m), ldu, ldvt, -1)
        mm, nn, lda, lu_, lvt, lwork = map(_fixed, args.addrs)
        letters = _letters(job, job)
        j1, j2 = _fixed(letters), _fixed(letters + 1)
        r, iw = _fixed(_address(rscratch)), _fixed(_address(iscratch))
        gesdd = routine_name == "gesdd"
        fn = routine(p + routine_name, 15 if cplx else 14, 1 if gesdd else 2)

        def arguments(scratch, inf):
            jobs = [j1] if gesdd else [j1, j2]
            common = [mm, nn, _each(work, 2), lda, _each(sv, 1), left, lu_, right, lvt]
            common += [scratch, lwork]
            tail = ([r] if cplx else []) + ([iw] if gesdd else []) + [inf]
            return jobs + common + tail

        probe = np.zeros(1, DTYPES[p])
        query = arguments(_fixed(_address(probe)), _fixed(_address(codes)))
        key = (routine_name, p, job, m, n)
        (size,) = _workspace(key, lambda: _query_size(fn, query, [probe]))
        scratch = np.empty(size, DTYPES[p])
        args.ints[5] = size
        flops = 8 * m * n * min(m, n)
        fn.batch(_batch(a), *arguments(_fixed(_address(scratch)), _info(codes)), flops=flops)
        memory.finish()

    return svd


def unpack_real_eigenvectors(wi: np.ndarray, v: np.ndarray, out: np.ndarray) -> None:
    """LAPACK's packed real eigenvectors `v` [batch, n, n] as complex columns in `out`: a
    conjugate pair j, j+1 (wi[j] > 0) is stored as the real and imaginary parts in columns
    j and j+1."""
    out[...] = v
    batch, col = np.nonzero(wi[:, :-1] > 0)
    re, im = v[batch, :, col], v[batch, :, col + 1]
    out[batch, :, col] = re + 1j * im
    out[batch, :, col + 1] = re - 1j * im


def _geev(p: str):
    cplx = p in "cz"
    ctype, attrs = COMPLEX_TYPES[p], {"compute_left": Attr(int), "compute_right": Attr(int)}
    vectors = [Buffer(ctype, min_rank=2), Buffer(ctype, min_rank=2), Buffer("s32")]
    if cplx:
        values = [Buffer(ctype, min_rank=1)]
    else:
        values = [Buffer(TYPES[p], min_rank=1), Buffer(TYPES[p], min_rank=1)]

    @handler(args=[_matrix(p)], results=values + vectors, attrs=attrs)
    def geev(a, *outs, compute_left, compute_right):
        *value_outs, vl, vr, info = outs
        n = a.shape[-1]
        batch = _batch(a)
        jobs = "".join("V" if _char(c) == "V" else "N" for c in (compute_left, compute_right))
        memory = _Memory()
        work = np.ascontiguousarray(np.swapaxes(a, -1, -2))  # geev destroys its input
        if cplx:
            lw, rw = memory.matrices(vl), memory.matrices(vr)
        else:  # the packed real vectors, unpacked into vl / vr below
            lw = np.empty((batch, n, n), DTYPES[p])
            rw = np.empty((batch, n, n), DTYPES[p])
        vals = [memory.dense(v) for v in value_outs]
        codes = memory.dense(info)
        letters = _letters(*jobs)
        j1, j2 = _fixed(letters), _fixed(letters + 1)
        args = _Args(n, max(1, n), -1)
        nn, lda, lwork = map(_fixed, args.addrs)
        rscratch = np.empty(max(1, 2 * n), REAL_DTYPES[p])
        fn = routine(p + "geev", 14, 2)

        def arguments(scratch, inf):
            head = [j1, j2, nn, _each(work, 2), lda, *(_each(v, 1) for v in vals)]
            tail = [_each(lw, 2), lda, _each(rw, 2), lda, scratch, lwork]
            return head + tail + ([_fixed(_address(rscratch))] if cplx else []) + [inf]

        probe = np.zeros(1, DTYPES[p])
        query = arguments(_fixed(_address(probe)), _fixed(_address(codes)))
        (size,) = _workspace(("geev", p, jobs, n), lambda: _query_size(fn, query, [probe]))
        scratch = np.empty(size, DTYPES[p])
        args.ints[2] = size
        fn.batch(batch, *arguments(_fixed(_address(scratch)), _info(codes)), flops=25 * n**3)
        if not cplx:
            wi = vals[1].reshape(batch, n)
            for flag, packed, out in ((jobs[0] == "V", lw, vl), (jobs[1] == "V", rw, vr)):
                if flag:
                    unpacked = np.empty((batch, n, n), out.dtype)
                    unpack_real_eigenvectors(wi, np.swapaxes(packed, -1, -2), unpacked)
                    out[...] = unpacked.reshape(out.shape)
        memory.finish()

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
