"""Compiling through the PJRT plugin: JAX's StableHLO bytes go to `Client.compile` as bytes
with the plugin's importer, so a program compiled before (by this process or another) comes
from the CPU backend's program image, without import, passes or lowering; the images of
the plugin's programs are keyed by its importer (the same bytes imported by `xlapy.load`
never share one); and the optimized program JAX reads back (layouts, `as_text()`) is an
HloModuleProtoWithConfig, which jaxlib decodes instead of parsing MLIR."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.interpreters import mlir
from test_cpu_program_image import images

import xlapy.stablehlo
from xlapy.backends.cpu import backend as cpu_backend
from xlapy.backends.cpu.jit.kernel import clear_kernel_cache
from xlapy.pjrt import core, executables, program
from xlapy.pjrt.client import PClient
from xlapy.pjrt.executables import PExecutable, _hlo_proto
from xlapy.pjrt.options import fields
from xlapy.runtime import Client

XLAPY = jax.devices("xlapy")[0]
CPU = jax.devices("cpu")[0]
RNG = np.random.default_rng(11)


def forbid_compiling(monkeypatch) -> None:
    """Fail the test if a compile imports the program or compiles the module."""

    def fail(*args, **kwargs):
        raise AssertionError("a warm compile imported or compiled the program")

    monkeypatch.setattr(program, "import_bytes", fail)
    monkeypatch.setattr(xlapy.stablehlo, "load", fail)
    monkeypatch.setattr(cpu_backend, "compile_module", fail)


def step(p, x):
    h = jnp.tanh(x @ p["w"] + p["b"])
    return {"w": p["w"] - 0.1 * x.T @ h, "b": p["b"] - 0.1 * h.sum(0)}, jnp.sort(h, axis=-1)


def stablehlo_bytes(fn, *args) -> bytes:
    """The StableHLO bytecode of `fn` lowered for xlapy (what JAX hands the plugin)."""
    return mlir.module_to_bytecode(jax.jit(fn).lower(*args).compiler_ir())


def arguments(seed: int):
    rng = np.random.default_rng(seed)
    p = {
        "w": rng.standard_normal((6, 5)).astype(np.float32),
        "b": rng.standard_normal(5).astype(np.float32),
    }
    return p, rng.standard_normal((4, 6)).astype(np.float32)


def run(exe, args) -> list[np.ndarray]:
    client = exe.client
    leaves = jax.tree_util.tree_leaves(args)
    outs = exe.execute([[client.buffer_from_pyval(a) for a in leaves]])[0]
    return [o.to_numpy() for o in outs]


def test_plugin_programs_are_imaged_and_a_warm_compile_imports_nothing(image_cache, monkeypatch):
    code = stablehlo_bytes(step, *arguments(0))
    cold = Client("cpu").compile(code, importer=program.module_from_mlir)
    assert len(images(image_cache)) == 1
    cold_out = [run(cold, arguments(seed)) for seed in (1, 2)]
    clear_kernel_cache()
    with monkeypatch.context() as m:
        forbid_compiling(m)
        warm = Client("cpu").compile(code, importer=program.module_from_mlir)
        warm_out = [run(warm, arguments(seed)) for seed in (1, 2)]
    assert warm.fingerprint == cold.fingerprint
    for w_run, c_run in zip(warm_out, cold_out, strict=True):
        for w, c in zip(w_run, c_run, strict=True):
            np.testing.assert_array_equal(w, c)  # the same program, the same bits


def test_the_importer_is_part_of_the_image_key(image_cache):
    code = stablehlo_bytes(step, *arguments(0))
    Client("cpu").compile(code, importer=program.module_from_mlir)
    Client("cpu").compile(code)  # xlapy.load's import of the same bytes: its own image
    assert len(images(image_cache)) == 2


def plugin_client() -> Client:
    clients = [o for o in core.OBJECTS.values() if isinstance(o, PClient)]
    return clients[0].client


def test_jax_recompiling_a_program_loads_its_image(image_cache, monkeypatch):
    p, x = arguments(3)

    def fn(p, x):  # a program of this test's own (no image from another test)
        new, h = step(p, x)
        return new, h * 3.0 + 0.25

    want = jax.jit(fn)(*jax.device_put((p, x), CPU))
    compiles: list[int] = []
    compile_ = executables._compile
    results = []
    for attempt in range(2):  # the same call site: JAX hands over the same bytes
        with monkeypatch.context() as m:
            if attempt:
                assert len(images(image_cache)) == 1
                plugin_client().clear_compile_cache()
                clear_kernel_cache()
                jax.clear_caches()  # JAX compiles again
                forbid_compiling(m)
                m.setattr(executables, "_compile", lambda *a: compiles.append(1) or compile_(*a))
            results.append(jax.jit(fn)(*jax.device_put((p, x), XLAPY)))
    assert compiles == [1]  # JAX did compile again: the plugin loaded the image
    first, again = results
    for a, b, w in zip(
        jax.tree_util.tree_leaves(first),
        jax.tree_util.tree_leaves(again),
        jax.tree_util.tree_leaves(want),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_allclose(np.asarray(a), np.asarray(w), rtol=1e-5, atol=1e-6)


def test_optimized_program_is_an_hlo_proto_with_config():
    x = jax.device_put(RNG.standard_normal((3, 4)).astype(np.float32), XLAPY)
    compiled = jax.jit(lambda a: jax.nn.softmax(a, -1) * 2).lower(x).compile()
    info = next(
        o.info
        for o in core.OBJECTS.values()
        if isinstance(o, PExecutable)
        and o.info.executable.fingerprint.encode() == compiled.runtime_executable().fingerprint
    )
    message = dict(fields(_hlo_proto(info)))
    config = dict(fields(message[2]))
    module = dict(fields(message[1]))
    assert config[1] == module[4]  # the entry layout is the module's program shape
    assert (config[4], config[5]) == (1, 1)  # replicas, partitions
    text = compiled.as_text()
    assert "ENTRY" in text and "f32[3,4]" in text
    layouts = compiled.output_formats
    assert jax.tree_util.tree_leaves(layouts)
