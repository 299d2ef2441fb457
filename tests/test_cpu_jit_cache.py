"""The JIT's disk cache: a second compile of the same program loads the object from the cache
(timings printed, not asserted), files are written atomically under $XLAPY_CACHE_DIR, and
different programs get different keys; the kernel cache skips emission on a hit, corrupted
entries are compiled again, and kernels compiled concurrently match serial ones. Also the
IR / optimized IR / assembly dumps."""

from __future__ import annotations

import time

import numpy as np
import pytest

from xlapy.backends import execute
from xlapy.backends.cpu import compile_computation
from xlapy.backends.cpu.compiler import compile_module
from xlapy.backends.cpu.jit import engine as jit
from xlapy.backends.cpu.jit import kernel as kernel_mod
from xlapy.backends.cpu.jit.kernel import clear_kernel_cache, clear_loaded_objects
from xlapy.errors import XlapyError
from xlapy.ir.parser import parse_module

TEXT = """HloModule m
ENTRY e {
  x = f32[32,64] parameter(0)
  y = f32[32,64] parameter(1)
  t = f32[32,64] tanh(x)
  ROOT r = f32[32,64] multiply(t, y)
}"""


@pytest.fixture(autouse=True)
def _fresh_process_cache():
    clear_loaded_objects()
    yield
    clear_loaded_objects()


def test_second_compile_hits_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    t0 = time.perf_counter()
    first = compile_computation(parse_module(TEXT).entry)
    t1 = time.perf_counter()
    second = compile_computation(parse_module(TEXT).entry)
    t2 = time.perf_counter()
    print(f"\ncold compile {1e3 * (t1 - t0):.1f} ms, cached compile {1e3 * (t2 - t1):.1f} ms")
    assert not first.from_cache and second.from_cache
    files = sorted(tmp_path.iterdir(), key=lambda f: f.suffix)
    assert [f.suffix for f in files] == [".kernel", ".o"], files
    assert files[1].stem == jit.cache_key(first.spec.llvm_ir)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((2, 32, 64)).astype(np.float32)
    np.testing.assert_array_equal(first(x, y), second(x, y))


def test_cache_key_depends_on_the_program(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    a = compile_computation(parse_module(TEXT).entry)
    b = compile_computation(parse_module(TEXT.replace("multiply", "add")).entry)
    assert jit.cache_key(a.spec.llvm_ir) != jit.cache_key(b.spec.llvm_ir)
    assert len(list(tmp_path.glob("*.o"))) == 2
    assert not list(tmp_path.glob(".tmp-*"))


def test_cache_dir_default_and_override(tmp_path, monkeypatch):
    monkeypatch.delenv("XLAPY_CACHE_DIR", raising=False)
    assert jit.cache_dir().parts[-3:] == (".cache", "xlapy", "kernels")
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path / "k"))
    assert jit.cache_dir() == tmp_path / "k"


