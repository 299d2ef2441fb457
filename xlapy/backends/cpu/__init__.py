"""The CPU backend: fused computations compiled to native kernels through llvmlite.

`compile_computation(comp)` emits LLVM IR for a fused (or wrapped single-instruction)
computation, optimizes it for the host CPU, loads it and returns a `Kernel` callable on NumPy
arrays. Anything the emitter cannot lower raises `UnsupportedForCodegen`, so callers can fall
back to the interpreter.

`CpuBackend` (registered as the backend "cpu") compiles whole modules: passes, buffer
assignment, then a thunk sequence of kernels, BLAS dots, library and control-flow thunks
(`compile_module`), executed over one arena per execution (`CpuProgram.run`).
"""

from xlapy.backends.cpu.backend import CpuBackend, CpuProgram
from xlapy.backends.cpu.codegen import elemental  # noqa: F401  (registers the elemental emit rules)
from xlapy.backends.cpu.codegen.emitter import (
    KernelSpec,
    UnsupportedForCodegen,
    emit_kernel,
    supported,
)
from xlapy.backends.cpu.compiler import CompiledModule, compile_module
from xlapy.backends.cpu.jit.kernel import (
    Kernel,
    compile_computation,
    compile_instruction,
    default_pool,
    run_parallel,
    wrap_instruction,
)

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
