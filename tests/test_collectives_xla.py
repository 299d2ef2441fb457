"""Partitioned programs that XLA produced for JAX programs over 2, 4 and 8 CPU devices
(tests/collectives/*.hlo, made by tests/collectives/generate.py), run by xlapy on as many
devices with JAX's per-device input shards; every device's outputs must match JAX's.

Programs made of collectives and exact arithmetic must match bit for bit (reductions in
XLA's CPU runtime order); programs with dots and transcendental functions match to float
tolerance (xlapy's kernels round differently from XLA's, collectives or not).
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from xlapy.ir.parser import parse_module
from xlapy.runtime import Client
from xlapy.runtime.options import CompileOptions

HERE = Path(__file__).resolve().parent / "collectives"
CASES = sorted(p.stem for p in HERE.glob("*.hlo"))
INEXACT = {
    "dp_train_step_2",
    "dp_train_step_4",
    "dp_train_step_8",
    "tp_matmul_4",
    "named_sharding_2x2",
}
"""Cases with dots and tanh: compared to float tolerance."""
INTERPRETER_CASES = [
    "psum_sub_axes_2x4",
    "reductions_8",
    "all_to_all_4",
    "dp_train_step_2",
    "named_sharding_2x2",
]


def load_case(name: str):
    text = (HERE / f"{name}.hlo").read_text()  # mesh groups read as XLA prints them
    data = np.load(HERE / f"{name}.npz")
    replicas = int(data["num_replicas"]) if "num_replicas" in data.files else 1
    partitions = int(data["num_partitions"])
    n = replicas * partitions
    args = [[_array(data, f"arg{i}_{p}") for i in range(_count(data, "arg"))] for p in range(n)]
    outs = [[_array(data, f"out{i}_{p}") for i in range(_count(data, "out"))] for p in range(n)]
    return text, (replicas, partitions), args, outs


def _count(data, prefix: str) -> int:
    return len({k.split("_")[0] for k in data.files if k.startswith(prefix)})


def _array(data, key: str) -> np.ndarray:
    """An array of the npz; bfloat16 ones are kept as uint16 bits (generate.py)."""
    if f"dtype__{key}" in data.files:
        return data[key].view(ml_dtypes.bfloat16)
    return data[key]


def run_case(name: str, platform: str):
    text, (replicas, partitions), args, want = load_case(name)
    n = replicas * partitions
    client = Client(platform, device_count=n)
    options = CompileOptions.make(
        num_replicas=replicas,
        num_partitions=partitions,
        backend_options={"collective_timeout": 60},
    )
    exe = client.compile(text, options)
    devices = client.devices()
    buffers = [[client.buffer_from_pyval(a, devices[p]) for a in row] for p, row in enumerate(args)]
    got = [[np.asarray(b) for b in row] for row in exe.execute(buffers)]
    for p in range(n):
        assert len(got[p]) == len(want[p])
        for i, (g, w) in enumerate(zip(got[p], want[p], strict=True)):
            assert g.shape == w.shape and g.dtype == w.dtype, (p, i)
            if name in INEXACT:
                np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=f"device {p}")
            else:
                assert g.tobytes() == w.tobytes(), f"device {p} output {i}: {g} != {w}"


@pytest.mark.parametrize("name", CASES)
def test_cpu_matches_xla(name):
    run_case(name, "cpu")


@pytest.mark.parametrize("name", INTERPRETER_CASES)
def test_interpreter_matches_xla(name):
    run_case(name, "interpreter")


def test_mesh_groups_with_iota_device_ids():
    """XLA prints a mesh's device order in iota form; the groups follow it, and the text
    reads back as printed."""
    module = parse_module((HERE / "named_sharding_2x2.hlo").read_text())
    meshes = [
        groups
        for instr in module.instructions()
        if (groups := instr.attrs.get("replica_groups")) is not None
        and groups.mesh is not None
        and groups.mesh.device_ids_iota == "[2,2]T(1,0)"
    ]
    assert meshes
    assert meshes[0].mesh.device_ids == (0, 2, 1, 3)
    printed = module.to_text()
    assert "device_ids=([2,2]T(1,0))" in printed
    assert parse_module(printed).to_text() == printed


def test_bench_and_memory_report_per_device():
    from click.testing import CliRunner

    from xlapy.tools.cli import cli

    path = str(HERE / "reductions_8.hlo")
    runner = CliRunner()
    done = runner.invoke(cli, ["bench", path, "--random-inputs", "--runs", "2", "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["devices"] == 8 and len(report["device_median_us"]) == 8
    done = runner.invoke(cli, ["memory", path, "--json"])
    assert done.exit_code == 0, done.output
    figures = json.loads(done.output)
    assert figures["devices"] == 8
    assert figures["peak_bytes_all_devices"] == 8 * figures["peak_bytes"]
    done = runner.invoke(cli, ["memory", path])
    assert "Runs on 8 devices (1 replicas x 8 partitions)" in done.output
