"""debug_options: `xla_dump_to` and friends are honoured (dumps before and after
optimization, as XLA writes them) or rejected with a clear error, from Python and through
JAX's compiler options and XLA_FLAGS-style DebugOptions."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.lib import xla_client

from xlapy.pjrt.options import IGNORED_DEBUG_FIELDS, compile_options_from_proto
from xlapy.runtime import Client, CompileOptions, RuntimeApiError
from xlapy.runtime.debug import DebugOptionWarning

PROGRAM = """HloModule dumped
ENTRY main {
  x = f32[64] parameter(0)
  y = f32[64] parameter(1)
  s = f32[64] sine(x)
  m = f32[64] multiply(s, y)
  ROOT e = f32[64] exponential(m)
}
"""


@pytest.fixture
def client():
    c = Client("cpu")
    yield c
    c.close()


def test_xla_dump_to_writes_the_hlo_before_and_after_optimization(client, tmp_path):
    options = CompileOptions.make(debug_options={"xla_dump_to": str(tmp_path / "dump")})
    exe = client.compile(PROGRAM, options)
    files = sorted(p.name for p in (tmp_path / "dump").iterdir())
    assert len(files) == 3
    before = next(p for p in (tmp_path / "dump").iterdir() if "before" in p.name)
    after = next(p for p in (tmp_path / "dump").glob("*cpu_after_optimizations.txt"))
    plan = next(p for p in (tmp_path / "dump").glob("*-buffer-assignment.txt"))
    assert before.name.startswith("module_") and ".dumped.before_optimizations" in before.name
    assert before.read_text() == exe.hlo_text()
    assert "fusion" in after.read_text() and "fusion" not in before.read_text()
    assert after.read_text() == exe.backend_program().module.to_text()
    assert plan.read_text() == exe.memory_plan().to_text() + "\n"
    rng = np.random.default_rng(11)
    x, y = (rng.standard_normal(64).astype(np.float32) for _ in range(2))
    [out] = exe.execute([[client.buffer_from_pyval(x), client.buffer_from_pyval(y)]])[0]
    np.testing.assert_allclose(out.to_numpy(), np.exp(np.sin(x) * y), rtol=2e-6)


def test_module_re_limits_the_dumps(client, tmp_path):
    options = CompileOptions.make(
        debug_options={"xla_dump_to": str(tmp_path), "xla_dump_hlo_module_re": "^other"}
    )
    client.compile(PROGRAM, options)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "debug, message",
    [
        ({"xla_cpu_enable_fast_math": True}, "xla_cpu_enable_fast_math is not supported"),
        ({"exec_time_compilation_effort": 0.0}, "No such compile option"),
        ({"xla_dump_max_hlo_modules": "2"}, "must be an integer"),
        ({"xla_dump_to": ""}, "must name a directory"),
        ({"xla_dump_to": "/tmp/x", "xla_dump_hlo_as_text": False}, "as text only"),
        ({"xla_dump_hlo_module_re": "("}, "xla_dump_hlo_module_re"),
    ],
)
def test_options_xlapy_cannot_honour_are_errors(client, debug, message):
    with pytest.raises(RuntimeApiError, match=message):
        client.compile(PROGRAM, CompileOptions.make(debug_options=debug))


def test_debug_options_from_the_pjrt_compile_options_proto(tmp_path):
    options = xla_client.CompileOptions()
    plain = compile_options_from_proto(options.SerializeAsString())
    assert plain.debug_options == ()  # XLA's defaults request nothing
    options.executable_build_options.debug_options.xla_dump_to = str(tmp_path)
    options.env_option_overrides = [("xla_dump_hlo_module_re", "jit_"), ("xla_flag", 3)]
    decoded = dict(compile_options_from_proto(options.SerializeAsString()).debug_options)
    assert decoded == {
        "xla_dump_to": str(tmp_path),
        "xla_dump_hlo_module_re": "jit_",
        "xla_flag": 3,
    }


def test_jax_compiler_options_are_honoured_or_rejected(tmp_path):
    xlapy = jax.devices("xlapy")[0]
    sharding = jax.sharding.SingleDeviceSharding(xlapy)
    spec = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=sharding)
    lowered = jax.jit(lambda a: jnp.sin(a) * 2).lower(spec)
    lowered.compile(compiler_options={"xla_dump_to": str(tmp_path)})
    names = [p.name for p in tmp_path.iterdir()]
    assert any(n.endswith("before_optimizations.txt") for n in names), names
    assert any(n.endswith("cpu_after_optimizations.txt") for n in names), names
    with pytest.raises(Exception, match="xla_cpu_use_thunk_runtime is not supported by xlapy"):
        lowered.compile(compiler_options={"xla_cpu_use_thunk_runtime": False})


def dump_fields_set(**settings) -> bytes:
    options = xla_client.CompileOptions()
    for name, value in settings.items():
        setattr(options.executable_build_options.debug_options, name, value)
    return options.SerializeAsString()


def test_dump_options_from_xla_flags_are_honoured(tmp_path):
    data = dump_fields_set(
        xla_dump_to=str(tmp_path), xla_dump_hlo_module_re="^jit_", xla_dump_hlo_as_text=True
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", DebugOptionWarning)
        decoded = dict(compile_options_from_proto(data).debug_options)
    assert decoded == {
        "xla_dump_to": str(tmp_path),
        "xla_dump_hlo_module_re": "^jit_",
        "xla_dump_hlo_as_text": True,
    }


@pytest.mark.parametrize("field", [name for name, _ in IGNORED_DEBUG_FIELDS.values()])
def test_debug_options_xlapy_ignores_are_never_ignored_silently(field):
    """JAX fills DebugOptions from $XLA_FLAGS (which XLA:CPU in the same process reads too):
    a non-default value xlapy does not honour warns, naming the option, and the compile
    goes on; JAX's defaults warn about nothing (test above)."""
    default = getattr(xla_client.CompileOptions().executable_build_options.debug_options, field)
    changed = "x" if isinstance(default, str) else (not default) if isinstance(default, bool) else 7
    with pytest.warns(DebugOptionWarning, match=field):
        options = compile_options_from_proto(dump_fields_set(**{field: changed}))
    assert field not in dict(options.debug_options)


