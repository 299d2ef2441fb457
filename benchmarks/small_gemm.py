"""Small matrix-matrix dots (a free side of 2-16: an RNN cell's batch): the kernel library's
generic kernels (codegen/emit_small_gemm.py) against the per-shape kernels of
codegen/emit_gemv.py and OpenBLAS, run time and cold compile, in the same minutes.

Run time: the dot inside a while loop of TRIPS trips (`acc += x @ W`, W in cache), which the
CPU backend compiles into one native function, so a trip is the kernel (or the cblas call)
and an add of B x n elements with no Python; the three paths' programs are timed in turn,
ROUNDS times, and the minimum per trip is kept (the machine is shared and noisy).

Cold compile: process CPU and wall of compiling the dot alone with an empty kernel cache,
the process's kernels forgotten (minimum of COLD_REPEATS); the library's kernels are read
from the library directory (built once per machine: its one-time cost is printed at the
end, measured in a scratch directory).

    PYTHONPATH=. python benchmarks/small_gemm.py [--rounds 5] [--no-cold]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.jit.kernel import clear_kernel_cache
from xlapy.backends.cpu.jit.kernel_library import build, build_cost_ms
from xlapy.ir.parser import parse_module

TRIPS = 200
COLD_REPEATS = 3

# (batch B, k, n, W transposed: x @ W^T with W [n, k])
SHAPES = [
    (3, 128, 256, False),
    (3, 256, 128, True),
    (8, 128, 128, False),
    (8, 96, 384, False),
    (8, 384, 96, True),
    (16, 160, 384, False),
    (16, 384, 160, True),
    (16, 256, 256, False),
    (5, 37, 29, False),
]

PATHS = {
    "library": {},
    "per-shape": {"small_gemm_library": False},
    "openblas": {"native_small_gemm": False},
}


def dot_text(b: int, k: int, n: int, transposed: bool) -> str:
    w = f"f32[{n},{k}]" if transposed else f"f32[{k},{n}]"
    rc = 1 if transposed else 0
    return f"""HloModule small_dot
ENTRY e {{
  x = f32[{b},{k}] parameter(0)
  w = {w} parameter(1)
  ROOT d = f32[{b},{n}] dot(x, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{{rc}}}
}}"""


def loop_text(b: int, k: int, n: int, transposed: bool) -> str:
    w = f"f32[{n},{k}]" if transposed else f"f32[{k},{n}]"
    rc = 1 if transposed else 0
    state = f"(s32[], f32[{b},{k}], {w}, f32[{b},{n}])"
    return f"""HloModule small_dot_loop
cond {{
  s = {state} parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant({TRIPS})
  ROOT c = pred[] compare(i, n), direction=LT
}}
body {{
  s = {state} parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[{b},{k}] get-tuple-element(s), index=1
  w = {w} get-tuple-element(s), index=2
  acc = f32[{b},{n}] get-tuple-element(s), index=3
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  d = f32[{b},{n}] dot(x, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{{rc}}}
  acc1 = f32[{b},{n}] add(acc, d)
  ROOT r = {state} tuple(i1, x, w, acc1)
}}
ENTRY e {{
  x = f32[{b},{k}] parameter(0)
  w = {w} parameter(1)
  acc = f32[{b},{n}] parameter(2)
  zero = s32[] constant(0)
  init = {state} tuple(zero, x, w, acc)
  l = {state} while(init), condition=cond, body=body
  ROOT r = f32[{b},{n}] get-tuple-element(l), index=3
}}"""


def run_times(rounds: int) -> None:
    rng = np.random.default_rng(0)
    print(f"run time, us per trip (min over {rounds} rounds of 5 x {TRIPS}-trip loops)")
    print(f"{'dot':28s} " + " ".join(f"{p:>10s}" for p in PATHS) + "   kept of the gain")
    for b, k, n, transposed in SHAPES:
        text = loop_text(b, k, n, transposed)
        programs = {
            p: CpuProgram(parse_module(text), {**o, "thunk_concurrency": "off"})
            for p, o in PATHS.items()
        }
        w_shape = (n, k) if transposed else (k, n)
        args = [
            rng.standard_normal((b, k)).astype(np.float32),
            (rng.standard_normal(w_shape) / 10).astype(np.float32),
            np.zeros((b, n), np.float32),
        ]
        results = {p: np.asarray(prog.run(args)) for p, prog in programs.items()}
        scale = float(np.max(np.abs(results["openblas"])))
        for p, r in results.items():
            assert np.max(np.abs(r - results["openblas"])) <= 1e-4 * scale * k, p
        best = dict.fromkeys(PATHS, float("inf"))
        for _ in range(rounds):
            for p, prog in programs.items():
                for _ in range(5):
                    start = time.perf_counter()
                    prog.run(args)
                    best[p] = min(best[p], (time.perf_counter() - start) / TRIPS)
        name = f"{b}x{k} @ " + (f"({n}x{k})^T" if transposed else f"{k}x{n}")
        gain = best["openblas"] - best["per-shape"]
        kept = (best["openblas"] - best["library"]) / gain if gain > 0 else float("nan")
        cells = " ".join(f"{1e6 * best[p]:10.2f}" for p in PATHS)
        print(f"{name:28s} {cells}   {100 * kept:5.0f}%")


def cold_compiles() -> None:
    print(f"\ncold compile of the dot alone, ms (min of {COLD_REPEATS}; process CPU / wall)")
    print(f"{'dot':28s} " + " ".join(f"{p:>15s}" for p in PATHS))
    for b, k, n, transposed in SHAPES:
        text = dot_text(b, k, n, transposed)
        cells = []
        for options in PATHS.values():
            best_cpu = best_wall = float("inf")
            for _ in range(COLD_REPEATS):
                with tempfile.TemporaryDirectory(prefix="xlapy-small-gemm-") as tmp:
                    old = os.environ.get("XLAPY_CACHE_DIR")
                    os.environ["XLAPY_CACHE_DIR"] = tmp
                    try:
                        clear_kernel_cache()
                        cpu, wall = time.process_time(), time.perf_counter()
                        CpuProgram(parse_module(text), dict(options))
                        best_cpu = min(best_cpu, time.process_time() - cpu)
                        best_wall = min(best_wall, time.perf_counter() - wall)
                    finally:
                        if old is None:
                            os.environ.pop("XLAPY_CACHE_DIR", None)
                        else:
                            os.environ["XLAPY_CACHE_DIR"] = old
            cells.append(f"{1e3 * best_cpu:7.1f} /{1e3 * best_wall:6.1f}")
        name = f"{b}x{k} @ " + (f"({n}x{k})^T" if transposed else f"{k}x{n}")
        print(f"{name:28s} " + " ".join(f"{c:>15s}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-cold", action="store_true", help="skip the cold compiles")
    args = parser.parse_args()
    build()  # the library is built once per machine: not part of any figure below
    run_times(args.rounds)
    if not args.no_cold:
        cold_compiles()
        kernels, ms = build_cost_ms()
        print(f"\nthe kernel library's one-time build: {kernels} kernels, {ms:.0f} ms process CPU")


if __name__ == "__main__":
    main()
