"""The compiler: HLO in, Executable out.

Compiling parses the input (a module or HLO text) into the runtime's own copy, turns buffer
donors into aliases (the buffer-donor-to-alias pass), verifies, checks every custom call
against the custom-call registry (an unknown target or a typed-FFI type mismatch is a
compile-time CustomCallError naming the instruction), and prints the result: that text is
what the executable keeps, fingerprints and serializes. Backends compile it further when
the executable is loaded onto a client's devices.

A global program with sharding annotations (what JAX lowers for `jax.jit` with shardings,
or a shard_map) compiled for `num_partitions` > 1 is SPMD-partitioned first, as XLA does:
the executable runs the per-device program (xlapy.passes.spmd), and its text's parameter
and root `sharding=` attributes say which piece of each global array a device holds.
"""

from __future__ import annotations

import contextlib
import sys

from xlapy.backends import BACKENDS, get_backend
from xlapy.backends.base import Backend
from xlapy.backends.custom_calls import CustomCallRegistry, check_custom_calls
from xlapy.backends.options import BackendOptionError
from xlapy.ir.module import HloModule
from xlapy.ir.parser import parse_module
from xlapy.ir.verifier import verify
from xlapy.runtime.debug import check_debug_options
from xlapy.runtime.errors import RuntimeApiError
from xlapy.runtime.executable import Executable
from xlapy.runtime.options import CompileOptions

# runtime platform -> the custom-call platform its targets are registered for
CUSTOM_CALL_PLATFORMS = {"interpreter": "Host", "cpu": "Host"}


def phase(name: str) -> contextlib.AbstractContextManager[None]:
    """The CPU compiler's `phase(name)` (xlapy.backends.cpu.jit.compile_timing: what `xlapy
    bench -v` breaks a cold compile into) when that module is loaded, else nothing: only a
    loaded module can be recording, and the runtime does not load the CPU backend for it."""
    timing = sys.modules.get("xlapy.backends.cpu.jit.compile_timing")
    return contextlib.nullcontext() if timing is None else timing.phase(name)


def backend_for(platform: str) -> Backend:
    """The backend that runs programs of `platform` (the interpreter for platforms without
    one of their own)."""
    return get_backend(platform if platform in BACKENDS else "interpreter")


def check_program(program: object, kinds: tuple[type, ...]) -> None:
    """RuntimeApiError unless `program` is one of `kinds` (a module, text, bytes)."""
    if not isinstance(program, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise RuntimeApiError(f"a program to compile is a {names}, got {type(program).__name__}")


def check_options(options: object) -> CompileOptions | None:
    """`options` when it is None or CompileOptions, else RuntimeApiError."""
    if options is None:
        return None
    if not isinstance(options, CompileOptions):
        raise RuntimeApiError(
            f"compile options are a CompileOptions (CompileOptions.make(...)), got {options!r}"
        )
    return options


def check_backend_options(platform: str, options: CompileOptions) -> None:
    """RuntimeApiError for a backend option the backend of `platform` (or the runtime) does
    not honour, naming it and the valid ones, or for a value it cannot take
    (xlapy.backends.options)."""
    try:
        backend_for(platform).check_options(dict(options.backend_options), user=True)
    except BackendOptionError as e:
        raise RuntimeApiError(str(e)) from e


class Compiler:
    """Compiles modules for one platform (PJRT's PjRtCompiler). Custom-call targets are
    looked up in `registry` first, then in the global registry."""

    def __init__(self, platform: str, registry: CustomCallRegistry | None = None):
        self.platform = platform
        self.registry = registry
        self.custom_call_platform = CUSTOM_CALL_PLATFORMS.get(platform, "Host")

    def compile(
        self, program: HloModule | str, options: CompileOptions | None = None
    ) -> Executable:
        """An Executable for `program` (an HloModule or HLO text); VerifierError or
        HloParseError when the program is invalid."""
        check_program(program, (HloModule, str))
        options = check_options(options) or CompileOptions()
        text = program if isinstance(program, str) else program.to_text()
        return self.compile_canonical(parse_module(text), options)

    def compile_canonical(
        self, module: HloModule, options: CompileOptions, text: str | None = None
    ) -> Executable:
        """Compile a module the runtime owns (it is modified); `text`, when the caller has
        it, is `module.to_text()` (used as the executable's text unless donors change the
        module)."""
        # (the passes are imported here: a warm compile from a program image never gets here,
        # and importing them would cost it more than the compile does)
        from xlapy.passes.donors import BufferDonorToAlias
        from xlapy.passes.spmd import needs_partitioning, partition

        check_debug_options(options)
        check_backend_options(self.platform, options)
        self.verify_text(module, text)
        if needs_partitioning(module, options.num_partitions):
            partition(module, options.num_partitions)  # as XLA: SPMD-partition a global program
            verify(module)
            text = None
        self.check_custom_calls(module)
        if BufferDonorToAlias().run(module):  # the new aliases are checked too
            verify(module)
            text = None
        return Executable(
            module, options, self.platform, module.to_text() if text is None else text
        )

    def verify_text(self, module: HloModule, text: str | None) -> None:
        """verify(module), whose text is `text`: skipped on the CPU platform when the disk
        cache holds this user's authenticated record that the same sources verified the
        same text (the warm compile's largest fixed cost after parsing), which a pass
        writes."""
        if self.platform != "cpu" or text is None:
            verify(module)
            return
        from xlapy.backends.cpu.jit import executable_cache

        with phase("verification"):
            if executable_cache.verified_before(text):
                return
            verify(module)
            executable_cache.mark_verified(text)

    def load_text(self, hlo_text: str, options: CompileOptions) -> Executable:
        """An Executable from already-compiled HLO text (deserialization)."""
        check_debug_options(options)
        check_backend_options(self.platform, options)
        module = parse_module(hlo_text)
        verify(module)
        self.check_custom_calls(module)
        return Executable(module, options, self.platform, hlo_text)

    def check_custom_calls(self, module: HloModule) -> None:
        """CustomCallError naming every custom call of `module` whose target is unknown
        or does not accept the call (see xlapy.backends.custom_calls.check_custom_calls)."""
        check_custom_calls(module, self.custom_call_platform, self.registry)