def test_jax_default_compile_options_warn_about_nothing():
    xlapy = jax.devices("xlapy")[0]
    sharding = jax.sharding.SingleDeviceSharding(xlapy)
    spec = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=sharding)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DebugOptionWarning)
        jax.jit(lambda a: jnp.cos(a) + 1).lower(spec).compile()


def test_dump_max_hlo_modules_stops_the_dumps(client, tmp_path):
    options = CompileOptions.make(
        debug_options={"xla_dump_to": str(tmp_path), "xla_dump_max_hlo_modules": 0}
    )
    client.compile(PROGRAM, options)
    assert list(tmp_path.iterdir()) == []
    unlimited = CompileOptions.make(
        debug_options={"xla_dump_to": str(tmp_path), "xla_dump_max_hlo_modules": -1}
    )
    client.compile(PROGRAM, unlimited)
    assert len(list(tmp_path.iterdir())) == 3


@pytest.mark.parametrize(
    "name, value, reason",
    [
        ("xla_gpu_auto_spmd_partitioning_memory_budget_ratio", 0.5, "another backend"),
        ("xla_tpu_enable_latency_hiding_scheduler", True, "another backend"),
        ("xla_embed_ir_in_executable", True, "no LLVM IR"),
        ("xla_dump_hlo_pass_re", ".*", "not per pass"),
    ],
)
def test_options_that_cannot_change_the_program_warn(client, name, value, reason):
    """What XLA accepts and XLA:CPU ignores (other backends' options) or xlapy does not
    produce (diagnostics) compiles, with a DebugOptionWarning naming it and saying why."""
    with pytest.warns(DebugOptionWarning, match=f"{name} is not honoured by xlapy: .*{reason}"):
        client.compile(PROGRAM, CompileOptions.make(debug_options={name: value}))


def test_jax_api_test_compile_options_run_on_xlapy():
    """JAX's own api_test.test_compile_options_jit and the 'No such' half of
    test_exec_time_optimization_effort_compiler_option, on the xlapy platform."""
    xlapy = jax.devices("xlapy")[0]
    x = jax.device_put(jnp.float32(-3.0), xlapy)
    options = {
        "xla_embed_ir_in_executable": True,
        "xla_dump_max_hlo_modules": 200,
        "xla_gpu_auto_spmd_partitioning_memory_budget_ratio": 0.5,
    }
    with pytest.warns(DebugOptionWarning):
        out = jax.jit(lambda v: jnp.sqrt(v**2) + 1.0, compiler_options=options)(x)
    assert float(out) == 4.0
    with pytest.raises(jax.errors.JaxRuntimeError, match="No such"):
        jax.jit(lambda v: v + 1.0, compiler_options={"exec_time_compilation_effort": 0.0})(x)
