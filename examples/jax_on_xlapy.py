"""`make demo`: plain JAX training a small model on the `xlapy` platform.

The model, its loss and an Adam optimizer (written in jax.numpy the way optax writes it:
`init` and `update` over pytrees) are ordinary JAX. `jax.jit(train_step, donate_argnums=(0,
1))` compiles the step for whatever device its arguments live on: through xlapy's PJRT
plugin for a device of the `xlapy` platform, through XLA for `cpu`. The parameters and the
optimizer state are donated, so each step updates them in place.

The script trains on xlapy (printing the loss as it falls), runs the same steps from the
same start on XLA:CPU in the same process (the losses must agree), times a step on both,
and prints the step's memory: `compiled.memory_analysis()` on both platforms (through the
plugin, these are xlapy's figures) and xlapy's own report of the same program (the
buffers live at the peak and the instructions that made them).

    python examples/jax_on_xlapy.py [--steps 200] [--timing-steps 50]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time

import numpy as np

import xlapy.pjrt

# With xlapy installed (pip install -e ".[jax]"), JAX finds the plugin by itself through
# its `jax_plugins` entry point; from a source checkout this registers it. Either way the
# call must come before JAX starts its backends.
xlapy.pjrt.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

# -- the model: an MLP classifier -------------------------------------------------------------
SIZES = (64, 256, 256, 10)
BATCH = 256


def init_params(key, sizes=SIZES):
    params = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        key, sub = jax.random.split(key)
        w = jax.random.normal(sub, (fan_in, fan_out)) * jnp.sqrt(2.0 / fan_in)
        params.append({"w": w, "b": jnp.zeros(fan_out)})
    return params


def predict(params, x):
    for layer in params[:-1]:
        x = jax.nn.gelu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, x, labels):
    logits = predict(params, x)
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


# -- an optax-style optimizer: Adam over pytrees ---------------------------------------------
def adam(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    def init(params):
        def zeros():  # one tree each: donated buffers must be distinct
            return jax.tree_util.tree_map(jnp.zeros_like, params)

        return {"count": jnp.zeros((), jnp.int32), "mu": zeros(), "nu": zeros()}

    def update(grads, state, params):
        count = state["count"] + 1
        mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, state["mu"], grads)
        nu = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, state["nu"], grads)
        t = count.astype(jnp.float32)
        scale = learning_rate * jnp.sqrt(1 - b2**t) / (1 - b1**t)
        new_params = jax.tree_util.tree_map(
            lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), params, mu, nu
        )
        return new_params, {"count": count, "mu": mu, "nu": nu}

    return init, update


OPT_INIT, OPT_UPDATE = adam()


def train_step(params, opt_state, x, labels):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
    params, opt_state = OPT_UPDATE(grads, opt_state, params)
    return params, opt_state, loss


STEP = jax.jit(train_step, donate_argnums=(0, 1))


# -- data: labels from a fixed random "teacher" network ---------------------------------------
def make_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    teacher = rng.standard_normal((SIZES[0], SIZES[-1])).astype(np.float32)
    labels = np.argmax(np.tanh(x @ teacher) + 0.5 * rng.standard_normal((BATCH, SIZES[-1])), 1)
    return x, labels.astype(np.int32)


def start(device):
    """Initial parameters, optimizer state and data, placed on `device`."""
    params = init_params(jax.random.key(0))
    x, labels = make_data()
    return jax.device_put((params, OPT_INIT(params), x, labels), device)


def train(device, steps: int, report_every: int = 0) -> list[float]:
    params, opt_state, x, labels = start(device)
    losses = []
    for i in range(steps):
        params, opt_state, loss = STEP(params, opt_state, x, labels)
        losses.append(float(loss))
        if report_every and (i % report_every == 0 or i == steps - 1):
            print(f"  step {i:4d}  loss {losses[-1]:.4f}")
    return losses


def step_times(device, steps: int) -> list[float]:
    params, opt_state, x, labels = start(device)
    params, opt_state, loss = STEP(params, opt_state, x, labels)  # compiled, first run done
    loss.block_until_ready()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        params, opt_state, loss = STEP(params, opt_state, x, labels)
        loss.block_until_ready()
        times.append(time.perf_counter() - t0)
    return times


def compiled_step(device):
    return STEP.lower(*start(device)).compile()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    parser.add_argument("--timing-steps", type=int, default=50, help="steps timed per platform")
    args = parser.parse_args(argv)

    xlapy_dev, cpu_dev = jax.devices("xlapy")[0], jax.devices("cpu")[0]
    print(f"JAX {jax.__version__}; devices: {xlapy_dev} (xlapy's PJRT plugin), {cpu_dev} (XLA)")
    sizes = " -> ".join(map(str, SIZES))
    print(f"\nTraining an MLP ({sizes}, batch {BATCH}, Adam, params and state donated) on xlapy:")
    losses = train(xlapy_dev, args.steps, report_every=max(1, args.steps // 10))
    reference = train(cpu_dev, args.steps)
    gap = max(abs(a - b) for a, b in zip(losses, reference))
    print(f"  same steps on XLA:CPU: final loss {reference[-1]:.4f} (largest difference {gap:.1e})")
    if not losses[-1] < 0.5 * losses[0]:
        print(f"error: the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})")
        return 1
    if gap > 1e-2 * max(1.0, abs(reference[0])):
        print("error: xlapy and XLA:CPU disagree on the losses")
        return 1

    print(f"\nStep time (median / best of {args.timing_steps} steps, same process):")
    medians = {}
    for name, device in (("XLA:CPU", cpu_dev), ("xlapy", xlapy_dev)):
        times = step_times(device, args.timing_steps)
        medians[name] = statistics.median(times)
        print(f"  {name:8s} {medians[name] * 1e3:8.3f} ms / {min(times) * 1e3:8.3f} ms")
    print(f"  xlapy / XLA:CPU: {medians['xlapy'] / medians['XLA:CPU']:.2f}x")

    print("\nMemory of one step, compiled.memory_analysis() (bytes):")
    stats = {"XLA:CPU": compiled_step(cpu_dev), "xlapy": compiled_step(xlapy_dev)}
    analyses = {name: c.memory_analysis() for name, c in stats.items()}
    print(f"  {'':10s}{'XLA:CPU':>12s}{'xlapy':>12s}")
    for field in ("argument", "output", "alias", "temp"):
        row = [getattr(analyses[n], f"{field}_size_in_bytes") for n in ("XLA:CPU", "xlapy")]
        print(f"  {field:10s}{row[0]:>12d}{row[1]:>12d}")
    print("  (alias: the donated parameters and optimizer state, counted once)")
    print("\nxlapy's memory report of the same step (xlapy.pjrt.memory_report(compiled)):")
    print(xlapy.pjrt.memory_report(stats["xlapy"], top=8))
    return 0


if __name__ == "__main__":
    sys.exit(main())
