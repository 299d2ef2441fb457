"""xlapy against XLA:CPU on saved HLO programs (the outside check's folders), in one process.

Each DIR holds `module.hlo` and `inputs.npz` (as /work/shared/outside/models.py --keep
writes them). Both compilers compile the same text; the runs alternate in blocks of a few
runs each, so both see the same load on a shared machine; donated parameters get fresh
copies outside the timed region. Prints per program the min and median run times and the
ratios, then the geometric means.

  .venv/bin/python benchmarks/hlo_vs_xla.py /tmp/out/*_bert --rounds 20
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from xlapy.ir.parser import parse_module
from xlapy.runtime import Client
from xlapy.tools import npz_io


def donated(text: str) -> set[int]:
    """Parameter numbers the module header aliases to outputs or lists as donors."""
    header, out = text.split("\n", 1)[0], set()
    for key, pat in (("input_output_alias", r"\}:\s*\((\d+),"), ("buffer_donor", r"\((\d+),")):
        m = re.search(key + r"=\{(.*?)\}\s*(,\s*\w+=|$)", header)
        if m:
            out |= {int(p) for p in re.findall(pat, m.group(1))}
    return out


def xla_executable(text: str):
    import jax.extend as je
    from jax._src.lib import _jax, hlo
    from jax._src.lib import xla_client as xc

    backend = je.backend.get_backend("cpu")
    device = backend.local_devices()[0]
    module = hlo.hlo_module_from_text(text)
    stablehlo = _jax.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    options = je.backend.get_compile_options(1, 1)
    exe = backend.compile_and_load(stablehlo, xc.DeviceList((device,)), options)
    return exe, device


def measure(folder: Path, rounds: int, block: int) -> tuple[list[float], list[float]]:
    text = (folder / "module.hlo").read_text()
    module = parse_module(text)
    arrays = npz_io.load_inputs(
        str(folder / "inputs.npz"), [p.shape for p in module.entry.parameters]
    )
    gone = donated(text)
    exe, device = xla_executable(text)
    client = Client("cpu")
    executable = client.compile(text)
    xla_base = [jax.device_put(a, device) for a in arrays]
    ours_base = [client.buffer_from_pyval(a) for a in arrays]

    def xla_args():
        return [
            jax.device_put(np.array(arrays[i], copy=True), device) if i in gone else b
            for i, b in enumerate(xla_base)
        ]

    def run_xla(args):
        for o in exe.execute(args):
            o.block_until_ready()

    def run_ours(args):
        for o in executable.execute([args])[0]:
            o.block_until_ready()

    times: tuple[list[float], list[float]] = ([], [])
    for r in range(rounds + 1):
        for which, run in enumerate((run_xla, run_ours)):
            for _ in range(block):
                args = xla_args() if which == 0 else ours_base
                if which == 0:
                    for a in args:
                        a.block_until_ready()
                t = time.perf_counter()
                run(args)
                if r:
                    times[which].append(time.perf_counter() - t)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=3)
    args = parser.parse_args()
    mins, meds = [], []
    print(f"{'program':28s} {'xla min':>9s} {'ours min':>9s} {'min x':>6s} {'med x':>6s}  (ms)")
    for folder in args.folders:
        xla, ours = measure(folder, args.rounds, args.block)
        a, b = min(xla), min(ours)
        ma, mb = statistics.median(xla), statistics.median(ours)
        mins.append(b / a)
        meds.append(mb / ma)
        print(f"{folder.name:28s} {1e3 * a:9.3f} {1e3 * b:9.3f} {b / a:6.2f} {mb / ma:6.2f}")
    gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
    print(f"geomean over {len(mins)}: min {gm(mins):.2f}, median {gm(meds):.2f}")


if __name__ == "__main__":
    main()