def test_dumps(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    kernel = compile_computation(parse_module(TEXT).entry, "dump_me")
    assert 'define void @"dump_me"' in kernel.llvm_ir and "noalias" in kernel.llvm_ir
    assert "@dump_me" in kernel.optimized_ir
    assert "dump_me" in kernel.asm
    host = jit.host_target()
    assert host.cpu and host.triple


def _x_y():
    rng = np.random.default_rng(7)
    return rng.standard_normal((2, 32, 64)).astype(np.float32)


def test_kernel_cache_hit_skips_emission(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    first = compile_computation(parse_module(TEXT).entry)
    clear_loaded_objects()

    def no_emission(*args, **kwargs):
        raise AssertionError("emitted on a kernel cache hit")

    monkeypatch.setattr(kernel_mod, "emit_kernel", no_emission)
    second = compile_computation(parse_module(TEXT).entry, "again")
    assert second.from_cache and second._spec is None
    assert second.outer_extent == first.outer_extent and second.in_place == first.in_place
    x, y = _x_y()
    np.testing.assert_array_equal(first(x, y), second(x, y))
    monkeypatch.undo()
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    assert 'define void @"again"' in second.llvm_ir  # emitted lazily for the dump


@pytest.mark.parametrize("defer", [False, True])
@pytest.mark.parametrize("suffix", [".o", ".kernel"])
@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_corrupted_entry_is_compiled_again(tmp_path, monkeypatch, suffix, damage, defer):
    """Also when the compile is deferred (as the compiler asks): a kernel-cache hit whose
    object is damaged is compiled again, never handed over as a failing kernel."""
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    want = compile_computation(parse_module(TEXT).entry)
    (path,) = tmp_path.glob(f"*{suffix}")
    raw = path.read_bytes()
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "flip":
        raw = raw[:-10] + bytes([raw[-10] ^ 0x40]) + raw[-9:]
    else:
        raw = b"not a cache entry"
    path.write_bytes(raw)
    clear_loaded_objects()
    got = compile_computation(parse_module(TEXT).entry, defer=defer).wait()
    assert got._spec is not None  # the kernel cache missed: emitted
    assert got.from_cache == (suffix == ".kernel")  # the object cache is keyed by the IR
    x, y = _x_y()
    np.testing.assert_array_equal(want(x, y), got(x, y))
    # written again (after a deferred compile, by a callback that may run just after wait)
    deadline = time.monotonic() + 60
    while jit.read_entry(path.stem, suffix) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert jit.read_entry(path.stem, suffix) is not None


def test_entry_of_other_sources_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    compile_computation(parse_module(TEXT).entry)
    clear_loaded_objects()
    monkeypatch.setattr(kernel_mod, "source_fingerprint", lambda: "other sources")
    again = compile_computation(parse_module(TEXT).entry)
    assert again._spec is not None  # a kernel cache miss: emitted
    assert len(list(tmp_path.glob("*.kernel"))) == 2
    assert len(list(tmp_path.glob("*.o"))) == 1  # the same IR: the same object


CHAIN = """HloModule chain
add {
  p = f32[] parameter(0)
  q = f32[] parameter(1)
  ROOT s = f32[] add(p, q)
}

ENTRY e {
  x = f32[64,96] parameter(0)
  y = f32[64,96] parameter(1)
  z = f32[] constant(0)
  a = f32[64,96] tanh(x)
  b = f32[64,96] multiply(a, y)
  c = f32[64] reduce(b, z), dimensions={1}, to_apply=add
  d = f32[64,96] broadcast(c), dimensions={0}
  e = f32[64,96] subtract(x, d)
  f = f32[96,64] transpose(e), dimensions={1,0}
  g = f32[96,64] exponential(f)
  ROOT r = (f32[96,64], f32[64]) tuple(g, c)
}"""


def test_program_compiled_concurrently_matches_the_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    module = parse_module(CHAIN)
    rng = np.random.default_rng(11)
    x, y = rng.standard_normal((2, 64, 96)).astype(np.float32)
    want = execute(module, [x, y])
    for _ in ("cold", "warm"):
        clear_kernel_cache()
        compiled = compile_module(module)
        assert not compiled.fallbacks, compiled.fallbacks
        assert compiled.kernels()
        got = execute(module, [x, y], "cpu")
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5)


def test_threads_compile_the_same_objects(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    texts = [TEXT.replace("tanh", op) for op in ("tanh", "exponential", "sine", "log", "sqrt")]
    specs = [kernel_mod.emit_kernel(parse_module(t).entry, kernel_mod.SYMBOL) for t in texts]
    serial = [jit.compile_object(s.llvm_ir, use_cache=False).data for s in specs]
    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(lambda s: jit.compile_object(s.llvm_ir, False).data, specs * 2))
    assert threaded == serial * 2


MEAN_VAR = """HloModule mean_var
add {
  p = f32[] parameter(0)
  q = f32[] parameter(1)
  ROOT s = f32[] add(p, q)
}

ENTRY e {
  x = f32[48,40] parameter(0)
  zero = f32[] constant(0)
  n = f32[] constant(48)
  nb = f32[40] broadcast(n), dimensions={}
  sum = f32[40] reduce(x, zero), dimensions={0}, to_apply=add
  mean = f32[40] divide(sum, nb)
  mb = f32[48,40] broadcast(mean), dimensions={1}
  d = f32[48,40] subtract(x, mb)
  sq = f32[48,40] multiply(d, d)
  ss = f32[40] reduce(sq, zero), dimensions={0}, to_apply=add
  var = f32[40] divide(ss, nb)
  t = f32[40] tanh(var)
  ROOT r = (f32[40], f32[40], f32[40]) tuple(mean, var, t)
}"""


@pytest.mark.parametrize("text", [CHAIN, MEAN_VAR], ids=["chain", "mean_var"])
def test_warm_kernels_share_one_engine(tmp_path, monkeypatch, text):
    """Kernels a compile takes from the cache are loaded into one execution engine, each
    at its own function, and compute what the interpreter does. (Objects compiled
    position-independent with the large code model reach their constants through the
    GOT; one MCJIT engine holding several such objects computed wrong values for
    MEAN_VAR's kernels.)"""
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    module = parse_module(text)
    clear_kernel_cache()
    # The test's own SharedEngine: the process's may hold an object of the same key in an
    # older engine (a live kernel of an earlier test), or retire its current engine
    # halfway through the cold compile once earlier tests filled it (ENGINE_OBJECTS).
    own = jit.SharedEngine()
    monkeypatch.setattr(jit, "shared_engine", lambda: own)
    compile_module(module)  # cold: fills this test's cache directory
    clear_kernel_cache()
    warm = compile_module(module)
    kernels = warm.kernels()
    objects = {id(k._loaded): k._loaded for k in kernels}.values()  # equal code: one object
    assert len(objects) >= 2, [k.name for k in kernels]
    assert all(k.from_cache for k in kernels)
    assert len({id(o.engine) for o in objects}) == 1
    assert len({o.address for o in objects}) == len(objects)
    rng = np.random.default_rng(12)
    args = [
        rng.standard_normal(p.shape.dims).astype(np.float32) + 0.5
        for p in module.entry_computation().parameters
    ]
    got = execute(module, args, "cpu")
    want = execute(module, args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5)


_ADD_ONE = """define void @"kernel"(float* noalias %out, float* noalias %x) {
entry:
  %v = load float, float* %x
  %w = fadd float %v, %c
  store float %w, float* %out
  ret void
}"""


def _object(constant: float, tmp_path, monkeypatch) -> tuple[str, bytes]:
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    text = _ADD_ONE.replace("%c", repr(constant))
    obj = jit.compile_object(text, False, "kernel")
    return obj.key, obj.data


def _call(address: int, x: float) -> float:
    import ctypes

    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(address)
    out, inp = np.zeros(1, np.float32), np.array([x], np.float32)
    fn(out.ctypes.data, inp.ctypes.data)
    return float(out[0])


def test_shared_engine_loads_batches_once_per_key(tmp_path, monkeypatch):
    """Batches of objects go into one engine; an object already loaded is not loaded
    again (same address); code of earlier batches keeps working after later ones."""
    engine = jit.SharedEngine()
    one, two, three = (_object(c, tmp_path, monkeypatch) for c in (1.0, 2.0, 3.0))
    first = engine.load([one, two])
    assert _call(first[one[0]].address, 5.0) == 6.0 and _call(first[two[0]].address, 5.0) == 7.0
    second = engine.load([two, three, three])
    assert second[two[0]].address == first[two[0]].address
    assert _call(second[three[0]].address, 5.0) == 8.0
    assert _call(first[one[0]].address, 1.5) == 2.5


def test_shared_engine_frees_code_with_its_last_hold(tmp_path, monkeypatch):
    """Issue 16 item 5: code is freed when the last hold on it goes (an engine at a time),
    not kept for the life of the process; code still held keeps working."""
    engine = jit.SharedEngine()
    objects = [_object(float(c), tmp_path, monkeypatch) for c in range(5)]
    first = engine.load(objects[:2])
    assert engine.stats()["objects"] == 2 and engine.stats()["bytes"] > 0
    del first
    assert engine.stats() == {"engines": 0, "objects": 0, "held": 0, "bytes": 0}
    kept = engine.load(objects[2:3])
    dropped = engine.load(objects[3:])
    del dropped
    assert engine.stats()["held"] == 1  # one engine: the dropped code waits for it
    assert _call(kept[objects[2][0]].address, 1.0) == 3.0
    del kept
    assert engine.stats()["engines"] == 0


def test_shared_engine_bounds_dead_code_behind_a_live_hold(tmp_path, monkeypatch):
    """An engine takes ENGINE_OBJECTS objects, then the next batch goes to a new one: a
    kernel kept for long keeps at most one engine's worth of dead code mapped."""
    monkeypatch.setattr(jit.SharedEngine, "ENGINE_OBJECTS", 4)
    engine = jit.SharedEngine()
    objects = [_object(float(c), tmp_path, monkeypatch) for c in range(40)]
    kept = engine.load(objects[:1])
    for obj in objects[1:]:
        holds = engine.load([obj])
        assert _call(holds[obj[0]].address, 1.0) == 1.0 + float(objects.index(obj))
        del holds
    stats = engine.stats()
    assert stats["engines"] == 1 and stats["objects"] <= 4 and stats["held"] == 1
    assert _call(kept[objects[0][0]].address, 2.0) == 2.0


def test_a_hold_dropped_while_the_engine_is_busy_is_released_later(tmp_path, monkeypatch):
    """A hold dropped by a garbage collection that runs while the engine's lock is held
    (this thread or another) is queued, not deadlocked on, and released by the next user."""
    engine = jit.SharedEngine()
    obj = _object(7.0, tmp_path, monkeypatch)
    holds = engine.load([obj])
    with jit._lock:
        del holds  # CodeHold.__del__ cannot take the lock here
    assert engine.stats()["engines"] == 0


def test_shared_engine_names_a_missing_symbol(tmp_path, monkeypatch):
    _, data = _object(1.0, tmp_path, monkeypatch)
    other = "0" * 64
    with pytest.raises(RuntimeError, match=jit.exported_symbol(other)):
        jit.SharedEngine().load([(other, data)])


DRIVER_IR = """
define i32 @"xla_loop"(i64* %table, i64 %n) nounwind {
entry:
  %slot = getelementptr i64, i64* %table, i64 0
  %raw = load i64, i64* %slot
  %f = inttoptr i64 %raw to i64 (i64)*
  br label %header
header:
  %i = phi i64 [0, %entry], [%next, %body]
  %acc = phi i64 [0, %entry], [%sum, %body]
  %more = icmp slt i64 %i, %n
  br i1 %more, label %body, label %exit
body:
  %r = call i64 %f(i64 %i)
  %sum = add i64 %acc, %r
  %next = add i64 %i, 1
  br label %header
exit:
  %out = trunc i64 %acc to i32
  ret i32 %out
}
"""


def test_driver_code_is_compiled_cheaply_and_cached_apart(tmp_path, monkeypatch):
    """Code that only calls other code (a native loop's driver) compiles with the short
    pipeline at code generation level 0 (`driver=True`): it runs the same, and its object
    is cached under a key of its own, never taken for the optimized one or made without a
    key that says so."""
    import ctypes

    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="needs the key"):
        jit.compile_object(DRIVER_IR, symbol="xla_loop", driver=True)
    callee = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(lambda i: 3 * i + 1)
    table = (ctypes.c_int64 * 1)(ctypes.cast(callee, ctypes.c_void_p).value)
    proto = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64)
    keys = set()
    for driver in (False, True):
        function = kernel_mod.request_function("a test driver", lambda: DRIVER_IR, "xla_loop",
                                               driver=driver)  # fmt: skip
        keys.add(function.key)
        assert proto(function.address())(ctypes.addressof(table), 10) == 3 * 45 + 10
    assert len(keys) == 2


