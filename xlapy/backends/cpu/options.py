"""The backend options the CPU backend honours (xlapy.backends.options checks them): the one
list a reader looks in; each is read where it acts (named below)."""

from __future__ import annotations

from typing import Any

from xlapy.backends.cpu.codegen.emitter import DENORMALS
from xlapy.backends.cpu.jit.engine import ISA_LEVELS, parse_isa
from xlapy.backends.cpu.runtime.fft_thunk import LIBRARIES as FFT_LIBRARIES
from xlapy.backends.cpu.runtime.thunk_graph import MODES
from xlapy.backends.options import MEMORY_SCHEDULER, Option, boolean, integer, one_of
from xlapy.errors import XlapyError


def _isa(value: Any) -> str | None:
    try:
        parse_isa(value)
    except XlapyError:
        return "one of " + ", ".join(ISA_LEVELS) + " or 'host'"
    return None


def _concurrency(value: Any) -> str | None:
    return None if isinstance(value, bool) else one_of(*MODES)(value)


CPU_OPTIONS: dict[str, Option] = {
    "optimize": Option("run the CPU pass pipeline (default true; compiler.py)", boolean),
    "verify": Option("verify the module after every pass (default false; compiler.py)", boolean),
    "native_loops": Option(
        "compile while loops whose bodies are all kernels into one native function "
        "(default true; lowering.py)",
        boolean,
    ),
    "inline_loop_kernels": Option(
        "compile a native loop's small kernels into the loop's own function too, with no "
        "call per kernel and iteration (default false: each such kernel compiles twice; "
        "lowering.py, codegen/emit_loop.py)",
        boolean,
    ),
    "native_runs": Option(
        "run stretches of kernels, copies and gemms of the entry as one native function "
        "each (default true; lowering.py)",
        boolean,
    ),
    "direct_convolutions": Option(
        "run 2-D convolutions that fit them as direct native kernels, not through BLAS "
        "(default true; lowering.py, codegen/emit_conv.py)",
        boolean,
    ),
    "native_gemv": Option(
        "run f32/f64 matrix-vector dots as native kernels, not through BLAS "
        "(default true; lowering.py, codegen/emit_gemv.py)",
        boolean,
    ),
    "native_small_gemm": Option(
        "run f32/f64 dots with a side of at most 16 free elements (an RNN cell's batch) as "
        "native kernels, not through BLAS (with native_gemv; default true; lowering.py, "
        "codegen/emit_gemv.py)",
        boolean,
    ),
    "small_gemm_library": Option(
        "run those small matrix-matrix dots on kernels generic in their shape, compiled once "
        "per machine into the kernel library, not on a kernel compiled per shape (default "
        "true; lowering.py, codegen/emit_small_gemm.py, jit/kernel_library.py)",
        boolean,
    ),
    "reduce_library": Option(
        "run plain f32/f64 reduces by add, maximum or minimum (row, column, middle-axis, "
        "full) on kernels generic in their extents from the kernel library, not on a kernel "
        "compiled per shape (default true; lowering.py, codegen/emit_reduce_library.py)",
        boolean,
    ),
    "conv_library": Option(
        "run the direct convolutions (f32, two spatial dims, one group) on the kernel "
        "library's convolution, its geometry read at run time, compiled once per machine, "
        "not on a kernel compiled per geometry (the same bits; default: where it runs no "
        "slower, the convolutions whose per-geometry kernel would run a short last tile; "
        "true: wherever it applies; false: never; lowering.py, "
        "codegen/emit_conv_library.py, docs/cpu_backend.md)",
        boolean,
    ),
    "window_library": Option(
        "run pooling reduce-windows (one f32/f64 array by add, maximum or minimum) on "
        "kernels generic in their geometry from the kernel library, not on a kernel compiled "
        "per shape (default false: slower at run time; lowering.py, "
        "codegen/emit_window_library.py)",
        boolean,
    ),
    "denormals": Option(
        "'flush' subnormals to zero as XLA:CPU does (default), or keep them: 'ieee' "
        "(codegen/emitter.py)",
        one_of(*DENORMALS),
    ),
    "max_isa": Option(
        "the widest x86 ISA level kernels may use: SSE4_2, AVX, AVX2, AVX512, AVX512_VNNI, "
        "AVX512_BF16, AMX, or 'host' (XLA:CPU's xla_cpu_max_isa; default $XLAPY_CPU_MAX_ISA, "
        "else every feature of the host; jit/engine.py)",
        _isa,
    ),
    "max_while_iterations": Option(
        "a while loop that runs more iterations fails (ExecutionError; lowering.py)", integer(0)
    ),
    "thunk_concurrency": Option(
        "run independent thunks concurrently: auto, off, always, or true/false "
        "(runtime/thunk_graph.py)",
        _concurrency,
    ),
    "strict_kernels": Option(
        "a kernel that fails to compile raises instead of falling back (lowering.py)", boolean
    ),
    "rng_seed": Option("the seed of the legacy `rng` op's generator (backend.py)", integer(0)),
    "memory_scheduler": MEMORY_SCHEDULER,
    "fft_library": Option(
        "run fft through 'ducc0' (default; scipy.fft where ducc0 is not importable) or "
        "'scipy' (runtime/fft_thunk.py)",
        one_of(*FFT_LIBRARIES),
    ),
}
