"""Sharded JAX programs run through xlapy's PJRT plugin against XLA:CPU, in one process.

Run as a script (it must set up the devices before JAX starts, so the tests run it in a
subprocess): `python tests/spmd/jax_sharded.py [case ...]` prints one JSON line per case:
{"case", "ok", "error", "max_err", "xla_out_shardings" / "xlapy_out_shardings"}. Each
case is a function jitted with NamedShardings (or a shard_map) on a mesh of 8 CPU devices
and on the same mesh of 8 xlapy devices; the results must match XLA:CPU's partitioned run
and the same program unsharded, and come back with the same shardings.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["XLAPY_DEVICE_COUNT"] = "8"
os.environ.setdefault("JAX_PLATFORMS", "cpu,xlapy")

import xlapy.pjrt

xlapy.pjrt.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def rnd(seed, *shape, scale=1.0):
    return (np.random.default_rng(seed).normal(size=shape) * scale).astype(np.float32)


def mesh(platform, shape, names, order=None):
    devices = np.array(jax.devices(platform)[: int(np.prod(shape))])
    if order is not None:  # a mesh over the devices in another order
        devices = devices[list(order)]
    return Mesh(devices.reshape(shape), names, axis_types=(AxisType.Auto,) * len(shape))


# -- programs -------------------------------------------------------------------------------
def mlp_loss(params, x, y):
    w1, b1, w2 = params
    h = jax.nn.relu(x @ w1 + b1)
    return jnp.mean((h @ w2 - y) ** 2)


def mlp_step(w1, b1, w2, x, y):
    loss, g = jax.value_and_grad(mlp_loss)((w1, b1, w2), x, y)
    return loss, w1 - 0.1 * g[0], b1 - 0.1 * g[1], w2 - 0.1 * g[2]


def mlp_args():
    return [
        rnd(1, 16, 32, scale=0.3),
        rnd(2, 32),
        rnd(3, 32, 8, scale=0.3),
        rnd(4, 16, 16),
        rnd(5, 16, 8),
    ]


def layer_norm(x, g, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + 1e-5) * g + b


def block(params, x):
    wq, wk, wv, wo, w1, w2, g, b = params
    h = layer_norm(x, g, b)
    q, k, v = h @ wq, h @ wk, h @ wv
    bsz, t, d = q.shape
    heads = 4
    q = q.reshape(bsz, t, heads, d // heads)
    k = k.reshape(bsz, t, heads, d // heads)
    v = v.reshape(bsz, t, heads, d // heads)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // heads)
    a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v).reshape(bsz, t, d)
    x = x + a @ wo
    return x + jax.nn.gelu(layer_norm(x, g, b) @ w1) @ w2


def block_loss(params, x):
    return jnp.mean(block(params, x) ** 2)


def block_step(params, x):
    loss, g = jax.value_and_grad(block_loss)(params, x)
    return loss, jax.tree_util.tree_map(lambda p, q: p - 0.05 * q, params, g)


def block_args():
    d, f = 16, 32
    params = [rnd(10 + i, d, d, scale=0.25) for i in range(4)]
    params += [rnd(14, d, f, scale=0.25), rnd(15, f, d, scale=0.25)]
    params += [1 + rnd(16, d, scale=0.1), rnd(17, d, scale=0.1)]
    return params, rnd(18, 4, 8, d)


def conv_net(w1, w2, x):
    dn = ("NHWC", "HWIO", "NHWC")
    h = jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn)
    h = jax.nn.relu(h)
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    h = jax.lax.conv_general_dilated(h, w2, (1, 1), "SAME", dimension_numbers=dn)
    return h


def conv_loss(w1, w2, x):
    return jnp.mean(conv_net(w1, w2, x) ** 2)


# -- the cases: (function, global args, in specs, out specs or None, mesh shape, names) ---
@case
def mlp_dp_2():
    return mlp_step, mlp_args(), [P(), P(), P(), P("x"), P("x")], None, (2,), ("x",)


@case
def mlp_dp_8():
    return mlp_step, mlp_args(), [P(), P(), P(), P("x"), P("x")], None, (8,), ("x",)


@case
def mlp_tp_4():
    specs = [P(None, "x"), P("x"), P("x", None), P(), P()]
    return mlp_step, mlp_args(), specs, None, (4,), ("x",)


@case
def mlp_2d_2x4():
    specs = [P(None, "model"), P("model"), P("model", None), P("data"), P("data")]
    return mlp_step, mlp_args(), specs, None, (2, 4), ("data", "model")


@case
def transformer_2x2():
    params, x = block_args()
    pspecs = [P(None, "model")] * 3 + [P("model", None), P(None, "model"), P("model", None)]
    pspecs += [P(), P()]

    def step(*flat):
        return block_step(list(flat[:-1]), flat[-1])

    return step, [*params, x], [*pspecs, P("data")], None, (2, 2), ("data", "model")


@case
def transformer_seq_8():
    params, x = block_args()

    def fwd(*flat):
        return block(list(flat[:-1]), flat[-1])

    return fwd, [*params, x], [P()] * 8 + [P(None, "x")], None, (8,), ("x",)


@case
def conv_batch_4():
    args = [rnd(20, 3, 3, 3, 8, scale=0.3), rnd(21, 3, 3, 8, 4, scale=0.3), rnd(22, 8, 8, 8, 3)]

    def step(w1, w2, x):
        loss, g = jax.value_and_grad(conv_loss, argnums=(0, 1))(w1, w2, x)
        return loss, w1 - 0.1 * g[0], w2 - 0.1 * g[1]

    return step, args, [P(), P(), P("x")], None, (4,), ("x",)


@case
def conv_2x2():
    args = [rnd(20, 3, 3, 3, 8, scale=0.3), rnd(21, 3, 3, 8, 4, scale=0.3), rnd(22, 8, 8, 8, 3)]
    specs = [P(None, None, None, "model"), P(None, None, "model"), P("data")]
    return conv_net, args, specs, None, (2, 2), ("data", "model")


@case
def conv_spatial_4():
    """Convolutions and a max pool over rows cut 4 ways (halo exchanges), with gradients."""
    args = [rnd(23, 3, 3, 3, 8, scale=0.3), rnd(24, 3, 3, 8, 4, scale=0.3), rnd(25, 2, 16, 8, 3)]

    def step(w1, w2, x):
        def loss(w1, w2):
            dn = ("NHWC", "HWIO", "NHWC")
            h = jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn)
            h = jax.lax.reduce_window(
                jax.nn.relu(h), -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"
            )
            h = jax.lax.conv_general_dilated(h, w2, (2, 2), "SAME", dimension_numbers=dn)
            return jnp.mean(h**2)

        return jax.value_and_grad(loss, argnums=(0, 1))(w1, w2)

    return step, args, [P(), P(), P(None, "x")], None, (4,), ("x",)


@case
def embedding_4():
    def embed(table, ids, w):
        return jnp.tanh(table[ids] @ w).sum(1)

    ids = np.random.default_rng(30).integers(0, 32, (8, 6)).astype(np.int32)
    args = [rnd(31, 32, 16), ids, rnd(32, 16, 8)]
    return embed, args, [P(None, "x"), P("x"), P()], None, (4,), ("x",)


@case
def vocab_embedding_xent_4():
    """An embedding table cut by vocabulary and a cross-entropy over cut classes (masked
    gathers completed by an all-reduce), with its gradient."""

    def loss(table, ids, labels):
        h = table[ids].mean(1)
        logp = jax.nn.log_softmax(h @ table.T)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    ids = np.random.default_rng(33).integers(0, 32, (8, 5)).astype(np.int32)
    labels = np.random.default_rng(34).integers(0, 32, (8,)).astype(np.int32)
    args = [rnd(35, 32, 16), ids, labels]
    return jax.value_and_grad(loss), args, [P("x"), P(), P()], None, (4,), ("x",)


@case
def out_shardings_2x4():
    def f(x, w):
        y = x @ w
        return jnp.sin(y), y.sum(0)

    args = [rnd(40, 16, 8), rnd(41, 8, 8)]
    return f, args, [P("a"), P()], [P("b", "a"), P("b")], (2, 4), ("a", "b")


@case
def permuted_mesh_2x4():
    """A mesh over the devices in another order than their ids, explicit out shardings."""

    def f(x, w):
        return jnp.tanh(x @ w), (x * 2).sum(1)

    args = [rnd(42, 16, 8), rnd(43, 8, 8)]
    order = (7, 2, 5, 0, 3, 6, 1, 4)
    return f, args, [P("a", "b"), P("b")], [P("b", "a"), P("a")], (2, 4), ("a", "b"), order


def smap(body, m, in_specs, out_specs, axis_names=None):
    kwargs = {} if axis_names is None else {"axis_names": axis_names}
    return jax.shard_map(body, mesh=m, in_specs=in_specs, out_specs=out_specs, **kwargs)


@case
def shard_map_psum_4():
    def make(m):
        def body(x, w):
            return jax.lax.psum(x @ w, "x")

        return smap(body, m, (P(None, "x"), P("x", None)), P())

    return make, [rnd(50, 8, 16), rnd(51, 16, 4)], [P(None, "x"), P("x")], "smap", (4,), ("x",)


@case
def shard_map_collectives_2x2():
    def make(m):
        def body(a, w):
            s = jax.lax.psum(a @ w, "y")
            g = jax.lax.all_gather(s, "x", tiled=True)
            p = jax.lax.ppermute(s, "x", [(0, 1), (1, 0)])
            return g.sum(0, keepdims=True) + p[:1]

        return smap(body, m, (P("x", "y"), P("y", None)), P("x", None))

    args = [rnd(52, 8, 16), rnd(53, 16, 4)]
    return make, args, [P("x", "y"), P("y")], "smap", (2, 2), ("x", "y")


@case
def shard_map_ring_8():
    def make(m):
        def body(x):
            perm = [(i, (i + 1) % 8) for i in range(8)]
            acc = x
            for _ in range(3):
                x = jax.lax.ppermute(x, "x", perm)
                acc = acc + jnp.sin(x)
            return acc

        return smap(body, m, P("x"), P("x"))

    return make, [rnd(54, 16, 4)], [P("x")], "smap", (8,), ("x",)


@case
def shard_map_partial_2x2():
    def make(m):
        def body(a, w):
            return jax.lax.psum(a @ w, "x")

        return smap(body, m, (P("x"), P()), P(), axis_names={"x"})

    return (
        make,
        [rnd(55, 8, 8), rnd(56, 8, 8)],
        [P("x"), P(None, "y")],
        "smap",
        (2, 2),
        (
            "x",
            "y",
        ),
    )


# -- running --------------------------------------------------------------------------------
def run_on(platform, name):
    fn, args, in_specs, out_specs, shape, names, *order = CASES[name]()
    m = mesh(platform, shape, names, order[0] if order else None)
    if out_specs == "smap":
        fn, out_specs = fn(m), None
    shard = [NamedSharding(m, s) for s in in_specs]
    outs = None
    if out_specs is not None:
        outs = tuple(NamedSharding(m, s) for s in out_specs)
    jitted = jax.jit(fn, in_shardings=tuple(shard), out_shardings=outs)
    placed = [jax.device_put(a, s) for a, s in zip(args, shard, strict=True)]
    result = jax.tree_util.tree_leaves(jitted(*placed))
    shardings = [str(getattr(r.sharding, "spec", r.sharding)) for r in result]
    return [np.asarray(r) for r in result], shardings, args, fn


def check(name):
    report = {"case": name, "ok": False}
    try:
        want, want_s, args, fn = run_on("cpu", name)
        got, got_s, _, _ = run_on("xlapy", name)
        report["xla_out_shardings"], report["xlapy_out_shardings"] = want_s, got_s
        if len(got) != len(want):
            raise AssertionError(f"{len(got)} results, XLA gives {len(want)}")
        err = 0.0
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if g.shape != w.shape or g.dtype != w.dtype:
                raise AssertionError(f"result {i}: {g.dtype}{g.shape}, XLA {w.dtype}{w.shape}")
            np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5, err_msg=f"result {i}")
            err = max(err, float(np.max(np.abs(g - w), initial=0.0)))
        whole = jax.jit(fn)(*args) if CASES[name]()[3] != "smap" else None
        for i, (g, w) in enumerate(zip(got, jax.tree_util.tree_leaves(whole), strict=False)):
            np.testing.assert_allclose(
                g, np.asarray(w), rtol=2e-4, atol=2e-5, err_msg=f"result {i} vs unsharded"
            )
        if isinstance(CASES[name]()[3], list) and got_s != want_s:  # shardings asked for
            raise AssertionError(f"result shardings {got_s}, XLA's {want_s}")
        report["max_err"] = err
        report["ok"] = True
    except Exception as e:
        report["error"] = f"{type(e).__name__}: {e}"[:3000]
        report["trace"] = traceback.format_exc()[-3000:]
    return report


if __name__ == "__main__":
    for name in sys.argv[1:] or list(CASES):
        print(json.dumps(check(name)), flush=True)
