"""JAX programs on the xlapy plugin whose host callbacks use JAX themselves: with
JAX_PLATFORMS=xlapy the callback's JAX code runs on the xlapy device that is running the
program calling back, so it runs nested (xlapy.runtime.device), as it does on XLA:CPU. The
same script runs under JAX_PLATFORMS=cpu and JAX_PLATFORMS=xlapy on the same random
inputs and the results are compared (one subprocess each: the platform list is fixed when
JAX starts)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import json, sys
import numpy as np, jax, jax.numpy as jnp
from jax.experimental import io_callback

rng = np.random.default_rng(int(sys.argv[1]))
x = rng.standard_normal(6).astype(np.float32)
xs = rng.standard_normal((3, 6)).astype(np.float32)
like = jax.ShapeDtypeStruct(x.shape, x.dtype)
helper = jax.jit(lambda v: v * 2 + 1)
seen = set()

def uses_jax(b):
    seen.add(next(iter(jnp.asarray(b).devices())).platform)
    return helper(b) + jnp.sin(b)

res = {}
res["pure_callback"] = jax.jit(lambda a: jax.pure_callback(uses_jax, like, a))(x)
printed = []
show = lambda v: printed.append(float(jnp.sum(v * 2)))
jax.jit(lambda a: (jax.debug.callback(show, a), a + 1)[1])(x).block_until_ready()
jax.effects_barrier()
res["debug_callback"] = np.asarray(printed, np.float32)
io = lambda a: io_callback(lambda b: jnp.cos(b) * helper(b), like, a, ordered=True)
res["io_callback"] = jax.jit(io)(x)
jax.effects_barrier()
inner = jax.jit(lambda a: jax.pure_callback(lambda b: jnp.tanh(b) + helper(b), like, a))
res["nested_twice"] = jax.jit(lambda a: jax.pure_callback(lambda b: inner(b) * 3, like, a) + 1)(x)
row = jax.ShapeDtypeStruct((6,), jnp.float32)
for method in ("sequential", "expand_dims"):
    vm = jax.vmap(lambda a: jax.pure_callback(uses_jax, row, a, vmap_method=method))
    res["vmap_" + method] = jax.jit(vm)(xs)

@jax.custom_vjp
def f(v):
    return jnp.sin(v)

def f_bwd(v, g):
    cos = jax.pure_callback(lambda r: jnp.cos(r), jax.ShapeDtypeStruct(v.shape, v.dtype), v)
    return (g * cos,)

f.defvjp(lambda v: (jnp.sin(v), v), f_bwd)
res["grad_custom_vjp"] = jax.jit(jax.grad(lambda v: (f(v) * v).sum()))(x)
out = {k: np.asarray(v).tolist() for k, v in res.items()}
out["platform"] = jax.devices()[0].platform
out["callbacks ran on"] = sorted(seen)
print("RESULT " + json.dumps(out))
"""


def run(platform: str, seed: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), str(seed)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": platform},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def test_callbacks_using_jax_on_their_own_device_run_as_on_cpu():
    seed = int.from_bytes(os.urandom(4), "little")
    want, got = run("cpu", seed), run("xlapy", seed)
    assert want["platform"] == "cpu" and got["platform"] == "xlapy"
    assert want["callbacks ran on"] == ["cpu"]
    assert got["callbacks ran on"] == ["xlapy"]  # nested on the device running the program
    keys = [k for k in want if k not in ("platform", "callbacks ran on")]
    assert keys and sorted(keys) == sorted(
        k for k in got if k not in ("platform", "callbacks ran on")
    )
    for key in keys:
        np.testing.assert_allclose(
            np.asarray(got[key]), np.asarray(want[key]), rtol=2e-5, atol=2e-6, err_msg=key
        )
