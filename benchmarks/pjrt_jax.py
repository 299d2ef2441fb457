"""JAX through xlapy's PJRT plugin next to JAX on XLA:CPU, in one process: dispatch of a
trivial jitted function, and the step time of a small MLP training step.

    python benchmarks/pjrt_jax.py [--profile]

--profile prints where the plugin's dispatch time goes (cProfile of the Python side).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import xlapy.pjrt

xlapy.pjrt.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402


def per_call(fn, *args, n: int) -> tuple[float, float]:
    """Best wall time and best process CPU time per call (the machine may be shared: CPU
    time is the steadier figure)."""
    out = fn(*args)
    out.block_until_ready()
    best = best_cpu = float("inf")
    for _ in range(5):
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            out = fn(*args)
        out.block_until_ready()
        best = min(best, (time.perf_counter() - start) / n)
        best_cpu = min(best_cpu, (time.process_time() - start_cpu) / n)
    return best, best_cpu


def mlp_step():
    def loss(p, x, y):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    def step(p, x, y):
        grads = jax.grad(loss)(p, x, y)
        return jax.tree_util.tree_map(lambda a, g: a - 0.01 * g, p, grads)

    rng = np.random.default_rng(0)
    params = {
        "w1": rng.standard_normal((256, 512)).astype(np.float32) * 0.05,
        "b1": np.zeros(512, np.float32),
        "w2": rng.standard_normal((512, 10)).astype(np.float32) * 0.05,
        "b2": np.zeros(10, np.float32),
    }
    x = rng.standard_normal((128, 256)).astype(np.float32)
    y = rng.standard_normal((128, 10)).astype(np.float32)
    return jax.jit(step, donate_argnums=0), params, x, y


def time_steps(device, n: int) -> float:
    step, params, x, y = mlp_step()
    p, xs, ys = jax.device_put((params, x, y), device)
    p = step(p, xs, ys)
    jax.block_until_ready(p)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            p = step(p, xs, ys)
        jax.block_until_ready(p)
        best = min(best, (time.perf_counter() - start) / n)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("-n", type=int, default=2000)
    args = parser.parse_args()
    trivial = jax.jit(lambda a: a + 1.0)
    results = {}
    for name in ("cpu", "xlapy"):
        device = jax.devices(name)[0]
        x = jax.device_put(np.ones(8, np.float32), device)
        results[name] = (per_call(trivial, x, n=args.n), time_steps(device, 20))
    cpu, xla = results["cpu"], results["xlapy"]
    for i, what in enumerate(("wall", "CPU")):
        c, x = cpu[0][i], xla[0][i]
        print(
            f"dispatch (trivial jit, {what}): cpu {c * 1e6:7.1f} us   xlapy {x * 1e6:7.1f} us"
            f"   ratio {x / c:.1f}x"
        )
    print(
        f"MLP step (128x256->512->10): cpu {cpu[1] * 1e3:7.2f} ms   xlapy {xla[1] * 1e3:7.2f} ms"
        f"   ratio {xla[1] / cpu[1]:.2f}x"
    )
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