@pytest.fixture
def _opt_level_from_env():
    jit.opt_level.cache_clear()
    yield
    jit.opt_level.cache_clear()


@pytest.mark.usefixtures("_opt_level_from_env")
@pytest.mark.parametrize("level", ["1", "2", "3"])
def test_every_optimization_level_compiles_correct_kernels(tmp_path, monkeypatch, level):
    """$XLAPY_CPU_LLVM_OPT picks LLVM's level; every level gives kernels that agree with the
    interpreter, and the level is part of every cache key (objects of another level are
    never reused)."""
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(jit.OPT_LEVEL_ENV, level)
    assert jit.opt_level() == int(level)
    key = jit.cache_key("; some IR")
    monkeypatch.setenv(jit.OPT_LEVEL_ENV, "3" if level != "3" else "2")
    jit.opt_level.cache_clear()
    assert jit.cache_key("; some IR") != key
    monkeypatch.setenv(jit.OPT_LEVEL_ENV, level)
    jit.opt_level.cache_clear()
    kernel = compile_computation(parse_module(TEXT).entry)
    assert not kernel.from_cache
    rng = np.random.default_rng(11)
    x, y = rng.standard_normal((2, 32, 64)).astype(np.float32)
    expected = execute(parse_module(TEXT), [x, y], backend="interpreter")
    np.testing.assert_allclose(kernel(x, y), expected, rtol=2e-6, atol=1e-6)


