"""jax.pmap on 4 xlapy devices (XLAPY_DEVICE_COUNT=4, in a subprocess: the count is fixed
when JAX starts): collectives over the mapped axis (all_to_all splitting one dimension and
concatenating along another included), unmapped arguments, a data-parallel
gradient step, and the outputs' placement, each against NumPy on fresh random inputs."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import numpy as np
import jax, jax.numpy as jnp
from jax import lax

assert jax.default_backend() == "xlapy" and jax.device_count() == 4, jax.devices()
rng = np.random.default_rng(int.from_bytes(__import__("os").urandom(4), "little"))
x = rng.standard_normal((4, 3, 5)).astype(np.float32)
w = rng.standard_normal((5, 2)).astype(np.float32)
n = rng.integers(-50, 50, (4, 6)).astype(np.int32)
x4 = rng.standard_normal((4, 8, 6)).astype(np.float32)
close = lambda got, want: np.testing.assert_allclose(np.asarray(got), want, 1e-5, 1e-5)

close(jax.pmap(lambda a: lax.psum(a, "i"), axis_name="i")(x), np.broadcast_to(x.sum(0), x.shape))
close(jax.pmap(lambda a: lax.pmean(a, "i"), axis_name="i")(x), np.broadcast_to(x.mean(0), x.shape))
np.testing.assert_array_equal(
    np.asarray(jax.pmap(lambda a: lax.pmax(a, "i"), axis_name="i")(n)),
    np.broadcast_to(n.max(0), n.shape))
gathered = jax.pmap(lambda a: lax.all_gather(a, "i"), axis_name="i")(x)
close(gathered, np.broadcast_to(x, (4,) + x.shape))
perm = [(0, 1), (1, 2), (2, 3), (3, 0)]
close(jax.pmap(lambda a: lax.ppermute(a, "i", perm), axis_name="i")(x), np.roll(x, 1, axis=0))
moved = jax.pmap(lambda a: lax.all_to_all(a, "i", 0, 1, tiled=True), axis_name="i")(x4)
want = np.stack([np.concatenate([x4[j][2 * k : 2 * k + 2] for j in range(4)], 1) for k in range(4)])
close(moved, want)  # split one dimension, concatenate along another
idx = jax.pmap(lambda a: a + lax.axis_index("i"), axis_name="i")(n)
np.testing.assert_array_equal(np.asarray(idx), n + np.arange(4)[:, None])
close(jax.pmap(lambda a, b: a @ b, in_axes=(0, None))(x, w), x @ w)

def loss(w, a):
    return jnp.mean((a @ w) ** 2)

@jax.pmap
def grads(w, a):
    return jax.grad(loss)(w, a)

g = grads(np.broadcast_to(w, (4,) + w.shape), x)
want = np.stack([2 * x[k].T @ (x[k] @ w) / (x[k] @ w).size for k in range(4)])
np.testing.assert_allclose(np.asarray(g), want, 1e-4, 1e-5)
assert {s.device for s in g.addressable_shards} == set(jax.devices())
print("pmap ok")
"""


def test_pmap_collectives_and_gradients_on_four_devices():
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "JAX_PLATFORMS": "xlapy",
            "XLAPY_DEVICE_COUNT": "4",
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pmap ok" in done.stdout
