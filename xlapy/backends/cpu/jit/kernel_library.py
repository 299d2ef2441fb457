# The kernel library: kernels generic in their shapes, compiled once per machine.
#
# A program's cold compile spends LLVM time on every kernel it emits. For kernels whose code
# need not depend on the program (the small matrix-matrix products of
# codegen/emit_small_gemm.py and the plain reductions of codegen/emit_reduce_library.py, each
# one of a finite menu, its shape passed at run time in a parameter block) the object is the
# same for every program, so it is compiled once and kept
# in the library directory (disk_cache.library_dir: $XLAPY_LIBRARY_DIR or
# ~/.cache/xlapy/library), apart from the per-program kernel cache: a fresh kernel cache
# (benchmarks/cpu_vs_xla.py's cold compile) reads the library and builds nothing. This is
# the analogue of the Eigen kernels XLA:CPU ships precompiled in jaxlib; xlapy's are built
# once per machine instead, on first need (compiled on the JIT's pool like any kernel) or
# ahead of time by `python -m xlapy.backends.cpu.jit.kernel_library` (`make kernel-library`),
# which prints what the build cost.
#
# An object's name is a content key (engine.content_key: the CPU and its features, the xlapy
# and llvmlite versions, LLVM's optimization level and options, the cache format) of the
# kernel's description, a SHA-256 of the code generator's sources (codegen/ and the JIT
# engine: what the IR and the object depend on; not the runtime or the lowering, so
# changing those does not rebuild the library) and a tag of this user's cache key (so that
# a test's own key never fights the user's over one file). Trust is the kernel cache's: a
# private directory, every object authenticated by HMAC; a damaged, truncated or forged
# object is a CacheEntryWarning and is compiled and written again.

from __future__ import annotations

import argparse
import functools
import hashlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from xlapy.backends.cpu.codegen import (
    emit_conv_library,
    emit_reduce_library,
    emit_small_gemm,
    emit_window_library,
)
from xlapy.backends.cpu.codegen.common import SYMBOL, KernelSpec
from xlapy.backends.cpu.codegen.emit_conv_library import ConvKernel
from xlapy.backends.cpu.codegen.emit_reduce_library import ReduceKernel
from xlapy.backends.cpu.codegen.emit_small_gemm import SmallGemmKernel
from xlapy.backends.cpu.codegen.emit_window_library import WindowKernel
from xlapy.backends.cpu.jit import engine as jit
from xlapy.backends.cpu.jit.disk_cache import LIBRARY_ENV, key_tag, library_dir
from xlapy.backends.cpu.jit.kernel import (
    Kernel,
    NativeFunction,
    Signature,
    clear_loaded_objects,
    function_address,
    library_request,
)


@functools.cache
def library_fingerprint() -> str:
    """A SHA-256 of the sources the library's objects are made from: the code generator
    (codegen/) and the JIT engine that compiles its IR."""
    backend = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted([*(backend / "codegen").glob("*.py"), backend / "jit" / "engine.py"]):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


LibraryKernel = SmallGemmKernel | ReduceKernel | ConvKernel | WindowKernel
"""A kernel of the library: a small gemm (codegen/emit_small_gemm.py), a reduction
(codegen/emit_reduce_library.py), a direct convolution (codegen/emit_conv_library.py) or a
pooling reduce-window (codegen/emit_window_library.py)."""


def menu(lanes: int) -> tuple[LibraryKernel, ...]:
    """Every kernel of the library for vector registers of `lanes` f32 elements."""
    return (
        *emit_small_gemm.menu(lanes),
        *emit_reduce_library.menu(lanes),
        *emit_conv_library.menu(lanes),
        *emit_window_library.menu(lanes),
    )


