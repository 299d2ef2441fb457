"""JAX through xlapy's PJRT plugin next to JAX on XLA:CPU, in one process: dispatch of a
trivial jitted function, and the step time of a small MLP training step.

    python benchmarks/pjrt_jax.py [-n CALLS] [--profile]

Dispatch is timed in batches (CALLS in all); min and median per call over the batches,
in wall time and in process CPU time (the steadier figure on a shared machine). The
xlapy runtime's own execute of the same program on the same buffer is timed alongside:
the rest is the PJRT C API on both sides (JAX's C++ wrapper and xlapy's plugin).
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
    parser.add_argument("-n", type=int, default=4000)
    args = parser.parse_args()
    trivial = jax.jit(lambda a: a + 1.0)
    results, steps = {}, {}
    for name in ("cpu", "xlapy"):
        device = jax.devices(name)[0]
        x = jax.device_put(np.ones(8, np.float32), device)
        results[name] = per_call(trivial, x, n=args.n)
        steps[name] = time_steps(device, 20)
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
    print(
        f"MLP step (128x256->512->10): XLA:CPU {steps['cpu'] * 1e3:7.2f} ms   "
        f"xlapy {steps['xlapy'] * 1e3:7.2f} ms   ratio {steps['xlapy'] / steps['cpu']:.2f}x"
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
