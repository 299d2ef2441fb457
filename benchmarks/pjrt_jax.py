"""JAX through xlapy's PJRT plugin next to JAX on XLA:CPU, in one process: dispatch of a
trivial jitted function, and the step time of model training steps written in plain JAX
(an MLP with SGD, a 2-layer transformer with Adam, a small CNN with momentum; the state
donated each step, as training loops do).

    python benchmarks/pjrt_jax.py [-n CALLS] [--models mlp,transformer,conv]
                                  [--rounds R] [--steps K] [--profile]

Dispatch is timed in batches (CALLS in all); min and median per call over the batches,
in wall time and in process CPU time (the steadier figure on a shared machine). The
xlapy runtime's own execute of the same program on the same buffer is timed alongside:
the rest is the PJRT C API on both sides (JAX's C++ wrapper and xlapy's plugin).
Model steps are timed in blocks of K steps (blocked on at the end of each), alternating
XLA:CPU and xlapy R times each; min and median seconds per step over the blocks.
--profile prints where the plugin's dispatch time goes (cProfile of the Python side).
Run with XLAPY_PJRT_NATIVE=0 to time the plugin without its native fast paths.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import xlapy.pjrt

xlapy.pjrt.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402


def per_call(fn, *args, n: int, batches: int = 20) -> dict[str, tuple[float, float]]:
    """{"wall": (min, median), "cpu": (min, median)} seconds per call over `batches`
    batches of n // batches calls."""
    out = fn(*args)
    if hasattr(out, "block_until_ready"):
        out.block_until_ready()
    size = max(1, n // batches)
    wall, cpu = [], []
    for _ in range(batches):
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(size):
            out = fn(*args)
        if hasattr(out, "block_until_ready"):
            out.block_until_ready()
        wall.append((time.perf_counter() - start) / size)
        cpu.append((time.process_time() - start_cpu) / size)
    return {"wall": (min(wall), statistics.median(wall)), "cpu": (min(cpu), statistics.median(cpu))}


def runtime_buffer(array):
    """The xlapy runtime Buffer behind a JAX array on an xlapy device."""
    from xlapy.pjrt import core
    from xlapy.pjrt.buffers import PBuffer

    pointer = array.unsafe_buffer_pointer()
    for obj in list(core.OBJECTS.values()):
        buffer = obj.buffer if isinstance(obj, PBuffer) else None
        if (
            buffer is not None
            and not buffer.is_deleted
            and (buffer.unsafe_buffer_pointer() == pointer)
        ):
            return buffer
    raise LookupError("no xlapy buffer behind this array")


def adam_update(params, state, grads, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    """One Adam step over pytrees, written the way optax writes it (init / update)."""
    tree_map = jax.tree_util.tree_map
    count = state["count"] + 1
    mu = tree_map(lambda m, g: b1 * m + (1 - b1) * g, state["mu"], grads)
    nu = tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, state["nu"], grads)
    t = count.astype(jnp.float32)
    scale = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
    params = tree_map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), params, mu, nu)
    return params, {"count": count, "mu": mu, "nu": nu}


def adam_state(params):
    zeros = lambda: jax.tree_util.tree_map(np.zeros_like, params)  # noqa: E731
    return {"count": np.zeros((), np.int32), "mu": zeros(), "nu": zeros()}


def mlp_step():
    """(step, state, batch): an MLP regression step, SGD, the parameters donated."""

    def loss(p, x, y):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    def step(p, x, y):
        grads = jax.grad(loss)(p, x, y)
        return jax.tree_util.tree_map(lambda a, g: a - 0.01 * g, p, grads)

    rng = np.random.default_rng(0)
    params = {
        "w1": rng.standard_normal((256, 512)).astype(np.float32) * 0.05,
        "b1": rng.standard_normal(512).astype(np.float32) * 0.01,
        "w2": rng.standard_normal((512, 10)).astype(np.float32) * 0.05,
        "b2": rng.standard_normal(10).astype(np.float32) * 0.01,
    }
    x = rng.standard_normal((128, 256)).astype(np.float32)
    y = rng.standard_normal((128, 10)).astype(np.float32)
    return jax.jit(step, donate_argnums=0), params, (x, y)


