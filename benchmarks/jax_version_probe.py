"""Does xlapy read what another JAX version lowers? A probe for a machine with a JAX other
than the pinned one (a lent device machine has jax 0.11.x; this repository pins 0.10.2).

    python benchmarks/jax_version_probe.py [--out DIR]

For each of a broad set of small JAX programs (sorts of every kind, top-k, scans, control
flow, gathers/scatters, convolutions, FFT, linear algebra, RNG, special functions, bit
operations, conversions) it lowers the program to HLO text with the installed JAX, has
xlapy parse, compile and run it (the CPU backend) and compares with XLA:CPU on the same
random inputs. Printed per program: ok / MISMATCH / FAILED with the first line of the
error; the HLO text of every program is written to --out (one file per program, and one
tar file of all) so that a grammar change can be read off the real text. Sorting of the
float special values (NaN of both signs, infinities, -0 and +0) is also reported as XLA
computes it, the facts a new comparison order needs.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
import tempfile
import traceback
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def programs(rng: np.random.Generator):
    """(name, function, arguments) of each probe program."""
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    i32 = lambda *s: rng.integers(-50, 50, s).astype(np.int32)  # noqa: E731
    special = np.array(
        [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1e-40, -1e-40],
        np.float32,
    )
    key = jax.random.key(7)
    yield "sort_f32", lambda x: jnp.sort(x), (f32(64),)
    yield "sort_special", lambda x: jnp.sort(x), (special,)
    yield "sort_desc", lambda x: jnp.sort(x, descending=True), (f32(8, 16),)
    yield "sort_stable", lambda x: lax.sort(x, is_stable=True), (i32(100),)
    yield "argsort_rows", lambda x: jnp.argsort(x, axis=-1), (f32(8, 32),)
    yield "argsort_special", lambda x: jnp.argsort(x, stable=True), (special,)
    yield "sort_multi_key", lambda a, b: lax.sort((a, b), num_keys=2), (i32(64) % 4, f32(64))
    yield "sort_i32", lambda x: jnp.sort(x), (i32(50),)
    yield "sort_bf16", lambda x: jnp.sort(x), (f32(40).astype(jnp.bfloat16),)
    yield "top_k", lambda x: lax.top_k(x, 5), (f32(8, 32),)
    yield "top_k_special", lambda x: lax.top_k(x, 4), (special,)
    yield "argmax", lambda x: jnp.argmax(x, axis=1), (f32(8, 32),)
    yield "argmin_special", lambda x: jnp.argmin(x), (special,)
    yield "max_special", lambda x, y: (jnp.maximum(x, y), x < y), (special, special[::-1].copy())
    yield "cumsum", lambda x: jnp.cumsum(x, axis=1), (f32(8, 64),)
    yield "cumlogsumexp", lambda x: lax.cumlogsumexp(x, axis=1), (f32(8, 64),)
    yield "cummax_rev", lambda x: lax.cummax(x, axis=0, reverse=True), (f32(64, 4),)
    yield (
        "scan_rnn",
        lambda h, xs: lax.scan(lambda c, x: (jnp.tanh(c + x), c), h, xs),
        (
            f32(16),
            f32(12, 16),
        ),
    )
    yield "fori", lambda x: lax.fori_loop(0, 10, lambda i, v: v * 1.01 + i, x), (f32(32),)
    yield (
        "while",
        lambda x: lax.while_loop(lambda v: v.sum() < 100.0, lambda v: v + 1.0, x),
        (np.abs(f32(8)),),
    )
    yield "cond", lambda p, x: lax.cond(p > 0, jnp.sin, jnp.cos, x), (np.float32(1.0), f32(8))
    yield (
        "switch",
        lambda i, x: lax.switch(i, [jnp.sin, jnp.cos, jnp.tanh], x),
        (
            np.int32(2),
            f32(8),
        ),
    )
    yield "gather", lambda x, i: x[i], (f32(32, 8), rng.integers(0, 32, (10,)).astype(np.int32))
    yield (
        "scatter_add",
        lambda x, i, u: x.at[i].add(u),
        (
            f32(32),
            rng.integers(0, 32, (40,)).astype(np.int32),
            f32(40),
        ),
    )
    yield (
        "dynamic_update",
        lambda x, u, i: lax.dynamic_update_slice(x, u, (i, 0)),
        (
            f32(16, 8),
            f32(4, 8),
            np.int32(5),
        ),
    )
    yield (
        "conv",
        lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME"),
        (
            f32(2, 3, 16, 16),
            f32(4, 3, 3, 3),
        ),
    )
    yield (
        "conv_grad",
        jax.grad(
            lambda x, w: jnp.sum(lax.conv_general_dilated(x, w, (2, 2), "VALID") ** 2), (0, 1)
        ),
        (f32(2, 3, 9, 9), f32(4, 3, 3, 3)),
    )
    yield (
        "maxpool",
        lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2), (1, 2, 2), "VALID"),
        (f32(2, 8, 8),),
    )
    yield "fft", lambda x: jnp.fft.fft(x), (f32(4, 32).astype(np.complex64),)
    yield "rfft", lambda x: jnp.fft.irfft(jnp.fft.rfft(x)), (f32(4, 32),)
    yield "cholesky", lambda a: jnp.linalg.cholesky(a @ a.T + 8 * jnp.eye(8)), (f32(8, 8),)
    yield "qr", lambda a: jnp.linalg.qr(a)[1], (f32(8, 6),)
    yield "eigh", lambda a: jnp.linalg.eigh(a + a.T)[0], (f32(8, 8),)
    yield "svd", lambda a: jnp.linalg.svd(a, compute_uv=False), (f32(8, 6),)
    yield "solve", lambda a, b: jnp.linalg.solve(a + 8 * jnp.eye(8), b), (f32(8, 8), f32(8, 2))
    yield (
        "triangular",
        lambda a, b: jax.scipy.linalg.solve_triangular(jnp.tril(a) + 8 * jnp.eye(8), b, lower=True),
        (f32(8, 8), f32(8, 3)),
    )
    yield "threefry", lambda: jax.random.normal(key, (64,)), ()
    yield "uniform_bits", lambda: jax.random.bits(key, (32,)), ()
    yield "rbg", lambda: jax.random.normal(jax.random.key(3, impl="rbg"), (16,)), ()
    yield "gamma", lambda: jax.random.gamma(key, 2.5, (16,)), ()
    yield "lgamma_digamma", lambda x: (lax.lgamma(x), lax.digamma(x)), (np.abs(f32(16)) + 0.1,)
    yield "erf_inv", lambda x: lax.erf_inv(jnp.tanh(x) * 0.9), (f32(16),)
    yield "igamma", lambda a, x: lax.igamma(a, x), (np.abs(f32(16)) + 0.5, np.abs(f32(16)))
    yield "bessel", lambda x: lax.bessel_i1e(x), (f32(16),)
    yield (
        "bit_ops",
        lambda x, y: (x & y, x ^ y, x >> 3, lax.population_count(x), lax.clz(x)),
        (
            i32(16),
            i32(16),
        ),
    )
    yield "convert_sat", lambda x: (x * 1e10).astype(jnp.int32), (f32(16),)
    yield "f8", lambda x: x.astype(jnp.float8_e4m3fn).astype(jnp.float32), (f32(16),)
    yield "reduce_precision", lambda x: lax.reduce_precision(x, 5, 10), (f32(16),)
    yield "bitcast", lambda x: lax.bitcast_convert_type(x, jnp.int32), (f32(16),)
    yield "complex_ops", lambda x: jnp.abs(jnp.exp(x * 1j)) + jnp.angle(x + 1j), (f32(16),)
    yield (
        "einsum_bf16",
        lambda a, b: jnp.einsum("bij,bjk->bik", a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)),
        (f32(2, 8, 16), f32(2, 16, 4)),
    )
    yield "dot_int", lambda a, b: a @ b, (i32(8, 8), i32(8, 8))
    yield "softmax_grad", jax.grad(lambda x: jnp.sum(jax.nn.softmax(x) ** 2)), (f32(8, 16),)
    yield (
        "layernorm_mlp",
        jax.grad(
            lambda w, x: jnp.mean(
                jax.nn.gelu(
                    (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5) @ w
                )
            )
        ),
        (f32(16, 16), f32(4, 16)),
    )
    yield (
        "vmap_while",
        jax.vmap(lambda x: lax.while_loop(lambda v: v < 10.0, lambda v: v * 2.0, x)),
        (np.abs(f32(8)) + 0.1,),
    )
    yield "clamp_round", lambda x: (jnp.clip(x, -0.5, 0.5), jnp.round(x), jnp.floor(x)), (f32(16),)
    yield "remainder", lambda x, y: (x % y, jnp.fmod(x, y)), (f32(16), np.abs(f32(16)) + 0.5)
    yield "iota_select", lambda x: jnp.where(jnp.arange(16) % 2 == 0, x, -x), (f32(16),)
    yield "pad_concat", lambda x: jnp.concatenate([jnp.pad(x, 2), x[::-1]]), (f32(8),)
    yield "reshape_transpose", lambda x: x.reshape(4, 8).T.reshape(-1), (f32(32),)


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def same(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape:
            return False
        if w.dtype.kind in "biu":
            if not np.array_equal(g, w):
                return False
            continue
        g64 = np.asarray(g, np.complex128 if w.dtype.kind == "c" else np.float64)
        w64 = np.asarray(w, g64.dtype)
        scale = max(float(np.max(np.abs(w64[np.isfinite(w64)]), initial=0.0)), 1e-6)
        if not np.allclose(g64, w64, rtol=1e-2, atol=1e-3 * scale, equal_nan=True):
            return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="where the HLO texts go")
    parser.add_argument("-p", action="append", default=[], help="names containing these")
    args = parser.parse_args()
    from xlapy.runtime import Client

    out = args.out or Path(tempfile.mkdtemp(prefix="xlapy-probe-"))
    hlo_dir = out / "hlo"
    hlo_dir.mkdir(parents=True, exist_ok=True)
    print(f"jax {jax.__version__}, jaxlib {jax.lib.__version__ if hasattr(jax, 'lib') else '?'}")
    client = Client("cpu")
    counts = {"ok": 0, "MISMATCH": 0, "FAILED": 0}
    rng = np.random.default_rng(0)
    for name, fn, fargs in programs(rng):
        if args.p and not any(p in name for p in args.p):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                lowered = jax.jit(fn).lower(*fargs)
            text = lowered.as_text(dialect="hlo")
            want = leaves(lowered.compile()(*fargs))
        except Exception as e:  # JAX itself could not run it: not xlapy's failure
            print(f"{name:20s} skipped (JAX: {type(e).__name__}: {str(e).splitlines()[0][:80]})")
            continue
        (hlo_dir / f"{name}.hlo.txt").write_text(text)
        if name.endswith("special"):
            print(f"{name:20s} XLA gives {[w.tolist() for w in want]}")
        try:
            executable = client.compile(text)
            buffers = [client.buffer_from_pyval(a) for a in leaves(fargs)]
            got = [b.to_numpy() for b in executable.execute([buffers])[0]]
            status = "ok" if same(got, want) else "MISMATCH"
            detail = "" if status == "ok" else f" xlapy {[g.tolist() for g in got]}"[:300]
        except Exception as e:
            status = "FAILED"
            detail = f" {type(e).__name__}: {str(e).splitlines()[0][:150]}"
            if "-v" in sys.argv:
                traceback.print_exc()
        counts[status] += 1
        print(f"{name:20s} {status}{detail}")
    with tarfile.open(out / "hlo.tar.gz", "w:gz") as tar:
        tar.add(hlo_dir, arcname="hlo")
    print(f"{counts}; HLO texts in {hlo_dir} and {out / 'hlo.tar.gz'}")
    return 0 if counts["FAILED"] + counts["MISMATCH"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
