"""The CPU backend's fallbacks are loud: a kernel that fails to compile raises under
strict_kernels (the suite's default, tests/conftest.py) and otherwise warns once and runs
another way; every instruction left to the interpreter's rule is listed with its reason on
the compiled program, by `xlapy opt --backend cpu` and by `xlapy bench`. Also the kernels
that used to fail to compile: width-changing bitcast-convert."""

import json
import re
import warnings

import ml_dtypes
import numpy as np
import pytest

from xlapy.backends.base import Fallback
from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.codegen.common import EMIT_RULES
from xlapy.backends.cpu.jit.kernel import clear_kernel_cache
from xlapy.backends.cpu.lowering import (
    KernelCompileError,
    KernelFallbackWarning,
    strict_kernels,
)
from xlapy.backends.interpreter import evaluate
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("kernel_cache")
RNG = np.random.default_rng(20261126)

# cholesky (the HLO op, not JAX's LAPACK custom call) has no kernel and no library path;
# complex tanh has no kernel rule
CHOLESKY = """HloModule with_cholesky
ENTRY e {
  x = c64[4,4] parameter(0)
  f = c64[4,4] cholesky(x), lower=true
  ROOT n = c64[4,4] tanh(f)
}"""

SORTED = """HloModule sorted
cmp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT lt = pred[] compare(a, b), direction=LT
}
ENTRY e {
  x = f32[6,9] parameter(0)
  ROOT s = f32[6,9] sort(x), dimensions={1}, to_apply=cmp
}"""


def _complex(*shape):
    return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(np.complex64)


def test_the_suite_runs_strict():
    assert strict_kernels({})
    assert not strict_kernels({"strict_kernels": False})


def test_an_instruction_without_kernel_or_library_path_is_a_listed_fallback():
    program = CpuProgram(parse_module(CHOLESKY))
    assert program.fallbacks == [
        Fallback("f", "cholesky", "no kernel for 'cholesky'"),
        Fallback("n", "tanh", "n: the CPU emitter has no complex rule for 'tanh'"),
    ]
    assert str(program.fallbacks[0]) == "f (cholesky): no kernel for 'cholesky'"
    a = _complex(4, 4)
    x = (a @ a.conj().T + 4 * np.eye(4)).astype(np.complex64)
    want = evaluate(parse_module(CHOLESKY), [x])
    np.testing.assert_allclose(program.run([x]), want, rtol=1e-5, atol=1e-5)


def test_a_library_fast_path_is_not_a_fallback():
    program = CpuProgram(parse_module(SORTED))
    assert "fast NumPy path" in program.thunk_listing()
    assert program.fallbacks == []
    x = RNG.standard_normal((6, 9)).astype(np.float32)
    np.testing.assert_array_equal(program.run([x]), np.sort(x, axis=1))


# A negate the emitter accepts but whose emission raises: what a code generator bug looks like.
BROKEN = """HloModule broken
ENTRY e {
  x = f32[13,7] parameter(0)
  ROOT n = f32[13,7] negate(x)
}"""


@pytest.fixture
def broken_negate(monkeypatch):
    def explode(em, instr, index):
        raise RuntimeError("emitter bug")

    clear_kernel_cache()
    monkeypatch.setitem(EMIT_RULES, Opcode.NEGATE, explode)
    yield
    clear_kernel_cache()


def test_a_kernel_that_fails_to_compile_raises_when_strict(broken_negate):
    with pytest.raises(KernelCompileError, match=r"n: its kernel failed to compile.*emitter bug"):
        CpuProgram(parse_module(BROKEN), {"strict_kernels": True})