@pytest.mark.usefixtures("_opt_level_from_env")
@pytest.mark.parametrize("raw", ["0", "4", "O2", "fast"])
def test_bad_optimization_level_is_a_clear_error(monkeypatch, raw):
    monkeypatch.setenv(jit.OPT_LEVEL_ENV, raw)
    with pytest.raises(XlapyError, match=r"XLAPY_CPU_LLVM_OPT must be 1, 2 or 3"):
        jit.opt_level()


def _reducing(op: str, names: tuple[str, str] = ("r", "f")) -> str:
    """A fused exp-then-reduce whose reducer is `op`; `names`: the reducer's and the fused
    computation's names."""
    reducer, fused = names
    return f"""HloModule m_{op}
{reducer} {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] {op}(a, b)
}}
{fused} {{
  p = f32[16,24] parameter(0)
  z = f32[] constant(0)
  e = f32[16,24] exponential(p)
  ROOT s = f32[16] reduce(e, z), dimensions={{1}}, to_apply={reducer}
}}
ENTRY e {{
  x = f32[16,24] parameter(0)
  ROOT k = f32[16] fusion(x), kind=kInput, calls={fused}
}}"""


@pytest.mark.parametrize("same_process", [True, False])
def test_reducers_of_the_same_name_get_their_own_kernels(tmp_path, monkeypatch, same_process):
    """Two programs whose fusions print alike but call reducers that differ (add, maximum,
    both named `r`) each run their own reducer: the kernel's key holds the reducer's body,
    not only its name (it did not: the second program ran the first one's sums)."""
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    x = np.random.default_rng(5).standard_normal((16, 24)).astype(np.float32)
    wants = {"add": np.exp(x).sum(axis=1), "maximum": np.exp(x).max(axis=1)}
    for op, want in wants.items():
        if not same_process:
            clear_kernel_cache()
        got = execute(parse_module(_reducing(op)), [x], "cpu")
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)


