"""Differential program fuzzing over many seeds: CPU backend vs interpreter vs XLA:CPU.

Generates random valid HLO programs (tests/program_fuzz.py), runs each on the interpreter,
the CPU backend (default options and native paths off) and, for every `--xla-every`-th,
XLA:CPU through jaxlib; shrinks each failure and writes the reproducer (module text,
arguments, mismatches) under `--out`. Prints a summary: programs run, failures grouped by
side and kind, time per program.

    PYTHONPATH=. python benchmarks/program_fuzz.py --programs 2000 --seed 1 --xla-every 3
    PYTHONPATH=. python benchmarks/program_fuzz.py --families linalg,fft --programs 200
    PYTHONPATH=. python benchmarks/program_fuzz.py --seed 7 --stablehlo-every 2 --plugin-every 2

XLA runs in a child process (a crash there is an `xla-crash` line, and the run goes on).
`--stablehlo-every` and `--plugin-every` also feed xlapy the program as StableHLO (XLA's own
HLO -> StableHLO translation): imported and compiled, and through the PJRT plugin as JAX
drives it (aliased parameters donated there, their buffers checked).
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
os.environ.setdefault("XLAPY_STRICT_KERNELS", "1")  # a kernel that fails to compile is a bug

import numpy as np
import program_fuzz


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--xla-every", type=int, default=3, help="0: never run XLA")
    parser.add_argument(
        "--stablehlo-every",
        type=int,
        default=0,
        help="also through XLA's HLO -> StableHLO translation and xlapy's importer",
    )
    parser.add_argument(
        "--plugin-every",
        type=int,
        default=0,
        help="also that StableHLO through xlapy's PJRT plugin as JAX drives it (donation too)",
    )
    parser.add_argument("--no-shrink", action="store_true")
    parser.add_argument(
        "--xla-in-process",
        action="store_true",
        help="run XLA:CPU in this process (by default a child process runs it, so a crash "
        "inside XLA is reported as an xla-crash and the campaign goes on)",
    )
    parser.add_argument(
        "--families",
        default=os.environ.get("XLAPY_FUZZ_FAMILIES", ""),
        help='operation families: "-linalg,fft=3" (reweighted, off) or "gather_general,sort" '
        "(only those); see FAMILIES in tests/program_fuzz.py",
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/xlapy-program-fuzz"))
    args = parser.parse_args()
    program_fuzz.families_from_text(args.families)  # an unknown name fails here
    os.environ["XLAPY_FUZZ_FAMILIES"] = args.families
    args.out.mkdir(parents=True, exist_ok=True)
    faulthandler.enable()  # a crash in native code prints where it happened
    if args.xla_every and not args.xla_in_process:
        program_fuzz.use_xla_child()
    kinds: collections.Counter = collections.Counter()

    def log(seed, found, program) -> None:
        folder = args.out / f"seed{seed}"
        folder.mkdir(exist_ok=True)
        (folder / "module.hlo").write_text(program.text())
        arrays = program.arguments()
        np.savez(folder / "inputs.npz", *arrays)
        lines = [f"{m.side} {m.output}: {m.message}" for m in found]
        (folder / "mismatches.txt").write_text("\n".join(lines) + "\n")
        for m in found:
            kinds[(m.side, re.sub(r"-?\d[\d.e+-]*", "N", m.message.split("\n")[0])[:80])] += 1
        print(f"seed {seed}: {found[0].side} {found[0].message.splitlines()[0][:160]}")
        print(f"  reproducer: {folder}/module.hlo", flush=True)

    start = time.perf_counter()

    def progress(k: int, seed: int) -> None:
        # the seed being run is on disk, so a crash of the process names it
        (args.out / "current_seed").write_text(f"{seed}\n")
        if k and k % 50 == 0:
            took = time.perf_counter() - start
            print(f"  {k} programs in {took:.0f} s, {len(failed)} failing", flush=True)

    failed: list[int] = []
    seeds = range(args.seed, args.seed + args.programs)
    if args.plugin_every:
        import xlapy.pjrt

        xlapy.pjrt.initialize()  # before JAX starts its backends
    report = program_fuzz.run_seeds(
        seeds,
        xla_every=args.xla_every,
        stablehlo_every=args.stablehlo_every,
        plugin_every=args.plugin_every,
        shrink_failures=not args.no_shrink,
        log=lambda seed, found, program: (failed.append(seed), log(seed, found, program)),
        progress=progress,
    )
    took = time.perf_counter() - start
    xla = len(range(0, args.programs, args.xla_every)) if args.xla_every else 0
    print(
        f"\n{report.programs} programs (seeds {args.seed}..{args.seed + args.programs - 1}, "
        f"{xla} also on XLA) in {took:.0f} s ({took / max(report.programs, 1):.2f} s each); "
        f"{len(report.failures)} failing"
    )
    for (side, kind), n in kinds.most_common():
        print(f"  {n:4d}  {side:15s} {kind}")


if __name__ == "__main__":
    main()
