"""Regenerate the XLA-partitioned programs the collective tests run.

    python tests/collectives/generate.py

Each case is a JAX program over 2, 4 or 8 CPU devices (shard_map and NamedSharding jit);
XLA compiles it and partitions it, and this script writes NAME.hlo (the compiled module's
text, `compiled.as_text()`) and NAME.npz (for every partition, the shard of every argument
and of every output that JAX's own run produced, as `arg{i}_{partition}` and
`out{i}_{partition}`) plus the partition count (for pmap programs, one partition and a
replica per device, `arg{i}_{replica}`). The tests run NAME.hlo with xlapy on as
many devices and compare with the outputs bit for bit.

It runs JAX in its own process with XLA_FLAGS=--xla_force_host_platform_device_count=8
(the flag must be set before jax is imported).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

try:
    from jax import shard_map
except ImportError:  # older JAX
    from jax.experimental.shard_map import shard_map

HERE = Path(__file__).resolve().parent


def mesh(shape, names):
    n = int(np.prod(shape))
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


def rand(seed, shape, dtype=np.float32):
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-50, 50, size=shape).astype(dtype)
    return rng.normal(size=shape).astype(dtype)


def smap(f, m, in_specs, out_specs):
    return jax.jit(shard_map(f, mesh=m, in_specs=in_specs, out_specs=out_specs))


def cases():
    m2 = mesh((2,), ("x",))
    m4 = mesh((4,), ("x",))
    m8 = mesh((8,), ("x",))
    m24 = mesh((2, 4), ("a", "b"))
    m22 = mesh((2, 2), ("data", "model"))

    # data-parallel training step of a two-layer MLP: grads averaged with pmean
    def loss(params, x, y):
        w1, w2 = params
        h = jnp.tanh(x @ w1)
        return jnp.mean((h @ w2 - y) ** 2)

    def dp_step(w1, w2, x, y):
        g1, g2 = jax.grad(loss)((w1, w2), x, y)
        g1, g2 = jax.lax.pmean(g1, "x"), jax.lax.pmean(g2, "x")
        return w1 - 0.1 * g1, w2 - 0.1 * g2, jax.lax.pmean(loss((w1, w2), x, y), "x")

    for n, m in ((2, m2), (4, m4), (8, m8)):
        yield (
            f"dp_train_step_{n}",
            smap(dp_step, m, (P(), P(), P("x"), P("x")), (P(), P(), P())),
            [rand(1, (16, 32)), rand(2, (32, 8)), rand(3, (8 * n, 16)), rand(4, (8 * n, 8))],
            m,
        )

    # tensor-parallel MLP (Megatron): columns then rows, psum at the end
    def tp_mlp(x, w1, w2):
        return jax.lax.psum(jax.nn.relu(x @ w1) @ w2, "x")

    yield (
        "tp_matmul_4",
        smap(tp_mlp, m4, (P(), P(None, "x"), P("x", None)), P()),
        [rand(5, (8, 16)), rand(6, (16, 64)), rand(7, (64, 16))],
        m4,
    )

    def a2a(x):
        return jax.lax.all_to_all(x, "x", 0, 1, tiled=True)

    yield ("all_to_all_4", smap(a2a, m4, P("x", None), P(None, "x")), [rand(8, (16, 8))], m4)

    def ring(x):
        n = 8
        return jax.lax.ppermute(x, "x", [(i, (i + 1) % n) for i in range(n)]) * 2 + x

    yield ("ppermute_ring_8", smap(ring, m8, P("x"), P("x")), [rand(9, (32, 3))], m8)

    def sub_axes(x):
        b = jax.lax.psum(x, "b")
        a = jax.lax.pmax(x, "a")
        both = jax.lax.psum(x, ("a", "b"))
        g = jax.lax.all_gather(b, "a", tiled=True)
        s = jax.lax.psum_scatter(g, "b", scatter_dimension=1, tiled=True)
        return b, a, both, s

    yield (
        "psum_sub_axes_2x4",
        smap(sub_axes, m24, P("a", "b"), (P("a", "b"),) * 4),
        [rand(10, (8, 16))],
        m24,
    )

    def reductions(x, i):
        return (
            jax.lax.psum(x, "x"),
            jax.lax.pmin(x, "x"),
            jax.lax.pmax(i, "x"),
            jax.lax.psum(i, "x"),
            jax.lax.axis_index("x") + i,
        )

    yield (
        "reductions_8",
        smap(reductions, m8, (P("x"), P("x")), (P(), P(), P(), P(), P("x"))),
        [rand(11, (8 * 5, 7)), rand(12, (8 * 2, 3), np.int32)],
        m8,
    )

    def scatter(x):
        return jax.lax.psum_scatter(x, "x", scatter_dimension=0, tiled=True)

    yield ("reduce_scatter_4", smap(scatter, m4, P(), P("x")), [rand(13, (16, 5))], m4)

    # NamedSharding jit: XLA's SPMD partitioner inserts the collectives
    def named(x, w):
        y = jnp.tanh(x @ w)
        return y.sum(axis=0), y

    x_s = NamedSharding(m22, P("data", None))
    w_s = NamedSharding(m22, P(None, "model"))
    f = jax.jit(
        named,
        in_shardings=(x_s, w_s),
        out_shardings=(NamedSharding(m22, P()), NamedSharding(m22, P("data", "model"))),
    )
    yield ("named_sharding_2x2", f, [rand(14, (8, 12)), rand(15, (12, 6))], m22)

    def named8(x):
        return jnp.cumsum(x, axis=0), jnp.max(x, axis=1)

    xs8 = NamedSharding(m24, P("a", "b"))
    f8 = jax.jit(
        named8,
        in_shardings=(xs8,),
        out_shardings=(NamedSharding(m24, P(None, "b")), NamedSharding(m24, P("a"))),
    )
    yield ("named_sharding_2x4", f8, [rand(16, (8, 16))], m24)


def more_cases():
    m4 = mesh((4,), ("x",))

    # a loop whose body holds collectives: each trip meets the peers again
    def looped(x):
        def body(i, carry):
            s = jax.lax.psum(carry, "x")
            r = jax.lax.ppermute(carry, "x", [(j, (j + 1) % 4) for j in range(4)])
            return r * 0.5 + s * 0.125 + i

        return jax.lax.fori_loop(0, 3, body, x)

    yield ("loop_collectives_4", smap(looped, m4, P("x"), P("x")), [rand(17, (8, 5))], m4)

    def low_precision(x, y):
        return jax.lax.psum(x, "x"), jax.lax.pmax(y, "x"), jax.lax.psum(y.astype(jnp.int8), "x")

    yield (
        "low_precision_4",
        smap(low_precision, m4, (P("x"), P("x")), (P(), P(), P())),
        [rand(18, (16, 8)).astype(jnp.bfloat16), rand(19, (16, 3)).astype(np.float16)],
        m4,
    )


def third_cases():
    m4 = mesh((4,), ("x",))
    m8 = mesh((8,), ("x",))
    m222 = mesh((2, 2, 2), ("p", "q", "r"))

    def a2a(x):  # split one axis, gather another
        return jax.lax.all_to_all(x, "x", 1, 0, tiled=True)

    yield ("all_to_all_axes_4", smap(a2a, m4, P("x"), P("x")), [rand(22, (8, 8))], m4)

    def three_axes(x):
        return (
            jax.lax.psum(x, ("p", "r")),
            jax.lax.all_gather(x, "q", tiled=True),
            jax.lax.ppermute(x, "r", [(0, 1), (1, 0)]),
        )

    yield (
        "three_axes_2x2x2",
        smap(three_axes, m222, P(("p", "q", "r")), (P(("p", "q", "r")),) * 3),
        [rand(23, (16, 3))],
        m222,
    )

    def scan_ring(x):
        def step(c, _):
            c = jax.lax.ppermute(c, "x", [(i, (i + 1) % 8) for i in range(8)])
            return c, jax.lax.psum(c.sum(), "x")

        return jax.lax.scan(step, x, None, length=4)

    yield ("scan_ring_8", smap(scan_ring, m8, P("x"), (P("x"), P())), [rand(24, (8, 2))], m8)

    # XLA prints the all-to-all's groups as a mesh with transposed device ids
    f = jax.jit(
        lambda x: x.T * 2,
        in_shardings=(NamedSharding(m4, P("x", None)),),
        out_shardings=NamedSharding(m4, P("x", None)),
    )
    yield ("named_transpose_4", f, [rand(25, (8, 8))], m4)


def pmap_cases():
    """pmap: device r gets row r of every argument (as a leading axis of size 1). Older
    JAX compiles a replicated program (replica_count = devices); newer JAX lowers pmap
    through shard_map to one partition per device."""

    def f(x, y):
        s = jax.lax.psum(x, "i")
        g = jax.lax.all_gather(y, "i")
        p = jax.lax.ppermute(x, "i", [(j, (j + 1) % 4) for j in range(4)])
        return s, g, p, jax.lax.axis_index("i") * 1.0 + jax.lax.pmin(x, "i")

    yield (
        "pmap_4",
        jax.pmap(f, axis_name="i", devices=jax.devices()[:4]),
        [
            rand(20, (4, 6)),
            rand(21, (4, 2, 3)),
        ],
    )


def pmap_main(only: list[str]) -> None:
    for name, fn, args in pmap_cases():
        if only and name not in only:
            continue
        text = fn.lower(*args).compile().as_text()
        outs = jax.tree_util.tree_leaves(fn(*args))
        n = args[0].shape[0]
        replicated = "replica_count=" in text.split("\n", 1)[0]
        data: dict[str, np.ndarray] = {
            "num_partitions": np.array(1 if replicated else n),
            "num_replicas": np.array(n if replicated else 1),
        }
        for i, a in enumerate(args):
            for r in range(n):
                data[f"arg{i}_{r}"] = np.asarray(a[r : r + 1])
        for i, out in enumerate(outs):
            for r in range(n):
                data[f"out{i}_{r}"] = np.asarray(out[r : r + 1])
        (HERE / f"{name}.hlo").write_text(text)
        np.savez_compressed(HERE / f"{name}.npz", **data)
        print(f"{name}: {n} devices, {len(text)} chars")


def shards_by_partition(array, devices):
    by_device = {s.device: np.asarray(s.data) for s in array.addressable_shards}
    return [by_device[d] for d in devices]


def main(only: list[str]) -> None:
    pmap_main(only)
    for name, fn, args, m in (*cases(), *more_cases(), *third_cases()):
        if only and name not in only:
            continue
        devices = list(m.devices.flat)
        lowered = fn.lower(*args)
        compiled = lowered.compile()
        text = compiled.as_text()
        outs = jax.tree_util.tree_leaves(compiled(*args))
        in_shardings = jax.tree_util.tree_leaves(compiled.input_shardings[0])
        data: dict[str, np.ndarray] = {"num_partitions": np.array(len(devices))}
        for i, (a, s) in enumerate(zip(args, in_shardings, strict=True)):
            placed = jax.device_put(a, s)
            for p, shard in enumerate(shards_by_partition(placed, devices)):
                data[f"arg{i}_{p}"] = shard
        for i, out in enumerate(outs):
            for p, shard in enumerate(shards_by_partition(out, devices)):
                data[f"out{i}_{p}"] = shard
        (HERE / f"{name}.hlo").write_text(text)
        np.savez_compressed(HERE / f"{name}.npz", **_storable(data))
        print(f"{name}: {len(devices)} devices, {len(text)} chars")


def _storable(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """bfloat16 arrays as their uint16 bits plus `dtype__KEY` (npz keeps no ml_dtypes)."""
    out = {}
    for key, value in data.items():
        if value.dtype == jnp.bfloat16:
            out[key] = value.view(np.uint16)
            out[f"dtype__{key}"] = np.array("bfloat16")
        else:
            out[key] = value
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
