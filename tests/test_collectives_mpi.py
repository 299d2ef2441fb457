"""Two-process MPI jobs on localhost: `mpiexec -n 2 python tests/collectives/mpi_program.py`
runs XLA-partitioned 4-device programs with devices 0-1 in one process and 2-3 in the
other, and checks them bit for bit against one process with 4 devices; a failing device
in one process fails every device of the job at once; with one device per process every
call meets the other process; send/recv with channels, ragged-all-to-all and the in-place
collective-permute between devices of both processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "tests" / "collectives" / "mpi_program.py"


def _mpiexec() -> str:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip('mpi4py is not installed (pip install "xlapy[mpi]")')
    found = Path(sys.executable).parent / "mpiexec"
    if found.exists():
        return str(found)
    on_path = shutil.which("mpiexec")
    if on_path is None:
        pytest.skip('no mpiexec next to the interpreter or on PATH (pip install "xlapy[mpi]")')
    return on_path


@pytest.mark.parametrize(
    "what",
    [[], ["fault"], ["one-device"], ["sliced"]],
    ids=["programs", "fault", "one-device", "sliced"],
)
def test_two_processes_match_one(what):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [_mpiexec(), "-n", "2", sys.executable, str(PROGRAM), *what],
        capture_output=True,
        text=True,
        timeout=900,  # a hang only: a job takes 10-60 s (more on a loaded machine)
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # the two processes' lines may interleave in mpiexec's output
    expected = {(): 8, ("sliced",): 8}.get(tuple(what), 2)
    assert done.stdout.count("ok ") == expected, done.stdout
