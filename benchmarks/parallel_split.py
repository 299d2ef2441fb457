"""Split against whole for the CPU runtime's dots and sorts, in one process, runs of the
ways interleaved (so a loaded machine's noise hits them alike), best of many runs.

Dots (float32, OpenBLAS on one thread per call in every way):
  whole      one gemm per product on the calling thread (a batch: one native call)
  native     the products cut into tiles (tile_grid over the pool's threads; per batch
             item when the batch is shorter), one gemm-list table run over the native pool
  python     the same tiles as Python tasks on the Python pool (pool.run_blocks, a cffi gemm
             call per tile), the way the fifth session ran them
Sorts: argsort of every row whole, and split over the Python pool (sort_thunk's way).

A kernel whose split does not beat its whole run on 2 threads will not scale to 16: the
speedup columns are whole / split.

  PYTHONPATH=. .venv/bin/python benchmarks/parallel_split.py --runs 40
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import xlapy.backends.cpu  # noqa: F401  (installs the runtime's native helpers)
from xlapy.backends.cpu.runtime import dot_thunk, pool
from xlapy.backends.cpu.runtime.native_pool import native_pool

# name -> (batch, m, k, n)
DOTS = {
    "matmul 512": (1, 512, 512, 512),
    "matmul 1024x256x1024": (1, 1024, 256, 1024),
    "batched 16x128": (16, 128, 128, 128),
    "batched 8x512": (8, 512, 512, 512),
    "attention 16x128x32x128": (16, 128, 32, 128),
}
SORTS = {"argsort 256x1024": (256, 1024), "argsort 64x16384": (64, 16384)}


def _dot_ways(b: int, m: int, k: int, n: int, threads: int):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, m, k)).astype(np.float32)
    y = rng.standard_normal((b, k, n)).astype(np.float32)
    out = np.zeros((b, m, n), np.float32)
    kernel = dot_thunk.gemm_list_kernel(np.dtype(np.float32), True)
    assert kernel is not None, "no OpenBLAS gemm"
    it = 4

    def entries(per_item: int):
        rows_p, cols_p = dot_thunk.tile_grid(m, n, per_item)
        rows = pool.even_blocks(m, rows_p)
        cols = dot_thunk._blocks(n, cols_p, dot_thunk._BLOCK_QUANTUM)
        return [
            (it * (i * m * k + r0 * k), it * (i * k * n + c0), it * (i * m * n + r0 * n + c0),
             r1 - r0, c1 - c0)
            for i in range(b)
            for (r0, r1), (c0, c1) in itertools.product(rows, cols)
        ]  # fmt: skip

    whole = dot_thunk.GemmList(kernel, (False, False), k, (k, n, n), entries(1))
    tiles = entries(-(-threads // b))
    split = dot_thunk.GemmList(kernel, (False, False), k, (k, n, n), tiles)
    pa, pb, pc = x.ctypes.data, y.ctypes.data, out.ctypes.data
    gemm = dot_thunk.flushing_gemm(np.dtype(np.float32)) or dot_thunk.cblas_gemm(
        np.dtype(np.float32)
    )
    R, N = dot_thunk.ROW_MAJOR, dot_thunk.NO_TRANS

    def tile_range(lo: int, hi: int) -> None:
        for ao, bo, co, rows, cols in tiles[lo:hi]:
            gemm(R, N, N, rows, cols, k, 1.0, pa + ao, k, pb + bo, n, 0.0, pc + co, n)

    blocks = pool.even_blocks(len(tiles), threads)
    keep = (x, y, out)  # the ways run on these arrays' addresses

    ways = {
        "whole": lambda: whole.run(pa, pb, pc, 1) or keep,
        "native": lambda: split.run(pa, pb, pc, threads),
        "python": lambda: pool.run_blocks(
            lambda lo, hi: dot_thunk.one_blas_thread(tile_range, lo, hi), blocks
        ),
    }
    want = np.matmul(x.astype(np.float64), y.astype(np.float64))
    for way in ways.values():  # every way computes the product
        out[...] = np.nan
        way()
        np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())
    return ways


def _sort_ways(rows: int, cols: int, threads: int):
    x = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32)
    out = np.empty(x.shape, np.int64)

    def block(lo: int, hi: int) -> None:
        out[lo:hi] = np.argsort(x[lo:hi], axis=1, kind="stable")

    parts = pool.even_blocks(rows, threads)
    return {"whole": lambda: block(0, rows), "python": lambda: pool.run_blocks(block, parts)}


def best_times(ways: dict, runs: int) -> dict[str, float]:
    for way in ways.values():
        way()
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(runs):
        for name, way in ways.items():
            t = time.perf_counter()
            way()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    opts = parser.parse_args()
    threads = pool.pool_size()
    print(f"threads {threads}, native pool: {native_pool() is not None}; best of {opts.runs}")
    print(f"{'kernel':26s} {'whole us':>9s} {'native us':>10s} {'python us':>10s}"
          f" {'native x':>9s} {'python x':>9s}")  # fmt: skip
    for name, (b, m, k, n) in DOTS.items():
        t = best_times(_dot_ways(b, m, k, n, threads), opts.runs)
        print(
            f"{name:26s} {1e6 * t['whole']:9.0f} {1e6 * t['native']:10.0f} "
            f"{1e6 * t['python']:10.0f} {t['whole'] / t['native']:9.2f} "
            f"{t['whole'] / t['python']:9.2f}"
        )
    for name, (rows, cols) in SORTS.items():
        t = best_times(_sort_ways(rows, cols, threads), opts.runs)
        print(
            f"{name:26s} {1e6 * t['whole']:9.0f} {'':>10s} {1e6 * t['python']:10.0f} {'':>9s} "
            f"{t['whole'] / t['python']:9.2f}"
        )


if __name__ == "__main__":
    main()
