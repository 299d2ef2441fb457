"""The whole-executable cache (xlapy/backends/cpu/jit/executable_cache.py): a warm compile
reads one authenticated entry (the optimized module, its kernels and their objects) instead
of running the passes and reading an entry per kernel; its executables compute what a cold
compile's do; any change to the key is a miss; a damaged, truncated, forged or inconsistent
entry is never used (a CacheEntryWarning, then a full compile that rewrites it); several
processes writing the same entry leave a valid one."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import xlapy
from xlapy.backends.cpu import compiler
from xlapy.backends.cpu.jit import engine as jit
from xlapy.backends.cpu.jit import executable_cache, kernel
from xlapy.backends.cpu.jit.disk_cache import CacheEntryWarning
from xlapy.backends.cpu.jit.kernel import clear_kernel_cache
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module
from xlapy.passes import pipelines
from xlapy.runtime import Client

ROOT = Path(__file__).resolve().parents[1]


def program(x, w, b):
    """Softmax of an affine map, then a loop that updates rows in place: several fused
    kernels, a dot and a while loop."""
    p = jax.nn.softmax(x @ w + b, axis=-1)

    def body(i, acc):
        row = lax.dynamic_slice_in_dim(acc, i, 1) * 0.5 + jnp.tanh(p[i])
        return lax.dynamic_update_slice_in_dim(acc, row, i, 0)

    return lax.fori_loop(0, x.shape[0], body, p * 2.0), p.sum(axis=0)


SHAPES = [(8, 16), (16, 12), (12,)]


@pytest.fixture(scope="module")
def text() -> str:
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in SHAPES]
    return jax.jit(program).lower(*args).as_text(dialect="hlo")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache and key directory; the process's in-memory kernels forgotten."""
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("XLAPY_EXECUTABLE_CACHE", raising=False)  # on by default
    monkeypatch.setenv("XLAPY_PROGRAM_IMAGES", "0")  # the layer above: test_cpu_program_image
    clear_kernel_cache()
    yield tmp_path / "kernels"
    clear_kernel_cache()


def inputs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def run(text: str, args: list[np.ndarray]) -> list[np.ndarray]:
    client = Client("cpu")
    exe = client.compile(text)
    outs = exe.execute([[client.buffer_from_pyval(a) for a in args]])[0]
    return [o.to_numpy() for o in outs]


