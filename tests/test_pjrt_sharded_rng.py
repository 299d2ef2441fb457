"""Random numbers per shard and shard_map in partly automatic meshes on 4 xlapy devices,
next to XLA:CPU on 4 CPU devices (`--xla_force_host_platform_device_count=4`) in the same
process (a subprocess: device counts are fixed when JAX starts its backends).

Each case runs the same jitted program on a 2x2 mesh of each platform's devices and the
results must agree: the RNG implementations JAX offers (threefry, rbg, unsafe_rbg) with
sharded outputs, split keys sharded over a mesh axis, keys folded with `axis_index` inside
`shard_map` (manual over one axis, automatic over the other, or fully manual), dropout in
a sharded gradient, and loops inside a partly manual shard_map. Found here: threefry's
loop inside a manual region (JAX lowers `fold_in` and `normal` with while loops) stopped
the partitioner with "'NoneType' object has no attribute 'rank'" (a tuple of manual values
was taken for an automatically sharded one).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

rng = np.random.default_rng(2611)
x = rng.uniform(-1, 1, (8, 8)).astype(np.float32)
w = rng.standard_normal((8, 8)).astype(np.float32) / 3


def cases(platform):
    mesh = Mesh(np.array(jax.devices(platform)).reshape(2, 2), ("a", "b"),
                axis_types=(AxisType.Auto,) * 2)
    ab, a_ = NamedSharding(mesh, P("a", "b")), NamedSharding(mesh, P("a"))
    smap = lambda f, i, o, **kw: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=i, out_specs=o, **kw))
    out = {}
    for impl in ("threefry2x32", "rbg", "unsafe_rbg"):
        key = jax.random.key(7, impl=impl)
        keys = jax.random.split(key, 4)

        def fold_a(k, v):  # a key per shard of "a"
            k = jax.random.fold_in(k[0], jax.lax.axis_index("a"))
            return v + jax.random.normal(k, v.shape)

        def fold_b(v):
            k = jax.random.fold_in(jax.random.key(3, impl=impl), jax.lax.axis_index("b"))
            return jax.random.bernoulli(k, 0.3, v.shape).astype(v.dtype) * v

        def dropout_loss(w, v, k):
            h = jnp.tanh(v @ w)
            keep = jax.random.bernoulli(k, 0.8, h.shape)
            return (jnp.where(keep, h / 0.8, 0) ** 2).sum()

        out[impl + " normal sharded out"] = lambda: jax.jit(
            lambda k: jax.random.normal(k, (8, 8)), out_shardings=ab)(key)
        out[impl + " bits sharded out"] = lambda: jax.jit(
            lambda k: jax.random.bits(k, (16, 4)), out_shardings=a_)(key)
        out[impl + " split keys sharded"] = lambda: jax.jit(
            lambda ks: jax.vmap(lambda k: jax.random.uniform(k, (5,)))(ks),
            in_shardings=a_, out_shardings=a_)(keys)
        out[impl + " shard_map manual a, auto b"] = lambda: smap(
            fold_a, (P(), P("a")), P("a"), axis_names={"a"})(key[None], jax.device_put(x, ab))
        out[impl + " shard_map fully manual"] = lambda: smap(
            fold_a, (P(), P("a", "b")), P("a", "b"))(key[None], jax.device_put(x, ab))
        out[impl + " shard_map manual b, auto a"] = lambda: smap(
            fold_b, P(None, "b"), P(None, "b"), axis_names={"b"})(jax.device_put(x, ab))
        out[impl + " dropout gradient"] = lambda: jax.jit(
            jax.grad(dropout_loss),
            in_shardings=(NamedSharding(mesh, P(None, "b")), a_, None))(w, x, key)

    def scan_body(v):
        def step(c, row):
            c = c + jnp.sin(row) + jax.lax.psum(row.sum(), "a")
            return c, c * 2
        c, ys = jax.lax.scan(step, jnp.zeros_like(v[0]), v)
        return ys + c

    out["scan in shard_map manual a, auto b"] = lambda: smap(
        scan_body, P("a"), P("a"), axis_names={"a"})(jax.device_put(x, ab))
    results = {}
    for name, run in out.items():
        try:
            results[name] = np.asarray(run()).astype(np.float64).tolist()
        except Exception as e:
            results[name] = "error: " + str(e).splitlines()[0][:300]
    return results


print(json.dumps({p: cases(p) for p in ("cpu", "xlapy")}))
"""


def test_sharded_rng_and_partly_manual_shard_map_like_cpu():
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "JAX_PLATFORMS": "cpu,xlapy",
            "XLAPY_DEVICE_COUNT": "4",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    want, got = results["cpu"], results["xlapy"]
    assert want.keys() == got.keys()
    for name, value in want.items():
        assert not isinstance(value, str), f"{name} on cpu: {value}"
        assert not isinstance(got[name], str), f"{name} on xlapy: {got[name]}"
        # bits exactly; float results to float32 rounding (tanh's gradient near
        # saturation amplifies one ulp of tanh)
        np.testing.assert_allclose(np.array(got[name]), np.array(value), rtol=2e-5, atol=2e-5)
