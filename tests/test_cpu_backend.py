"""The CPU backend's thunks and executor: registration, donation in place, concurrency,
control flow, custom calls, BLAS dots with an epilogue, parallel kernels, dumps, errors, and
ten steps of the MLP training step against the interpreter."""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from xlapy.backends import execute, get_backend
from xlapy.backends.cpu import CpuBackend
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.custom_calls import CustomCallRegistry
from xlapy.backends.interpreter import evaluate
from xlapy.errors import XlapyError
from xlapy.ir.parser import parse_module
from xlapy.runtime import Client

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RNG = np.random.default_rng(7)


pytestmark = pytest.mark.usefixtures("kernel_cache")


def normal(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def kinds(program: CpuProgram) -> list[str]:
    """The kind of every thunk in the listing, nested sequences included."""
    return [
        line.split()[0]
        for line in program.thunk_listing().splitlines()
        if line.strip().split(" ")[0] in {"kernel", "blas", "library", "copy", "while",
                                          "conditional", "call", "custom-call"}
    ]  # fmt: skip


def compile_text(text: str, **options) -> CpuProgram:
    return CpuBackend().compile(parse_module(text), options)


def check(program: CpuProgram, text: str, args, rtol=1e-5, atol=1e-6):
    got = program.run(args)
    want = evaluate(parse_module(text), args)
    for g, w in zip(_leaves(got), _leaves(want), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return got


def _leaves(v):
    return [x for e in v for x in _leaves(e)] if isinstance(v, tuple) else [v]


# -- registration -----------------------------------------------------------------------------

INCREMENT = """HloModule increment, input_output_alias={ {}: (0, {}, may-alias) }
ENTRY e {
  p = f32[64] parameter(0)
  c = f32[] constant(1)
  b = f32[64] broadcast(c), dimensions={}
  ROOT out = f32[64] add(p, b)
}"""


def test_cpu_is_registered_and_used_by_the_runtime():
    assert isinstance(get_backend("cpu"), CpuBackend)
    client = Client("cpu")
    assert client.backend.name == "cpu"
    x = normal(64)
    np.testing.assert_array_equal(execute(parse_module(INCREMENT), [x], "cpu"), x + 1)


def test_donation_writes_in_place_through_the_runtime():
    client = Client("cpu")
    exe = client.compile(INCREMENT)
    x = normal(64)
    buf = client.buffer_from_pyval(x)
    address = buf.unsafe_buffer_pointer()
    [y] = exe.execute_portable([buf], client.devices()[0], donate=[0])
    np.testing.assert_allclose(y.to_numpy(), x + 1)
    assert y.unsafe_buffer_pointer() == address
    assert buf.is_donated


def test_donated_output_is_the_argument_array_and_undonated_is_untouched():
    program = compile_text(INCREMENT)
    x = normal(64)
    keep = x.copy()
    out = program.run([x])  # not donated: copy-protection inside the program
    np.testing.assert_array_equal(x, keep)
    assert not np.shares_memory(out, x)
    out = program.run([x], frozenset({0}))
    assert out is x
    np.testing.assert_allclose(x, keep + 1)


# -- concurrency ------------------------------------------------------------------------------

CHAIN = """HloModule chain
ENTRY e {
  a = f32[256,128] parameter(0)
  b = f32[128,64] parameter(1)
  d = f32[256,64] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  t = f32[256,64] tanh(d)
  e = f32[256,64] exponential(t)
  zero = f32[] constant(0)
  ROOT r = f32[256] reduce(e, zero), dimensions={1}, to_apply=add
}
add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}"""


def test_concurrent_executions_of_one_program():
    program = compile_text(CHAIN)
    inputs = [(normal(256, 128), normal(128, 64)) for _ in range(4)]
    expected = [np.exp(np.tanh(a @ b)).sum(1) for a, b in inputs]
    errors = []

    def worker(k):
        try:
            for _ in range(10):
                got = program.run(list(inputs[k]))
                np.testing.assert_allclose(got, expected[k], rtol=1e-4)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert len(program._arenas) >= 1  # arenas are kept for reuse


# -- control flow -----------------------------------------------------------------------------

WHILE = """HloModule loop
cond {
  s = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  five = s32[] constant(5)
  ROOT lt = pred[] compare(i, five), direction=LT
}
body {
  s = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[8] get-tuple-element(s), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  x1 = f32[8] multiply(x, x)
  x2 = f32[8] sine(x1)
  ROOT t = (s32[], f32[8]) tuple(i1, x2)
}
ENTRY e {
  x = f32[8] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[8]) tuple(zero, x)
  w = (s32[], f32[8]) while(init), condition=cond, body=body
  ROOT r = f32[8] get-tuple-element(w), index=1
}"""

CONDITIONAL = """HloModule branches
b0 {
  p = f32[16] parameter(0)
  ROOT r = f32[16] exponential(p)
}
b1 {
  p = f32[16] parameter(0)
  ROOT r = f32[16] negate(p)
}
b2 {
  p = f32[16] parameter(0)
  ROOT r = f32[16] multiply(p, p)
}
ENTRY e {
  i = s32[] parameter(0)
  x = f32[16] parameter(1)
  ROOT c = f32[16] conditional(i, x, x, x), branch_computations={b0, b1, b2}
}"""

CALL = """HloModule calls
f {
  a = f32[32] parameter(0)
  b = f32[32] parameter(1)
  m = f32[32] multiply(a, b)
  ROOT s = f32[32] add(m, a)
}
ENTRY e {
  x = f32[32] parameter(0)
  y = f32[32] parameter(1)
  ROOT c = f32[32] call(x, y), to_apply=f
}"""


def test_while_thunk():
    program = compile_text(WHILE)
    assert "while" in kinds(program)
    check(program, WHILE, [normal(8)])


@pytest.mark.parametrize("index", [0, 1, 2, 7, -1])
def test_conditional_thunk(index):
    program = compile_text(CONDITIONAL)
    assert "conditional" in kinds(program)
    check(program, CONDITIONAL, [np.array(index, np.int32), normal(16)])


def test_call_thunk_without_inlining():
    program = compile_text(CALL, optimize=False)
    assert "call" in kinds(program)
    check(program, CALL, [normal(32), normal(32)])


# -- custom calls -----------------------------------------------------------------------------

CUSTOM = """HloModule custom
ENTRY e {
  x = f32[4,8] parameter(0)
  y = f32[4,8] parameter(1)
  ROOT c = f32[4,8] custom-call(x, y), custom_call_target="{target}"
}"""

_C_ADD = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))


