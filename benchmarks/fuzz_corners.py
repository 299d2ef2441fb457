"""Corner-case fuzzing (tests/corner_fuzz.py): edge values, layouts, tuples, size-0 dims.

Each seed draws one small program whose inputs are edge values of their types (NaN, +-0,
+-inf, subnormals, INT_MIN, -1, shift counts past the bit width, out-of-range indices) and
runs it on the interpreter (the oracle), the CPU backend (default options and native paths
off) and XLA:CPU (through jaxlib, in a child process). Prints each failing seed with its
program and a summary per family; opt-in (not in CI), seeded and time-boxed:

    PYTHONPATH=. python benchmarks/fuzz_corners.py --seed 1 --programs 3000 --minutes 20
    PYTHONPATH=. python benchmarks/fuzz_corners.py --families sort,argmax --no-xla
    PYTHONPATH=. python benchmarks/fuzz_corners.py --stablehlo-mutants 20000 --seed 3

`--stablehlo-mutants N` fuzzes the StableHLO importer instead: N mutants of StableHLO text
JAX wrote, each imported; it must succeed or raise one of xlapy's errors naming a line and
column, within 10 s.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
os.environ.setdefault("XLAPY_STRICT_KERNELS", "1")  # a kernel that fails to compile is a bug

import corner_fuzz
import program_fuzz


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--programs", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=30.0, help="stop after this long")
    parser.add_argument("--families", default="", help="comma-separated (default: all)")
    parser.add_argument("--no-xla", action="store_true", help="interpreter and CPU only")
    parser.add_argument("--xla-timeout", type=float, default=120.0)
    parser.add_argument("--quiet", action="store_true", help="no program text per failure")
    parser.add_argument("--stablehlo-mutants", type=int, default=0)
    opts = parser.parse_args()
    if opts.stablehlo_mutants:
        return mutants(opts)
    families = [f for f in opts.families.split(",") if f] or None
    child = None if opts.no_xla else program_fuzz.XlaChild(opts.xla_timeout)
    start = time.perf_counter()
    runs: collections.Counter = collections.Counter()
    fails: collections.Counter = collections.Counter()
    failing = []
    done = 0
    try:
        for seed in range(opts.seed, opts.seed + opts.programs):
            if time.perf_counter() - start > opts.minutes * 60:
                break
            case = corner_fuzz.generate(seed, families)
            found = corner_fuzz.check_case(case, child.run if child else None)
            done += 1
            runs[case.family] += 1
            if found:
                fails[case.family] += 1
                failing.append(seed)
                print(f"FAIL seed {seed} ({case.family}): " + " | ".join(found), flush=True)
                if not opts.quiet:
                    print(case.text, flush=True)
    finally:
        if child is not None:
            child.close()
    took = time.perf_counter() - start
    print(f"\n{done} programs (seeds {opts.seed}..{opts.seed + done - 1}) in {took:.0f} s, "
          f"{len(failing)} failing")  # fmt: skip
    for family in sorted(runs):
        print(f"  {family:20s} {runs[family]:5d} run, {fails[family]:4d} failing")
    if failing:
        print("failing seeds:", " ".join(map(str, failing)))


def mutants(opts) -> None:
    import numpy as np

    corpus = corner_fuzz.stablehlo_corpus()
    rng = np.random.default_rng(opts.seed)
    start = time.perf_counter()
    kinds: collections.Counter = collections.Counter()
    done = 0
    for done in range(1, opts.stablehlo_mutants + 1):
        if time.perf_counter() - start > opts.minutes * 60:
            break
        text = corner_fuzz.mutate(corpus[int(rng.integers(len(corpus)))], rng)
        problem = corner_fuzz.check_mutant(text)
        if problem:
            key = problem.split("\n")[0][:100]
            if not kinds[key]:
                print(f"FAIL mutant {done}: {problem}\n{text}", flush=True)
            kinds[key] += 1
    took = time.perf_counter() - start
    print(f"\n{done} StableHLO mutants (seed {opts.seed}) in {took:.0f} s, "
          f"{sum(kinds.values())} failing")  # fmt: skip
    for key, n in kinds.most_common():
        print(f"  {n:5d}  {key}")


if __name__ == "__main__":
    main()
