"""The CPU backend: fused computations compiled to native kernels through llvmlite.

`compile_computation(comp)` emits LLVM IR for a fused (or wrapped single-instruction)
computation, optimizes it for the host CPU, loads it and returns a `Kernel` callable on NumPy
arrays. Anything the emitter cannot lower raises `UnsupportedForCodegen`, so callers can fall
back to the interpreter.

`CpuBackend` (registered as the backend "cpu") compiles whole modules: passes, buffer
assignment, then a thunk sequence of kernels, BLAS dots, library and control-flow thunks
(`compile_module`), executed over one arena per execution (`CpuProgram.run`). The runtime's
own native helpers (the native parallel-for, the subnormal-flushing BLAS wrappers) are
compiled by the jit too: the package installs their compiler into runtime/native_code.py.

The names below load their modules on first use (as xlapy.backends.interpreter's do): a
warm compile from a program image imports the backend, the kernels and the thunks it
unpickles, never the emitter, the lowering or the passes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from xlapy.backends.cpu.jit.native_helpers import JitNativeCode
from xlapy.backends.cpu.runtime import native_code

if TYPE_CHECKING:
    from xlapy.backends.cpu.backend import CpuBackend, CpuProgram
    from xlapy.backends.cpu.codegen.common import KernelSpec, UnsupportedForCodegen
    from xlapy.backends.cpu.codegen.emitter import emit_kernel, supported
    from xlapy.backends.cpu.compiler import CompiledModule, compile_module
    from xlapy.backends.cpu.jit.kernel import (
        Kernel,
        compile_computation,
        compile_instruction,
        run_parallel,
        wrap_instruction,
    )
    from xlapy.backends.cpu.runtime.pool import default_pool

native_code.install(JitNativeCode())  # the runtime's native helpers, compiled by the jit

_HOMES = {
    "CompiledModule": "compiler",
    "CpuBackend": "backend",
    "CpuProgram": "backend",
    "Kernel": "jit.kernel",
    "KernelSpec": "codegen.common",
    "UnsupportedForCodegen": "codegen.common",
    "compile_computation": "jit.kernel",
    "compile_instruction": "jit.kernel",
    "compile_module": "compiler",
    "default_pool": "runtime.pool",
    "emit_kernel": "codegen.emitter",
    "run_parallel": "jit.kernel",
    "supported": "codegen.emitter",
    "wrap_instruction": "jit.kernel",
}

__all__ = [
    "CompiledModule",
    "CpuBackend",
    "CpuProgram",
    "Kernel",
    "KernelSpec",
    "UnsupportedForCodegen",
    "compile_computation",
    "compile_instruction",
    "compile_module",
    "default_pool",
    "emit_kernel",
    "run_parallel",
    "supported",
    "wrap_instruction",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is not None:
        return getattr(importlib.import_module(f"{__name__}.{home}"), name)
    try:  # a submodule (`xlapy.backends.cpu.lowering` after `import xlapy.backends.cpu`)
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
