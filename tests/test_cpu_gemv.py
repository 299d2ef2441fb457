"""Matrix-vector dots as native kernels (codegen/emit_gemv.py) against the interpreter:
both loop orders (k contiguous, rows contiguous), every operand order and transposition,
column-major layouts and strided results, batches (leading or not), merged dimension
groups, remainders of every tile, k of 0 and 1, f32 and f64; the same bits whether the
kernel runs whole or split over the pool; inside native while loops of 0, 1 and many trips
(bit for bit the Python loop's); subnormals flushed as XLA:CPU does unless denormals is
'ieee'; small matrix-matrix products (a side of 2 to 16 free elements, native_small_gemm)
in both orders, every chunking of their columns, batched, strided, split and in loops, on
the kernel library's generic kernels and on kernels compiled per shape;
dots that are not such products (or do not merge) stay with BLAS."""

from __future__ import annotations

import numpy as np
import pytest
from hlo_snippets import counted_loop_hlo

from xlapy.backends.cpu import CpuBackend
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.codegen.emit_gemv import gemv_geometry
from xlapy.backends.cpu.runtime.control_flow_thunk import WhileThunk
from xlapy.backends.cpu.runtime.dot_thunk import DotThunk
from xlapy.backends.cpu.runtime.kernel_thunk import KernelThunk
from xlapy.backends.interpreter import evaluate
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("kernel_cache")

RNG = np.random.default_rng(20261127)
NP = {"f32": np.float32, "f64": np.float64}


def dot_hlo(t, lhs, rhs, out, dims, layouts=("", "", "")) -> str:
    def ty(shape, layout):
        return f"{t}[{','.join(map(str, shape))}]{layout}"

    return f"""HloModule gemv
ENTRY e {{
  a = {ty(lhs, layouts[0])} parameter(0)
  b = {ty(rhs, layouts[1])} parameter(1)
  ROOT d = {ty(out, layouts[2])} dot(a, b), {dims}
}}"""


def dims(lc, rc, lb=(), rb=()) -> str:
    def group(xs):
        return "{" + ",".join(map(str, xs)) + "}"

    text = f"lhs_contracting_dims={group(lc)}, rhs_contracting_dims={group(rc)}"
    if lb:
        text = f"lhs_batch_dims={group(lb)}, rhs_batch_dims={group(rb)}, " + text
    return text


# (id, lhs, rhs, out, dims, layouts (lhs, rhs, out), loop order: "rows" / "columns")
CASES = [
    ("a_x", (37, 70), (70,), (37,), dims([1], [0]), ("", "", ""), "rows"),
    ("x_a", (70,), (70, 37), (37,), dims([0], [0]), ("", "", ""), "columns"),
    ("at_x", (70, 37), (70,), (37,), dims([0], [0]), ("", "", ""), "columns"),
    ("x_at", (70,), (37, 70), (37,), dims([0], [1]), ("", "", ""), "rows"),
    ("a_col_major", (37, 70), (70,), (37,), dims([1], [0]), ("{0,1}", "", ""), "columns"),
    ("column_result", (45, 19), (19, 1), (45, 1), dims([1], [0]), ("", "", ""), "rows"),
    ("row_result", (1, 19), (19, 130), (1, 130), dims([1], [0]), ("", "", ""), "columns"),
    ("row_result_t", (19, 1), (130, 19), (1, 130), dims([0], [1]), ("", "", ""), "rows"),
    ("dot_product", (101,), (101,), (), dims([0], [0]), ("", "", ""), "rows"),
    ("k1", (33, 1), (1,), (33,), dims([1], [0]), ("", "", ""), "rows"),
    ("k0", (33, 0), (0,), (33,), dims([1], [0]), ("", "", ""), "rows"),
    ("k0_columns", (0,), (0, 70), (70,), dims([0], [0]), ("", "", ""), "columns"),
    ("long_k", (6, 1003), (1003,), (6,), dims([1], [0]), ("", "", ""), "rows"),
    ("wide", (9,), (9, 2100), (2100,), dims([0], [0]), ("", "", ""), "columns"),
    ("merged_k", (13, 6, 7), (6, 7), (13,), dims([1, 2], [0, 1]), ("", "", ""), "rows"),
    ("merged_rows", (5, 6, 40), (40,), (5, 6), dims([2], [0]), ("", "", ""), "rows"),
    (
        "batched_mv",
        (5, 23, 40),
        (5, 40),
        (5, 23),
        dims([2], [1], [0], [0]),
        ("", "", ""),
        "rows",
    ),
    (
        "batched_vm",
        (5, 40),
        (5, 40, 90),
        (5, 90),
        dims([1], [1], [0], [0]),
        ("", "", ""),
        "columns",
    ),
    (
        "batch_not_leading",
        (23, 5, 40),
        (40, 5),
        (5, 23),
        dims([2], [0], [1], [1]),
        ("", "", ""),
        "rows",
    ),
    (
        "batched_out_col_major",
        (5, 23, 40),
        (5, 40),
        (5, 23),
        dims([2], [1], [0], [0]),
        ("", "", "{0,1}"),
        "rows",
    ),
    (
        "batched_vm_x_strided",
        (40, 5),
        (5, 40, 90),
        (5, 90),
        dims([0], [1], [1], [0]),
        ("", "", "{0,1}"),
        "columns",
    ),
]