def test_fusions_alike_up_to_names_share_one_kernel(tmp_path, monkeypatch):
    """XLA's kernel reuse: a second program whose fused computation and reducer differ only
    in their names (and metadata) takes the first one's kernel without emitting it again;
    a fusion with another shape does not."""
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    clear_kernel_cache()
    x = np.random.default_rng(6).standard_normal((16, 24)).astype(np.float32)
    first = compile_module(parse_module(_reducing("add")))
    emitted = []
    real_emit = kernel_mod.emit_kernel
    monkeypatch.setattr(kernel_mod, "emit_kernel", lambda *a: emitted.append(a) or real_emit(*a))
    renamed = _reducing("add", ("sum_reducer.7", "fused_exp.3")).replace(
        "exponential(p)", 'exponential(p), metadata={op_name="jit(f)/exp"}'
    )
    second = compile_module(parse_module(renamed))
    assert not emitted
    assert second.kernels()[0] is first.kernels()[0]
    np.testing.assert_allclose(
        np.asarray(execute(parse_module(renamed), [x], "cpu")), np.exp(x).sum(axis=1), rtol=1e-5
    )
    other = compile_module(parse_module(_reducing("add").replace("16,24", "16,25")))
    assert len(emitted) == 1 and other.kernels()[0] is not first.kernels()[0]


def test_canonical_text_renames_by_position_and_prints_called_bodies():
    from xlapy.ir.printer import print_canonical

    a = parse_module(_reducing("add"))
    b = parse_module(_reducing("add", ("other", "fused.2")))
    c = parse_module(_reducing("maximum"))
    fused = [m.get_computation(n) for m, n in ((a, "f"), (b, "fused.2"), (c, "f"))]
    texts = [print_canonical(f) for f in fused]
    assert texts[0] == texts[1] != texts[2]
    assert "add(c1.0, c1.1)" in texts[0] and "to_apply=c1" in texts[0]
    # a name used twice is printed as it is (renaming could not be told apart)
    clash = parse_module(_reducing("add", ("s", "f")))
    assert "to_apply=s" in print_canonical(clash.get_computation("f"))
