"""Make the SPMD partitioner's fixtures: sharded JAX programs lowered to annotated HLO.

Run from the repository root (it needs 8 host devices, so it sets XLA_FLAGS itself):

    python tests/spmd/generate.py

For each program it writes `<name>.hlo` (the annotated global module JAX hands a compiler,
GSPMD `sharding=` form), `<name>.mlir` (the StableHLO JAX hands a PJRT plugin, with
Shardy's `sdy` annotations), `<name>.sdy.hlo` for some (the Shardy form as HLO), and
`<name>.npz` holding the global inputs (`arg<i>`), JAX's global outputs (`out<i>`) and the
device count (`num_partitions`). It also writes `<name>.xla.hlo`,
XLA's own partitioned module, to compare the bytes moved by collectives.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

HERE = Path(__file__).resolve().parent


def mesh(shape, names):
    """An Auto mesh: the compiler (GSPMD, or xlapy) decides the shardings in between."""
    return jax.make_mesh(
        shape,
        names,
        axis_types=(AxisType.Auto,) * len(shape),
        devices=jax.devices()[: int(np.prod(shape))],
    )


def save(name, fn, args, in_specs, out_specs, m, sdy=False, xla=True):
    shard = [NamedSharding(m, s) for s in in_specs]
    outs = None if out_specs is None else tuple(NamedSharding(m, s) for s in out_specs)
    if outs is not None and len(outs) == 1:
        outs = outs[0]
    jitted = jax.jit(fn, in_shardings=tuple(shard), out_shardings=outs)
    args = [jax.device_put(a, s) for a, s in zip(args, shard, strict=True)]
    jax.config.update("jax_use_shardy_partitioner", True)
    (HERE / f"{name}.mlir").write_text(jitted.lower(*args).as_text())
    if sdy:
        (HERE / f"{name}.sdy.hlo").write_text(jitted.lower(*args).as_text(dialect="hlo"))
    jax.config.update("jax_use_shardy_partitioner", False)
    lowered = jitted.lower(*args)
    (HERE / f"{name}.hlo").write_text(lowered.as_text(dialect="hlo"))
    if xla:
        (HERE / f"{name}.xla.hlo").write_text(lowered.compile().as_text())
    result = jitted(*args)
    result = result if isinstance(result, tuple | list) else (result,)
    data = {f"arg{i}": np.asarray(a) for i, a in enumerate(args)}
    data.update({f"out{i}": np.asarray(r) for i, r in enumerate(result)})
    data["num_partitions"] = np.array(m.devices.size)
    np.savez(HERE / f"{name}.npz", **data)
    print(name, "ok")


def rnd(seed, *shape, scale=1.0):
    return (np.random.default_rng(seed).normal(size=shape) * scale).astype(np.float32)


def mlp_loss(params, x, y):
    w1, b1, w2 = params
    h = jax.nn.relu(x @ w1 + b1)
    return jnp.mean((h @ w2 - y) ** 2)


def mlp_step(w1, b1, w2, x, y):
    loss, g = jax.value_and_grad(mlp_loss)((w1, b1, w2), x, y)
    return loss, w1 - 0.1 * g[0], b1 - 0.1 * g[1], w2 - 0.1 * g[2]


def layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b


def attention(q, k, v):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1]).astype(np.float32)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)


def block_loss(params, x):
    wq, wk, wv, wo, w1, w2, g = params
    b, s, d = x.shape
    h = 4
    xn = layer_norm(x, g, 0.0)
    q = (xn @ wq).reshape(b, s, h, d // h)
    k = (xn @ wk).reshape(b, s, h, d // h)
    v = (xn @ wv).reshape(b, s, h, d // h)
    x = x + attention(q, k, v).reshape(b, s, d) @ wo
    x = x + jax.nn.gelu(layer_norm(x, g, 0.0) @ w1) @ w2
    return jnp.mean(x**2)


def block_step(wq, wk, wv, wo, w1, w2, g, x):
    params = (wq, wk, wv, wo, w1, w2, g)
    loss, grads = jax.value_and_grad(block_loss)(params, x)
    return (loss, *(p - 0.01 * d for p, d in zip(params, grads, strict=True)))


def main():
    m2 = mesh((2,), ("x",))
    m4 = mesh((4,), ("x",))
    m8 = mesh((8,), ("x",))
    m22 = mesh((2, 2), ("data", "model"))
    m24 = mesh((2, 4), ("data", "model"))

    mlp_args = [rnd(1, 16, 32, scale=0.2), rnd(2, 32), rnd(3, 32, 8, scale=0.2)]
    mlp_args += [rnd(4, 8, 16), rnd(5, 8, 8)]
    save("mlp_dp_2", mlp_step, mlp_args, [P(), P(), P(), P("x"), P("x")], None, m2, sdy=True)
    save(
        "mlp_tp_2x4",
        mlp_step,
        mlp_args,
        [P(None, "model"), P("model"), P("model", None), P("data"), P("data")],
        None,
        m24,
    )
    save(
        "layer_norm_2x2",
        layer_norm,
        [rnd(6, 8, 16), rnd(7, 16), rnd(8, 16)],
        [P("data", "model"), P("model"), P("model")],
        [P("data", "model")],
        m22,
        sdy=True,
    )
    qkv = [rnd(9, 2, 8, 4, 8), rnd(10, 2, 8, 4, 8), rnd(11, 2, 8, 4, 8)]
    save("attention_heads_4", attention, qkv, [P(None, None, "x")] * 3, None, m4)
    save("attention_batch_2x2", attention, qkv, [P("data", None, "model")] * 3, None, m22)
    qkv = [rnd(50, 2, 16, 4, 8), rnd(51, 2, 16, 4, 8), rnd(52, 2, 16, 4, 8)]
    save("attention_sequence_8", attention, qkv, [P(None, "x")] * 3, None, m8)

    def conv(x, w):
        return jax.lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    save(
        "conv_2x2",
        conv,
        [rnd(12, 4, 6, 6, 4), rnd(13, 3, 3, 4, 8)],
        [P("data", None, None, "model"), P(None, None, "model", None)],
        [P("data", None, None, None)],
        m22,
    )
    save(
        "conv_batch_4",
        conv,
        [rnd(12, 4, 6, 6, 4), rnd(13, 3, 3, 4, 8)],
        [P("x"), P()],
        None,
        m4,
    )

    def cnn_loss(w1, w2, x):
        h = jax.nn.relu(conv(x, w1))
        h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        return jnp.mean((h.reshape(h.shape[0], -1) @ w2) ** 2)

    def cnn_step(w1, w2, x):
        loss, g = jax.value_and_grad(cnn_loss, argnums=(0, 1))(w1, w2, x)
        return loss, w1 - 0.1 * g[0], w2 - 0.1 * g[1]

    args = [rnd(53, 3, 3, 4, 8, scale=0.2), rnd(54, 128, 4, scale=0.1), rnd(55, 4, 8, 8, 4)]
    specs = [P(None, None, None, "model"), P(None, "model"), P("data", "model")]
    save("cnn_step_2x2", cnn_step, args, specs, None, m22)

    def spatial_cnn(w1, w2, x):
        dn = ("NHWC", "HWIO", "NHWC")
        h = jax.nn.relu(jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn))
        h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
        return jax.lax.conv_general_dilated(h, w2, (2, 2), "SAME", dimension_numbers=dn)

    args = [rnd(56, 3, 3, 3, 8, scale=0.3), rnd(57, 3, 3, 8, 4, scale=0.3), rnd(58, 2, 16, 16, 3)]
    save("spatial_conv_4", spatial_cnn, args, [P(), P(), P(None, "x")], None, m4)

    def patchify(x, w):
        return jax.lax.conv_general_dilated(
            x, w, (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    args = [rnd(48, 2, 8, 8, 3), rnd(49, 2, 2, 3, 8)]
    save("patch_conv_4", patchify, args, [P(None, "x"), P()], None, m4)

    def embed(table, ids, w):
        return jnp.tanh(jnp.take(table, ids, axis=0) @ w)

    ids = np.random.default_rng(14).integers(0, 32, size=(8, 4)).astype(np.int32)
    save(
        "embedding_8",
        embed,
        [rnd(15, 32, 16), ids, rnd(16, 16, 8)],
        [P(None, "x"), P(), P("x", None)],
        None,
        m8,
    )

    def embed_grad(table, ids):
        return jax.grad(lambda t: jnp.sum(jnp.take(t, ids, axis=0) ** 2))(table)

    save("embedding_grad_4", embed_grad, [rnd(17, 32, 16), ids], [P(None, "x"), P("x")], None, m4)

    def psum_sin(a):
        return jax.lax.psum(jnp.sin(a), "x")

    smap = jax.shard_map(psum_sin, mesh=m4, in_specs=P("x"), out_specs=P())
    save("shard_map_psum_4", smap, [rnd(18, 8, 3)], [P("x")], None, m4, sdy=True)

    def ring(a):
        return jax.lax.ppermute(a * 2, "x", [(i, (i + 1) % 8) for i in range(8)]) + 1

    smap = jax.shard_map(ring, mesh=m8, in_specs=P("x"), out_specs=P("x"))
    save("shard_map_ring_8", smap, [rnd(19, 16, 4)], [P("x")], None, m8)

    def constrained(x):
        y = jax.lax.with_sharding_constraint(x * 2, NamedSharding(m4, P(None, "x")))
        return jnp.sin(y) + 1

    save("constraint_4", constrained, [rnd(30, 8, 8)], [P("x")], None, m4, sdy=True)

    def psum_pmax(a):
        return jax.lax.psum(a * 2, "model") + jax.lax.pmax(a, "data")

    smap = jax.shard_map(
        psum_pmax, mesh=m22, in_specs=P("data", "model"), out_specs=P("data", "model")
    )
    save("shard_map_2x2", smap, [rnd(31, 8, 8)], [P("data", "model")], None, m22, sdy=True)

    def scan(w, x):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=3)[0]

    save("scan_4", scan, [rnd(32, 8, 8, scale=0.3), rnd(33, 8, 8)], [P(), P("x")], None, m4)

    def psum_data(a, w):
        return jax.lax.psum(a @ w, "data")

    smap = jax.shard_map(
        psum_data,
        mesh=m22,
        in_specs=(P("data", None), P()),
        out_specs=P(),
        axis_names={"data"},  # manual over "data" only; "model" stays automatic
    )
    args = [rnd(46, 8, 8), rnd(47, 8, 8)]
    save("shard_map_partial_2x2", smap, args, [P("data"), P(None, "model")], None, m22, sdy=True)

    def grow(x):
        return jax.lax.while_loop(lambda c: jnp.sum(c) < 500.0, lambda c: c * 1.5 + 1.0, x)

    save("while_sum_2x2", grow, [np.abs(rnd(43, 8, 8))], [P("data", "model")], None, m22)

    def branch(x, w):
        return jax.lax.cond(jnp.sum(x) > 0, lambda a: jnp.sin(a) @ w, lambda a: a @ w * 2, x)

    args = [rnd(44, 8, 8), rnd(45, 8, 4)]
    save("cond_4", branch, args, [P("x"), P()], None, m4)

    def argmax(x):
        return jnp.argmax(x, axis=1), jnp.max(x, axis=0)

    save("argmax_2x2", argmax, [rnd(34, 8, 8)], [P("data", "model")], None, m22)

    def sort_topk(x):
        return jnp.sort(x, axis=1), jax.lax.top_k(x, 3)[0]

    save("sort_topk_4", sort_topk, [rnd(35, 8, 8)], [P("x")], None, m4)

    def cumsum(x):
        return jnp.cumsum(x, axis=1) + jnp.cumsum(x, axis=0)

    save("cumsum_2x2", cumsum, [rnd(36, 8, 8)], [P("data", "model")], None, m22)

    def xent(logits, labels):
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    labels = np.random.default_rng(37).integers(0, 16, size=(8,)).astype(np.int32)
    save(
        "cross_entropy_grad_2x2",
        jax.value_and_grad(xent),
        [rnd(38, 8, 16), labels],
        [P("data", "model"), P("data")],
        None,
        m22,
    )

    def dyn(x, i):
        return jax.lax.dynamic_slice_in_dim(x, i, 2, axis=1) * 3

    save("dynamic_slice_4", dyn, [rnd(39, 8, 8), np.int32(3)], [P("x"), P()], None, m4)
    reversed_mesh = jax.make_mesh(
        (2, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=jax.devices()[:4][::-1]
    )
    save(
        "reversed_mesh_2x2",
        lambda a, b: a @ b,
        [rnd(40, 8, 8), rnd(41, 8, 8)],
        [P("data", "model"), P("model", None)],
        [P("data", None)],
        reversed_mesh,
        sdy=True,
    )

    def max_pool(x):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    save("max_pool_4", max_pool, [rnd(42, 4, 8, 8, 4)], [P(None, "x")], None, m4)

    d, f = 16, 32
    block = [rnd(20 + i, d, d, scale=0.2) for i in range(4)]
    block += [rnd(24, d, f, scale=0.2), rnd(25, f, d, scale=0.2), rnd(26, d) + 1.0]
    block += [rnd(27, 4, 8, d)]
    specs = [P(None, "model")] * 3 + [P("model", None), P(None, "model"), P("model", None)]
    specs += [P(), P("data")]
    save("transformer_step_2x4", block_step, block, specs, None, m24)
    save("transformer_sequence_8", block_step, block, [P()] * 7 + [P(None, "x")], None, m8)
    return 0


if __name__ == "__main__":
    sys.exit(main())
