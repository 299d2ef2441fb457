"""The disk cache trusts only what this user's xlapy wrote for the key being read
(xlapy/backends/cpu/disk_cache.py): a private directory, HMAC-authenticated entries,
regular files of bounded size, metadata checked against the program."""

import hashlib
import json
import os
import stat
import threading
import warnings

import numpy as np
import pytest

from xlapy.backends.cpu.compiler import compile_module
from xlapy.backends.cpu.jit import engine as jit
from xlapy.backends.cpu.jit import executable_cache
from xlapy.backends.cpu.jit.kernel import clear_kernel_cache
from xlapy.ir.parser import parse_module
from xlapy.runtime import Client

ADD = """HloModule add
ENTRY e {
  a = f32[64] parameter(0)
  b = f32[64] parameter(1)
  ROOT r = f32[64] add(a, b)
}
"""
MUL = ADD.replace("add(a, b)", "multiply(a, b)").replace("HloModule add", "HloModule add")

X = np.arange(64, dtype=np.float32)
Y = np.full(64, 3.0, np.float32)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory and key directory; the process's in-memory caches cleared.
    The whole-executable entries are not read, so the module and kernel entries are (the
    executable entries' own trust tests: test_cpu_executable_cache.py; the program images':
    test_cpu_program_image.py)."""
    monkeypatch.setattr(executable_cache, "read", lambda key: None)
    monkeypatch.setenv("XLAPY_PROGRAM_IMAGES", "0")
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    clear_kernel_cache()
    yield tmp_path / "kernels"
    clear_kernel_cache()


def run(text: str) -> np.ndarray:
    client = Client("cpu")
    exe = client.compile(text)
    out = exe.execute([[client.buffer_from_pyval(X), client.buffer_from_pyval(Y)]])[0][0]
    return out.to_numpy()


def forge(path, payload: bytes) -> None:
    """What an attacker who can write the directory does: keep the header's first word,
    put `payload` after it and recompute a SHA-256 of the payload as its digest."""
    head = path.read_bytes().partition(b"\n")[0]
    magic = head.rpartition(b" ")[0]
    path.write_bytes(magic + b" " + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)


def entries(directory, suffix):
    return sorted(p for p in directory.iterdir() if p.name.endswith(suffix))


def test_forged_module_entry_is_not_run(cache):
    np.testing.assert_array_equal(run(ADD), X + Y)
    (hlo,) = entries(cache, ".hlo")
    forged = hlo.read_bytes().partition(b"\n")[2].replace(b" add(", b" multiply(")
    forge(hlo, forged)
    clear_kernel_cache()
    np.testing.assert_array_equal(run(ADD), X + Y)


def test_entry_copied_under_another_key_is_not_used(cache):
    run(ADD)
    (add_hlo,) = entries(cache, ".hlo")
    run(MUL)
    (mul_hlo,) = [p for p in entries(cache, ".hlo") if p != add_hlo]
    add_hlo.write_bytes(mul_hlo.read_bytes())  # an authentic entry, under the wrong name
    clear_kernel_cache()
    np.testing.assert_array_equal(run(ADD), X + Y)


def test_forged_object_is_not_loaded(cache):
    run(ADD)
    run(MUL)
    objects = entries(cache, ".o")
    assert len(objects) == 2
    a, b = objects
    payload_b = b.read_bytes().partition(b"\n")[2]
    forge(a, payload_b)
    forge(b, payload_b)
    assert jit.read_entry(a.stem, ".o") is None
    assert jit.read_entry(b.stem, ".o") is None
    clear_kernel_cache()
    np.testing.assert_array_equal(run(ADD), X + Y)
    np.testing.assert_array_equal(run(MUL), X * Y)


def test_kernel_entry_extent_is_recomputed(cache):
    module = parse_module(ADD)
    compiled = compile_module(module, {})
    (kernel,) = compiled.kernels()
    true_extent = kernel.outer_extent
    for path in entries(cache, ".kernel"):
        entry = json.loads(path.read_bytes().partition(b"\n")[2])
        entry["outer_extent"] *= 4096
        forge(path, json.dumps(entry).encode())
    clear_kernel_cache()
    (kernel,) = compile_module(parse_module(ADD), {}).kernels()
    assert kernel.outer_extent == true_extent


def test_directory_writable_by_others_is_refused(cache):
    cache.mkdir(mode=0o700)
    os.chmod(cache, 0o777)
    with pytest.warns(UserWarning, match="writable by other users"):
        np.testing.assert_array_equal(run(ADD), X + Y)
    assert not any(cache.iterdir())


def test_directory_of_another_user_is_refused(cache):
    if os.getuid() != 0:
        pytest.skip("needs root to give the directory away")
    cache.mkdir(mode=0o700)
    os.chown(cache, 12345, 12345)
    with pytest.warns(UserWarning, match="owned by uid 12345"):
        np.testing.assert_array_equal(run(ADD), X + Y)
    assert not any(cache.iterdir())


def test_cache_directory_and_key_are_private(cache, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(ADD)
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    key = tmp_path / "config" / "xlapy" / "cache-key"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(key.parent).st_mode) == 0o700
    assert os.path.getsize(key) == 32
    assert not key.is_relative_to(cache)


def test_key_readable_by_others_is_refused(cache, tmp_path):
    run(ADD)
    key = tmp_path / "config" / "xlapy" / "cache-key"
    os.chmod(key, 0o644)
    from xlapy.backends.cpu.jit import disk_cache

    disk_cache._keys.clear()
    with pytest.warns(UserWarning, match="other users may access"):
        assert jit.read_entry("0" * 64, ".o") is None


def test_fifo_entry_does_not_hang(cache):
    run(ADD)
    (obj,) = entries(cache, ".o")
    obj.unlink()
    os.mkfifo(obj)
    result = []
    reader = threading.Thread(target=lambda: result.append(jit.read_entry(obj.stem, ".o")))
    reader.daemon = True
    reader.start()
    reader.join(60)
    hung = reader.is_alive()
    if hung:  # let the old code's blocked open go
        fd = os.open(obj, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    assert not hung and result == [None]


def test_symlinked_entry_is_not_followed(cache, tmp_path):
    run(ADD)
    (obj,) = entries(cache, ".o")
    elsewhere = tmp_path / "elsewhere.o"
    obj.rename(elsewhere)
    obj.symlink_to(elsewhere)
    assert jit.read_entry(obj.stem, ".o") is None


def test_oversized_entry_is_not_read(cache, monkeypatch):
    run(ADD)
    (obj,) = entries(cache, ".o")
    with open(obj, "ab") as f:
        f.truncate(os.path.getsize(obj) + (64 << 20))  # sparse: 64 MiB more
    from xlapy.backends.cpu.jit import disk_cache

    monkeypatch.setattr(disk_cache, "MAX_ENTRY_BYTES", 1 << 20)
    assert jit.read_entry(obj.stem, ".o") is None


def test_directory_removed_while_running_is_made_again(cache):
    """The directory is checked once per process; one removed after that is checked and
    made again by the next write (not written into blindly, not given up on)."""
    import shutil

    from xlapy.backends.cpu.jit import disk_cache

    disk_cache.write_entry("1" * 64, ".o", b"first")
    assert disk_cache.read_entry("1" * 64, ".o") == b"first"
    shutil.rmtree(cache)
    assert disk_cache.read_entry("1" * 64, ".o") is None
    disk_cache.write_entry("2" * 64, ".o", b"second")
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    assert disk_cache.read_entry("2" * 64, ".o") == b"second"
