"""Shared test fixtures."""

import jax
import pytest


@pytest.fixture(scope="module")
def x64_mode():
    """64-bit JAX for one test module, restored afterwards so other modules keep the default
    32-bit mode (the JAX programs are checked as users run them)."""
    with jax.enable_x64(True):
        yield


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
