"""The JIT's disk cache: a second compile of the same program loads the object from the cache
(timings printed, not asserted), files are written atomically under $XLAPY_CACHE_DIR, and
different programs get different keys. Also the IR / optimized IR / assembly dumps."""

from __future__ import annotations

import time

import numpy as np
import pytest

from xlapy.backends.cpu import compile_computation, jit
from xlapy.backends.cpu.kernel import clear_loaded_objects
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
    files = list(tmp_path.iterdir())
    assert [f.suffix for f in files] == [".o"], files
    assert files[0].stem == jit.cache_key(first.spec.llvm_ir)
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
