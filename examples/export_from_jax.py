"""Export one SGD step of a small MLP from JAX as HLO text: examples/mlp_train_step.hlo.

The model: 64 inputs -> 128 -> 128 -> 10 classes, ReLU between layers, softmax cross-entropy
loss, plain SGD with learning rate 0.1, batches of 32. The step is lowered with
`jax.jit(step, donate_argnums=(0,))`, so every parameter is donated and the module's header
carries `input_output_alias` entries tying each updated parameter to its input.

Entry parameters, in order (this is the order `make demo` feeds them):

    0  w0  f32[64,128]     donated, aliased with output 1
    1  b0  f32[128]        donated, aliased with output 2
    2  w1  f32[128,128]    donated, aliased with output 3
    3  b1  f32[128]        donated, aliased with output 4
    4  w2  f32[128,10]     donated, aliased with output 5
    5  b2  f32[10]         donated, aliased with output 6
    6  x   f32[32,64]      the batch
    7  y   s32[32]         the labels, 0..9

Outputs (a tuple): 0 the mean loss f32[], then the six updated parameters in the order above.

    python examples/export_from_jax.py [--out PATH] [--check]

`--check` also runs the step in JAX and in xlapy's interpreter on random data and compares.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

HERE = Path(__file__).resolve().parent
SIZES = (64, 128, 128, 10)
BATCH = 32
LEARNING_RATE = 0.1


def loss_fn(params, x, y):
    """Mean softmax cross-entropy of the MLP `params` (w0, b0, w1, b1, w2, b2) on (x, y)."""
    h = x
    layers = len(params) // 2
    for i in range(layers):
        h = h @ params[2 * i] + params[2 * i + 1]
        if i < layers - 1:
            h = jax.nn.relu(h)
    logp = jax.nn.log_softmax(h)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def step(params, x, y):
    """One SGD step: (loss, updated params)."""
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return loss, tuple(p - LEARNING_RATE * g for p, g in zip(params, grads))


def example_arguments(rng: np.random.Generator):
    """Random initial parameters (He initialization, zero biases) and one random batch."""
    params = []
    for fan_in, fan_out in itertools.pairwise(SIZES):
        params.append((rng.standard_normal((fan_in, fan_out)) * np.sqrt(2 / fan_in)).astype("f4"))
        params.append(np.zeros(fan_out, np.float32))
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], BATCH).astype(np.int32)
    return tuple(params), x, y


def export_text() -> str:
    """The HLO text of the step, with a comment naming the parameter order on top."""
    params, x, y = example_arguments(np.random.default_rng(0))
    text = jax.jit(step, donate_argnums=(0,)).lower(params, x, y).as_text(dialect="hlo")
    header = (
        "/* One SGD step of an MLP 64-128-128-10 (lr 0.1, batch 32), exported by "
        "examples/export_from_jax.py.\n"
        "   Parameters: w0, b0, w1, b1, w2, b2 (donated), x f32[32,64], y s32[32].\n"
        "   Outputs: (loss, w0', b0', w1', b1', w2', b2'). */\n"
    )
    return header + text


def check(text: str) -> None:
    """Run the exported step in JAX and in xlapy's interpreter and compare the results."""
    from xlapy.backends.interpreter import evaluate
    from xlapy.ir.parser import parse_module

    params, x, y = example_arguments(np.random.default_rng(1))
    want = jax.tree_util.tree_leaves(jax.jit(step)(params, x, y))
    got = evaluate(parse_module(text), [*params, x, y])
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-4, atol=1e-5, err_msg=f"output {i}")
    print(f"interpreter matches JAX on all {len(want)} outputs (loss {float(got[0]):.4f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "mlp_train_step.hlo")
    ap.add_argument("--check", action="store_true", help="compare JAX and xlapy on the step")
    ns = ap.parse_args()
    text = export_text()
    ns.out.write_text(text)
    print(f"wrote {ns.out} ({len(text.splitlines())} lines)")
    if ns.check:
        check(text)


if __name__ == "__main__":
    main()
