"""A forked child keeps the parent's clients: its runs on a device the parent ran on (on the
device's worker thread, which the child does not have) start a worker of their own, and a
device lock another thread held at the fork is free in the child. Each case forks from a
small child Python process (no JAX, few threads) so the test process itself never forks."""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="os.fork")

PROGRAM = '''
import os, sys, threading, time
import numpy as np
from xlapy.runtime import Client

HLO = """HloModule m
ENTRY e {
  x = f32[64] parameter(0)
  y = f32[64] parameter(1)
  ROOT r = f32[64] add(x, y)
}"""
client = Client("cpu", inline_execution=False)  # every run goes to the device's worker
program = client.compile(HLO)
rng = np.random.default_rng()
x, y = rng.standard_normal((2, 64)).astype(np.float32)


def run():
    [out] = program.execute([[client.buffer_from_pyval(x), client.buffer_from_pyval(y)]])[0]
    return out.to_numpy()


assert np.array_equal(run(), x + y)  # the parent's worker thread exists now
device = client.devices()[0]
HOLD
pid = os.fork()
if pid == 0:
    code = 1
    try:
        got = run()
        code = 0 if np.array_equal(got, x + y) else 3
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
assert os.WEXITSTATUS(status) == 0, status
assert np.array_equal(run(), x + y)  # the parent's worker still serves the parent
print("fork ok")
'''

HOLD_LOCK = """
held, release = threading.Event(), threading.Event()
def holder():
    with device.lock:
        held.set()
        release.wait(120)
t = threading.Thread(target=holder, daemon=True)
t.start()
assert held.wait(60)
threading.Timer(0.2, release.set).start()  # the fork waits for the lock, then goes on
"""


@pytest.mark.parametrize("hold", ["", HOLD_LOCK], ids=["idle", "lock-held-at-fork"])
def test_a_forked_child_runs_on_the_parents_client(hold):
    code = textwrap.dedent(PROGRAM).replace("HOLD", textwrap.dedent(hold))
    done = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and "fork ok" in done.stdout, done.stderr[-3000:]
