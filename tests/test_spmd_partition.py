"""The SPMD partitioner on sharded JAX programs (tests/spmd/*.hlo, made by
tests/spmd/generate.py): xlapy partitions the annotated global module, runs it on as many
in-process devices with each device's slice of the global inputs, reassembles the outputs
by their shardings, and compares them with JAX's results and with the unpartitioned
program run by the reference interpreter on one device (the oracle).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module
from xlapy.ir.sharding import HloSharding
from xlapy.ir.verifier import verify
from xlapy.passes.spmd import partition
from xlapy.passes.spmd.tiling import Tiling
from xlapy.passes.spmd.traffic import collective_traffic
from xlapy.runtime import Client
from xlapy.runtime.options import CompileOptions

HERE = Path(__file__).resolve().parent / "spmd"
CASES = sorted(p.name.removesuffix(".hlo") for p in HERE.glob("*.hlo") if ".xla." not in p.name)
MANUAL = {
    "shard_map_psum_4",
    "shard_map_psum_4.sdy",
    "shard_map_ring_8",
    "shard_map_2x2",
    "shard_map_2x2.sdy",
    "shard_map_partial_2x2",
    "shard_map_partial_2x2.sdy",
}
"""shard_map programs: their collectives need the devices, so there is no 1-device oracle."""

FALLBACKS: dict[str, set[str]] = {}
"""Programs with ops that run whole on every device (the rest partition natively)."""


def _tiling(instr, shape, n):
    s = instr.attrs.get("sharding")
    return Tiling.from_sharding(
        s if isinstance(s, HloSharding) else HloSharding.replicated(), len(shape), n
    )


def run_partitioned(text: str, args, n: int, platform: str = "interpreter"):
    """Partition `text` for n devices, run it on n devices with each device's slice of the
    global `args`, and reassemble the global outputs; returns (outputs, report, module)."""
    module = parse_module(text)
    report = partition(module, n)
    verify(module)
    client = Client(platform, device_count=n)
    exe = client.compile(module.to_text(), CompileOptions.make(num_partitions=n))
    return run_sharded(client, exe, module, args, n), report, module


def run_sharded(client, exe, module, args, n: int):
    """Run the partitioned `module` (compiled as `exe`) on n devices with each device's
    slice of the global `args`; the global outputs, reassembled by their shardings."""
    devices = client.devices()
    params = module.entry_computation().parameters
    rows = []
    for d in range(n):
        row = []
        for p, a in zip(params, args, strict=True):
            piece = np.array(a[_tiling(p, a.shape, n).slices(a.shape)[d]])
            row.append(client.buffer_from_pyval(piece, devices[d]))
        rows.append(row)
    got = [[np.asarray(b) for b in row] for row in exe.execute(rows)]
    root = module.entry_computation().root_instruction()
    shapes = [s for _, s in root.shape.leaves()]
    sharding = root.attrs["sharding"]
    elements = sharding.elements if sharding.is_tuple else (sharding,)
    outs = []
    for k, (shape, s) in enumerate(zip(shapes, elements, strict=True)):
        t = Tiling.from_sharding(s, shape.rank, n)
        glob = [d * tt for d, tt in zip(shape.dims, t.tiles, strict=True)]
        out = np.zeros(glob, got[0][k].dtype)
        for d in range(n):
            out[t.slices(glob)[d]] = got[d][k]
        outs.append(out)
    return outs


def load(name: str):
    data = np.load(HERE / f"{name.removesuffix('.sdy')}.npz")
    args = [data[f"arg{i}"] for i in range(sum(k.startswith("arg") for k in data.files))]
    outs = [data[f"out{i}"] for i in range(sum(k.startswith("out") for k in data.files))]
    return (HERE / f"{name}.hlo").read_text(), args, outs, int(data["num_partitions"])


@pytest.mark.parametrize("name", CASES)
def test_partitioned_matches_jax_and_oracle(name):
    text, args, want, n = load(name)
    got, report, _ = run_partitioned(text, args, n)
    assert len(got) == len(want)
    assert {f.opcode for f in report.fallbacks} == FALLBACKS.get(name, set()), report.text()
    oracle = None if name in MANUAL else evaluate(parse_module(text), args)
    oracle = None if oracle is None else (oracle if isinstance(oracle, tuple) else (oracle,))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5, err_msg=f"output {i} vs JAX")
        if oracle is not None:
            np.testing.assert_allclose(
                g, oracle[i], rtol=2e-4, atol=2e-5, err_msg=f"output {i} vs 1 device"
            )


MLIR_CASES = sorted(p.name.removesuffix(".mlir") for p in HERE.glob("*.mlir"))


@pytest.mark.parametrize("name", MLIR_CASES)
def test_stablehlo_from_jax_partitions(name):
    """The StableHLO JAX hands a PJRT plugin (Shardy annotations, shard_map as
    sdy.manual_computation), given to Client.compile as it is: a global program for the
    mesh's devices, partitioned; each device's parameters and results have its local
    shapes, and the reassembled results are JAX's."""
    _, args, want, n = load(name)
    client = Client("interpreter", device_count=n)
    exe = client.compile((HERE / f"{name}.mlir").read_text())
    assert exe.num_partitions == n
    module = exe.module
    assert module.config.num_partitions == n
    params = module.entry_computation().parameters
    local = [
        tuple(d // t for d, t in zip(a.shape, _tiling(p, a.shape, n).tiles, strict=True))
        for p, a in zip(params, args, strict=True)
    ]
    assert [p.shape.dims for p in params] == local
    assert local != [a.shape for a in args]  # every program has a sharded parameter
    got = run_sharded(client, exe, module, args, n)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5, err_msg=f"output {i} vs JAX")