def exe_entries(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{executable_cache.SUFFIX}"))


class Spy:
    """Counts entry hits, and fails the test if a warm compile runs the passes or reads a
    per-kernel entry."""

    def __init__(self, monkeypatch):
        self.hits = 0
        self.monkeypatch = monkeypatch
        read = executable_cache.read

        def counting(key):
            entry = read(key)
            self.hits += entry is not None
            return entry

        monkeypatch.setattr(executable_cache, "read", counting)

    def forbid_full_compile(self):
        def fail(*args, **kwargs):
            raise AssertionError("a warm compile ran the passes or read a kernel entry")

        self.monkeypatch.setattr(pipelines, "default_cpu_pipeline", fail)  # (imported on use)
        self.monkeypatch.setattr(kernel, "_read_entry", fail)
        self.monkeypatch.setattr(kernel, "compile_computation", fail)


def test_warm_executable_computes_what_the_cold_one_does(cache, text, monkeypatch):
    spy = Spy(monkeypatch)
    args = inputs(11)
    cold = run(text, args)
    assert spy.hits == 0 and len(exe_entries(cache)) == 1
    clear_kernel_cache()
    spy.forbid_full_compile()
    for seed in (11, 12):
        clear_kernel_cache()
        warm = run(text, inputs(seed))
        if seed == 11:
            for w, c in zip(warm, cold, strict=True):
                np.testing.assert_array_equal(w, c)  # the same kernels: the same bits
        want = evaluate(parse_module(text), inputs(seed))
        for w, r in zip(warm, want, strict=True):
            np.testing.assert_allclose(w, r, rtol=2e-5, atol=2e-6)
    assert spy.hits == 2


def test_warm_compile_keeps_the_thunk_plan(cache, text):
    module = parse_module(text)
    cold = compiler.compile_module(module)
    clear_kernel_cache()
    warm = compiler.compile_module(module)
    assert warm.thunk_listing() == cold.thunk_listing()
    assert warm.module.to_text() == cold.module.to_text()
    assert [k.outer_extent for k in warm.kernels()] == [k.outer_extent for k in cold.kernels()]


@pytest.mark.parametrize(
    "change",
    ["options", "denormals", "version", "cpu_features", "opt_level", "sources", "program"],
)
def test_any_key_change_is_a_miss(text, monkeypatch, change):
    options = {"replica_id": 0}
    before = executable_cache.cache_key(text, options, True)
    assert executable_cache.cache_key(text, dict(options), True) == before
    if change == "options":
        options = {"replica_id": 1}
    elif change == "denormals":
        assert executable_cache.cache_key(text, options, False) != before
        return
    elif change == "version":
        monkeypatch.setattr(xlapy, "__version__", xlapy.__version__ + ".post1")
    elif change == "cpu_features":
        host = jit.host_target()
        other = type(host)(host.triple, host.cpu, host.features.replace("+", "-", 1))
        monkeypatch.setattr(jit, "host_target", lambda: other)
    elif change == "opt_level":
        level = jit.opt_level()
        monkeypatch.setattr(jit, "opt_level", lambda: 1 if level != 1 else 2)
    elif change == "sources":
        monkeypatch.setattr(executable_cache, "package_fingerprint", lambda: "other sources")
    else:
        text = text.replace("0.5", "0.25")
    assert executable_cache.cache_key(text, options, True) != before


def test_custom_call_registry_is_not_in_the_key(text):
    """A client's registry object is read by the lowering, which every compile runs."""
    a = executable_cache.cache_key(text, {"custom_calls": object()}, True)
    assert a == executable_cache.cache_key(text, {"custom_calls": object()}, True)


def test_options_changed_compile_is_a_miss(cache, text, monkeypatch):
    spy = Spy(monkeypatch)
    module = parse_module(text)
    compiler.compile_module(module, {"optimize": True})
    clear_kernel_cache()
    compiler.compile_module(module, {"optimize": False})
    assert spy.hits == 0 and len(exe_entries(cache)) == 2


def damage_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def damage_truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def damage_foreign_key(path: Path) -> None:
    """An entry made under another user's key (a copy from elsewhere)."""
    head, _, payload = path.read_bytes().partition(b"\n")
    magic = head.rpartition(b" ")[0]
    mac = hmac.new(b"k" * 32, magic, hashlib.sha256)
    mac.update(b"\0" + path.name.encode() + b"\0")
    mac.update(payload)
    path.write_bytes(magic + b" " + mac.hexdigest().encode() + b"\n" + payload)


@pytest.mark.parametrize("damage", [damage_flip, damage_truncate, damage_foreign_key])
def test_rejected_entry_warns_recompiles_and_is_rewritten(cache, text, monkeypatch, damage):
    args = inputs(21)
    cold = run(text, args)
    (path,) = exe_entries(cache)
    damage(path)
    loaded: list[str] = []
    monkeypatch.setattr(kernel, "_request_bytes", lambda key, data: loaded.append(key))
    clear_kernel_cache()
    with pytest.warns(CacheEntryWarning, match=r"\.exe is not used"):
        again = run(text, args)
    assert loaded == []  # nothing of the rejected entry was loaded
    for a, c in zip(again, cold, strict=True):
        np.testing.assert_array_equal(a, c)
    assert jit.read_entry(path.name[: -len(executable_cache.SUFFIX)], ".exe") is not None


def rewrite_authentic(path: Path, edit) -> None:
    """What someone holding the user's key could write: an authentic entry whose contents
    are edited by `edit(header dict, objects bytes) -> (header, objects)`."""
    key = path.name[: -len(executable_cache.SUFFIX)]
    payload = jit.read_entry(key, executable_cache.SUFFIX)
    assert payload is not None
    head, _, blob = payload.partition(b"\n")
    doc, blob = edit(json.loads(head), blob)
    jit.write_entry(key, executable_cache.SUFFIX, json.dumps(doc).encode() + b"\n" + blob)


def bigger_extent(doc, blob):
    for k in doc["kernels"]:
        k[7] *= 4096
    return doc, blob


def other_module(doc, blob):
    doc["module"] = doc["module"].replace("f32[8,16]", "f32[9,16]")
    return doc, blob


def trailing_bytes(doc, blob):
    return doc, blob + b"\0" * 8


@pytest.mark.parametrize("edit", [bigger_extent, other_module, trailing_bytes])
def test_inconsistent_authentic_entry_is_not_used(cache, text, monkeypatch, edit):
    module = parse_module(text)
    cold = compiler.compile_module(module)
    (path,) = exe_entries(cache)
    rewrite_authentic(path, edit)
    clear_kernel_cache()
    with pytest.warns(CacheEntryWarning):
        again = compiler.compile_module(module)
    assert [k.outer_extent for k in again.kernels()] == [k.outer_extent for k in cold.kernels()]
    assert again.thunk_listing() == cold.thunk_listing()
    args = inputs(31)
    want = run(text, args)
    clear_kernel_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheEntryWarning)  # rewritten: a clean hit now
        got = run(text, args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


WRITER = """
import sys, numpy as np
from xlapy.runtime import Client
text = open(sys.argv[1]).read()
client = Client("cpu")
exe = client.compile(text)
rng = np.random.default_rng(int(sys.argv[2]))
args = [rng.standard_normal(s).astype(np.float32) for s in [(8, 16), (16, 12), (12,)]]
outs = exe.execute([[client.buffer_from_pyval(a) for a in args]])[0]
np.save(sys.argv[3], np.concatenate([o.to_numpy().ravel() for o in outs]))
"""


def test_concurrent_writers_leave_a_valid_entry(cache, text, tmp_path, monkeypatch):
    source = tmp_path / "program.hlo"
    source.write_text(text)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "XLAPY_CACHE_DIR": str(cache),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "PYTHONWARNINGS": "error::UserWarning",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(source), "41", str(tmp_path / f"out{i}.npy")],
            env=env,
            stderr=subprocess.PIPE,
        )
        for i in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()[-2000:]
    outs = [np.load(tmp_path / f"out{i}.npy") for i in range(4)]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    (path,) = exe_entries(cache)
    assert jit.read_entry(path.name[: -len(executable_cache.SUFFIX)], ".exe") is not None
    spy = Spy(monkeypatch)
    spy.forbid_full_compile()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheEntryWarning)
        got = run(text, inputs(41))
    np.testing.assert_array_equal(np.concatenate([g.ravel() for g in got]), outs[0])
    assert spy.hits == 1


