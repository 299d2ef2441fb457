"""StableHLO import time against XLA:CPU's compile time, on a 12-layer transformer training
step (forward, backward and an SGD update, donated parameters) lowered by JAX.

Prints the size of the StableHLO text, the time xlapy takes to import it (MLIR text ->
HloModule, verified), the time to parse JAX's HLO text of the same program for comparison,
and the time XLA:CPU takes to compile the lowered program (`lowered.compile()`, no cache),
each the median of a few runs. Run: `.venv/bin/python benchmarks/stablehlo_import.py`.
"""

from __future__ import annotations

import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from xlapy.ir.parser import parse_module
from xlapy.stablehlo import import_text

LAYERS, D, HEADS, FF, SEQ, BATCH, VOCAB = 12, 256, 4, 1024, 64, 4, 1000


def init(rng: np.random.Generator):
    def w(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    layers = [
        {
            "qkv": w(D, 3 * D),
            "out": w(D, D),
            "ff1": w(D, FF),
            "ff2": w(FF, D),
            "ln1": np.ones(D, np.float32),
            "ln2": np.ones(D, np.float32),
        }
        for _ in range(LAYERS)
    ]
    return {"embed": w(VOCAB, D), "layers": layers, "head": w(D, VOCAB)}


def layer_norm(x, g):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * g


def block(x, p):
    h = layer_norm(x, p["ln1"])
    q, k, v = jnp.split(h @ p["qkv"], 3, axis=-1)

    def heads(t):
        return t.reshape(BATCH, SEQ, HEADS, D // HEADS).transpose(0, 2, 1, 3)

    q, k, v = heads(q), heads(k), heads(v)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D // HEADS)
    mask = jnp.tril(jnp.ones((SEQ, SEQ), bool))
    scores = jnp.where(mask, scores, -1e9)
    att = jax.nn.softmax(scores, axis=-1) @ v
    x = x + att.transpose(0, 2, 1, 3).reshape(BATCH, SEQ, D) @ p["out"]
    h = layer_norm(x, p["ln2"])
    return x + jax.nn.gelu(h @ p["ff1"]) @ p["ff2"]


def loss(params, tokens, targets):
    x = params["embed"][tokens]
    for p in params["layers"]:
        x = block(x, p)
    logits = x @ params["head"]
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def make_train_step(learning_rate: float):
    def train_step(params, tokens, targets):
        value, grads = jax.value_and_grad(loss)(params, tokens, targets)
        new = jax.tree_util.tree_map(lambda p, g: p - learning_rate * g, params, grads)
        return new, value

    return train_step


def median_time(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    rng = np.random.default_rng(0)
    params = init(rng)
    tokens = rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32)
    # a different learning rate per program, so that no compile hits JAX's compile cache
    lowered = [
        jax.jit(make_train_step(1e-3 * (1 + i)), donate_argnums=0).lower(params, tokens, tokens)
        for i in range(3)
    ]
    text = lowered[0].as_text(debug_info=True)
    hlo = lowered[0].as_text(dialect="hlo")
    module = import_text(text)
    count = sum(len(c.instructions) for c in module.computations)
    imported = median_time(lambda: import_text(text), 3)
    parsed = median_time(lambda: parse_module(hlo), 3)
    compiles = iter(lowered)
    compiled = median_time(lambda: next(compiles).compile(), 3)
    load = os.getloadavg()[0]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load {load:.2f}; "
        f"jax {jax.__version__}; {time.strftime('%Y-%m-%d %H:%M')}"
    )
    print(
        f"12-layer transformer train step: StableHLO text {len(text) / 1e6:.2f} MB "
        f"({text.count(chr(10))} lines), {count} HLO instructions after import"
    )
    print(f"xlapy StableHLO import:  {imported:.3f} s")
    print(f"xlapy HLO text parse:    {parsed:.3f} s (JAX's HLO text of the same program)")
    print(f"XLA:CPU compile:         {compiled:.3f} s")
    print(f"import / XLA compile:    {imported / compiled:.3f}")


if __name__ == "__main__":
    main()
