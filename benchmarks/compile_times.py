"""Compile times only: xlapy's cold and warm compile of every cpu_vs_xla program against
XLA's, without the run-time measurements (so a before/after comparison of compile-path
changes fits in a few minutes, on a shared machine or a short device lease).

Per program: XLA's compile (jax `lowered.compile()`, min of --xla-runs fresh lowerings),
xlapy's cold compile (a new, empty XLAPY_CACHE_DIR) and warm compiles (the same directory,
the process's kernels forgotten before each: what a new process finds), each by a fresh
client (`xlapy.tools.bench.time_compile`); warm is given as min and median of --warm-runs.
Beside the wall times, the process CPU time (`time.process_time`, all threads) of the cold
compile and the least of the warm ones: on a loaded machine the fairer figure.

  python benchmarks/compile_times.py [-p NAME ...] [--json OUT] [--warm-runs 5]
      [--hlo DIR ...] [--only-hlo] [--worst 10]

`--hlo DIR` adds the program in DIR/module.hlo (the outside models' `--keep` folders,
/work/shared/outside/models.py) or every */module.hlo under DIR, compiled by xlapy only
(no XLA time: the ratio columns skip them). The end lists the `--worst` programs by warm
CPU time (the least of the warm compiles), with their warm wall times.

To compare two trees, run it with PYTHONPATH set to each (the same minutes, the same machine).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpu_vs_xla as suite

from xlapy.tools.bench import clear_process_kernel_cache, kernel_cache_dir, time_compile


def measure(name: str, warm_runs: int, xla_runs: int) -> dict[str, float | str]:
    prog = suite.PROGRAMS[name]
    args = prog.make_args(np.random.default_rng(0), suite.BIG)
    xla = []
    text = ""
    for _ in range(xla_runs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lowered = jax.jit(prog.fn, keep_unused=True).lower(*args)
        text = lowered.as_text(dialect="hlo")
        start = time.perf_counter()
        lowered.compile()
        xla.append(1e3 * (time.perf_counter() - start))
    row: dict[str, float | str] = {"name": name, "xla_ms": min(xla)}
    row.update(measure_text(name, text, warm_runs))
    return row


def measure_text(name: str, text: str, warm_runs: int) -> dict[str, float | str]:
    """`measure` for a program given as HLO text (no XLA compile)."""
    row: dict[str, float | str] = {"name": name}
    try:
        with tempfile.TemporaryDirectory(prefix="xlapy-ct-") as tmp, kernel_cache_dir(tmp):
            start = time.process_time()
            row["cold_ms"] = time_compile("cpu", text)[0]
            row["cold_cpu_ms"] = 1e3 * (time.process_time() - start)
            warm, warm_cpu = [], []
            for _ in range(warm_runs):
                start = time.process_time()
                warm.append(time_compile("cpu", text)[0])
                warm_cpu.append(1e3 * (time.process_time() - start))
    except Exception as e:
        row["status"] = f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:80]}"
        return row
    finally:
        clear_process_kernel_cache()
    row["warm_min_ms"], row["warm_med_ms"] = min(warm), statistics.median(warm)
    row["warm_cpu_ms"] = min(warm_cpu)
    return row


def hlo_programs(folders: list[str]) -> list[tuple[str, Path]]:
    """(name, module.hlo) of each --hlo folder: its own module.hlo, or those one level down."""
    found = []
    for folder in map(Path, folders):
        files = [folder / "module.hlo"] if (folder / "module.hlo").is_file() else []
        for path in files or sorted(folder.glob("*/module.hlo")):
            found.append((f"{path.parent.parent.name}/{path.parent.name}", path))
    return found


def print_worst(rows: list[dict], count: int) -> None:
    """The `count` programs with the largest warm CPU time."""
    good = sorted((r for r in rows if "status" not in r), key=lambda r: -float(r["warm_cpu_ms"]))[
        :count
    ]
    print(
        f"worst {len(good)} by warm CPU (ms): "
        + ", ".join(
            f"{r['name']} {float(r['warm_cpu_ms']):.1f} (wall {float(r['warm_min_ms']):.1f})"
            for r in good
        )
    )


def geomean(values) -> float:
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else math.nan


def print_row(name: str, row: dict) -> dict:
    """Print one program's row of the table (a "-" for XLA where only xlapy ran it); `row`."""
    if "status" in row:
        print(f"{name:28s} {row['status']}", flush=True)
        return row
    xla = f"{row['xla_ms']:8.1f}" if "xla_ms" in row else f"{'-':>8s}"
    print(
        f"{name:28s} {xla} {row['cold_ms']:8.1f} {row['warm_min_ms']:8.1f} "
        f"{row['warm_med_ms']:8.1f} {row['cold_cpu_ms']:8.1f} {row['warm_cpu_ms']:8.1f}",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", action="append", default=[], help="names containing this")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--warm-runs", type=int, default=5)
    parser.add_argument("--xla-runs", type=int, default=1)
    parser.add_argument("--hlo", action="append", default=[], help="outside programs' folder")
    parser.add_argument("--only-hlo", action="store_true", help="skip the suite's programs")
    parser.add_argument("--worst", type=int, default=10, help="how many worst to list")
    opts = parser.parse_args()
    names = [n for n in suite.PROGRAMS if not opts.p or any(p in n for p in opts.p)]
    names = [] if opts.only_hlo else names
    rows = []
    print(
        f"{'program':28s} {'xla ms':>8s} {'cold ms':>8s} {'warm min':>8s} {'warm med':>8s} "
        f"{'cold cpu':>8s} {'warm cpu':>8s}"
    )
    for name in names:
        rows.append(print_row(name, measure(name, opts.warm_runs, opts.xla_runs)))
    for name, path in hlo_programs(opts.hlo):
        rows.append(print_row(name, measure_text(name, path.read_text(), opts.warm_runs)))
    print_worst(rows, opts.worst)
    good = [r for r in rows if "status" not in r and "xla_ms" in r]
    cold = geomean(float(r["cold_ms"]) / float(r["xla_ms"]) for r in good)
    warm = geomean(float(r["warm_min_ms"]) / float(r["xla_ms"]) for r in good)
    meds = [float(r["warm_min_ms"]) for r in good]
    cpus = [float(r["warm_cpu_ms"]) for r in good]
    print(
        f"geomean cold {cold:.2f}x XLA, warm {warm:.2f}x XLA; warm min: median "
        f"{statistics.median(meds or [math.nan]):.1f} ms, worst {max(meds or [math.nan]):.1f} ms"
        f", programs over 10 ms: {sum(m > 10 for m in meds)} of {len(meds)}; warm CPU (min): "
        f"median {statistics.median(cpus or [math.nan]):.1f} ms, worst "
        f"{max(cpus or [math.nan]):.1f} ms, over 10 ms: {sum(c > 10 for c in cpus)}"
    )
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
