"""Plain JAX on N xlapy devices through the PJRT plugin: jax.jit with NamedShardings on
1-D and 2-D meshes of 2, 4 and 8 devices, and shard_map, against XLA:CPU's partitioned run
of the same program and the program unsharded (tests/spmd/jax_sharded.py, run in a
subprocess: the device counts must be set before JAX starts).

A few cases run by default; XLAPY_SPMD_JAX=all runs every case of the script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "spmd" / "jax_sharded.py"

DEFAULT = [
    "mlp_2d_2x4",
    "transformer_2x2",
    "conv_2x2",
    "shard_map_collectives_2x2",
    "vocab_embedding_xent_4",
]
ALL = [
    *DEFAULT,
    "mlp_dp_2",
    "mlp_dp_8",
    "mlp_tp_4",
    "transformer_seq_8",
    "conv_batch_4",
    "conv_spatial_4",
    "embedding_4",
    "out_shardings_2x4",
    "permuted_mesh_2x4",
    "shard_map_psum_4",
    "shard_map_ring_8",
    "shard_map_partial_2x2",
]
CASES = ALL if os.environ.get("XLAPY_SPMD_JAX") == "all" else DEFAULT


@pytest.fixture(scope="module")
def reports():
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu,xlapy")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *CASES],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        cwd=ROOT,
    )
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    found = {r["case"]: r for r in lines}
    if not found:
        pytest.fail(f"the script reported nothing (rc {done.returncode}):\n{done.stderr[-3000:]}")
    return found


@pytest.mark.parametrize("case", CASES)
def test_sharded_jax_on_xlapy_devices(reports, case):
    report = reports.get(case)
    assert report is not None, f"{case}: no report (the script stopped early?)"
    assert report["ok"], f"{case}: {report.get('error')}\n{report.get('trace')}"
