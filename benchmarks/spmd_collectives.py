"""Per-device bytes moved by collectives: xlapy's SPMD partitioner vs XLA's.

For every program of tests/spmd (sharded JAX programs; tests/spmd/generate.py also saved
XLA's own partitioned module of each as `<name>.xla.hlo`), partition the annotated global
module with xlapy and count the bytes each device receives through collectives in both
texts, by the same rule (xlapy/passes/spmd/traffic.py).

    python benchmarks/spmd_collectives.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from xlapy.ir.parser import parse_module
from xlapy.passes.spmd import partition
from xlapy.passes.spmd.traffic import collective_traffic

CASES = Path(__file__).resolve().parent.parent / "tests" / "spmd"


def main() -> int:
    print(f"{'program':28} {'devices':>7} {'xlapy B':>10} {'XLA B':>10}  collectives (xlapy | XLA)")
    for xla_path in sorted(CASES.glob("*.xla.hlo")):
        name = xla_path.name.removesuffix(".xla.hlo")
        n = int(np.load(CASES / f"{name}.npz")["num_partitions"])
        module = parse_module((CASES / f"{name}.hlo").read_text())
        partition(module, n)
        mine = collective_traffic(module.to_text(), n)
        xla = collective_traffic(xla_path.read_text(), n)

        def kinds(t):
            return ", ".join(f"{k} x{v}" for k, v in sorted(t.count.items())) or "none"

        print(
            f"{name:28} {n:>7} {mine.total:>10.0f} {xla.total:>10.0f}  {kinds(mine)} | {kinds(xla)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
