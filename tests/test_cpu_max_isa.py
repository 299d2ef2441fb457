"""The maximum ISA level (XLA:CPU's xla_cpu_max_isa; option `max_isa`, $XLAPY_CPU_MAX_ISA):
kernels are generated for the host CPU with the features above the level off, so a
vectorizable kernel at SSE4_2 uses no ymm or zmm register and computes what the
interpreter does; code made at one level is never taken from a cache at another (the
level's features are in every key, the process's kernel cache included); a level that is
not one is a typed error."""

from __future__ import annotations

import re

import numpy as np
import pytest

from xlapy.backends.cpu.jit import engine as jit
from xlapy.backends.cpu.jit.kernel import clear_kernel_cache
from xlapy.backends.interpreter import evaluate
from xlapy.errors import XlapyError
from xlapy.ir.parser import parse_module
from xlapy.runtime import Client, CompileOptions

X86 = jit.native_target().triple.startswith(("x86_64", "i386", "i686"))
x86_only = pytest.mark.skipif(not X86, reason="the ISA levels are x86's")

# elementwise over 4096 floats (vectorized at every level) and a row reduction
TEXT = """HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  x = f32[64,64] parameter(0)
  y = f32[64,64] parameter(1)
  m = f32[64,64] multiply(x, y)
  t = f32[64,64] add(m, x)
  z = f32[] constant(0)
  r = f32[64] reduce(t, z), dimensions={1}, to_apply=add
  ROOT out = (f32[64,64], f32[64]) tuple(t, r)
}"""


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XLAPY_LIBRARY_DIR", str(tmp_path / "library"))
    clear_kernel_cache()
    yield tmp_path
    clear_kernel_cache()


def _compile(level: str | None):
    options = {} if level is None else {"max_isa": level}
    client = Client("cpu")
    return client, client.compile(TEXT, CompileOptions.make(backend_options=options))


def _registers(executable) -> set[str]:
    program = executable.backend_program()
    return {r for k in program.compiled.kernels() for r in re.findall(r"%([xyz])mm\d+", k.asm)}


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("SSE4_2", "SSE4_2"),
        ("sse4.2", "SSE4_2"),
        ("avx2", "AVX2"),
        ("AVX512F", "AVX512"),
        ("AMX", "AMX"),
        ("host", None),
        ("", None),
        (None, None),
    ],
)
def test_level_names(text, level):
    assert jit.parse_isa(text) == level


@pytest.mark.parametrize("bad", ["AVX3", "neon", 2, True])
def test_a_bad_level_is_a_typed_error(bad):
    with pytest.raises(XlapyError, match="SSE4_2, AVX, AVX2, AVX512"):
        jit.parse_isa(bad)
    with pytest.raises(XlapyError, match="max_isa"):
        Client("cpu").compile(TEXT, CompileOptions.make(backend_options={"max_isa": bad}))


@x86_only
def test_a_bad_environment_level_is_a_typed_error(monkeypatch):
    monkeypatch.setenv(jit.MAX_ISA_ENV, "AVX1024")
    jit._env_isa.cache_clear()
    try:
        with pytest.raises(XlapyError, match=jit.MAX_ISA_ENV):
            jit.host_target()
    finally:
        monkeypatch.undo()  # the process's own level again (a run under one)
        jit._env_isa.cache_clear()


@x86_only
def test_capped_features_turn_off_what_is_above_the_level():
    host = jit.native_target()
    host_on = {f for f in host.features.split(",") if f.startswith("+")}
    for level in jit.ISA_LEVELS:
        features = jit.capped_target(level).features.split(",")
        on = {f[1:] for f in features if f.startswith("+")}
        assert all(jit._level_of(f) <= jit.ISA_LEVELS.index(level) for f in on), level
        # what is kept is the host's; what is turned off comes after everything kept
        assert on <= {f[1:] for f in host_on}
        last_on = max(i for i, f in enumerate(features) if f.startswith("+"))
        capped = [i for i, f in enumerate(features) if f[0] == "-" and f"+{f[1:]}" in host_on]
        assert all(i > last_on for i in capped), level
    sse = jit.capped_target("SSE4_2").features.split(",")
    assert "-avx" in sse and "+avx" not in sse and "+avx2" not in sse and "+fma" not in sse
    avx2 = jit.capped_target("AVX2").features.split(",")
    assert not any(f.startswith("+avx512") for f in avx2)
    assert jit.capped_target(None) == host


