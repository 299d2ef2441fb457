"""xlapy's LAPACK custom calls and FFTs against XLA:CPU (through JAX), in one process.

The programs are jnp.linalg / jax.scipy.linalg / jnp.fft calls at several sizes, including
batches of small matrices (where per-matrix overhead shows) and odd FFT lengths. Each is
timed the way `cpu_vs_xla.py` times its programs (same harness: interleaved blocks,
medians, outputs checked against XLA's with a loose tolerance); this file only adds the
programs.

  .venv/bin/python benchmarks/linalg_fft.py                   # everything
  .venv/bin/python benchmarks/linalg_fft.py -p eigh -p fft    # names containing these
  .venv/bin/python benchmarks/linalg_fft.py --list
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_vs_xla import BIG, Program, copy_bandwidth, report, run_program

PROGRAMS: dict[str, Program] = {}


def normal(rng, shape, dtype=np.float32):
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def spd(rng, shape, dtype=np.float32):
    a = normal(rng, shape, dtype)
    n = shape[-1]
    return (a @ np.conj(np.swapaxes(a, -1, -2)) / n + np.eye(n)).astype(dtype)


def add(name, fn, make):
    PROGRAMS[name] = Program(name, fn, lambda rng, _sizes: make(rng))


def _svd(x):
    return jnp.linalg.svd(x, full_matrices=False)


def _cho_solve(a, b):
    return jsl.cho_solve(jsl.cho_factor(a, lower=True), b)


def _tri(a, b):
    return jsl.solve_triangular(a, b, lower=True)


for n, batch in ((64, ()), (256, ()), (8, (512,))):
    tag = f"{n}" if not batch else f"{batch[0]}x{n}"
    shape = (*batch, n, n)
    add(f"eigh_{tag}", jnp.linalg.eigh, lambda rng, s=shape: (spd(rng, s),))
    add(f"svd_{tag}", _svd, lambda rng, s=shape: (normal(rng, s),))
    add(f"qr_{tag}", jnp.linalg.qr, lambda rng, s=shape: (normal(rng, s),))
    add(f"cho_solve_{tag}", _cho_solve, lambda rng, s=shape: (spd(rng, s), normal(rng, s)))
    add(f"lu_{tag}", lambda a: jsl.lu_factor(a), lambda rng, s=shape: (normal(rng, s),))
    add(
        f"tri_solve_{tag}",
        _tri,
        lambda rng, s=shape, n=n: (normal(rng, s) + n * np.eye(n, dtype="f4"), normal(rng, s)),
    )
    add(f"solve_{tag}", jnp.linalg.solve, lambda rng, s=shape: (normal(rng, s), normal(rng, s)))
for n, batch in ((64, ()), (128, ()), (8, (256,))):
    tag = f"{n}" if not batch else f"{batch[0]}x{n}"
    add(f"eig_{tag}", jnp.linalg.eig, lambda rng, s=(*batch, n, n): (normal(rng, s),))
add("eigh_c64_128", jnp.linalg.eigh, lambda rng: (spd(rng, (128, 128), np.complex64),))
add("svd_c64_128", _svd, lambda rng: (normal(rng, (128, 128), np.complex64),))

FFTS = [
    ("fft_64x4096", jnp.fft.fft, (64, 4096), np.complex64),
    ("fft_odd_64x1001", jnp.fft.fft, (64, 1001), np.complex64),
    ("ifft_64x4096", jnp.fft.ifft, (64, 4096), np.complex64),
    ("rfft_256x4096", jnp.fft.rfft, (256, 4096), np.float32),
    ("rfft_odd_256x999", jnp.fft.rfft, (256, 999), np.float32),
    ("irfft_256x2049", jnp.fft.irfft, (256, 2049), np.complex64),
    ("fft2_16x256x256", jnp.fft.fft2, (16, 256, 256), np.complex64),
    ("rfft2_16x256x256", jnp.fft.rfft2, (16, 256, 256), np.float32),
    ("fftn3_64x64x64", jnp.fft.fftn, (64, 64, 64), np.complex64),
    ("fft_small_4096x16", jnp.fft.fft, (4096, 16), np.complex64),
]
for name, fn, shape, dtype in FFTS:
    add(name, fn, lambda rng, s=shape, d=dtype: (normal(rng, s, d),))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-p", "--program", action="append", default=[])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--list", action="store_true")
    opts = parser.parse_args(argv)
    names = [n for n in PROGRAMS if not opts.program or any(p in n for p in opts.program)]
    if opts.list:
        print("\n".join(names))
        return
    jax.config.update("jax_platforms", "cpu")
    rows = []
    for name in names:
        row = run_program(PROGRAMS[name], BIG, opts.runs, opts.warmup)
        print(f"  {name}: {row.status}", file=sys.stderr, flush=True)
        rows.append(row)
    report(rows, copy_bandwidth())


if __name__ == "__main__":
    main()
