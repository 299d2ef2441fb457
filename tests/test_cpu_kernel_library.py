"""The kernel library (jit/kernel_library.py) and its small-gemm kernels generic in their
shape (codegen/emit_small_gemm.py) against the interpreter: every kernel of the menu (both
element types, both loop orders, every chunk width pair, contiguous and strided x or
result), odd and tiny depths and row counts (whole and short tiles), batches and column-
major operands; no per-program LLVM (the dot's kernel comes from the library, shared by
dots of other shapes); inside native loops and native runs (the parameter block passed by
native code); in a program image (warm compile) and split over the pool with the same bits.
Trust: the library's objects live in their own directory, are read back without compiling,
and a damaged or forged object is a CacheEntryWarning, compiled again and written over; an
untrusted directory is refused (CacheTrustWarning) and the compile still works."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from hlo_snippets import counted_loop_hlo
from test_cpu_gemv import dims, dot_hlo

from xlapy.backends.cpu import CpuBackend
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.codegen.emit_gemv import gemv_geometry
from xlapy.backends.cpu.codegen.emit_small_gemm import menu, small_gemm_kernel
from xlapy.backends.cpu.jit import kernel_library
from xlapy.backends.cpu.jit.disk_cache import CacheEntryWarning, CacheTrustWarning
from xlapy.backends.cpu.jit.kernel import clear_kernel_cache
from xlapy.backends.cpu.runtime.control_flow_thunk import NativeRun, WhileThunk
from xlapy.backends.cpu.runtime.kernel_thunk import KernelThunk
from xlapy.backends.interpreter import evaluate
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module

RNG = np.random.default_rng(20261127)
NP = {"f32": np.float32, "f64": np.float64}
LANES = 8  # the tests' geometry (AVX2); the compiled kernels use the host's


def case(order: str, contiguous: bool, cols: int, k: int, n: int):
    """(lhs, rhs, out, dims, layouts) of x[cols, k] times a matrix of n rows whose loop
    order is `order` ("rows": W^T, k contiguous; "columns": W, rows contiguous), with x
    contiguous along k (rows) or the result along rows (columns) or not."""
    if order == "rows":
        x_layout = "" if contiguous else "{0,1}"
        return (cols, k), (n, k), (cols, n), dims([1], [1]), (x_layout, "", "")
    out_layout = "" if contiguous else "{0,1}"
    return (cols, k), (k, n), (cols, n), dims([1], [0]), ("", "", out_layout)


# (order, contiguous, cols, k, n): every chunk-width pair of every order; odd k and n, k
# below one vector, rows below one tile (all short tile), k of 0 and 1
MENU_CASES = [
    (order, contiguous, cols, k, n)
    for order in ("rows", "columns")
    for contiguous in (True, False)
    for cols, k, n in [(2, 37, 29), (3, 5, 45), (4, 64, 70), (5, 19, 9), (7, 33, 100), (16, 9, 33)]
] + [
    ("columns", True, 6, 0, 40),
    ("rows", True, 6, 1, 40),
    ("columns", True, 13, 130, 17),
    ("rows", False, 11, 130, 19),
]


def _args(t, lhs, rhs):
    return [RNG.standard_normal(lhs).astype(NP[t]), RNG.standard_normal(rhs).astype(NP[t])]


def _close(got, want, t, k):
    tol = (1e-13 if t == "f64" else 3e-6) * max(k, 1)
    scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1.0)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.max(np.abs(got - want), initial=0.0) <= tol * scale


def _dot_thunk(program: CpuProgram) -> KernelThunk:
    (thunk,) = [t for t in program.compiled.entry.thunks if t.instr.opcode is Opcode.DOT]
    assert isinstance(thunk, KernelThunk) and thunk.data is not None, program.thunk_listing()
    return thunk


def _geometry(text: str):
    geometry = gemv_geometry(parse_module(text).entry_computation().root_instruction(), LANES, True)
    assert not isinstance(geometry, str), geometry
    return geometry


def test_the_cases_reach_every_kernel_of_the_menu():
    reached = set()
    for t in ("f32", "f64"):
        for order, contiguous, cols, k, n in MENU_CASES:
            g = _geometry(dot_hlo(t, *case(order, contiguous, cols, k, n)))
            kernel = small_gemm_kernel(g)
            assert not isinstance(kernel, str), kernel
            assert (kernel.by_rows, kernel.contiguous) == (order == "rows", contiguous)
            reached.add(kernel)
    assert reached == set(menu(LANES))


@pytest.mark.parametrize("t", ["f32", "f64"])
@pytest.mark.parametrize("params", MENU_CASES, ids=["-".join(map(str, c)) for c in MENU_CASES])
def test_library_kernels_match_the_interpreter(params, t):
    lhs, rhs, out, d, layouts = case(*params)
    text = dot_hlo(t, lhs, rhs, out, d, layouts)
    program = CpuProgram(parse_module(text), {"optimize": False})
    _dot_thunk(program)
    args = _args(t, lhs, rhs)
    want = np.asarray(evaluate(parse_module(text), args))
    _close(np.asarray(program.run(args)), want, t, params[3])


BATCHED = [
    # batch leading, columns order
    ((2, 3, 37), (2, 37, 29), (2, 3, 29), dims([2], [1], [0], [0]), ("", "", "")),
    # batch leading, rows order
    ((4, 9, 21), (4, 30, 21), (4, 9, 30), dims([2], [2], [0], [0]), ("", "", "")),
    # batch not leading in the matrix, transposed x
    ((40, 5, 3), (5, 40, 90), (5, 3, 90), dims([0], [1], [1], [0]), ("", "", "")),
    # every operand column-major
    ((3, 37), (37, 29), (3, 29), dims([1], [0]), ("{0,1}",) * 3),
    # x as the matrix: the other side has more free elements
    ((45, 37), (37, 7), (45, 7), dims([1], [0]), ("", "", "")),
    ((37, 45), (37, 16), (45, 16), dims([0], [0]), ("", "", "")),
]


@pytest.mark.parametrize("t", ["f32", "f64"])
@pytest.mark.parametrize("params", BATCHED, ids=range(len(BATCHED)))
def test_batched_and_strided_library_dots_match_the_interpreter(params, t):
    lhs, rhs, out, d, layouts = params
    text = dot_hlo(t, lhs, rhs, out, d, layouts)
    program = CpuProgram(parse_module(text), {"optimize": False})
    _dot_thunk(program)
    args = _args(t, lhs, rhs)
    want = np.asarray(evaluate(parse_module(text), args))
    _close(np.asarray(program.run(args)), want, t, _geometry(text).depth)


def test_dots_of_other_shapes_share_one_library_object(library):
    """Two programs, dots of different depths and widths: one object, no LLVM for the
    second; the per-shape option still compiles a kernel of its own."""
    texts = [
        dot_hlo("f32", (3, 40), (40, 64), (3, 64), dims([1], [0])),
        dot_hlo("f32", (2, 123), (123, 200), (2, 200), dims([1], [0])),
    ]
    first, second = (CpuProgram(parse_module(t)) for t in texts)
    a, b = _dot_thunk(first), _dot_thunk(second)
    assert a.kernel.object_key == b.kernel.object_key
    assert a.data != b.data
    (obj,) = library.glob("*.o")
    assert obj.name.startswith(a.kernel.object_key)
    clear_kernel_cache()
    third = CpuProgram(parse_module(texts[1]))
    assert _dot_thunk(third).kernel.wait().from_cache  # read back, not compiled
    own = CpuProgram(parse_module(texts[1]), {"small_gemm_library": False})
    (thunk,) = [t for t in own.compiled.entry.thunks if t.instr.opcode is Opcode.DOT]
    assert isinstance(thunk, KernelThunk) and thunk.data is None
    args = _args("f32", (2, 123), (123, 200))
    np.testing.assert_array_equal(np.asarray(third.run(args)), np.asarray(second.run(args)))
    _close(np.asarray(own.run(args)), np.asarray(second.run(args)), "f32", 123)


def _damage_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def _damage_forge(path: Path) -> None:
    head, _, payload = path.read_bytes().partition(b"\n")
    magic, _, _ = head.rpartition(b" ")
    path.write_bytes(magic + b" " + b"0" * 64 + b"\n" + payload)


def _damage_truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


@pytest.mark.parametrize("damage", [_damage_flip, _damage_forge, _damage_truncate])
def test_a_damaged_library_object_is_rejected_and_built_again(library, damage):
    text = dot_hlo("f32", (5, 70), (70, 90), (5, 90), dims([1], [0]))
    args = _args("f32", (5, 70), (70, 90))
    want = np.asarray(CpuProgram(parse_module(text)).run(args))
    (obj,) = library.glob("*.o")
    good = obj.read_bytes()
    damage(obj)
    clear_kernel_cache()
    with pytest.warns(CacheEntryWarning, match="kernel library object"):
        program = CpuProgram(parse_module(text))
        thunk = _dot_thunk(program)
        assert not thunk.kernel.wait().from_cache  # compiled again
    np.testing.assert_array_equal(np.asarray(program.run(args)), want)
    assert obj.read_bytes() == good  # written again (the same code, authenticated)
    clear_kernel_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheEntryWarning)
        assert _dot_thunk(CpuProgram(parse_module(text))).kernel.wait().from_cache


def test_an_untrusted_library_directory_is_not_used(library):
    library.mkdir(mode=0o700)
    os.chmod(library, 0o777)
    try:
        text = dot_hlo("f32", (4, 33), (33, 50), (4, 50), dims([1], [0]))
        with pytest.warns(CacheTrustWarning):
            program = CpuProgram(parse_module(text))
            _dot_thunk(program).kernel.wait()
        assert not list(library.glob("*.o"))
        args = _args("f32", (4, 33), (33, 50))
        want = np.asarray(evaluate(parse_module(text), args))
        _close(np.asarray(program.run(args)), want, "f32", 33)
    finally:
        os.chmod(library, 0o700)


def test_the_library_builds_ahead_and_then_reads(library):
    built = kernel_library.build()
    host = kernel_library._lanes()  # the conv menu's size depends on the host's registers
    assert len(built) == len(kernel_library.menu(host)) > len(menu(host))  # and reductions
    assert all(ms is not None for _, ms in built)
    assert len(list(library.glob("*.o"))) == len(built)
    clear_kernel_cache()
    assert all(ms is None for _, ms in kernel_library.build())


def rnn_run_hlo() -> str:
    """Two small dots with elementwise work between them: one native run of the entry."""
    return """HloModule rnn_run
