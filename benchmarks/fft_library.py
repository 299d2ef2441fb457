"""The CPU backend's fft through DUCC (ducc0, the default) against its scipy.fft path (the
compile option fft_library="scipy": scipy's pocketfft, then a copy into the arena, the path
every fft took before ducc0), in one process on the same inputs.

Each program of cpu_vs_xla.py's FFT family (and of linalg_fft.py's FFTs with --all) is
compiled both ways; the two executables then run in alternating blocks (so both see the
same load on a shared machine), and the table gives each one's best and median run time
and the ratio ducc0 / scipy of the best runs, then the geometric mean of the ratios.

  .venv/bin/python benchmarks/fft_library.py                 # cpu_vs_xla's fft family
  .venv/bin/python benchmarks/fft_library.py --all --runs 30 # and linalg_fft's FFTs
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_vs_xla import BIG, FAMILIES, PROGRAMS

from xlapy.runtime import Client, CompileOptions


def programs(include_linalg_fft: bool) -> dict:
    chosen = {n: p for n, p in PROGRAMS.items() if n.startswith(FAMILIES["fft"])}
    if include_linalg_fft:
        import linalg_fft

        chosen |= {n: p for n, p in linalg_fft.PROGRAMS.items() if "fft" in n}
    return chosen


def timed(exe, buffers, count: int, times: list[float]) -> None:
    """`count` runs of `exe`, their seconds appended to `times`."""
    for _ in range(count):
        start = time.perf_counter()
        outs = exe.execute([buffers])[0]
        for o in outs:
            o.block_until_ready()
        times.append(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per library")
    parser.add_argument("--all", action="store_true", help="linalg_fft.py's FFTs as well")
    parser.add_argument("-p", action="append", default=[], help="names containing this")
    opts = parser.parse_args()
    print(
        f"{'program':24} {'ducc0 us':>10} {'(median)':>10} {'scipy us':>10} {'(median)':>10}  ratio"
    )
    ratios = []
    for name, prog in programs(opts.all).items():
        if opts.p and not any(p in name for p in opts.p):
            continue
        args = prog.make_args(np.random.default_rng(0), BIG)
        text = jax.jit(prog.fn).lower(*args).as_text(dialect="hlo")
        client = Client("cpu")
        exes = {
            lib: client.compile(text, CompileOptions.make(backend_options={"fft_library": lib}))
            for lib in ("ducc0", "scipy")
        }
        buffers = [client.buffer_from_pyval(a) for a in args]
        times: dict[str, list[float]] = {lib: [] for lib in exes}
        for exe in exes.values():  # warm-up (first touch, ducc0's import)
            timed(exe, buffers, 2, [])
        block = max(1, opts.runs // 5)
        while len(times["ducc0"]) < opts.runs:
            for lib, exe in exes.items():
                timed(exe, buffers, block, times[lib])
        d, s = times["ducc0"], times["scipy"]
        ratio = min(d) / min(s)
        ratios.append(ratio)
        print(
            f"{name:24} {1e6 * min(d):10.1f} {1e6 * statistics.median(d):10.1f} "
            f"{1e6 * min(s):10.1f} {1e6 * statistics.median(s):10.1f}  {ratio:5.2f}"
        )
    if ratios:
        mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"geometric mean ducc0 / scipy (best runs) over {len(ratios)}: {mean:.2f}")


if __name__ == "__main__":
    main()