def _args(t, lhs, rhs):
    return [RNG.standard_normal(lhs).astype(NP[t]), RNG.standard_normal(rhs).astype(NP[t])]


def _dot_thunks(program: CpuProgram):
    return [t for t in program.compiled.entry.thunks if t.instr.opcode is Opcode.DOT]


def _close(got, want, t, k):
    tol = (1e-13 if t == "f64" else 3e-6) * max(k, 1)
    scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1.0)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.max(np.abs(got - want), initial=0.0) <= tol * scale


@pytest.mark.parametrize("t", ["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gemv_matches_interpreter(case, t):
    _, lhs, rhs, out, d, layouts, order = case
    text = dot_hlo(t, lhs, rhs, out, d, layouts)
    geometry = gemv_geometry(parse_module(text).entry_computation().root_instruction(), 8)
    assert not isinstance(geometry, str), geometry
    assert geometry.by_rows == (order == "rows")
    program = CpuProgram(parse_module(text), {"optimize": False})
    (thunk,) = _dot_thunks(program)
    assert isinstance(thunk, KernelThunk), program.thunk_listing()
    args = _args(t, lhs, rhs)
    want = np.asarray(evaluate(parse_module(text), args))
    got = np.asarray(program.run(args))
    _close(got, want, t, geometry.depth)


@pytest.mark.parametrize("t", ["f32", "f64"])
@pytest.mark.parametrize("transposed", [False, True])
def test_a_split_gemv_gives_the_same_bits(t, transposed):
    """A product large enough to split over the pool: runs whole and split (SplitChoice
    tries both) give one result, bit for bit."""
    # operands of 1M elements (DOT_PARALLEL_MIN_ELEMENTS); columns tiles are 8 KiB wide
    m, k = (3000, 400) if transposed else (2100, 500)
    if transposed:
        text = dot_hlo(t, (k,), (k, m), (m,), dims([0], [0]))
        args = _args(t, (k,), (k, m))
    else:
        text = dot_hlo(t, (m, k), (k,), (m,), dims([1], [0]))
        args = _args(t, (m, k), (k,))
    program = CpuProgram(parse_module(text))
    (thunk,) = _dot_thunks(program)
    assert isinstance(thunk, KernelThunk) and thunk.split_choice is not None
    results = [np.asarray(program.run(args)) for _ in range(12)]
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    _close(results[0], np.asarray(evaluate(parse_module(text), args)), t, k)


def loop_hlo(t: str, trips: int, transposed: bool) -> str:
    n = 96
    mat, vec = f"{t}[{n},{n}]", f"{t}[{n}]"
    d = dims([0], [0]) if transposed else dims([1], [0])
    body = f"""  w = {vec} dot(a, v), {d}
  q = {t}[] constant(0.25)
  qw = {vec} broadcast(q), dimensions={{}}
  w1 = {vec} multiply(w, qw)
  v1 = {vec} add(w1, v)"""
    return counted_loop_hlo("gemv_loop", trips, [("a", mat), ("v", vec)], body, ["a", "v1"], ["v"])


@pytest.mark.parametrize("t", ["f32", "f64"])
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("trips", [0, 1, 17])
def test_gemv_in_a_native_loop(t, transposed, trips):
    """A loop whose body's dot is a gemv kernel is one native function (no Python per
    iteration) with the Python loop's bits, and the interpreter's numbers."""
    text = loop_hlo(t, trips, transposed)
    a = (RNG.standard_normal((96, 96)) / 10).astype(NP[t])
    v = RNG.standard_normal(96).astype(NP[t])
    native = CpuBackend().compile(parse_module(text), {})
    (loop,) = [x for x in native.compiled.entry.thunks if isinstance(x, WhileThunk)]
    assert loop.native is not None, native.thunk_listing()
    assert any(
        isinstance(x, KernelThunk) and x.instr.opcode is Opcode.DOT for x in loop.body.thunks
    )
    python = CpuBackend().compile(parse_module(text), {"native_loops": False})
    got = np.asarray(native.run([a, v]))
    np.testing.assert_array_equal(got, np.asarray(python.run([a, v])))
    want = np.asarray(evaluate(parse_module(text), [a, v]))
    _close(got, want, t, 96 * max(trips, 1))


@pytest.mark.parametrize("order", ["rows", "columns"])
def test_gemv_flushes_subnormals_unless_ieee(order):
    """Products of 1e-20 * 1e-20 are subnormal in f32: zero by default (as XLA:CPU's dots),
    kept with denormals='ieee'."""
    k, m = 24, 16
    if order == "rows":
        text = dot_hlo("f32", (m, k), (k,), (m,), dims([1], [0]))
        args = [np.full((m, k), 1e-20, np.float32), np.full(k, 1e-20, np.float32)]
    else:
        text = dot_hlo("f32", (k,), (k, m), (m,), dims([0], [0]))
        args = [np.full(k, 1e-20, np.float32), np.full((k, m), 1e-20, np.float32)]
    flushed = np.asarray(CpuProgram(parse_module(text)).run(args))
    np.testing.assert_array_equal(flushed, np.zeros(m, np.float32))
    ieee = np.asarray(CpuProgram(parse_module(text), {"denormals": "ieee"}).run(args))
    want = np.asarray(evaluate(parse_module(text), args))
    assert np.all(ieee > 0)
    np.testing.assert_allclose(ieee, want, rtol=1e-5)


# (id, lhs, rhs, out, dims, layouts, loop order, columns: the smaller free side)
GEMM_CASES = [
    ("x_w", (3, 128), (128, 256), (3, 256), dims([1], [0]), ("", "", ""), "columns", 3),
    ("x_wt", (3, 256), (128, 256), (3, 128), dims([1], [1]), ("", "", ""), "rows", 3),
    ("five_rows", (5, 160), (160, 77), (5, 77), dims([1], [0]), ("", "", ""), "columns", 5),
    ("seven_t", (7, 37), (45, 37), (7, 45), dims([1], [1]), ("", "", ""), "rows", 7),
    ("a_x_cols", (45, 37), (37, 7), (45, 7), dims([1], [0]), ("", "", ""), "rows", 7),
    ("at_x_cols", (37, 45), (37, 16), (45, 16), dims([0], [0]), ("", "", ""), "columns", 16),
    ("two_cols", (2, 19), (19, 41), (2, 41), dims([1], [0]), ("", "", ""), "columns", 2),
    ("col_major", (3, 37), (37, 29), (3, 29), dims([1], [0]), ("{0,1}",) * 3, "rows", 3),
    ("out_col_major", (6, 33), (33, 50), (6, 50), dims([1], [0]), ("", "", "{0,1}"), "columns", 6),
    ("k0", (13, 0), (0, 29), (13, 29), dims([1], [0]), ("", "", ""), "columns", 13),
    ("k1", (11, 1), (1, 29), (11, 29), dims([1], [0]), ("", "", ""), "rows", 11),
    (
        "batched",
        (2, 3, 37),
        (2, 37, 29),
        (2, 3, 29),
        dims([2], [1], [0], [0]),
        ("", "", ""),
        "columns",
        3,
    ),
    (
        "batched_rows",
        (4, 9, 21),
        (4, 30, 21),
        (4, 9, 30),
        dims([2], [2], [0], [0]),
        ("", "", ""),
        "rows",
        9,
    ),
]


@pytest.mark.parametrize("library", [True, False], ids=["library", "per_shape"])
@pytest.mark.parametrize("t", ["f32", "f64"])
@pytest.mark.parametrize("case", GEMM_CASES, ids=[c[0] for c in GEMM_CASES])
def test_small_gemm_matches_interpreter(case, t, library):
    """On the kernel library's generic kernel (default; tests/test_cpu_kernel_library.py)
    and on the kernel compiled for the dot's shape (small_gemm_library=False)."""
    _, lhs, rhs, out, d, layouts, order, cols = case
    text = dot_hlo(t, lhs, rhs, out, d, layouts)
    instr = parse_module(text).entry_computation().root_instruction()
    assert isinstance(gemv_geometry(instr, 8), str)  # not a matrix-vector product
    geometry = gemv_geometry(instr, 8, small_gemm=True)
    assert not isinstance(geometry, str), geometry
    assert (geometry.by_rows, geometry.cols) == (order == "rows", cols)
    options = {"optimize": False, "small_gemm_library": library}
    program = CpuProgram(parse_module(text), options)
    (thunk,) = _dot_thunks(program)
    assert isinstance(thunk, KernelThunk), program.thunk_listing()
    assert (thunk.data is not None) == library
    args = _args(t, lhs, rhs)
    want = np.asarray(evaluate(parse_module(text), args))
    got = np.asarray(program.run(args))
    _close(got, want, t, geometry.depth)


@pytest.mark.parametrize("cols", range(2, 17))
def test_small_gemm_chunks_cover_every_column_once(cols):
    text = dot_hlo("f32", (cols, 20), (20, 40), (cols, 40), dims([1], [0]))
    g = gemv_geometry(parse_module(text).entry_computation().root_instruction(), 8, True)
    assert not isinstance(g, str)
    starts = [j for j0, width in g.chunks for j in range(j0, j0 + width)]
    assert starts == list(range(cols))
    assert max(w for _, w in g.chunks) - min(w for _, w in g.chunks) <= 1
    assert all(w <= 4 for _, w in g.chunks) and g.gemm_vectors * max(w for _, w in g.chunks) <= 12


@pytest.mark.parametrize("transposed", [False, True])
def test_a_split_small_gemm_gives_the_same_bits(transposed):
    m, k, n = 4, 1024, 1030  # a 1M-element operand may split (DOT_PARALLEL_MIN_ELEMENTS)
    if transposed:
        text = dot_hlo("f32", (m, k), (n, k), (m, n), dims([1], [1]))
        args = _args("f32", (m, k), (n, k))
    else:
        text = dot_hlo("f32", (m, k), (k, n), (m, n), dims([1], [0]))
        args = _args("f32", (m, k), (k, n))
    program = CpuProgram(parse_module(text))
    (thunk,) = _dot_thunks(program)
    assert isinstance(thunk, KernelThunk) and thunk.split_choice is not None
    results = [np.asarray(program.run(args)) for _ in range(12)]
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    _close(results[0], np.asarray(evaluate(parse_module(text), args)), "f32", k)


def rnn_loop_hlo(trips: int, transposed: bool) -> str:
    """h <- tanh(h @ W + b) (or h @ W^T) over `trips` steps: an RNN cell on 3 rows."""
    w, h, d = "f32[40,40]", "f32[3,40]", dims([1], [1] if transposed else [0])
    body = f"""  z = {h} dot(h, w), {d}
  b = f32[] constant(0.125)
  bz = {h} broadcast(b), dimensions={{}}
  zb = {h} add(z, bz)
  h1 = {h} tanh(zb)"""
    return counted_loop_hlo("rnn_loop", trips, [("w", w), ("h", h)], body, ["w", "h1"], ["h"])


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("trips", [0, 1, 23])
def test_small_gemm_in_a_native_loop(transposed, trips):
    """An RNN cell's dot is a kernel of the native loop: the Python loop's bits and the
    interpreter's numbers."""
    text = rnn_loop_hlo(trips, transposed)
    w = (RNG.standard_normal((40, 40)) / 6).astype(np.float32)
    h = RNG.standard_normal((3, 40)).astype(np.float32)
    native = CpuBackend().compile(parse_module(text), {})
    (loop,) = [x for x in native.compiled.entry.thunks if isinstance(x, WhileThunk)]
    assert loop.native is not None, native.thunk_listing()
    assert any(
        isinstance(x, KernelThunk) and x.instr.opcode is Opcode.DOT for x in loop.body.thunks
    )
    python = CpuBackend().compile(parse_module(text), {"native_loops": False})
    got = np.asarray(native.run([w, h]))
    np.testing.assert_array_equal(got, np.asarray(python.run([w, h])))
    want = np.asarray(evaluate(parse_module(text), [w, h]))
    _close(got, want, "f32", 40 * max(trips, 1))


@pytest.mark.parametrize(
    ("lhs", "rhs", "out", "d", "layouts", "options"),
    [
        ((30, 40), (40, 20), (30, 20), dims([1], [0]), ("", "", ""), {}),  # matrix-matrix
        ((17, 40), (40, 90), (17, 90), dims([1], [0]), ("", "", ""), {}),  # 17 > SMALL_COLS
        ((3, 40), (40, 90), (3, 90), dims([1], [0]), ("", "", ""), {"native_small_gemm": False}),
        ((30, 40), (40,), (30,), dims([1], [0]), ("", "", ""), {"native_gemv": False}),
        # neither rows nor k contiguous: the contracting dims' group has two strides
        ((8, 30, 8), (8, 8), (30,), dims([0, 2], [0, 1]), ("{0,2,1}", "", ""), {}),
    ],
    ids=["matrix_matrix", "seventeen_rows", "small_gemm_off", "option_off", "unmergeable"],
)
def test_other_dots_stay_with_blas(lhs, rhs, out, d, layouts, options):
    text = dot_hlo("f32", lhs, rhs, out, d, layouts)
    program = CpuProgram(parse_module(text), {"optimize": False, **options})
    (thunk,) = _dot_thunks(program)
    assert isinstance(thunk, DotThunk), program.thunk_listing()
    args = _args("f32", lhs, rhs)
    want = np.asarray(evaluate(parse_module(text), args))
    _close(np.asarray(program.run(args)), want, "f32", 64)
