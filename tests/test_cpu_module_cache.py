"""The compiled-module cache: a second compile of a module reads the prepared module from
disk instead of running the pass pipeline, with the same thunks and results."""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends import execute
from xlapy.backends.cpu.compiler import compile_module
from xlapy.backends.cpu.jit import engine as jit
from xlapy.backends.cpu.jit import executable_cache, module_cache
from xlapy.backends.cpu.jit.kernel import clear_kernel_cache
from xlapy.ir.parser import parse_module

SOFTMAX = """HloModule softmax
max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  x = f32[16,40] parameter(0)
  lo = f32[] constant(-inf)
  m = f32[16] reduce(x, lo), dimensions={1}, to_apply=max
  mb = f32[16,40] broadcast(m), dimensions={0}
  d = f32[16,40] subtract(x, mb)
  ex = f32[16,40] exponential(d)
  zero = f32[] constant(0)
  s = f32[16] reduce(ex, zero), dimensions={1}, to_apply=add
  sb = f32[16,40] broadcast(s), dimensions={0}
  ROOT r = f32[16,40] divide(ex, sb)
}"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory, and the keys read from it that were hits. The
    whole-executable cache above the module cache (test_cpu_executable_cache.py) is off:
    these tests are about what a compile does when it has no entry."""
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(executable_cache, "read", lambda key: None)
    clear_kernel_cache()
    hits: list[str] = []
    read = module_cache.read

    def counting_read(key):
        text = read(key)
        if text is not None:
            hits.append(key)
        return text

    monkeypatch.setattr(module_cache, "read", counting_read)
    return hits


def _passes_must_not_run(monkeypatch):
    # (the compiler imports them when it runs them: patched where they are defined)
    import xlapy.memory.buffer_assignment as buffer_assignment
    import xlapy.passes.pipelines as pipelines

    def fail(*args, **kwargs):
        raise AssertionError("the pass pipeline ran on a cached module")

    monkeypatch.setattr(pipelines, "default_cpu_pipeline", fail)
    monkeypatch.setattr(buffer_assignment, "prepare_with_plan", fail)


def test_second_compile_skips_the_passes(cache, monkeypatch):
    module = parse_module(SOFTMAX)
    cold = compile_module(module)
    assert cache == []
    clear_kernel_cache()
    _passes_must_not_run(monkeypatch)
    warm = compile_module(module)
    assert len(cache) == 1
    assert warm.thunk_listing() == cold.thunk_listing()
    assert warm.module.to_text() == cold.module.to_text()
    x = np.random.default_rng(3).standard_normal((16, 40)).astype(np.float32)
    got = execute(module, [x], "cpu")
    np.testing.assert_allclose(np.asarray(got), np.asarray(execute(module, [x])), rtol=1e-5)


def test_options_the_pipeline_reads_are_part_of_the_key(cache):
    text = parse_module(SOFTMAX).to_text()
    keys = {
        module_cache.cache_key(text, {}),
        module_cache.cache_key(text, {"optimize": False}),
        module_cache.cache_key(text, {"verify": True}),
    }
    assert len(keys) == 3
    assert module_cache.cache_key(text, {"replica_id": 1}) == module_cache.cache_key(text, {})
    module = parse_module(SOFTMAX)
    optimized = compile_module(module)
    clear_kernel_cache()
    plain = compile_module(module, {"optimize": False})
    assert cache == []  # a different key: no hit
    assert plain.module.to_text() != optimized.module.to_text()


def test_sources_are_part_of_the_key(monkeypatch):
    text = parse_module(SOFTMAX).to_text()
    before = module_cache.cache_key(text, {})
    monkeypatch.setattr(module_cache, "package_fingerprint", lambda: "other sources")
    assert module_cache.cache_key(text, {}) != before


def test_damaged_entry_is_a_miss_and_is_written_again(cache, tmp_path):
    module = parse_module(SOFTMAX)
    cold = compile_module(module)
    (path,) = tmp_path.glob(f"*{module_cache.SUFFIX}")
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x20
    path.write_bytes(bytes(data))
    clear_kernel_cache()
    again = compile_module(module)
    assert cache == []
    assert again.thunk_listing() == cold.thunk_listing()
    assert jit.read_entry(path.name[: -len(module_cache.SUFFIX)], module_cache.SUFFIX)


def _tree(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _hashed(root) -> str:
    """The fingerprint computed from the files alone (what the memo stands for)."""
    import hashlib

    h = hashlib.sha256()
    for name in module_cache._sources(str(root)):
        h.update(name.encode())
        h.update((root / name).read_bytes())
    return h.hexdigest()


def test_source_fingerprint_is_memoized_by_the_sources_stats(tmp_path, monkeypatch):
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(module_cache, "RACY_NS", -(10**12))  # files written just now count
    root = tmp_path / "pkg"
    _tree(root, {"a.py": "x = 1\n", "sub/b.py": "y = 2\n", "sub/notes.txt": "not a source"})
    first = module_cache.source_fingerprint(str(root))
    assert first == _hashed(root)
    # the memo answers without reading a source while none changed
    monkeypatch.setattr("builtins.open", None)
    assert module_cache.source_fingerprint(str(root)) == first
    monkeypatch.undo()
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(module_cache, "RACY_NS", -(10**12))
    # an edit of the same size is another fingerprint (the stats differ: mtime, ctime)
    (root / "sub/b.py").write_text("y = 3\n")
    edited = module_cache.source_fingerprint(str(root))
    assert edited == _hashed(root) != first
    # a new source, a removed one
    _tree(root, {"sub/c.py": ""})
    assert module_cache.source_fingerprint(str(root)) == _hashed(root) != edited
    (root / "sub/c.py").unlink()
    assert module_cache.source_fingerprint(str(root)) == edited
    # a damaged memo is not believed: the fingerprint is computed again and rewritten
    memos = list((tmp_path / "cache").glob(f"*{module_cache.FINGERPRINT_SUFFIX}"))
    for path in memos:
        raw = bytearray(path.read_bytes())
        raw[-3] ^= 0x01
        path.write_bytes(bytes(raw))
    assert module_cache.source_fingerprint(str(root)) == edited
    keys = [p.name[: -len(module_cache.FINGERPRINT_SUFFIX)] for p in memos]
    assert edited.encode() in [jit.read_entry(k, module_cache.FINGERPRINT_SUFFIX) for k in keys]


def test_source_fingerprint_memo_must_be_a_digest(tmp_path, monkeypatch):
    """An authentic memo that is no SHA-256 digest (a key's holder wrote it) is ignored."""
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(module_cache, "RACY_NS", -(10**12))
    root = tmp_path / "pkg"
    _tree(root, {"a.py": "x = 1\n"})
    first = module_cache.source_fingerprint(str(root))
    (memo,) = (tmp_path / "cache").glob(f"*{module_cache.FINGERPRINT_SUFFIX}")
    key = memo.name[: -len(module_cache.FINGERPRINT_SUFFIX)]
    jit.write_entry(key, module_cache.FINGERPRINT_SUFFIX, b"not a digest")
    assert module_cache.source_fingerprint(str(root)) == first
    assert jit.read_entry(key, module_cache.FINGERPRINT_SUFFIX) == first.encode()


def test_no_memo_while_a_source_just_changed(tmp_path, monkeypatch):
    """A source written within RACY_NS may change again with the same stats: no memo."""
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "pkg"
    _tree(root, {"a.py": "x = 1\n"})
    assert module_cache.source_fingerprint(str(root)) == _hashed(root)
    assert not list((tmp_path / "cache").glob(f"*{module_cache.FINGERPRINT_SUFFIX}"))
