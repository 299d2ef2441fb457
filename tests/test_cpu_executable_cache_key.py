"""The whole-executable cache key covers everything that changes the compiled program.

A table of program pairs that differ in one thing each (every attribute kind the CPU
compiler reads, constants small and large, layouts, called computations, loop bounds,
branch order): after the first program of a pair is compiled (its entry written), the
second must miss (a second entry) and compute its own result, checked against the
interpreter. Then every compile option the CPU backend honours, and every environment
variable that changes code generation, changes the key; those that change only the
lowering (which every compile runs again) give a warm compile the thunk plan of a cold one.
"""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends.cpu import CpuBackend
from xlapy.backends.cpu.codegen import emitter
from xlapy.backends.cpu.jit import engine as jit
from xlapy.backends.cpu.jit import executable_cache
from xlapy.backends.cpu.jit.kernel import clear_kernel_cache
from xlapy.backends.interpreter import evaluate
from xlapy.backends.options import INTERNAL_OPTIONS, RUNTIME_OPTIONS
from xlapy.ir.parser import parse_module
from xlapy.ir.verifier import verify


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv(executable_cache.ENABLE_ENV, "1")
    clear_kernel_cache()
    yield tmp_path / "kernels"
    clear_kernel_cache()


def unary(body: str, shape: str = "f32[5,5]") -> str:
    return f"HloModule m\nENTRY e {{\n  x = {shape} parameter(0)\n{body}\n}}"


REDUCER = "a {\n  p = f32[] parameter(0)\n  q = f32[] parameter(1)\n  ROOT ra = f32[] @(p, q)\n}\n"
LOOP = """HloModule m
cond {
  sc = (s32[], f32[5,5]) parameter(0)
  ic = s32[] get-tuple-element(sc), index=0
  n = s32[] constant(@)
  ROOT lt = pred[] compare(ic, n), direction=LT
}
body {
  s = (s32[], f32[5,5]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  xb = f32[5,5] get-tuple-element(s), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  y = f32[5,5] sine(xb)
  ROOT t = (s32[], f32[5,5]) tuple(i1, y)
}
ENTRY e {
  x = f32[5,5] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[5,5]) tuple(zero, x)
  w = (s32[], f32[5,5]) while(init), condition=cond, body=body
  ROOT r = f32[5,5] get-tuple-element(w), index=1
}"""
BRANCHES = """HloModule m
b0 {
  p = f32[5,5] parameter(0)
  ROOT s = f32[5,5] sine(p)
}
b1 {
  p.1 = f32[5,5] parameter(0)
  ROOT n = f32[5,5] negate(p.1)
}
ENTRY e {
  k = s32[] parameter(0)
  x = f32[5,5] parameter(1)
  ROOT r = f32[5,5] conditional(k, x, x), branch_computations={@}
}"""
BIG = ", ".join(f"{0.01 * i:.2f}" for i in range(64))

