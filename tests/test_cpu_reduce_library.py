"""The kernel library's reductions (codegen/emit_reduce_library.py) against the interpreter:
every kernel of the menu (f32 and f64; add, maximum, minimum; rows and columns orders), row,
column, middle-axis and full reductions, extents of 0 and 1, odd sizes (whole tiles, tiles
with outputs left to scalars, register and stack accumulators), column-major and permuted
input and result layouts, a non-trivial init, long sums (blocked accuracy), NaN and signed
zeros for maximum and minimum; no per-program LLVM (one library object for reduces of
other shapes; `reduce_library=False` compiles its own kernel); fused reductions keep the
per-shape kernel; a split over the pool gives the same bits; in a native loop; a damaged
library object is rejected and built again."""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends.cpu import CpuBackend
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.codegen.emit_reduce_library import (
    ReduceGeometry,
    menu,
    reduce_library_kernel,
)
from xlapy.backends.cpu.jit.disk_cache import CacheEntryWarning
from xlapy.backends.cpu.jit.kernel import clear_kernel_cache
from xlapy.backends.cpu.runtime.control_flow_thunk import WhileThunk
from xlapy.backends.cpu.runtime.kernel_thunk import KernelThunk
from xlapy.backends.interpreter import evaluate
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.runtime import Client

RNG = np.random.default_rng(20261127)
NP = {"f32": np.float32, "f64": np.float64}
LANES = 8  # the tests' geometry (AVX2); the compiled kernels use the host's
INITS = {"add": "0", "maximum": "-inf", "minimum": "inf", "multiply": "1"}


def layout_text(layout: tuple[int, ...] | None) -> str:
    return "" if layout is None else "{" + ",".join(map(str, layout)) + "}"


def reduce_hlo(
    t: str,
    op: str,
    shape: tuple[int, ...],
    dims: tuple[int, ...],
    layout: tuple[int, ...] | None = None,
    out_layout: tuple[int, ...] | None = None,
    init: str | None = None,
) -> str:
    out = [n for d, n in enumerate(shape) if d not in dims]
    result = f"{t}[{','.join(map(str, out))}]{layout_text(out_layout)}"
    reduced = "{" + ",".join(map(str, dims)) + "}"
    return f"""HloModule reduce_{op}
r {{
  a = {t}[] parameter(0)
  b = {t}[] parameter(1)
  ROOT c = {t}[] {op}(a, b)
}}
ENTRY e {{
  x = {t}[{",".join(map(str, shape))}]{layout_text(layout)} parameter(0)
  i = {t}[] constant({INITS[op] if init is None else init})
  ROOT y = {result} reduce(x, i), dimensions={reduced}, to_apply=r
}}"""


# (shape, reduced dims, input layout, result layout): rows, columns, middle axis, full;
# odd sizes, sizes below one vector and one step, extents 0 and 1, permuted layouts
CASES = [
    ((37, 53), (1,), None, None),  # rows: 53 = one step + 21 left
    ((37, 53), (0,), None, None),  # columns: a tile of 4 vectors + a tile left to scalars
    ((37, 53), (0, 1), None, None),  # full
    ((1000,), (0,), None, None),  # full, 1-D
    ((5, 67, 19), (1,), None, None),  # middle axis, Q below three vectors
    ((3, 300, 64), (1,), None, None),  # middle axis, 8 vectors in registers
    ((6, 129, 200), (1,), None, None),  # middle axis, a tile on the stack
    ((2, 3, 1500), (0, 1), None, None),  # columns: Q above the largest tile
    ((37, 53), (1,), (0, 1), None),  # a row sum read column-major: the columns order
    ((37, 53), (0,), (0, 1), None),  # a column sum read column-major: the rows order
    ((4, 5, 6), (1,), (0, 2, 1), (0, 1)),  # permuted input layout, the result's alike
    ((6, 7, 9), (1,), None, (0, 1)),  # column-major result
    ((4, 0, 3), (1,), None, None),  # R = 0: the init
    ((0, 5), (1,), None, None),  # no outputs
    ((7, 1, 9), (1,), None, None),  # R = 1
    ((1, 1), (0, 1), None, None),  # one element
    ((3, 1, 4, 1), (1, 3), None, None),  # reduced dims of extent 1 only
    ((9, 2), (1,), None, None),  # rows shorter than a vector
]
OPS = ["add", "maximum", "minimum"]


