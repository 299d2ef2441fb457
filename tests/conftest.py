"""Shared test fixtures."""

import os

import jax
import pytest

import xlapy.pjrt
from xlapy.backends.cpu.jit import program_image
from xlapy.backends.cpu.jit.kernel import clear_kernel_cache

# A kernel the CPU code generator accepted but cannot compile is a bug: in the tests it raises
# (xlapy.backends.cpu.lowering.KernelCompileError) instead of warning and falling back.
# Tests of the fallback itself pass the compile option strict_kernels=False.
os.environ.setdefault("XLAPY_STRICT_KERNELS", "1")

# JAX's platform "xlapy" (the PJRT plugin), registered before any test starts JAX's
# backends; it ranks below "cpu", so JAX programs elsewhere keep running on XLA:CPU.
xlapy.pjrt.initialize()


@pytest.fixture(scope="module")
def x64_mode():
    """64-bit JAX for one test module, restored afterwards so other modules keep the default
    32-bit mode (the JAX programs are checked as users run them)."""
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    """Kernels of one test module compile into a fresh cache directory, not the user's
    home (use with `pytestmark = pytest.mark.usefixtures("kernel_cache")`)."""
    old = os.environ.get("XLAPY_CACHE_DIR")
    os.environ["XLAPY_CACHE_DIR"] = str(tmp_path_factory.mktemp("kernels"))
    yield
    if old is None:
        os.environ.pop("XLAPY_CACHE_DIR", None)
    else:
        os.environ["XLAPY_CACHE_DIR"] = old


@pytest.fixture
def image_cache(tmp_path, monkeypatch):
    """A fresh kernel cache and key directory with program images on, the process's kernels
    forgotten before and after; its value is the cache directory (where images are)."""
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("XLAPY_EXECUTABLE_CACHE", raising=False)
    monkeypatch.delenv(program_image.ENABLE_ENV, raising=False)
    clear_kernel_cache()
    yield tmp_path / "kernels"
    clear_kernel_cache()


@pytest.fixture
def library(tmp_path, monkeypatch):
    """A fresh kernel cache, key and library directory (jit/kernel_library.py), the
    process's kernels forgotten before and after; its value is the library directory."""
    monkeypatch.setenv("XLAPY_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XLAPY_LIBRARY_DIR", str(tmp_path / "library"))
    clear_kernel_cache()
    yield tmp_path / "library"
    clear_kernel_cache()


@pytest.fixture
def write(tmp_path):
    """write(name, text) -> the path of a new file with `text` in the test's tmp dir."""

    def write(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


@pytest.fixture
def run_cli(capsys):
    """run_cli(*argv) -> (exit code, stdout, stderr) of the `xlapy` command line."""
    from xlapy.tools.cli import main

    def run(*argv):
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run
