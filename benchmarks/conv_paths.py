"""Every convolution of an HLO module, timed on the CPU backend's convolution paths with and
without the gather path for small float convolutions (conv_thunk.py, `_GATHER_MAX`), on the
same fresh random inputs; the two results are compared too.

Run: `.venv/bin/python benchmarks/conv_paths.py MODULE.hlo [-v]` (for instance a program the
outside model harness keeps with `--keep`). Prints, with -v, per convolution the minimum time
of each (microseconds), their largest difference, and the instruction; then the sums.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from xlapy.backends.cpu.runtime import conv_thunk
from xlapy.ir.parser import parse_module


def best_time(run, args, out, repeats: int) -> float:
    for _ in range(3):
        run(args, out, None)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(args, out, None)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module")
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("-v", action="store_true", help="one line per convolution")
    opts = parser.parse_args()
    with open(opts.module) as f:
        module = parse_module(f.read())
    rng = np.random.default_rng(0)
    totals = {"without": 0.0, "with": 0.0}
    count, keep = 0, conv_thunk._GATHER_MAX
    for comp in module.computations:
        for instr in comp.instructions:
            if instr.opcode.text != "convolution":
                continue
            plans = {}
            for name, limit in (("without", 0), ("with", keep)):
                conv_thunk._GATHER_MAX = limit
                plans[name] = conv_thunk.plan_convolution(instr)
            conv_thunk._GATHER_MAX = keep
            if any(p is None for p in plans.values()):
                print(f"{instr.name}: no fast path")
                continue
            args = [
                rng.standard_normal(op.shape.dims).astype(op.shape.dtype) for op in instr.operands
            ]
            outs, best = {}, {}
            for name, run in plans.items():
                outs[name] = np.empty(instr.shape.dims, instr.shape.dtype)
                best[name] = best_time(run, args, outs[name], opts.repeats) * 1e6
                totals[name] += best[name]
            diff = np.max(np.abs(outs["with"].astype(np.float64) - outs["without"]))
            count += 1
            if opts.v:
                print(f"{best['without']:9.1f} {best['with']:9.1f}  {diff:.1e}  {instr.name}")
    print(
        f"{count} convolutions, sum of minimum times: without the gather path "
        f"{totals['without']:.0f} us, with it {totals['with']:.0f} us"
    )


if __name__ == "__main__":
    main()