def test_a_kernel_that_fails_to_compile_warns_once_and_falls_back(broken_negate):
    options = {"strict_kernels": False}
    with pytest.warns(KernelFallbackWarning, match=r"n: kernel compile failed.*emitter bug"):
        program = CpuProgram(parse_module(BROKEN), options)
    [fallback] = program.fallbacks
    assert (fallback.name, fallback.opcode) == ("n", "negate")
    assert "kernel compile failed: RuntimeError: emitter bug" in fallback.reason
    x = RNG.standard_normal((13, 7)).astype(np.float32)
    np.testing.assert_array_equal(program.run([x]), -x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        again = CpuProgram(parse_module(BROKEN), options)  # the same failure: no second warning
    assert again.fallbacks == program.fallbacks


# (operand, result): every direction of a width-changing bitcast-convert, floats and ints
BITCASTS = [
    ("f32[3,5]", "u16[3,5,2]"),
    ("f64[4]", "u32[4,2]"),
    ("f32[6]", "s8[6,4]"),
    ("s64[3]", "bf16[3,4]"),
    ("u32[2,3,2]", "u64[2,3]"),
    ("u8[7,4]", "f32[7]"),
    ("u16[5,2]", "f32[5]"),
    ("s16[2,4]", "f64[2]"),
]


DTYPES = {
    "f32": np.float32,
    "f64": np.float64,
    "u32": np.uint32,
    "u8": np.uint8,
    "u16": np.uint16,
    "s64": np.int64,
    "s16": np.int16,
}


def _random(shape_text: str) -> np.ndarray:
    dtype = DTYPES[shape_text.split("[")[0]]
    dims = [int(d) for d in re.findall(r"\d+", shape_text.split("[")[1])]
    bits = RNG.integers(0, 256, int(np.prod(dims)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    return bits.view(dtype).reshape(dims)


@pytest.mark.parametrize("operand,result", BITCASTS, ids=[f"{a}->{b}" for a, b in BITCASTS])
def test_width_changing_bitcast_convert_is_a_kernel(operand, result):
    text = f"""HloModule bitcast
ENTRY e {{
  x = {operand} parameter(0)
  b = {result} bitcast-convert(x)
  ROOT r = {result} reverse(b), dimensions={{0}}
}}"""
    program = CpuProgram(parse_module(text))
    assert program.fallbacks == []
    assert "library" not in program.thunk_listing()
    x = _random(operand)
    got, want = program.run([x]), evaluate(parse_module(text), [x])
    assert np.asarray(got).dtype == np.asarray(want).dtype
    np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8))


def test_opt_lists_the_cpu_fallbacks(run_cli, write):
    path = write("cholesky.hlo", CHOLESKY)
    code, out, err = run_cli("opt", path, "--backend", "cpu")
    assert code == 0, err
    assert "cholesky(" in out
    assert "cpu fallbacks: 2\n  f (cholesky): no kernel for 'cholesky'\n  n (tanh): " in err
    code, _, err = run_cli("opt", write("sorted.hlo", SORTED), "--backend", "cpu")
    assert code == 0 and "cpu fallbacks: none" in err


def test_bench_lists_the_fallbacks(run_cli, write):
    path = write("cholesky.hlo", CHOLESKY)
    code, out, err = run_cli("bench", path, "--random-inputs", "--runs", "2", "--warmup", "0")
    assert code == 0, err
    assert "fallbacks: 2\n  f (cholesky): no kernel for 'cholesky'\n  n (tanh): " in out
    code, out, err = run_cli(
        "bench", path, "--random-inputs", "--runs", "2", "--warmup", "0", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["fallbacks"][0] == "f (cholesky): no kernel for 'cholesky'"


# XLA's optimized HLO: a dot fused with its bias add and tanh (an output fusion), and a
# reduce-window fused with its operand's producer; the defuser undoes both, the dot runs as
# BLAS, the reduce-window as its library path, and xlapy fuses the elementwise rest again.
FOREIGN_FUSIONS = """HloModule foreign
fused_dot {
  p0 = f32[8,16] parameter(0)
  p1 = f32[16,4] parameter(1)
  p2 = f32[4] parameter(2)
  d = f32[8,4] dot(p0, p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  b = f32[8,4] broadcast(p2), dimensions={1}
  a = f32[8,4] add(d, b)
  ROOT t = f32[8,4] tanh(a)
}
add_f32 {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}
fused_window {
  q0 = f32[8,4] parameter(0)
  e = f32[8,4] exponential(q0)
  z = f32[] constant(0)
  ROOT w = f32[8,4] reduce-window(e, z), window={size=8x1 pad=7_0x0_0}, to_apply=add_f32
}
ENTRY e {
  x = f32[8,16] parameter(0)
  w = f32[16,4] parameter(1)
  b = f32[4] parameter(2)
  f = f32[8,4] fusion(x, w, b), kind=kOutput, calls=fused_dot
  ROOT g = f32[8,4] fusion(f), kind=kLoop, calls=fused_window
}"""


def test_foreign_fusions_around_own_thunk_ops_are_undone():
    from xlapy.passes.inline import Defuser

    module = parse_module(FOREIGN_FUSIONS)
    assert Defuser().run(module)
    opcodes = {i.opcode for i in module.entry_computation().instructions}
    assert Opcode.FUSION not in opcodes
    assert {Opcode.DOT, Opcode.REDUCE_WINDOW, Opcode.TANH} <= opcodes
    assert [c.name for c in module.computations] == ["add_f32", "e"]
    assert not Defuser().run(module)

    program = CpuProgram(parse_module(FOREIGN_FUSIONS))
    assert program.fallbacks == []
    args = [RNG.standard_normal(s).astype(np.float32) for s in ((8, 16), (16, 4), (4,))]
    want = evaluate(parse_module(FOREIGN_FUSIONS), args)
    np.testing.assert_allclose(program.run(args), want, rtol=2e-5, atol=2e-5)


REDUCE_PRECISION = [  # (type, exponent_bits, mantissa_bits)
    ("f32", 5, 10),
    ("f32", 8, 7),
    ("f32", 4, 3),
    ("f32", 5, 2),
    ("f32", 8, 23),
    ("f64", 8, 23),
    ("f64", 11, 10),
    ("f64", 5, 0),
    ("f16", 4, 3),
    ("f16", 5, 2),
    ("bf16", 5, 2),
    ("bf16", 4, 5),
]
FLOATS = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def _wide_range(dtype, n: int) -> np.ndarray:
    """Magnitudes over the type's whole range with NaN, +-inf, +-0 and subnormals."""
    info = ml_dtypes.finfo(dtype)
    exps = RNG.uniform(np.log2(float(info.smallest_subnormal)), np.log2(float(info.max)), n)
    x = (np.sign(RNG.standard_normal(n)) * np.exp2(exps)).astype(np.float64)
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, float(info.smallest_subnormal)]
    x[: len(specials)] = specials
    return x.astype(dtype)


@pytest.mark.parametrize(
    "t,e,m", REDUCE_PRECISION, ids=[f"{t}-e{e}m{m}" for t, e, m in REDUCE_PRECISION]
)
def test_reduce_precision_is_a_kernel(t, e, m):
    text = f"""HloModule rp
ENTRY e {{
  x = {t}[257] parameter(0)
  r = {t}[257] reduce-precision(x), exponent_bits={e}, mantissa_bits={m}
  ROOT n = {t}[257] negate(r)
}}"""
    program = CpuProgram(parse_module(text), {"denormals": "ieee"})
    assert program.fallbacks == []
    x = _wide_range(FLOATS[t], 257)
    got, want = np.asarray(program.run([x])), np.asarray(evaluate(parse_module(text), [x]))
    assert got.dtype == want.dtype
    nan = np.isnan(want.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan)
    np.testing.assert_array_equal(
        got[~nan].view(f"u{got.itemsize}"), want[~nan].view(f"u{got.itemsize}")
    )


def test_replica_and_partition_id_are_not_fallbacks():
    """replica-id and partition-id read the execution's ids (0 when run on its own)."""
    text = """HloModule ids, replica_count=4, num_partitions=6
ENTRY e {
  r = u32[] replica-id()
  p = u32[] partition-id()
  ROOT t = (u32[], u32[]) tuple(r, p)
}"""
    plain = CpuProgram(parse_module(text))
    assert not plain.fallbacks, plain.fallbacks
    r, p = plain.run([])
    assert (int(np.asarray(r)), int(np.asarray(p))) == (0, 0)
    program = CpuProgram(parse_module(text), {"replica_id": 3, "partition_id": 5})
    r, p = program.run([])
    assert (int(np.asarray(r)), int(np.asarray(p))) == (3, 5)
    want = evaluate(parse_module(text), [], replica_id=3, partition_id=5)
    assert (int(want[0]), int(want[1])) == (3, 5)