# (what changes, program with `@`, the two fills)
CASES = {
    "scalar constant": (
        unary(
            "  c = f32[] constant(@)\n  b = f32[5,5] broadcast(c), dimensions={}\n"
            "  ROOT r = f32[5,5] add(x, b)"
        ),
        "0.5",
        "0.25",
    ),
    "array constant, one element": (
        unary("  c = f32[64] constant({@})\n  ROOT r = f32[64] multiply(x, c)", "f32[64]"),
        BIG,
        BIG.replace("0.33", "0.34"),
    ),
    "parameter layout": (
        unary("  ROOT r = f32[5] reduce(x, z), dimensions={0}, to_apply=a", "f32[5,5]{@}")
        .replace("ENTRY", REDUCER.replace("@", "add") + "ENTRY")
        .replace("{\n  x", "{\n  z = f32[] constant(0)\n  x"),
        "1,0",
        "0,1",
    ),
    "result layout": (
        unary("  ROOT r = f32[5,5]{@} exponential(x)"),
        "1,0",
        "0,1",
    ),
    "reduce dimensions": (
        REDUCER.replace("@", "add")
        + unary(
            "  z = f32[] constant(0)\n  ROOT r = f32[5] reduce(x, z), dimensions={@}, to_apply=a"
        ).replace("HloModule m\n", ""),
        "0",
        "1",
    ),
    "reducer body": (
        REDUCER
        + unary(
            "  z = f32[] constant(-1e30)\n"
            "  ROOT r = f32[5] reduce(x, z), dimensions={1}, to_apply=a"
        ).replace("HloModule m\n", ""),
        "add",
        "maximum",
    ),
    "compare direction": (
        unary(
            "  z = f32[] constant(0.1)\n  b = f32[5,5] broadcast(z), dimensions={}\n"
            "  c = pred[5,5] compare(x, b), direction=@\n"
            "  ROOT r = f32[5,5] select(c, x, b)"
        ),
        "GT",
        "LT",
    ),
    "compare type": (
        unary(
            "  c = pred[5,5] compare(x, x), direction=EQ@\n"
            "  n = f32[5,5] negate(x)\n  ROOT r = f32[5,5] select(c, x, n)"
        ),
        "",
        ", type=TOTALORDER",
    ),
    "slice": (
        unary("  ROOT r = f32[4,5] slice(x), slice={[@], [0:5]}"),
        "0:4",
        "1:5",
    ),
    "pad config": (
        unary("  z = f32[] constant(0.5)\n  ROOT r = f32[6,5] pad(x, z), padding=@"),
        "1_0x0_0",
        "0_1x0_0",
    ),
    "transpose dimensions": (
        unary("  ROOT r = f32[5,5] transpose(x), dimensions={@}"),
        "1,0",
        "0,1",
    ),
    "broadcast dimensions": (
        unary(
            "  v = f32[5] slice(x), slice={[0:1], [0:5]}\n"
            "  w = f32[5] reshape(v)\n  b = f32[5,5] broadcast(w), dimensions={@}\n"
            "  ROOT r = f32[5,5] add(x, b)"
        ).replace("f32[5] slice", "f32[1,5] slice"),
        "0",
        "1",
    ),
    "reverse dimensions": (
        unary("  ROOT r = f32[5,5] reverse(x), dimensions={@}"),
        "0",
        "1",
    ),
    "iota dimension": (
        unary("  i = f32[5,5] iota(), iota_dimension=@\n  ROOT r = f32[5,5] multiply(x, i)"),
        "0",
        "1",
    ),
    "dot dimensions": (
        unary("  ROOT r = f32[5,5] dot(x, x), lhs_contracting_dims={@}, rhs_contracting_dims={0}"),
        "1",
        "0",
    ),
    "reduce-window padding": (
        REDUCER.replace("@", "add")
        + unary(
            "  z = f32[] constant(0)\n"
            "  ROOT r = f32[5,5] reduce-window(x, z), window={size=3x1 pad=@x0_0}, to_apply=a"
        ).replace("HloModule m\n", ""),
        "1_1",
        "2_0",
    ),
    "reduce-precision bits": (
        unary("  ROOT r = f32[5,5] reduce-precision(x), exponent_bits=@"),
        "8, mantissa_bits=7",
        "5, mantissa_bits=10",
    ),
    "element type": (
        unary("  c = @[5,5] convert(x)\n  ROOT r = f32[5,5] convert(c)"),
        "bf16",
        "f16",
    ),
    "loop bound (a native loop's constant)": (LOOP, "3", "4"),
    "branch order": (BRANCHES, "b0, b1", "b1, b0"),
}


