"""Ordered effects through the xlapy plugin: a program whose `main` takes and returns
tokens (`!stablehlo.token {jax.token = true}`), the calling convention JAX uses for
ordered effects, compiles and runs, with the token outputs PJRT reports, as on "cpu".

Found by JAX's own export_test (`test_ordered_effects_basic`): the plugin counted only
the array outputs, so jaxlib stopped with "Memory kinds and dtypes have different sizes".
"""

import dataclasses

import jax
import numpy as np
from jax._src import core, effects
from jax._src.interpreters import mlir

XLAPY = jax.devices("xlapy")[0]
CPU = jax.devices("cpu")[0]


@dataclasses.dataclass(frozen=True)
class _XlapyOrderedEffect(effects.Effect):
    """An ordered effect of this test only (JAX threads a token through main for it)."""


ORDERED = _XlapyOrderedEffect()
effects.lowerable_effects.add_type(_XlapyOrderedEffect)
effects.control_flow_allowed_effects.add_type(_XlapyOrderedEffect)
effects.ordered_effects.add_type(_XlapyOrderedEffect)

# x -> 2x, with the ordered effect: its lowering passes the effect's token through.
twice_p = core.Primitive("xlapy_test_twice_ordered")
twice_p.def_effectful_abstract_eval(lambda aval: (aval, {ORDERED}))


def _twice_lowering(ctx, x):
    ctx.set_tokens_out(mlir.TokenSet({ORDERED: ctx.tokens_in.get(ORDERED)}))
    return [mlir.hlo.add(x, x)]


mlir.register_lowering(twice_p, _twice_lowering)


def program(x, y):
    return twice_p.bind(x) * y + twice_p.bind(y), x - y


def test_main_with_tokens_lowers_with_token_signature():
    text = jax.jit(program).lower(np.float32(1), np.float32(2)).as_text()
    assert "!stablehlo.token {jax.token = true}" in text


def test_ordered_effect_program_runs_like_cpu():
    rng = np.random.default_rng(11)
    for step in range(3):  # later calls take the tokens the earlier ones returned
        x = rng.standard_normal((4, 3)).astype(np.float32)
        y = rng.standard_normal((4, 3)).astype(np.float32)
        want = [np.asarray(a) for a in jax.jit(program)(*jax.device_put((x, y), CPU))]
        got = jax.jit(program)(*jax.device_put((x, y), XLAPY))
        assert all(XLAPY in a.devices() for a in got), step
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6, atol=1e-6)
    jax.effects_barrier()


def test_compiled_output_count_includes_tokens():
    compiled = jax.jit(program).lower(np.float32(1), np.float32(2)).compile()
    kinds = compiled.runtime_executable().get_output_memory_kinds()
    assert len(kinds[0]) == 3  # the effect's token, then the two results


# -- outputs in another memory: out_shardings with memory_kind="pinned_host" -------------


def test_outputs_land_in_the_memory_kind_jax_asks_for():
    """`jax.jit(..., out_shardings=...memory_kind="pinned_host")`: the plugin used to put
    every output in device memory, and JAX stopped with "Unexpected XLA sharding override"
    (found by JAX's memories_test `compute_on2_out_mem_space`)."""
    from jax.sharding import SingleDeviceSharding

    rng = np.random.default_rng(12)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    want = []
    for device in (CPU, XLAPY):
        host = SingleDeviceSharding(device, memory_kind="pinned_host")
        here = SingleDeviceSharding(device, memory_kind="device")
        f = jax.jit(lambda a: (a * 2.0, a.sum(0)), out_shardings=(host, here))
        doubled, total = f(jax.device_put(x, device))
        assert doubled.sharding.memory_kind == "pinned_host", device
        assert total.sharding.memory_kind == "device", device
        got = [np.asarray(doubled), np.asarray(total)]
        if not want:
            want = got
            continue
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
        # a host output is an ordinary argument of the next program
        again = jax.jit(lambda a: a + 1.0)(doubled)
        np.testing.assert_allclose(np.asarray(again), want[0] + 1.0, rtol=1e-6)
