"""Call a custom call written in C and one written in Python from xlapy.

Run it from the repository root:  .venv/bin/python examples/custom_call/run_example.py

It compiles bias_add.c with cffi (gcc must be installed), registers it and a Python twin
under two names, builds the same program twice (with XlaBuilder and from HLO text), checks
the custom calls at compile time, runs every combination through xlapy's interpreter and
prints how far each result is from NumPy's answer.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import cffi
import numpy as np

from xlapy.backends.custom_calls import (
    ApiVersion,
    CustomCallRegistry,
    check_custom_calls,
    write_c_header,
)
from xlapy.backends.interpreter import evaluate
from xlapy.builder import XlaBuilder
from xlapy.ir.parser import parse_module

HERE = Path(__file__).resolve().parent
BIAS, N = 128, 2048
OPAQUE = f"{BIAS},{N}"


def build_c_target(build_dir: Path):
    """Compile bias_add.c into a Python extension with cffi; return the function pointer."""
    write_c_header(build_dir)
    builder = cffi.FFI()
    builder.cdef(
        "typedef struct XlaCustomCallStatus_ XlaCustomCallStatus;\n"
        "void bias_add(void* out, const void** ins, const char* opaque, size_t opaque_len,"
        " XlaCustomCallStatus* status);"
    )
    builder.set_source(
        "_bias_add_example", (HERE / "bias_add.c").read_text(), include_dirs=[str(build_dir)]
    )
    library = builder.compile(tmpdir=str(build_dir))
    spec = importlib.util.spec_from_file_location("_bias_add_example", library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ffi.addressof(module.lib, "bias_add")


def python_bias_add(ins, opaque):
    """The same computation as a Python target: NumPy views in, the result array out."""
    bias, x = ins
    bias_len, _ = (int(v) for v in opaque.split(","))
    return bias[np.arange(x.size) % bias_len] + x


def module_from_builder(target: str):
    b = XlaBuilder("bias_add_builder")
    bias = b.parameter(0, f"f32[{BIAS}]", "bias")
    x = b.parameter(1, f"f32[{N}]", "x")
    b.custom_call(
        target,
        [bias, x],
        f"f32[{N}]",
        opaque=OPAQUE,
        api_version="API_VERSION_STATUS_RETURNING_UNIFIED",
    )
    return b.build()


def module_from_text(target: str):
    return parse_module(f"""HloModule bias_add_text
ENTRY main {{
  bias = f32[{BIAS}] parameter(0)
  x = f32[{N}] parameter(1)
  ROOT out = f32[{N}] custom-call(bias, x), custom_call_target="{target}",
      backend_config="{OPAQUE}", api_version=API_VERSION_STATUS_RETURNING_UNIFIED
}}""")


def main(build_dir: Path | None = None) -> dict[str, float]:
    """Build, register, check and run everything; return the max error per combination."""
    build_dir = Path(build_dir or tempfile.mkdtemp(prefix="xlapy_custom_call_"))
    registry = CustomCallRegistry()
    registry.register(
        "bias_add_c",
        build_c_target(build_dir),
        platform="Host",
        api_version=ApiVersion.STATUS_RETURNING_UNIFIED,
    )
    registry.register("bias_add_py", python_bias_add)

    rng = np.random.default_rng(0)
    bias = rng.standard_normal(BIAS).astype(np.float32)
    x = rng.standard_normal(N).astype(np.float32)
    expected = bias[np.arange(N) % BIAS] + x

    errors = {}
    for language, target in (("C", "bias_add_c"), ("Python", "bias_add_py")):
        for form, make in (("builder", module_from_builder), ("hlo", module_from_text)):
            module = make(target)
            check_custom_calls(module, "Host", registry)
            result = evaluate(module, [bias, x], custom_calls=registry)
            errors[f"{language}/{form}"] = float(np.max(np.abs(result - expected)))
    return errors


if __name__ == "__main__":
    for name, error in main(Path(sys.argv[1]) if len(sys.argv) > 1 else None).items():
        print(f"{name:16s} max error {error:.3g}")