def arguments(module, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    args = []
    for p in module.entry.parameters:
        dtype = np.dtype(p.shape.dtype)
        if dtype.kind == "i":
            args.append(np.array(1, dtype))
        else:
            v = rng.standard_normal(p.shape.dims).astype(dtype)
            v.flat[::3] = np.nan  # compare type: NaN == NaN only in the total order
            args.append(v)
    return args


def compile_and_check(text: str, seed: int) -> None:
    module = parse_module(text)
    verify(module)
    program = CpuBackend().compile(module, {})
    args = arguments(module, seed)
    np.testing.assert_allclose(
        np.asarray(program.run(args)), np.asarray(evaluate(module, args)), rtol=2e-6, atol=1e-6
    )


@pytest.mark.parametrize("case", list(CASES))
def test_a_program_that_differs_in_one_thing_misses(cache, case):
    template, a, b = CASES[case]
    first, second = template.replace("@", a), template.replace("@", b)
    assert first != second
    compile_and_check(first, 1)
    assert len(list(cache.glob("*.exe"))) == 1
    clear_kernel_cache()
    compile_and_check(second, 2)
    assert len(list(cache.glob("*.exe"))) == 2, "the second program hit the first's entry"


OPTION_VALUES = {
    "rng_seed": (0, 1),
    "optimize": (True, False),
    "verify": (False, True),
    "native_loops": (True, False),
    "inline_loop_kernels": (True, False),
    "direct_convolutions": (True, False),
    "native_gemv": (True, False),
    "native_small_gemm": (True, False),
    "small_gemm_library": (True, False),
    "reduce_library": (True, False),
    "conv_library": (True, False),
    "window_library": (True, False),
    "native_runs": (True, False),
    "denormals": ("flush", "ieee"),
    "max_while_iterations": (10, 11),
    "thunk_concurrency": ("auto", "off"),
    "strict_kernels": (True, False),
    "replica_id": (0, 1),
    "partition_id": (0, 1),
    "collective_timeout": (5.0, 6.0),
    "memory_scheduler": ("plan", "dfs"),
    "fft_library": ("ducc0", "scipy"),
    "max_isa": ("host", "SSE4_2"),
}


def test_every_option_the_cpu_backend_honours_is_in_the_key():
    honoured = {*CpuBackend.options, *RUNTIME_OPTIONS, *INTERNAL_OPTIONS}
    assert set(OPTION_VALUES) | executable_cache.UNKEYED_OPTIONS == honoured
    text = unary("  ROOT r = f32[5,5] sine(x)")
    for name, (a, b) in OPTION_VALUES.items():
        flush = emitter.denormals_flushed
        ka = executable_cache.cache_key(text, {name: a}, flush({name: a}))
        kb = executable_cache.cache_key(text, {name: b}, flush({name: b}))
        assert ka != kb, name


def test_environment_that_changes_code_is_in_the_key(monkeypatch):
    text = unary("  ROOT r = f32[5,5] sine(x)")

    def key() -> str:
        jit.opt_level.cache_clear()
        return executable_cache.cache_key(text, {}, emitter.denormals_flushed({}))

    base = key()
    monkeypatch.setenv(emitter.DENORMALS_ENV, "ieee")
    assert key() != base
    monkeypatch.delenv(emitter.DENORMALS_ENV)
    monkeypatch.setenv(jit.OPT_LEVEL_ENV, "1")
    assert key() != base
    monkeypatch.delenv(jit.OPT_LEVEL_ENV)
    assert key() == base
    jit.opt_level.cache_clear()


def test_the_maximum_isa_from_the_environment_is_in_the_key(monkeypatch):
    if not jit.native_target().triple.startswith("x86_64"):
        pytest.skip("the ISA levels are x86's")
    text = unary("  ROOT r = f32[5,5] sine(x)")

    def key(level: str | None) -> str:
        if level is None:
            monkeypatch.delenv(jit.MAX_ISA_ENV, raising=False)
        else:
            monkeypatch.setenv(jit.MAX_ISA_ENV, level)
        jit._env_isa.cache_clear()
        return executable_cache.cache_key(text, {}, emitter.denormals_flushed({}))

    try:
        assert key(None) != key("SSE4_2") != key("AVX2")
        assert key("avx2") == key("AVX2")
    finally:
        monkeypatch.undo()  # the process's own level again (a run under one)
        jit._env_isa.cache_clear()


LOWERING_ENV = {"XLAPY_CPU_CONCURRENCY": ("off", "always")}


@pytest.mark.parametrize("var", list(LOWERING_ENV))
def test_environment_read_by_the_lowering_gives_a_warm_compile_the_cold_plan(
    cache, monkeypatch, var
):
    """Not in the key: the lowering (thunks, splits, concurrency) runs on every compile,
    warm or cold, so a warm compile under another setting plans as a cold one does."""
    from xlapy.backends.cpu.compiler import compile_module

    text = LOOP.replace("@", "3")
    module = parse_module(text)
    first, second = LOWERING_ENV[var]
    monkeypatch.setenv(var, first)
    compile_module(module)
    monkeypatch.setenv(var, second)
    clear_kernel_cache()
    warm = compile_module(module).thunk_listing()
    monkeypatch.setattr(executable_cache, "read", lambda key: None)
    clear_kernel_cache()
    assert compile_module(module).thunk_listing() == warm