def _emitter(kernel: LibraryKernel, flush_denormals: bool) -> Callable[[], str]:
    """A function writing `kernel`'s LLVM IR."""
    if isinstance(kernel, WindowKernel):
        return functools.partial(emit_window_library.emit_window_kernel, kernel, flush_denormals)
    if isinstance(kernel, ConvKernel):
        return functools.partial(emit_conv_library.emit_conv_kernel, kernel, flush_denormals)
    if isinstance(kernel, ReduceKernel):
        return functools.partial(emit_reduce_library.emit_reduce_kernel, kernel, flush_denormals)
    return functools.partial(emit_small_gemm.emit_small_gemm, kernel, flush_denormals)


def library_key(kernel: LibraryKernel, flush_denormals: bool) -> str:
    """The name of `kernel`'s object in the library."""
    description = kernel.description(flush_denormals)
    return jit.content_key("kernel-library", library_fingerprint(), description, key_tag())


def library_kernel(
    kernel: LibraryKernel, flush_denormals: bool, signature: Signature, name: str
) -> Kernel:
    """A Kernel running library kernel `kernel` with `signature` (its shapes, outer range
    and one parameter block): loaded from the library, or compiled into it now on the JIT's
    pool (`wait()` before running it). Kernels of the same library kernel share one object."""
    key = library_key(kernel, flush_denormals)
    emit = _emitter(kernel, flush_denormals)

    def spec() -> KernelSpec:  # for dumps
        sig = signature
        return KernelSpec(SYMBOL, emit(), sig.outputs, sig.params, sig.outer_extent)

    request = library_request(key, emit, library_dir())
    return Kernel._deferred(signature, name, request, None, spec, key)


def library_function(kernel: ConvKernel, flush_denormals: bool) -> NativeFunction:
    """Library kernel `kernel` as a function outside the kernel ABI (the direct
    convolution's thunk calls it with its own pointers): loaded from the library, or
    compiled into it now on the JIT's pool (`address()` waits for it)."""
    key = library_key(kernel, flush_denormals)
    future, _ = library_request(key, _emitter(kernel, flush_denormals), library_dir())
    return NativeFunction(key, future)


def build(
    flush_denormals: bool = True, directory: Path | None = None
) -> list[tuple[str, float | None]]:
    """Make sure every kernel of the library is in `directory` (default: the library's):
    (kernel name, process CPU ms) of each one compiled now, None for those read."""
    where = directory or library_dir()
    found = []
    for kernel in menu(_lanes()):
        start = time.process_time()
        request, _ = library_request(
            library_key(kernel, flush_denormals),
            _emitter(kernel, flush_denormals),
            where,
        )
        function_address(request)
        ms = 1e3 * (time.process_time() - start)
        found.append((kernel.name, None if request.result().from_cache else ms))
    return found


def build_cost_ms(flush_denormals: bool = True) -> tuple[int, float]:
    """(kernels, process CPU ms) of building the whole library from nothing (in a scratch
    directory): the one-time cost a machine pays, reported beside cold compile times."""
    with tempfile.TemporaryDirectory(prefix="xlapy-library-") as tmp:
        clear_loaded_objects()
        built = build(flush_denormals, Path(tmp))
        clear_loaded_objects()
    return len(built), sum(ms or 0.0 for _, ms in built)


def _lanes() -> int:
    from xlapy.backends.cpu.codegen.emit_conv import vector_shape

    return vector_shape(jit.host_target().features)[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Build xlapy's CPU kernel library (kernels generic in their shapes) "
        "for this machine, into $XLAPY_LIBRARY_DIR or ~/.cache/xlapy/library."
    )
    parser.add_argument("--ieee", action="store_true", help="the kernels that keep subnormals")
    args = parser.parse_args(argv)
    built = build(not args.ieee)
    for name, ms in built:
        print(f"  {name:40s} {'there already' if ms is None else f'{ms:7.0f} ms'}")
    made = [ms for _, ms in built if ms is not None]
    print(f"kernel library in {library_dir()} (${LIBRARY_ENV}): {len(built)} kernels, "
          f"{len(made)} compiled now in {sum(made):.0f} ms of process CPU")  # fmt: skip


if __name__ == "__main__":
    main()