@_C_ADD
def _c_add_scaled(out, ins):
    n = 32
    x = np.ctypeslib.as_array(ctypes.cast(ins[0], ctypes.POINTER(ctypes.c_float)), (n,))
    y = np.ctypeslib.as_array(ctypes.cast(ins[1], ctypes.POINTER(ctypes.c_float)), (n,))
    o = np.ctypeslib.as_array(ctypes.cast(out, ctypes.POINTER(ctypes.c_float)), (n,))
    o[:] = x + 2 * y


@pytest.mark.parametrize("kind", ["python", "c"])
def test_custom_call_thunks(kind):
    registry = CustomCallRegistry()
    if kind == "python":
        registry.register("target", lambda ins, opaque: ins[0] + 2 * ins[1])
    else:
        registry.register("target", _c_add_scaled)
    text = CUSTOM.replace("{target}", "target")
    program = CpuBackend().compile(parse_module(text), {"custom_calls": registry})
    assert "custom-call" in kinds(program)
    x, y = normal(4, 8), normal(4, 8)
    np.testing.assert_allclose(program.run([x, y]), x + 2 * y, rtol=1e-6)


# -- dots -------------------------------------------------------------------------------------

DOT_BIAS_RELU = """HloModule dense
ENTRY e {
  x = f32[64,96] parameter(0)
  w = f32[96,48] parameter(1)
  b = f32[48] parameter(2)
  d = f32[64,48] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  bb = f32[64,48] broadcast(b), dimensions={1}
  s = f32[64,48] add(d, bb)
  zero = f32[] constant(0)
  z = f32[64,48] broadcast(zero), dimensions={}
  ROOT r = f32[64,48] maximum(s, z)
}"""

BATCHED_DOT = """HloModule batched
ENTRY e {
  a = f32[3,5,7] parameter(0)
  b = f32[3,4,7] parameter(1)
  ROOT d = f32[3,5,4] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0},
      lhs_contracting_dims={2}, rhs_contracting_dims={2}
}"""