ENTRY e {
  x = f32[3,40] parameter(0)
  w = f32[40,48] parameter(1)
  v = f32[48,24] parameter(2)
  h = f32[3,48] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  t = f32[3,48] tanh(h)
  g = f32[3,24] dot(t, v), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT s = f32[3,24] sine(g)
}"""


def test_library_kernels_in_a_native_run():
    text = rnn_run_hlo()
    native = CpuBackend().compile(parse_module(text), {})
    runs = [s for s in native.compiled.entry.steps or () if isinstance(s, NativeRun)]
    assert runs, native.thunk_listing()
    dots = [t for t in native.compiled.entry.thunks if t.instr.opcode is Opcode.DOT]
    assert len(dots) == 2 and all(isinstance(t, KernelThunk) and t.data for t in dots)
    args = [RNG.standard_normal(s).astype(np.float32) for s in ((3, 40), (40, 48), (48, 24))]
    python = CpuBackend().compile(parse_module(text), {"native_runs": False})
    got = np.asarray(native.run(args))
    np.testing.assert_array_equal(got, np.asarray(python.run(args)))
    _close(got, np.asarray(evaluate(parse_module(text), args)), "f32", 48)


def loop_hlo(trips: int) -> str:
    """h <- tanh(h @ W) and g <- g @ V^T over `trips` steps: both loop orders in a loop."""
    body = """  z = f32[5,40] dot(h, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  h1 = f32[5,40] tanh(z)
  g1 = f32[5,24] dot(h1, v), lhs_contracting_dims={1}, rhs_contracting_dims={1}"""
    carried = [("w", "f32[40,40]"), ("h", "f32[5,40]"), ("v", "f32[24,40]"), ("g", "f32[5,24]")]
    return counted_loop_hlo("rnn_loop", trips, carried, body, ["w", "h1", "v", "g1"], ["h", "g"])


@pytest.mark.parametrize("trips", [0, 1, 19])
def test_library_kernels_in_a_native_loop(trips):
    text = loop_hlo(trips)
    args = [
        (RNG.standard_normal((40, 40)) / 6).astype(np.float32),
        RNG.standard_normal((5, 40)).astype(np.float32),
        (RNG.standard_normal((24, 40)) / 6).astype(np.float32),
        RNG.standard_normal((5, 24)).astype(np.float32),
    ]
    native = CpuBackend().compile(parse_module(text), {})
    (loop,) = [x for x in native.compiled.entry.thunks if isinstance(x, WhileThunk)]
    assert loop.native is not None, native.thunk_listing()
    dots = [x for x in loop.body.thunks if x.instr.opcode is Opcode.DOT]
    assert len(dots) == 2 and all(isinstance(x, KernelThunk) and x.data for x in dots)
    python = CpuBackend().compile(parse_module(text), {"native_loops": False})
    got = [np.asarray(r) for r in native.run(args)]
    for g, p in zip(got, python.run(args), strict=True):
        np.testing.assert_array_equal(g, np.asarray(p))
    want = evaluate(parse_module(text), args)
    for g, w in zip(got, want, strict=True):
        _close(g, np.asarray(w), "f32", 40 * max(trips, 1))
