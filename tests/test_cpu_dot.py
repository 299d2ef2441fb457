"""DotThunk against the interpreter on hand-written HLO: cblas gemm on arena addresses for
every operand layout (as stored or transposed, through the dot's dimension order and the
layouts), a column-major result computed as its transpose, degenerate extents, and the
matmul path (complex, batched, non-mergeable views). Each product runs several times so
that both the whole and the split way of SplitChoice are checked (products of at least
dot_thunk.PARALLEL_MIN_FLOPS: blocks of rows, of columns, of a transposed result's columns)."""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module

RNG = np.random.default_rng(20260512)


def _dot_hlo(dtype, lhs, rhs, out, dims, lhs_layout="", rhs_layout="", out_layout=""):
    def ty(shape, layout):
        return f"{dtype}[{','.join(map(str, shape))}]{layout}"

    return f"""HloModule dot_test

ENTRY main {{
  p0 = {ty(lhs, lhs_layout)} parameter(0)
  p1 = {ty(rhs, rhs_layout)} parameter(1)
  ROOT d = {ty(out, out_layout)} dot(p0, p1), {dims}
}}
"""


NN = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
TN = "lhs_contracting_dims={0}, rhs_contracting_dims={0}"
NT = "lhs_contracting_dims={1}, rhs_contracting_dims={1}"
TT = "lhs_contracting_dims={0}, rhs_contracting_dims={1}"
MERGED = "lhs_contracting_dims={1,2}, rhs_contracting_dims={0,1}"
MIDDLE = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
BATCH = "lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={1}"

# (id, dtype, lhs, rhs, out, dims, lhs layout, rhs layout, out layout, expected path)
CASES = [
    ("nn_wide", "f32", (64, 300), (300, 520), (64, 520), NN, "", "", "", "cblas"),
    ("nn_tall", "f32", (700, 96), (96, 80), (700, 80), NN, "", "", "", "cblas"),
    ("tn", "f32", (200, 64), (200, 300), (64, 300), TN, "", "", "", "cblas"),
    ("tn_tall", "f32", (200, 300), (200, 80), (300, 80), TN, "", "", "", "cblas"),
    ("nt", "f32", (96, 200), (300, 200), (96, 300), NT, "", "", "", "cblas"),
    ("tt", "f64", (200, 96), (300, 200), (96, 300), TT, "", "", "", "cblas"),
    ("lhs_col_major", "f32", (64, 300), (300, 520), (64, 520), NN, "{0,1}", "", "", "cblas"),
    ("rhs_col_major", "f32", (64, 300), (300, 520), (64, 520), NN, "", "{0,1}", "", "cblas"),
    ("out_col_major", "f32", (300, 200), (200, 100), (300, 100), NN, "", "", "{0,1}", "cblas"),
    ("row_vector", "f32", (1, 700), (700, 900), (1, 900), NN, "", "", "", "cblas"),
    ("column", "f32", (900, 700), (700, 1), (900, 1), NN, "", "", "", "cblas"),
    ("k1", "f32", (300, 1), (1, 400), (300, 400), NN, "", "", "", "cblas"),
    ("small", "f32", (3, 5), (5, 7), (3, 7), NN, "", "", "", "cblas"),
    ("f64_wide", "f64", (32, 256), (256, 256), (32, 256), NN, "", "", "", "cblas"),
    ("merged_free_dims", "f32", (100, 8, 8), (100, 300), (8, 8, 300), TN, "", "", "", "cblas"),
    (
        "merged_contraction",
        "f32",
        (64, 6, 50),
        (6, 50, 200),
        (64, 200),
        MERGED,
        "",
        "",
        "",
        "cblas",
    ),
    ("unmergeable", "f32", (8, 100, 8), (100, 300), (8, 8, 300), MIDDLE, "", "", "", "matmul"),
    # the same dot through the pipeline: dot-matrix-operands transposes its lhs for BLAS
    ("unmergeable_piped", "f32", (8, 100, 8), (100, 300), (8, 8, 300), MIDDLE, "", "", "", "cblas"),
    ("complex", "c64", (40, 120), (120, 96), (40, 96), NN, "", "", "", "matmul"),
    ("batched", "f32", (4, 64, 200), (4, 200, 96), (4, 64, 96), BATCH, "", "", "", "cblas"),
    ("batched_f64", "f64", (3, 50, 70), (3, 70, 40), (3, 50, 40), BATCH, "", "", "", "cblas"),
    (
        "batched_out_col_major",
        "f32",
        (3, 40, 70),
        (3, 70, 50),
        (3, 40, 50),
        BATCH,
        "",
        "",
        "{1,2,0}",
        "matmul",
    ),
    (
        "batched_lhs_transposed",
        "f32",
        (5, 30, 70),
        (5, 70, 20),
        (5, 30, 20),
        BATCH,
        "{1,2,0}",
        "",
        "",
        "cblas",
    ),
]


def _random(shape, dtype):
    x = RNG.standard_normal(shape)
    if dtype == "c64":
        return (x + 1j * RNG.standard_normal(shape)).astype(np.complex64)
    return x.astype({"f32": np.float32, "f64": np.float64}[dtype])


UNOPTIMIZED = {"unmergeable"}
"""Cases compiled without the pass pipeline: the dot reaches DotThunk as written (the
pipeline would transpose its operand into a BLAS matrix: dot-matrix-operands)."""


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_dot_matches_interpreter(case):
    name, dtype, ls, rs, os_, dims, ll, rl, ol, path = case
    text = _dot_hlo(dtype, ls, rs, os_, dims, ll, rl, ol)
    # matrix-vector products (row_vector, column) are native kernels by default
    # (test_cpu_gemv.py); here they check the BLAS path
    options = {"native_gemv": False, **({"optimize": False} if name in UNOPTIMIZED else {})}
    program = CpuProgram(parse_module(text), options)
    listing = program.thunk_listing()
    line = next(x for x in listing.splitlines() if "= dot [" in x)
    assert ("cblas gemm" in line) == (path == "cblas"), line
    args = [_random(ls, dtype), _random(rs, dtype)]
    expected = np.asarray(evaluate(parse_module(text), args))
    k = 300
    tol = 1e-12 if dtype in ("f64",) else 2e-6
    for _ in range(5):  # warm-up, then whole and split turns
        got = np.asarray(program.run(args))
        assert got.shape == expected.shape and got.dtype == expected.dtype
        np.testing.assert_allclose(got, expected, rtol=tol * k, atol=tol * k)
