"""The memory plan of each program, to compare two trees (issue 17: the plan choice made
cheaper must stay the same plan), and the main-thread CPU time the plan costs.

For each HLO file it prints one JSON line: the order kept, temp and peak bytes, a hash of
the prepared module's text and one of the buffer-assignment report (format_report), and the
thread CPU seconds of plan_module outside parsing and HLO passes (the schedule, copies and
plan choice, the buffer assignment, the module's printing). Run it once per tree and compare:

  PYTHONPATH=/tmp/base python benchmarks/plan_check.py FILES_OR_DIRS > base.jsonl
  PYTHONPATH=$PWD      python benchmarks/plan_check.py FILES_OR_DIRS > new.jsonl
  python benchmarks/plan_check.py --compare base.jsonl new.jsonl

A directory stands for every *.hlo below it. --dump DIR writes the HLO text of every program
of benchmarks/cpu_vs_xla.py (its full sizes) into DIR first. Each file is planned in a fresh
process-local cache directory, so no cached module is read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path


def dump_suite(folder: Path) -> None:
    import warnings

    import jax
    import numpy as np

    sys.path.insert(0, str(Path(__file__).parent))
    import cpu_vs_xla

    folder.mkdir(parents=True, exist_ok=True)
    for name, prog in cpu_vs_xla.PROGRAMS.items():
        args = prog.make_args(np.random.default_rng(0), cpu_vs_xla.BIG)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            text = jax.jit(prog.fn, keep_unused=True).lower(*args).as_text(dialect="hlo")
        (folder / f"{name}.hlo").write_text(text)


def files_of(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for p in paths:
        found += sorted(p.rglob("*.hlo")) if p.is_dir() else [p]
    return [f for f in found if "cache" not in f.parent.name]


def plan_one(path: Path) -> dict[str, object]:
    from xlapy.backends.cpu.compiler import plan_module
    from xlapy.backends.cpu.jit.compile_timing import recording
    from xlapy.ir.parser import parse_module
    from xlapy.memory.report import format_report

    text = path.read_text()
    module = parse_module(text)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["XLAPY_CACHE_DIR"] = cache
        start = time.thread_time()
        with recording() as times:
            prepared, assignment = plan_module(module, text=text)
        total = time.thread_time() - start
    other = sum(p.cpu for (_, n), p in times.phases.items() if n in ("parsing", "HLO passes"))

    def digest(s: str) -> str:
        return hashlib.sha256(s.encode()).hexdigest()[:16]

    return {
        "file": str(path),
        "order": assignment.scheduler,
        "temp": assignment.temp_bytes,
        "peak": assignment.peak_bytes,
        "module": digest(prepared.to_text()),
        "report": digest(format_report(assignment)),
        "plan_cpu_s": round(total - other, 4),
    }


def compare(a_path: Path, b_path: Path) -> int:
    a = {r["file"]: r for r in map(json.loads, a_path.read_text().splitlines())}
    b = {r["file"]: r for r in map(json.loads, b_path.read_text().splitlines())}
    keys = ("order", "temp", "peak", "module", "report")
    differ = [f for f in a if f in b and any(a[f][k] != b[f][k] for k in keys)]
    both = [f for f in a if f in b]
    for f in differ:
        print("DIFFERS", f, {k: (a[f][k], b[f][k]) for k in keys if a[f][k] != b[f][k]})
    ratios = [b[f]["plan_cpu_s"] / a[f]["plan_cpu_s"] for f in both if a[f]["plan_cpu_s"] > 0]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
    print(f"{len(both)} programs, {len(differ)} plans differ; plan CPU new/old geomean {geo:.3f}")
    return 1 if differ else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--dump", type=Path, help="write the suite's HLO files here first")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("OLD", "NEW"))
    opts = parser.parse_args()
    if opts.compare:
        sys.exit(compare(*opts.compare))
    if opts.dump:
        dump_suite(opts.dump)
    for path in files_of(opts.paths):
        print(json.dumps(plan_one(path)), flush=True)


if __name__ == "__main__":
    main()