@x86_only
@pytest.mark.parametrize("level", ["SSE4_2", "AVX2", "host"])
def test_kernels_honour_the_level(fresh, level):
    """At SSE4_2 no kernel touches a ymm or zmm register, at AVX2 none a zmm; the results
    are the interpreter's."""
    _, executable = _compile(level)
    registers = _registers(executable)
    host = set(jit.native_target().features.split(","))
    if level == "SSE4_2":
        assert registers <= {"x"}, registers
    elif level == "AVX2":
        assert "z" not in registers, registers
        if "+avx2" in host:
            assert "y" in registers, registers
    elif "+avx512f" in host:
        assert "z" in registers or "y" in registers, registers
    rng = np.random.default_rng(11)
    x, y = rng.standard_normal((2, 64, 64)).astype(np.float32)
    client = executable.client
    buffers = [client.buffer_from_pyval(a) for a in (x, y)]
    got = [b.to_numpy() for b in executable.execute([buffers])[0]]
    want = evaluate(parse_module(TEXT), [x, y])
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@x86_only
def test_code_of_one_level_is_not_taken_at_another(fresh):
    """The same program at the host's level, then at SSE4_2, in one process and one cache
    directory: the second compile finds neither the first's kernels in the process nor its
    whole-executable entry or objects on disk."""
    _, host = _compile("host")
    host_keys = {k.object_key for k in host.backend_program().compiled.kernels()}
    _, sse = _compile("SSE4_2")
    sse_kernels = sse.backend_program().compiled.kernels()
    assert not host_keys & {k.object_key for k in sse_kernels}
    assert all("-avx" in k.target.features.split(",") for k in sse_kernels)
    assert _registers(sse) <= {"x"}
    # and back: the host's level compiles to the host's objects again
    _, again = _compile("host")
    assert {k.object_key for k in again.backend_program().compiled.kernels()} == host_keys


@x86_only
def test_environment_level_sets_the_default(fresh, monkeypatch):
    monkeypatch.setenv(jit.MAX_ISA_ENV, "sse4_2")
    jit._env_isa.cache_clear()
    try:
        assert jit.max_isa() == "SSE4_2"
        assert "-avx" in jit.host_target().features.split(",")
        _, executable = _compile(None)
        assert _registers(executable) <= {"x"}
        with jit.compiling_for(None):  # the option's 'host' overrides the environment
            assert jit.host_target() == jit.native_target()
    finally:
        monkeypatch.undo()  # the process's own level again (a run under one)
        jit._env_isa.cache_clear()


HALF = """HloModule m
ENTRY e {
  h = f16[65536] parameter(0)
  f = f32[8192] parameter(1)
  d = f64[8192] parameter(2)
  wide = f32[65536] convert(h)
  narrow = f16[8192] convert(f)
  narrow64 = f16[8192] convert(d)
  e = f16[65536] exponential(h)
  ROOT out = (f32[65536], f16[8192], f16[8192], f16[65536]) tuple(wide, narrow, narrow64, e)
}"""


def _near_halfway(rng) -> tuple[np.ndarray, np.ndarray]:
    halves = rng.integers(0, 1 << 16, size=2000, dtype=np.uint16).view(np.float16)
    halves = halves[np.isfinite(halves)].astype(np.float64)
    mid = halves * (1 + 2.0**-11)  # the halfway points between neighbouring halves
    edges = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 65519.99, 65536.0, 2.0**-24]
    edges += [2.0**-25, 3 * 2.0**-26, 2.0**-14, 2.0**-14 * (1 - 2.0**-11), 1e-30, -1e30, 1e-40]
    x = np.concatenate([mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf), edges])
    x = np.concatenate([x, rng.standard_normal(8192) * 10.0 ** rng.integers(-9, 6, 8192)])
    return x[:8192].astype(np.float32), x[:8192]


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    bits = got.view(f"u{got.itemsize}") == want.view(f"u{want.itemsize}")
    same = bits | (np.isnan(got) & np.isnan(want))
    assert same.all(), (np.flatnonzero(~same)[:5], got[~same][:5], want[~same][:5])


@x86_only
def test_f16_without_f16c(fresh):
    """At SSE4_2 there is no F16C: every f16 <-> f32 conversion is a call to the JIT's
    __extendhfsf2 / __truncsfhf2 (jit/engine.py RUNTIME_BUILTINS; unresolved, the kernel
    jumped to address 0). Every f16 widens, and f32 and f64 values at and beside the
    halfway points narrow, exactly as NumPy does; exp agrees with the host's F16C code."""
    rng = np.random.default_rng(7)
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    f, d = _near_halfway(rng)
    results = {}
    for level in ("SSE4_2", "host"):
        client = Client("cpu")
        options = CompileOptions.make(backend_options={"max_isa": level})
        executable = client.compile(HALF, options)
        buffers = [client.buffer_from_pyval(a) for a in (h, f, d)]
        results[level] = [b.to_numpy() for b in executable.execute([buffers])[0]]
    wide, narrow, narrow64, _ = results["SSE4_2"]
    with np.errstate(over="ignore", invalid="ignore"):
        _same_bits(wide, h.astype(np.float32))
        _same_bits(narrow, f.astype(np.float16))
        _same_bits(narrow64, d.astype(np.float16))
    for got, host in zip(results["SSE4_2"], results["host"], strict=True):
        _same_bits(got, host)