def test_dot_with_bias_relu_epilogue():
    program = compile_text(DOT_BIAS_RELU)
    assert kinds(program) == ["blas", "kernel"]
    x, w, b = normal(64, 96), normal(96, 48), normal(48)
    got = check(program, DOT_BIAS_RELU, [x, w, b], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-4)


def test_batched_dot_with_transposed_operand():
    # 5x4 results: a native small-gemm kernel; without it, a BLAS gemm per batch
    for options, kind in (({}, "kernel"), ({"native_small_gemm": False}, "blas")):
        program = compile_text(BATCHED_DOT, **options)
        assert kinds(program) == [kind], options
        check(program, BATCHED_DOT, [normal(3, 5, 7), normal(3, 4, 7)], rtol=1e-5, atol=1e-5)


# -- kernels: parallel chunks, fallbacks ------------------------------------------------------

BIG = """HloModule big
ENTRY e {
  x = f32[512,256] parameter(0)
  y = f32[512,256] parameter(1)
  m = f32[512,256] multiply(x, y)
  ROOT r = f32[512,256] tanh(m)
}"""

SORT = """HloModule sorting
cmp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT lt = pred[] compare(a, b), direction=LT
}
ENTRY e {
  x = f32[10,20] parameter(0)
  s = f32[10,20] sort(x), dimensions={1}, to_apply=cmp
  ROOT n = f32[10,20] negate(s)
}"""


def test_large_kernels_run_in_parallel_chunks():
    program = compile_text(BIG)
    if (os.cpu_count() or 1) > 1:
        assert "parallel x" in program.thunk_listing()
    check(program, BIG, [normal(512, 256), normal(512, 256)])


def test_unsupported_ops_fall_back_to_library_thunks():
    program = compile_text(SORT)
    assert kinds(program) == ["library", "kernel"]
    x = normal(10, 20)
    np.testing.assert_array_equal(program.run([x]), -np.sort(x, axis=1))


# -- dumps and errors -------------------------------------------------------------------------


def test_dump_writes_listing_hlo_and_kernel_code(tmp_path):
    program = compile_text(DOT_BIAS_RELU)
    paths = program.dump(tmp_path)
    names = {p.name for p in paths}
    assert {"thunks.txt", "module.hlo", "buffer_assignment.txt"} <= names
    listing = (tmp_path / "thunks.txt").read_text()
    assert "blas d = dot" in listing and "alloc" in listing
    [ll] = [p for p in paths if p.name.endswith(".ll") and not p.name.endswith(".opt.ll")]
    assert "define void" in ll.read_text()
    [asm] = [p for p in paths if p.suffix == ".s"]
    assert asm.read_text().strip()


def test_user_errors_are_xlapy_errors():
    program = compile_text(INCREMENT)
    with pytest.raises(XlapyError, match="takes 1 arguments"):
        program.run([])
    with pytest.raises(XlapyError, match="expects f32\\[64\\]"):
        program.run([np.zeros(3, np.float32)])
    bad = INCREMENT.replace("ROOT out = f32[64] add(p, b)", "ROOT out = f32[64] add(p, q)")
    with pytest.raises(XlapyError):
        compile_text(bad)


# -- the MLP training step --------------------------------------------------------------------


def test_mlp_train_step_ten_steps_matches_interpreter():
    text = (EXAMPLES / "mlp_train_step.hlo").read_text()
    module = parse_module(text)
    program = CpuBackend().compile(module)
    rng = np.random.default_rng(3)
    shapes = [p.shape for p in module.entry.parameters]
    params = [(rng.standard_normal(s.dims) * 0.1).astype(s.dtype) for s in shapes[:6]]
    x = rng.standard_normal(shapes[6].dims).astype(np.float32)
    y = rng.integers(0, 10, shapes[7].dims).astype(np.int32)
    ours, theirs = [p.copy() for p in params], [p.copy() for p in params]
    for _ in range(10):
        got = program.run([*ours, x, y], frozenset(range(6)))
        want = evaluate(module, [*theirs, x, y])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4)
        for i in range(6):
            assert got[1 + i] is ours[i]  # updated in place
        theirs = [np.array(w) for w in want[1:]]
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