@pytest.mark.parametrize(
    "name",
    [
        "transformer_step_2x4",
        "transformer_sequence_8",
        "cnn_step_2x2",
        "mlp_tp_2x4",
        "embedding_grad_4",
        "argmax_2x2",
        "cross_entropy_grad_2x2",
        "spatial_conv_4",
    ],
)
def test_collective_bytes_at_most_xla(name):
    """Per-device bytes moved by collectives: xlapy's partitioning <= XLA's (same rule)."""
    text, _, _, n = load(name)
    module = parse_module(text)
    partition(module, n)
    mine = collective_traffic(module.to_text(), n)
    xla = collective_traffic((HERE / f"{name}.xla.hlo").read_text(), n)
    assert mine.total <= xla.total, f"xlapy {mine.text()}; XLA {xla.text()}"


def test_traffic_rules():
    text = """
  a = f32[8,4]{1,0} all-reduce(x), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=add
  b = f32[8,4]{1,0} all-gather(y), replica_groups=[2,4]<=[8], dimensions={0}
  c = f32[2,4]{1,0} reduce-scatter(z), replica_groups=mesh['a'=2,'b'=2] {'b'}, dimensions={0}
  ROOT d = f32[4]{0} collective-permute(w), source_target_pairs={{0,1}}
"""
    t = collective_traffic(text, 8)
    assert t.by_op == {
        "all-reduce": 2 * 3 / 4 * 128,
        "all-gather": 3 / 4 * 128,
        "reduce-scatter": 32.0,
        "collective-permute": 16.0,
    }


@pytest.mark.parametrize("name", ["mlp_tp_2x4", "embedding_grad_4", "shard_map_psum_4"])
def test_partitioned_on_cpu_backend(name):
    """The same partitioned programs compiled by the CPU backend (LLVM) on n devices."""
    text, args, want, n = load(name)
    got, _, _ = run_partitioned(text, args, n, platform="cpu")
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5, err_msg=f"output {i} vs JAX")


@pytest.mark.parametrize("name", ["mlp_dp_2.sdy", "layer_norm_2x2.sdy", "reversed_mesh_2x2.sdy"])
def test_shardy_annotations_alone(name):
    """The Shardy form with its GSPMD `sharding=` attributes removed partitions the same."""
    text, args, want, n = load(name)
    text = re.sub(r", sharding=\{[^{}]*(\{[^{}]*\}[^{}]*)*\}", "", text)
    assert "sharding={" not in text
    got, _, _ = run_partitioned(text, args, n)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5, err_msg=f"output {i} vs JAX")
