"""`make demo`: train an MLP for 100 steps by running the HLO that JAX exported.

examples/mlp_train_step.hlo is one SGD step of a small MLP, exported from JAX by
examples/export_from_jax.py with its parameters donated (`input_output_alias` in the header).
This script parses and verifies it, makes a synthetic classification task, compiles it once
for the chosen backend (the native CPU backend by default) and runs the step 100 times,
donating the parameters so each step updates them in place, printing the loss every 10
steps. When JAX is installed it also times the same step under jax.jit on the same inputs,
and prints both times per step.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from xlapy.backends import get_backend
from xlapy.errors import XlapyError
from xlapy.ir.parser import parse_module
from xlapy.ir.verifier import verify

HERE = Path(__file__).resolve().parent


def synthetic_task(module, rng: np.random.Generator):
    """Initial parameters and a fixed batch: the non-donated parameters are the data."""
    entry = module.entry
    donated = {a.param_number for a in module.config.input_output_alias}
    params, data = {}, {}
    for p in entry.parameters:
        shape = p.shape
        if p.parameter_number in donated:
            if shape.rank >= 2:
                scale = np.sqrt(2.0 / shape.dims[0])
                params[p.parameter_number] = (rng.standard_normal(shape.dims) * scale).astype(
                    shape.dtype
                )
            else:
                params[p.parameter_number] = np.zeros(shape.dims, shape.dtype)
        else:
            data[p.parameter_number] = shape
    # Data: x is the floating parameter of rank 2, y the labels (ints or one-hot floats).
    x_num = next(n for n, s in data.items() if s.rank == 2 and s.element_type.is_float)
    y_num = next(n for n in data if n != x_num)
    x_shape, y_shape = data[x_num], data[y_num]
    batch, features = x_shape.dims
    classes = y_shape.dims[1] if y_shape.rank == 2 else 10
    teacher = rng.standard_normal((features, classes))
    x = rng.standard_normal((batch, features)).astype(x_shape.dtype)
    labels = np.argmax(x @ teacher, axis=1)
    if y_shape.rank == 2:
        y = np.eye(classes, dtype=y_shape.dtype)[labels]
    else:
        y = labels.astype(y_shape.dtype)
    return params, {x_num: x, y_num: y}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default=str(HERE / "mlp_train_step.hlo"))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--no-jax", action="store_true", help="skip the jax.jit timing")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    try:
        module = parse_module(Path(args.module).read_text(), filename=args.module)
        verify(module)
    except XlapyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    rng = np.random.default_rng(args.seed)
    params, data = synthetic_task(module, rng)
    aliases = module.config.input_output_alias
    n_params = len(module.entry.parameters)
    print(f"{module.name}: {n_params} parameters, {len(params)} donated; backend {args.backend}")
    initial = {i: p.copy() for i, p in params.items()}

    start = time.perf_counter()
    try:
        program = get_backend(args.backend).compile(module)
    except XlapyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"compiled in {time.perf_counter() - start:.2f} s")
    donated = frozenset(params)
    times = []
    for step in range(1, args.steps + 1):
        inputs = [params[i] if i in params else data[i] for i in range(n_params)]
        start = time.perf_counter()
        outputs = program.run(inputs, donated)
        times.append(time.perf_counter() - start)
        loss = float(np.asarray(outputs[0]))
        for alias in aliases:
            value = outputs
            for i in alias.output_index:
                value = value[i]
            params[alias.param_number] = value
        if step % 10 == 0 or step == 1:
            print(f"step {step:4d}  loss {loss:.5f}")
    median_ms = 1e3 * float(np.median(times))
    print(f"time per step (median of {len(times)}): {median_ms:.3f} ms on {args.backend}")
    if not args.no_jax and Path(args.module).resolve() == HERE / "mlp_train_step.hlo":
        jax_ms = time_jax(initial, data, args.steps)
        if jax_ms is not None:
            print(f"time per step (median of {args.steps}): {jax_ms:.3f} ms with jax.jit")
    return 0


def time_jax(initial: dict, data: dict, steps: int) -> float | None:
    """Median milliseconds per step of the same SGD step under jax.jit, on the same initial
    parameters and batch (None when JAX is not installed)."""
    try:
        import jax

        sys.path.insert(0, str(HERE))
        from export_from_jax import step
    except ImportError:
        return None
    params = tuple(jax.numpy.asarray(initial[i]) for i in range(len(initial)))
    x, y = (jax.numpy.asarray(data[i]) for i in sorted(data))
    fn = jax.jit(step, donate_argnums=(0,))
    _, params = fn(params, x, y)  # compile
    jax.block_until_ready(params)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss, params = fn(params, x, y)
        jax.block_until_ready((loss, params))
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


if __name__ == "__main__":
    sys.exit(main())
