"""Backend options (xlapy/backends/options.py): each backend honours a listed set; an unknown
key, a value of the wrong kind, or an option only the runtime may set is a typed error at
compile time (and when a serialized executable is loaded) that names the key and lists the
valid ones. Never accepted silently (issue 16)."""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends import get_backend
from xlapy.backends.options import INTERNAL_OPTIONS, RUNTIME_OPTIONS, BackendOptionError
from xlapy.ir.parser import parse_module
from xlapy.runtime import Client, CompileOptions, RuntimeApiError
from xlapy.runtime.serialize import decode, encode

pytestmark = pytest.mark.usefixtures("kernel_cache")

PROGRAM = """HloModule opts
ENTRY e {
  x = f32[4] parameter(0)
  ROOT s = f32[4] sine(x)
}"""

PLATFORMS = ["cpu", "interpreter"]

VALID = {
    "cpu": {
        "optimize": False,
        "verify": True,
        "native_loops": False,
        "inline_loop_kernels": False,
        "native_runs": False,
        "direct_convolutions": False,
        "native_gemv": False,
        "native_small_gemm": False,
        "small_gemm_library": False,
        "reduce_library": False,
        "conv_library": False,
        "window_library": False,
        "denormals": "ieee",
        "max_while_iterations": 5,
        "thunk_concurrency": "off",
        "strict_kernels": True,
        "rng_seed": 3,
        "collective_timeout": 2.5,
        "memory_scheduler": "dfs",
        "fft_library": "scipy",
        "max_isa": "AVX2",
    },
    "interpreter": {
        "max_while_iterations": 5,
        "rng_seed": 3,
        "collective_timeout": 2.5,
        "memory_scheduler": "module",
    },
}

BAD_VALUES = {
    "optimize": "yes",
    "native_loops": 1,
    "inline_loop_kernels": "no",
    "native_runs": "off",
    "direct_convolutions": "no",
    "native_gemv": 0,
    "native_small_gemm": "off",
    "small_gemm_library": "no",
    "reduce_library": "off",
    "conv_library": "no",
    "window_library": 0,
    "denormals": float("nan"),
    "max_while_iterations": -1,
    "thunk_concurrency": "sometimes",
    "rng_seed": 1.5,
    "collective_timeout": "soon",
    "memory_scheduler": "fastest",
    "fft_library": "fftw",
    "max_isa": "AVX3",
}


def compile_with(platform: str, backend_options):
    client = Client(platform)
    return client.compile(PROGRAM, CompileOptions.make(backend_options=backend_options))


@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_honoured_option_compiles_and_runs(platform):
    assert set(VALID[platform]) == set(get_backend(platform).user_options())
    x = np.random.default_rng(5).standard_normal(4).astype(np.float32)
    for key, value in VALID[platform].items():
        exe = compile_with(platform, {key: value})
        out = exe.execute([[exe.client.buffer_from_pyval(x)]])[0][0].to_numpy()
        np.testing.assert_allclose(out, np.sin(x), rtol=1e-5, err_msg=key)


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("key", ["bogus", "opt_level", "xla_cpu_enable_fast_math"])
def test_unknown_option_is_an_error_naming_it_and_the_valid_ones(platform, key):
    with pytest.raises(RuntimeApiError, match=rf"'{key}' is not honoured") as info:
        compile_with(platform, {key: 1})
    for valid in VALID[platform]:
        assert valid in str(info.value)


@pytest.mark.parametrize("key", sorted(set(VALID["cpu"]) - set(VALID["interpreter"])))
def test_a_cpu_option_is_an_error_for_the_interpreter(key):
    with pytest.raises(RuntimeApiError, match=rf"'{key}' is not honoured by the interpreter"):
        compile_with("interpreter", {key: VALID["cpu"][key]})


@pytest.mark.parametrize("key", list(BAD_VALUES))
def test_bad_value_is_an_error_naming_the_option(key):
    with pytest.raises(RuntimeApiError, match=rf"{key}=.*expected"):
        compile_with("cpu", {key: BAD_VALUES[key]})


@pytest.mark.parametrize("key", list(INTERNAL_OPTIONS))
def test_options_the_runtime_sets_are_not_for_users(key):
    value = 1 if key != "custom_calls" else "registry"
    with pytest.raises(RuntimeApiError, match=rf"'{key}' is .*set by the runtime"):
        compile_with("cpu", {key: value})


def test_backend_compile_checks_its_options():
    """The backend interface checks too (what the runtime passes it, and direct callers)."""
    module = parse_module(PROGRAM)
    backend = get_backend("cpu")
    with pytest.raises(BackendOptionError, match="'nativeloops' is not honoured"):
        backend.compile(module, {"nativeloops": False})
    backend.compile(module, {"replica_id": 0, "partition_id": 0, "native_loops": False})
    with pytest.raises(BackendOptionError, match="'fast' is not honoured"):
        get_backend("interpreter").compile(module, {"fast": True})


def test_loading_a_serialized_executable_checks_its_options():
    client = Client("cpu")
    data = client.compile(PROGRAM).serialize()
    parts = decode(data)
    parts.metadata["options"]["backend_options"] = {"bogus": 1}
    with pytest.raises(RuntimeApiError, match="'bogus' is not honoured"):
        client.deserialize_executable(encode(parts.metadata, parts.hlo_text))


def test_runtime_options_are_honoured_by_every_backend():
    for platform in PLATFORMS:
        assert set(RUNTIME_OPTIONS) <= set(get_backend(platform).user_options())