def test_verifier_runs_once_per_program_text(cache, text, monkeypatch):
    import xlapy.runtime.compiler as runtime_compiler

    calls: list[int] = []
    real = runtime_compiler.verify
    monkeypatch.setattr(runtime_compiler, "verify", lambda m: calls.append(1) or real(m))
    run(text, inputs(51))
    assert calls == [1]
    (marker,) = cache.glob(f"*{executable_cache.VERIFIED}")
    clear_kernel_cache()
    run(text, inputs(52))
    assert calls == [1]  # the authenticated marker stands for the verifier's verdict
    damage_foreign_key(marker)
    clear_kernel_cache()
    run(text, inputs(53))
    assert calls == [1, 1]  # a marker not made with this user's key is not believed


def test_invalid_program_is_never_marked_verified(cache, text):
    from xlapy.errors import XlapyError

    bad = text.replace("f32[8,12]{1,0} dot(", "f32[8,13]{1,0} dot(", 1)
    assert bad != text
    for _ in range(2):
        with pytest.raises(XlapyError):
            Client("cpu").compile(bad)
    assert list(cache.glob(f"*{executable_cache.VERIFIED}")) == []


# Instruction names unique per computation only (`r` is the root of three computations):
# the CPU compiler accepts such text without the verifier, and an entry that named kernels
# by instruction alone gave every `r` the kernel of one of them (session 4's wrong switch).
SAME_NAMES = """HloModule same_names
b0 {
  p = f32[4] parameter(0)
  ROOT r = f32[4] sine(p)
}
b1 {
  p = f32[4] parameter(0)
  ROOT r = f32[4] exponential(p)
}
b2 {
  p = f32[4] parameter(0)
  ROOT r = f32[4] negate(p)
}
ENTRY e {
  k = s32[] parameter(0)
  x = f32[4] parameter(1)
  ROOT r = f32[4] conditional(k, x, x, x), branch_computations={b0, b1, b2}
}"""


def test_kernels_of_same_named_instructions_stay_apart(cache):
    module = parse_module(SAME_NAMES)
    x = np.random.default_rng(61).standard_normal(4).astype(np.float32)
    for attempt in ("cold", "warm"):
        clear_kernel_cache()
        program = xlapy.backends.cpu.CpuBackend().compile(module, {})
        for k in (0, 1, 2, 7):
            args = [np.array(k, np.int32), x]
            np.testing.assert_allclose(
                program.run(args), evaluate(module, args), rtol=2e-6, err_msg=f"{attempt} k={k}"
            )
    assert len(exe_entries(cache)) == 1


def test_an_id_given_two_kernels_is_left_out_of_the_entry(cache):
    """Whatever makes two kernels share an id (a module built without unique names, a
    future lowering), the entry cannot say which one an instruction runs: it holds neither,
    and both compile again on a warm compile."""
    module = parse_module(SAME_NAMES)
    comps = {c.name: c for c in module.computations}
    book = executable_cache.KernelBook()
    with kernel.using_book(book):
        for name in ("b0", "b2"):
            kernel.kernel_for(comps[name], "r", site="same")
        kernel.kernel_for(comps["b1"], "r", site="b1/r")
    assert book.ambiguous == {("same", (), True)}
    assert executable_cache.write("0" * 64, "module text", book)
    entry = executable_cache.read("0" * 64)
    assert entry is not None and set(entry.book.known) == {("b1/r", (), True)}


def test_the_cache_is_on_by_default_and_can_be_turned_off(cache, text, monkeypatch):
    module = parse_module(text)
    compiler.compile_module(module)
    assert len(exe_entries(cache)) == 1
    monkeypatch.setenv(executable_cache.ENABLE_ENV, "0")
    spy = Spy(monkeypatch)
    clear_kernel_cache()
    compiler.compile_module(module, {"native_loops": False})
    compiler.compile_module(module)
    assert spy.hits == 0 and len(exe_entries(cache)) == 1
