"""The HLO pass pipeline's result and cost per program, to compare two trees.

For each program (an HLO text file, or a folder holding `module.hlo` as
/work/shared/outside/models.py --keep writes them, or a folder of `*.hlo` files) it runs the
CPU pipeline (passes/pipelines.py, no verifier, as the compiler runs it) and prints the
sha256 of the optimized module's text, the pipeline's thread CPU time, and with -v the CPU
time, run count and no-change run count of every pass. Run it on the same programs with
`--tree` pointing at another checkout (e.g. a `git archive` of main) and diff the hashes:
a pipeline made cheaper must give byte-identical text.

  python benchmarks/pass_hashes.py --dump-suite /tmp/suite        # cpu_vs_xla.py's programs
  python benchmarks/pass_hashes.py /tmp/suite /tmp/outside-*/ -v  # hashes and times
  python benchmarks/pass_hashes.py --tree /tmp/base /tmp/suite     # the same, another tree
  python benchmarks/pass_hashes.py FILE --profile 30               # cProfile, thread CPU
  python benchmarks/pass_hashes.py --tree /tmp/base DIRS --save base.txt   # then, on a branch:
  python benchmarks/pass_hashes.py DIRS --against base.txt          # lists programs that differ

--rounds N runs each program N times (fresh parse each time) and keeps each pass's minimum
over rounds (the fairer figure on a loaded machine); the hash must be the same every round.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import pstats
import sys
import time
from pathlib import Path


def _programs(paths: list[str]) -> list[tuple[str, str]]:
    """(name, HLO text) of every program under `paths`, in a stable order."""
    found: list[tuple[str, str]] = []
    for p in map(Path, paths):
        if p.is_file():
            found.append((p.stem, p.read_text()))
        elif (p / "module.hlo").is_file():
            found.append((p.name, (p / "module.hlo").read_text()))
        elif p.is_dir():
            for sub in sorted(p.iterdir()):
                if sub.suffix == ".hlo":
                    found.append((sub.stem, sub.read_text()))
                elif (sub / "module.hlo").is_file():
                    found.append((f"{p.name}/{sub.name}", (sub / "module.hlo").read_text()))
        else:
            raise SystemExit(f"pass_hashes: no program at {p}")
    return found


def dump_suite(out: Path) -> None:
    """Write each cpu_vs_xla.py program's JAX lowering (benchmark sizes) as OUT/<name>.hlo."""
    import warnings

    import cpu_vs_xla as suite  # benchmarks/ is on sys.path: the script's own folder
    import jax
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    for name, prog in suite.PROGRAMS.items():
        args = prog.make_args(np.random.default_rng(0), suite.BIG)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lowered = jax.jit(prog.fn, keep_unused=True).lower(*args)
        (out / f"{name}.hlo").write_text(lowered.as_text(dialect="hlo"))
    print(f"{len(suite.PROGRAMS)} programs in {out}")


def run_pipeline(text: str, stats: dict[str, list[float]] | None = None) -> tuple[str, float]:
    """The optimized module's text and the pipeline's thread CPU seconds; per pass name,
    `stats` collects [cpu seconds, runs, runs that changed nothing]."""
    from xlapy.ir.parser import parse_module
    from xlapy.passes.pass_base import FixedPoint
    from xlapy.passes.pipelines import default_cpu_pipeline

    module = parse_module(text)
    pipeline = default_cpu_pipeline(verify=False)
    if stats is not None:
        for item in pipeline.passes:
            for p in item.passes if isinstance(item, FixedPoint) else [item]:
                _time_pass(p, stats)
    start = time.thread_time()
    pipeline.run(module)
    cpu = time.thread_time() - start
    return module.to_text(), cpu


def _time_pass(p, stats: dict[str, list[float]]) -> None:
    inner = p.run

    def timed(module):
        start = time.thread_time()
        changed = inner(module)
        entry = stats.setdefault(p.name, [0.0, 0, 0])
        entry[0] += time.thread_time() - start
        entry[1] += 1
        entry[2] += 0 if changed else 1
        return changed

    p.run = timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--tree", help="checkout whose xlapy to import (default: this one)")
    ap.add_argument("--dump-suite", metavar="DIR", help="write cpu_vs_xla.py's programs")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("-v", "--verbose", action="store_true", help="per-pass CPU, runs, no-ops")
    ap.add_argument("--profile", type=int, metavar="N", help="cProfile: top N by own time")
    ap.add_argument("--save", metavar="FILE", help="write 'name hash' per program")
    ap.add_argument(
        "--against", metavar="FILE", help="compare with a --save listing; exit 1 on a difference"
    )
    args = ap.parse_args()
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    sys.path.insert(0, str(Path(args.tree).resolve() if args.tree else here.parent))
    if args.dump_suite:
        dump_suite(Path(args.dump_suite))
        return
    import xlapy

    print(f"# xlapy from {Path(xlapy.__file__).parent}")
    total = 0.0
    found: dict[str, str] = {}
    for name, text in _programs(args.paths):
        best: dict[str, list[float]] = {}
        hashes, cpus = set(), []
        for _ in range(args.rounds):
            stats: dict[str, list[float]] = {}
            if args.profile:
                prof = cProfile.Profile(time.thread_time)
                prof.enable()
            out, cpu = run_pipeline(text, stats)
            if args.profile:
                prof.disable()
            hashes.add(hashlib.sha256(out.encode()).hexdigest()[:16])
            cpus.append(cpu)
            for k, v in stats.items():
                if k not in best or v[0] < best[k][0]:
                    best[k] = v
        if len(hashes) != 1:
            raise SystemExit(f"{name}: the pipeline gave different text in different rounds")
        total += min(cpus)
        lines = text.count("\n")
        found[name] = hashes.pop()
        print(f"{name:44s} {found[name]}  {min(cpus) * 1e3:9.1f} ms cpu  {lines} lines")
        if args.verbose:
            for k, (sec, runs, noop) in sorted(best.items(), key=lambda kv: -kv[1][0]):
                print(f"    {k:36s} {sec * 1e3:8.1f} ms  runs {runs:3d}  no-change {noop:3d}")
        if args.profile:
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
    print(f"# total pipeline cpu {total * 1e3:.1f} ms")
    if args.save:
        Path(args.save).write_text("".join(f"{k} {v}\n" for k, v in found.items()))
    if args.against:
        _compare(found, Path(args.against))


def _compare(found: dict[str, str], listing: Path) -> None:
    """Report the programs whose hash differs from (or is missing in) a --save listing."""
    saved = dict(line.split() for line in listing.read_text().splitlines() if line.strip())
    differ = [k for k, v in found.items() if saved.get(k) != v]
    print(f"# against {listing}: {len(found) - len(differ)} of {len(found)} identical")
    for k in differ:
        print(f"#   differs: {k} ({saved.get(k, 'missing')} -> {found[k]})")
    if differ:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
