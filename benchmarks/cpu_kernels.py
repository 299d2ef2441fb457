"""xlapy CPU kernels against the same computations jitted by JAX on the same inputs.

Prints, per kernel, the median time of xlapy and of JAX, their ratio, and for elementwise
kernels the bytes moved per second as a fraction of this machine's copy bandwidth (measured
with a large np.copyto). Run: `.venv/bin/python benchmarks/cpu_kernels.py`.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from xlapy.backends.cpu import compile_computation
from xlapy.ir.parser import parse_module

N, M = 1024, 4096
ADD = "add { a = f32[] parameter(0) b = f32[] parameter(1) ROOT c = f32[] add(a, b) }"

CASES = {
    # name: (HLO body, JAX function, number of inputs, elementwise?)
    "add": ("ROOT r = f32[{n},{m}] add(p0, p1)", lambda x, y: x + y, 2, True),
    "exp": ("ROOT r = f32[{n},{m}] exponential(p0)", jnp.exp, 1, True),
    "tanh": ("ROOT r = f32[{n},{m}] tanh(p0)", jnp.tanh, 1, True),
    "to_bf16": (
        "ROOT r = bf16[{n},{m}] convert(p0)",
        lambda x: x.astype(jnp.bfloat16),
        1,
        True,
    ),
    "gelu_chain": (
        "h = f32[] constant(0.5)\n hb = f32[{n},{m}] broadcast(h), dimensions={{}}\n"
        " t = f32[{n},{m}] tanh(p0)\n u = f32[{n},{m}] multiply(p0, t)\n"
        " ROOT r = f32[{n},{m}] multiply(u, hb)",
        lambda x: 0.5 * x * jnp.tanh(x),
        1,
        True,
    ),
    "row_sum": (
        "z = f32[] constant(0)\n ROOT r = f32[{n}] reduce(p0, z), dimensions={{1}}, to_apply=add",
        lambda x: jnp.sum(x, axis=1),
        1,
        False,
    ),
    "col_sum": (
        "z = f32[] constant(0)\n ROOT r = f32[{m}] reduce(p0, z), dimensions={{0}}, to_apply=add",
        lambda x: jnp.sum(x, axis=0),
        1,
        False,
    ),
}


def median_time(fn, repeats: int = 15) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _run_jax(fn, args):
    fn(*args).block_until_ready()


def copy_bandwidth() -> float:
    """Bytes per second (read + write) of a large np.copyto."""
    src = np.ones(64 * 1024 * 1024 // 4, np.float32)
    dst = np.empty_like(src)
    t = median_time(lambda: np.copyto(dst, src), 7)
    return 2 * src.nbytes / t


def main() -> None:
    bw = copy_bandwidth()
    print(f"copy bandwidth: {bw / 1e9:.1f} GB/s")
    print(
        f"{'kernel':12s} {'xlapy ms':>9s} {'jax ms':>8s} {'ratio':>6s} {'GB/s':>6s} {'of copy':>8s}"
    )
    rng = np.random.default_rng(0)
    for name, (body, jfn, arity, elementwise) in CASES.items():
        params = "\n".join(f" p{i} = f32[{N},{M}] parameter({i})" for i in range(arity))
        text = f"HloModule m\n{ADD}\nENTRY e {{\n{params}\n {body.format(n=N, m=M)}\n}}"
        kernel = compile_computation(parse_module(text).entry, name)
        args = [rng.standard_normal((N, M)).astype(np.float32) for _ in range(arity)]
        outputs, inputs = kernel.prepare(args)
        ptrs = kernel.pointers(outputs, inputs)
        t_x = median_time(functools.partial(kernel.run_raw, ptrs))
        jitted = jax.jit(jfn)
        jargs = [jnp.asarray(a) for a in args]
        t_j = median_time(functools.partial(_run_jax, jitted, jargs))
        moved = sum(a.nbytes for a in args) + sum(o.nbytes for o in outputs)
        gbs = moved / t_x / 1e9
        frac = f"{moved / t_x / bw:8.2f}" if elementwise else f"{'':8s}"
        print(f"{name:12s} {1e3 * t_x:9.2f} {1e3 * t_j:8.2f} {t_x / t_j:6.2f} {gbs:6.1f} {frac}")


if __name__ == "__main__":
    main()