def _args(t: str, shape, zero: float | None = None) -> list[np.ndarray]:
    """Random normal values; with `zero`, a seventh of them set to that signed zero (one
    sign only: the interpreter's fold leaves max(+0, -0) to the order it meets them in)."""
    x = RNG.standard_normal(shape).astype(NP[t])
    if zero is not None and x.size:
        flat = x.reshape(-1)
        flat[RNG.choice(flat.size, size=max(1, flat.size // 7), replace=False)] = zero
    return [x]


ZERO = {"add": None, "maximum": -0.0, "minimum": 0.0}
"""The signed zero whose sign a fold must keep: a maximum of -0 and negatives is -0."""


def _reduce_thunk(program: CpuProgram) -> KernelThunk:
    thunks = [t for t in program.compiled.entry.thunks if t.instr.opcode is Opcode.REDUCE]
    (thunk,) = thunks
    assert isinstance(thunk, KernelThunk), program.thunk_listing()
    return thunk


def _close(got: np.ndarray, want: np.ndarray, t: str, op: str, r: int) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    if op != "add":  # a fold of maximum / minimum is exact: the same bits
        np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{got.itemsize}"))
        return
    tol = (1e-14 if t == "f64" else 2e-6) * max(r, 1) ** 0.5 * 4
    scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1.0)
    assert np.max(np.abs(got - want), initial=0.0) <= tol * scale


def _reduced(shape, dims) -> int:
    return int(np.prod([shape[d] for d in dims]))


def test_the_cases_reach_every_kernel_of_the_menu():
    reached = set()
    for t in ("f32", "f64"):
        for op in OPS:
            for shape, dims, layout, out_layout in CASES:
                text = reduce_hlo(t, op, shape, dims, layout, out_layout)
                instr = parse_module(text).entry_computation().root_instruction()
                found = reduce_library_kernel(instr, LANES)
                assert not isinstance(found, str), (shape, dims, found)
                reached.add(found[0])
    assert reached == {k for k in menu(LANES) if k.prologue == "x"}  # plain reduces


def test_geometry_of_the_usual_reductions():
    def geometry(shape, dims, layout=None, out_layout=None) -> ReduceGeometry:
        text = reduce_hlo("f32", "add", shape, dims, layout, out_layout)
        found = reduce_library_kernel(parse_module(text).entry_computation().root_instruction(), 8)
        assert not isinstance(found, str), found
        return found[1]

    assert geometry((4, 6), (1,)) == ReduceGeometry(4, 6, 1, 6, 1, 1, 1, 1)
    assert geometry((4, 6), (0,)) == ReduceGeometry(1, 4, 6, 1, 6, 1, 1, 1)
    assert geometry((4, 6), (0, 1)) == ReduceGeometry(1, 24, 1, 1, 1, 1, 1, 1)
    assert geometry((2, 3, 5), (1,)) == ReduceGeometry(2, 3, 5, 15, 5, 1, 5, 1)
    assert geometry((4, 6), (1,), (0, 1)) == ReduceGeometry(1, 6, 4, 1, 4, 1, 1, 1)
    assert geometry((6, 7, 9), (1,), None, (0, 1)) == ReduceGeometry(6, 7, 9, 63, 9, 1, 1, 6)
    text = reduce_hlo("f32", "add", (6, 7, 9), (0,), None, (0, 1))  # Q's dims do not merge
    found = reduce_library_kernel(parse_module(text).entry_computation().root_instruction(), 8)
    assert isinstance(found, str) and "layout" in found


def test_reductions_the_library_leaves_to_per_shape_kernels():
    text = reduce_hlo("f32", "add", (4, 5, 6), (0, 2))  # reduced on both sides of a kept dim
    found = reduce_library_kernel(parse_module(text).entry_computation().root_instruction(), 8)
    assert isinstance(found, str) and "both sides" in found
    program = CpuProgram(parse_module(text))
    assert _reduce_thunk(program).data is None  # its own kernel
    (x,) = args = _args("f32", (4, 5, 6))
    _close(np.asarray(program.run(args)), x.sum(axis=(0, 2)), "f32", "add", 24)
    text = reduce_hlo("f32", "multiply", (4, 5), (1,))
    found = reduce_library_kernel(parse_module(text).entry_computation().root_instruction(), 8)
    assert isinstance(found, str) and "reducer" in found


@pytest.mark.parametrize("t", ["f32", "f64"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in CASES])
def test_library_reductions_match_the_interpreter(case, op, t):
    shape, dims, layout, out_layout = case
    text = reduce_hlo(t, op, shape, dims, layout, out_layout)
    program = CpuProgram(parse_module(text), {"optimize": False})
    assert _reduce_thunk(program).data is not None  # the library's kernel
    args = _args(t, shape, ZERO[op])
    want = np.asarray(evaluate(parse_module(text), args))
    _close(np.asarray(program.run(args)), want, t, op, _reduced(shape, dims))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("case", [((40, 33), (1,)), ((40, 33), (0,)), ((200,), (0,))])
def test_nan_and_an_init_other_than_the_identity(case, op):
    shape, dims = case
    init = {"add": "2.5", "maximum": "0.75", "minimum": "-0.75"}[op]
    text = reduce_hlo("f32", op, shape, dims, init=init)
    program = CpuProgram(parse_module(text))
    assert _reduce_thunk(program).data is not None
    (x,) = args = _args("f32", shape, ZERO[op])
    flat = x.reshape(-1)
    flat[RNG.choice(flat.size, size=3, replace=False)] = np.nan
    want = np.asarray(evaluate(parse_module(text), args))
    got = np.asarray(program.run(args))
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got).any()
    _close(np.nan_to_num(got), np.nan_to_num(want), "f32", op, _reduced(shape, dims))


@pytest.mark.parametrize("op", ["maximum", "minimum"])
@pytest.mark.parametrize("case", [((40, 33), (1,)), ((40, 33), (0,)), ((5, 1500), (0,))])
def test_signed_zeros_as_the_per_shape_kernel(case, op):
    """+0 above -0 (llvm.maximum / minimum), whatever order they come in: the same bits
    as the per-shape kernel, with both zeros in most rows and columns."""
    shape, dims = case
    text = reduce_hlo("f32", op, shape, dims)
    x = RNG.standard_normal(shape).astype(np.float32)
    x = np.where(RNG.random(shape) < 0.5, np.float32(0.0), np.float32(-0.0)) * (x != 0)
    x[RNG.random(shape) < 0.2] = -1.0 if op == "maximum" else 1.0
    library, own = (
        np.asarray(CpuProgram(parse_module(text), {"reduce_library": on}).run([x]))
        for on in (True, False)
    )
    np.testing.assert_array_equal(library.view(np.uint32), own.view(np.uint32))
    negative = np.signbit(x) & (x == 0)
    positive = ~np.signbit(x) & (x == 0)
    if op == "maximum":  # -0 only where no +0 is there
        want_negative = ~positive.any(axis=dims)
    else:  # -0 wherever one is there
        want_negative = negative.any(axis=dims)
    zeros = library == 0
    assert zeros.any() and (positive.any(axis=dims) & negative.any(axis=dims)).any()
    np.testing.assert_array_equal(np.signbit(library[zeros]), want_negative[zeros])


@pytest.mark.parametrize("case", [((1 << 20,), (0,)), ((3000, 64), (0,)), ((4, 100_000), (1,))])
def test_long_sums_stay_accurate(case):
    """Blocked partial sums: a long f32 sum keeps the error of a short chain."""
    shape, dims = case
    text = reduce_hlo("f32", "add", shape, dims)
    (x,) = args = [(RNG.random(shape) + 0.5).astype(np.float32)]  # all positive: no cancelling
    got = np.asarray(CpuProgram(parse_module(text)).run(args)).astype(np.float64)
    exact = x.astype(np.float64).sum(axis=dims)
    assert np.max(np.abs(got - exact) / exact) < 2e-6


def test_reduces_of_other_shapes_share_one_library_object(library):
    texts = [reduce_hlo("f32", "add", (30, 70), (1,)), reduce_hlo("f32", "add", (9, 1001), (1,))]
    first, second = (CpuProgram(parse_module(t)) for t in texts)
    a, b = _reduce_thunk(first), _reduce_thunk(second)
    assert a.kernel.object_key == b.kernel.object_key and a.data != b.data
    (obj,) = library.glob("*.o")
    assert obj.name.startswith(a.kernel.object_key)
    assert not list((library.parent / "kernels").rglob("*.o"))  # no per-program object
    clear_kernel_cache()
    third = CpuProgram(parse_module(texts[1]))
    assert _reduce_thunk(third).kernel.wait().from_cache  # read back, not compiled
    own = CpuProgram(parse_module(texts[1]), {"reduce_library": False})
    assert _reduce_thunk(own).data is None  # compiled for its shape
    args = _args("f32", (9, 1001))
    np.testing.assert_array_equal(np.asarray(third.run(args)), np.asarray(second.run(args)))
    _close(np.asarray(own.run(args)), np.asarray(second.run(args)), "f32", "add", 1001)


def test_a_fused_reduction_keeps_its_per_shape_kernel():
    text = """HloModule fused
r {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
ENTRY e {
  x = f32[16,40] parameter(0)
  ex = f32[16,40] exponential(x)
  i = f32[] constant(0)
  ROOT y = f32[16] reduce(ex, i), dimensions={1}, to_apply=r
}"""
    program = CpuProgram(parse_module(text))
    kernels = [t for t in program.compiled.entry.thunks if isinstance(t, KernelThunk)]
    assert len(kernels) == 1 and kernels[0].instr.opcode is Opcode.FUSION
    assert kernels[0].data is None
    args = _args("f32", (16, 40))
    want = np.asarray(evaluate(parse_module(text), args))
    _close(np.asarray(program.run(args)), want, "f32", "add", 40)


@pytest.mark.parametrize("case", [((512, 1024), (1,)), ((700, 1024), (0,)), ((64, 256, 64), (1,))])
def test_a_split_over_the_pool_gives_the_same_bits(case):
    shape, dims = case
    text = reduce_hlo("f32", "add", shape, dims)
    program = CpuProgram(parse_module(text))
    thunk = _reduce_thunk(program)
    assert thunk.data is not None
    assert thunk.split_choice is not None or thunk.chunks == 1  # splits where there are cores
    args = _args("f32", shape)
    results = [np.asarray(program.run(args)) for _ in range(12)]  # whole and split runs
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    want = np.asarray(evaluate(parse_module(text), args))
    _close(results[0], want, "f32", "add", _reduced(shape, dims))


def test_a_library_reduction_in_a_native_loop():
    state = "(s32[], f32[24,40], f32[24])"
    text = f"""HloModule loop
r {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] maximum(a, b)
}}
cond {{
  s = {state} parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(5)
  ROOT c = pred[] compare(i, n), direction=LT
}}
body {{
  s = {state} parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[24,40] get-tuple-element(s), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  x1 = f32[24,40] sine(x)
  init = f32[] constant(-inf)
  m = f32[24] reduce(x1, init), dimensions={{1}}, to_apply=r
  ROOT t = {state} tuple(i1, x1, m)
}}
ENTRY e {{
  x = f32[24,40] parameter(0)
  m = f32[24] parameter(1)
  zero = s32[] constant(0)
  s = {state} tuple(zero, x, m)
  l = {state} while(s), condition=cond, body=body
  ROOT out = f32[24] get-tuple-element(l), index=2
}}"""
    args = [RNG.standard_normal((24, 40)).astype(np.float32), np.zeros(24, np.float32)]
    native = CpuBackend().compile(parse_module(text), {})
    (loop,) = [x for x in native.compiled.entry.thunks if isinstance(x, WhileThunk)]
    assert loop.native is not None, native.thunk_listing()
    reduces = [x for x in loop.body.thunks if x.instr.opcode is Opcode.REDUCE]
    assert len(reduces) == 1 and isinstance(reduces[0], KernelThunk) and reduces[0].data
    python = CpuBackend().compile(parse_module(text), {"native_loops": False})
    got = np.asarray(native.run(args))
    np.testing.assert_array_equal(got, np.asarray(python.run(args)))
    want = np.asarray(evaluate(parse_module(text), args))  # its sines within an ulp or two
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_damaged_library_reduction_is_rejected_and_built_again(library):
    text = reduce_hlo("f32", "maximum", (20, 30), (0,))
    args = _args("f32", (20, 30))
    want = np.asarray(CpuProgram(parse_module(text)).run(args))
    (obj,) = library.glob("*.o")
    good = obj.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0x40
    obj.write_bytes(bytes(data))
    clear_kernel_cache()
    with pytest.warns(CacheEntryWarning, match="kernel library object"):
        program = CpuProgram(parse_module(text))
        assert not _reduce_thunk(program).kernel.wait().from_cache  # compiled again
    np.testing.assert_array_equal(np.asarray(program.run(args)), want)
    assert obj.read_bytes() == good


def test_per_shape_kernels_of_reducers_with_the_same_name_are_not_shared(library):
    """A per-shape reduce kernel is keyed by its reducer's body too (the kernel key's
    ir.printer.print_canonical): a minimum whose reducer is named as a maximum's once ran
    the maximum's kernel."""
    x = RNG.standard_normal((40, 33)).astype(np.float32)
    for op, want in (("maximum", x.max(axis=1)), ("minimum", x.min(axis=1))):
        text = reduce_hlo("f32", op, (40, 33), (1,))  # both reducers are named `r`
        program = CpuProgram(parse_module(text), {"reduce_library": False})
        np.testing.assert_array_equal(np.asarray(program.run([x])), want)
    clear_kernel_cache()  # and from the disk cache
    text = reduce_hlo("f32", "minimum", (40, 33), (1,))
    got = CpuProgram(parse_module(text), {"reduce_library": False}).run([x])
    np.testing.assert_array_equal(np.asarray(got), x.min(axis=1))


def test_a_warm_compile_runs_the_library_reduction(library):
    """The second compile comes from the executable cache / program image (the thunk's
    parameter block pickled with it): the same bits, the library object read back."""
    text = reduce_hlo("f32", "add", (300, 77), (0,))
    x = RNG.standard_normal((300, 77)).astype(np.float32)
    results = []
    for _ in range(2):
        clear_kernel_cache()
        client = Client("cpu")
        executable = client.compile(text)
        results.append(executable.execute([[client.buffer_from_pyval(x)]])[0][0].to_numpy())
    np.testing.assert_array_equal(results[1], results[0])
    assert list((library.parent / "kernels").glob("*.image"))
    _close(results[0], x.sum(axis=0), "f32", "add", 300)