def transformer_step(layers=2, d=128, heads=4, seq=64, batch=8, vocab=256):
    """A decoder-only transformer's training step (pre-LN blocks: causal attention, GELU
    MLP; cross-entropy on the next token) with Adam; parameters and optimizer state
    donated, the loss returned beside them."""
    rng = np.random.default_rng(1)

    def w(*shape, scale=0.05):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    params = {
        "emb": w(vocab, d),
        "pos": w(seq, d),
        "blocks": [
            {
                "ln1": 1 + w(d, scale=0.01),
                "qkv": w(d, 3 * d),
                "out": w(d, d),
                "ln2": 1 + w(d, scale=0.01),
                "up": w(d, 4 * d),
                "down": w(4 * d, d),
            }
            for _ in range(layers)
        ],
        "lnf": 1 + w(d, scale=0.01),
    }
    tokens = rng.integers(0, vocab, (batch, seq + 1)).astype(np.int32)

    def norm(x, g):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-5) * g

    def loss(p, tokens):
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        x = p["emb"][inputs] + p["pos"]
        causal = jnp.tril(jnp.ones((seq, seq), bool))
        for blk in p["blocks"]:
            q, k, v = jnp.split(norm(x, blk["ln1"]) @ blk["qkv"], 3, axis=-1)
            q, k, v = (a.reshape(batch, seq, heads, d // heads) for a in (q, k, v))
            scores = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(d // heads)
            attn = jax.nn.softmax(jnp.where(causal, scores, -1e9), -1)
            mixed = jnp.einsum("bhts,bshd->bthd", attn, v).reshape(batch, seq, d)
            x = x + mixed @ blk["out"]
            x = x + jax.nn.gelu(norm(x, blk["ln2"]) @ blk["up"]) @ blk["down"]
        logits = norm(x, p["lnf"]) @ p["emb"].T
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1))

    def step(p, opt, tokens):
        value, grads = jax.value_and_grad(loss)(p, tokens)
        p, opt = adam_update(p, opt, grads)
        return p, opt, value

    return jax.jit(step, donate_argnums=(0, 1)), (params, adam_state(params)), (tokens,)


def conv_step(batch=16, size=32, classes=10):
    """A small CNN classifier's training step (two 3x3 convolutions with ReLU and 2x2
    average pooling, a dense head, softmax cross-entropy) with SGD + momentum; parameters
    and momentum donated, the loss returned beside them."""
    rng = np.random.default_rng(2)

    def w(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    params = {
        "c1": w(3, 3, 3, 16),
        "b1": w(16, scale=0.01),
        "c2": w(3, 3, 16, 32),
        "b2": w(32, scale=0.01),
        "dense": w((size // 4) ** 2 * 32, classes, scale=0.02),
    }
    images = rng.standard_normal((batch, size, size, 3)).astype(np.float32)
    labels = rng.integers(0, classes, batch).astype(np.int32)
    dims = ("NHWC", "HWIO", "NHWC")

    def pool(x):
        return jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4

    def loss(p, images, labels):
        x = jax.lax.conv_general_dilated(images, p["c1"], (1, 1), "SAME", dimension_numbers=dims)
        x = pool(jax.nn.relu(x + p["b1"]))
        x = jax.lax.conv_general_dilated(x, p["c2"], (1, 1), "SAME", dimension_numbers=dims)
        x = pool(jax.nn.relu(x + p["b2"]))
        logp = jax.nn.log_softmax(x.reshape(batch, -1) @ p["dense"])
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], -1))

    def step(p, momentum, images, labels):
        value, grads = jax.value_and_grad(loss)(p, images, labels)
        tree_map = jax.tree_util.tree_map
        momentum = tree_map(lambda m, g: 0.9 * m + g, momentum, grads)
        p = tree_map(lambda a, m: a - 0.01 * m, p, momentum)
        return p, momentum, value

    momentum = jax.tree_util.tree_map(np.zeros_like, params)
    return jax.jit(step, donate_argnums=(0, 1)), (params, momentum), (images, labels)


MODELS = {"mlp": mlp_step, "transformer": transformer_step, "conv": conv_step}
"""Model training steps: name -> () -> (jitted step, donated state, batch). A step takes
(*state, *batch) and returns the new state (then maybe the loss)."""


class Stepper:
    """One model's training loop on one device: `block(k)` runs k steps and returns the
    seconds per step (wall, process CPU)."""

    def __init__(self, make, device):
        self.step, state, batch = make()
        self.state = jax.device_put(state, device)
        self.batch = jax.device_put(batch, device)
        self.n_state = len(state) if isinstance(state, tuple) else 1
        self.block(2)  # compile and warm up

    def block(self, k: int) -> tuple[float, float]:
        start, start_cpu = time.perf_counter(), time.process_time()
        state = self.state
        for _ in range(k):
            if self.n_state == 1:
                state = self.step(state, *self.batch)
            else:
                state = self.step(*state, *self.batch)[: self.n_state]
        jax.block_until_ready(state)
        self.state = state
        return (time.perf_counter() - start) / k, (time.process_time() - start_cpu) / k


def time_models(names, rounds: int, k: int) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """{model: {platform: [(wall, cpu) seconds per step of each block]}}: blocks of k steps
    alternating between XLA:CPU and xlapy, `rounds` blocks each."""
    times: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for name in names:
        steppers = {p: Stepper(MODELS[name], jax.devices(p)[0]) for p in ("cpu", "xlapy")}
        times[name] = {p: [] for p in steppers}
        for r in range(rounds):
            order = ("cpu", "xlapy") if r % 2 == 0 else ("xlapy", "cpu")
            for platform in order:
                times[name][platform].append(steppers[platform].block(k))
    return times


def print_models(times) -> None:
    print("model training steps (donated state), ms per step, min / median of interleaved blocks:")
    for name, by in times.items():
        line = [f"  {name:12s}"]
        for what, i in (("wall", 0), ("cpu", 1)):
            c = [t[i] for t in by["cpu"]]
            x = [t[i] for t in by["xlapy"]]
            line.append(
                f"{what} XLA:CPU {min(c) * 1e3:6.2f} / {statistics.median(c) * 1e3:6.2f}"
                f"  xlapy {min(x) * 1e3:6.2f} / {statistics.median(x) * 1e3:6.2f}"
                f"  ({min(x) / min(c):.2f}x / {statistics.median(x) / statistics.median(c):.2f}x)"
            )
        print("   ".join(line))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("-n", type=int, default=4000)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated; '' for none")
    parser.add_argument("--rounds", type=int, default=10, help="blocks per platform and model")
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    args = parser.parse_args()
    trivial = jax.jit(lambda a: a + 1.0)
    results = {}
    for name in ("cpu", "xlapy"):
        device = jax.devices(name)[0]
        x = jax.device_put(np.ones(8, np.float32), device)
        results[name] = per_call(trivial, x, n=args.n)
    x = jax.device_put(np.ones(8, np.float32), jax.devices("xlapy")[0])
    executable = xlapy.pjrt.executable_of(trivial.lower(x).compile())
    buffers = [runtime_buffer(x)]
    results["runtime"] = per_call(lambda: executable.execute([buffers])[0][0], n=args.n)
    print("dispatch of a trivial jit (f32[8] + 1), us per call, min / median of 20 batches:")
    for what in ("wall", "cpu"):
        c, x_, r = results["cpu"][what], results["xlapy"][what], results["runtime"][what]
        print(
            f"  {what:4s}  XLA:CPU {c[0] * 1e6:6.1f} / {c[1] * 1e6:6.1f}   xlapy {x_[0] * 1e6:6.1f}"
            f" / {x_[1] * 1e6:6.1f}   ratio {x_[0] / c[0]:4.1f}x / {x_[1] / c[1]:4.1f}x   "
            f"(xlapy runtime alone {r[0] * 1e6:5.1f} / {r[1] * 1e6:5.1f})"
        )
    names = [m for m in args.models.split(",") if m]
    if names:
        print_models(time_models(names, args.rounds, args.steps))
    if args.profile:
        import cProfile
        import pstats

        x = jax.device_put(np.ones(8, np.float32), jax.devices("xlapy")[0])
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.n):
            trivial(x)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
