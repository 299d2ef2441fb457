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
"""

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
from xlapy.backends.cpu.jit.native_helpers import JitNativeCode
from xlapy.backends.cpu.runtime import native_code
from xlapy.backends.cpu.runtime.pool import default_pool

native_code.install(JitNativeCode())  # the runtime's native helpers, compiled by the jit

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
