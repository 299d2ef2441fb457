# The CPU compiler: module -> passes -> buffer assignment -> thunk sequence.
#
# 1. The module (a private copy: the caller's is never changed) runs the default CPU pipeline
#    (simplification, fusion, flatten-call-graph, copy insertion), then is prepared for and
#    given a buffer assignment. The prepared module's text is kept on disk
#    (jit/module_cache.py), so a later compile of the same module skips the passes; and the
#    whole program's entry (jit/executable_cache.py: that module, which kernel each
#    instruction runs and the kernels' objects) lets a warm compile read one file, then
#    assign buffers and lower as always with the kernels taken from the entry.
# 2. Each computation that runs sequentially (the entry, while bodies and conditions,
#    branches, called computations) becomes a ThunkSequence in its schedule's order, each
#    instruction lowered by the first strategy of the lowering table that applies
#    (lowering.py): forwarding ops, tuples, parameters and constants need no thunk
#    (constants are written into their allocation once, here); kernels compile once per
#    process per computation, the JIT caches objects on disk, and the LLVM work of the
#    program's kernels runs on a thread pool while lowering goes on. A kernel whose compile
#    fails is lowered again by its next strategy.
# 3. Every thunk declares the slices it reads and writes and answers its cost(); a sequence
#    with independent thunks worth overlapping gets a graph plan and runs them concurrently
#    (runtime/thunk_graph.py; option `thunk_concurrency`).

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from xlapy.backends.base import Fallback
from xlapy.backends.cpu.codegen.emitter import denormals_flushed
from xlapy.backends.cpu.jit import executable_cache, module_cache
from xlapy.backends.cpu.jit.compile_timing import phase
from xlapy.backends.cpu.jit.disk_cache import warn_rejected
from xlapy.backends.cpu.jit.engine import compiling_for, parse_isa
from xlapy.backends.cpu.jit.executable_cache import KernelBook
from xlapy.backends.cpu.jit.kernel import Kernel, using_book
from xlapy.backends.cpu.runtime.loadable import deferred_attribute
from xlapy.backends.cpu.runtime.thunk import ThunkSequence
from xlapy.backends.options import memory_scheduler
from xlapy.errors import EvaluationError, XlapyError
from xlapy.gc_pause import collector_paused
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module

if TYPE_CHECKING:
    from xlapy.memory.buffer_assignment import BufferAssignment

# Lowering, buffer assignment and the passes are imported by the functions that run them: a
# warm compile (a program image, jit/program_image.py) unpickles a CompiledModule and runs
# none of them, and importing them would cost it more than the compile (~150 ms of CPU).


def load_compiler() -> None:
    """Import what a cold compile runs and a warm one does not (the passes, buffer
    assignment, the lowering and the code generators it pulls in), and do the compiler's
    other once-a-process work: set up LLVM's native target and take the digest of xlapy's
    sources that every cache key holds (module_cache.package_fingerprint: ~7 ms of CPU
    with an empty cache directory). A process's first cold compile does all of it itself
    (~120 ms of wall time, ~250 ms of CPU on the 2-core test machine, once per process).
    For a caller that wants that cost out of its first compile: a server warming up, or a
    benchmark timing cold compiles against XLA's, whose compiler is loaded with jaxlib
    before any timer starts (xlapy.tools.bench.time_compile)."""
    import xlapy.backends.cpu.lowering
    import xlapy.memory.buffer_assignment
    import xlapy.passes.donors
    import xlapy.passes.pipelines
    import xlapy.passes.spmd  # noqa: F401
    from xlapy.backends.cpu.jit import engine

    engine.native_target()
    module_cache.package_fingerprint()


@dataclass
class CompiledModule:
    """What the CPU compiler produces: the optimized module, its buffer assignment, the
    entry's thunk sequence and the constant allocations' bytes (shared, read-only)."""

    module: HloModule
    assignment: BufferAssignment
    entry: ThunkSequence
    constants: dict[int, np.ndarray]
    fallbacks: list[Fallback] = field(default_factory=list)
    """The instructions run with the interpreter's rule alone, and why."""
    python_loops: list[Fallback] = field(default_factory=list)
    """The while loops driven from Python (not one native function), and why."""
    IMAGE_DEFERRED = ("module", "assignment")
    """What a program image unpickles on first use (runtime/loadable.py): running needs
    neither, the reports (listings, memory figures, dumps) read them."""

    def __getattr__(self, name: str) -> Any:
        return deferred_attribute(self, name)

    def kernels(self) -> list[Kernel]:
        seen: dict[int, Kernel] = {}
        for k in self.entry.kernels():
            assert isinstance(k, Kernel), "kernel thunks run JIT-compiled kernels"
            seen.setdefault(id(k), k)
        return list(seen.values())

    def thunk_listing(self) -> str:
        """The thunk sequence as text: kind, instruction and slices of every thunk."""
        lines = [f"CPU executable {self.module.name}"]
        for alloc in self.assignment.allocations:
            lines.append(f"  {alloc.describe()}")
        lines += self.entry.describe()
        return "\n".join(lines) + "\n"


def compile_module(
    module: HloModule, options: Mapping[str, Any] | None = None, *, text: str | None = None
) -> CompiledModule:
    """Optimize a copy of `module`, assign its buffers and lower it to thunks. `text`, when
    the caller has it, is `module.to_text()`. A program compiled before with the same
    options comes from its whole-executable cache entry (jit/executable_cache.py). Python's
    cyclic garbage collector is paused meanwhile (xlapy/gc_pause.py)."""
    options = dict(options or {})
    with collector_paused(), compiling_for(_max_isa(options)):
        return _compile_module(module, options, module.to_text() if text is None else text)


def _max_isa(options: Mapping[str, Any]) -> str | bool | None:
    """The ISA level option `max_isa` asks for (None: the host's every feature), or False
    when it is not given ($XLAPY_CPU_MAX_ISA decides)."""
    if "max_isa" not in options:
        return False
    return parse_isa(options["max_isa"], "the option max_isa")


def _compile_module(module: HloModule, options: dict[str, Any], text: str) -> CompiledModule:
    """`compile_module` with the collector paused and the ISA level set."""
    from xlapy.backends.cpu.lowering import Lowering
    from xlapy.memory.buffer_assignment import assign_buffers

    key = executable_cache.cache_key(text, options, denormals_flushed(options))
    use_entries = executable_cache.enabled()
    entry = executable_cache.read(key) if use_entries else None
    prepared = _cached_module(entry, module) if entry is not None else None
    book = entry.book if entry is not None and prepared is not None else KernelBook()
    planned = None
    if prepared is None:
        prepared, prepared_text, planned = _prepared_module(text, options, module)
    else:
        prepared_text = None
    if planned is not None:
        assignment = planned
    else:
        with phase("buffer assignment"):
            assignment = assign_buffers(prepared)
    entry_comp = prepared.entry_computation()
    with using_book(book):
        lowering = Lowering(assignment, options)
        with phase("lowering to thunks"):
            entry_seq = lowering.sequence(entry_comp)
            lowering.plan_native_runs(entry_seq)
        with phase("waiting for LLVM"):
            failed = lowering.wait_for_kernels()
        if failed:  # lower again, those instructions as rule thunks
            lowering = Lowering(assignment, options, failed)
            with phase("lowering to thunks"):
                entry_seq = lowering.sequence(entry_comp)
                lowering.plan_native_runs(entry_seq)
            with phase("waiting for LLVM"):
                lowering.wait_for_kernels()
        with phase("native while loops"):
            lowering.compile_loops()
    for why in book.rejected:
        warn_rejected(key + executable_cache.SUFFIX, why)
    if use_entries and (prepared_text is not None or book.rejected) and not failed:
        if prepared_text is None:
            prepared_text = prepared.to_text()
        book.known.clear()
        with phase("cache writes"):
            executable_cache.write(key, prepared_text, book)
    return CompiledModule(
        prepared,
        assignment,
        entry_seq,
        _constant_memory(assignment),
        lowering.fallbacks,
        lowering.python_loops,
    )


def _cached_module(entry: executable_cache.Entry, original: HloModule) -> HloModule | None:
    """The optimized module of a whole-executable entry, when it parses and has
    `original`'s parameter and result shapes (else a CacheEntryWarning, and None)."""
    try:
        module = parse_module(entry.module_text)
    except XlapyError as e:
        warn_rejected(entry.key + executable_cache.SUFFIX, f"its module does not parse ({e})")
        return None
    if _entry_signature(module) != _entry_signature(original):
        warn_rejected(
            entry.key + executable_cache.SUFFIX,
            "its module's parameter and result shapes are not the program's",
        )
        return None
    return module


def plan_module(
    module: HloModule, options: Mapping[str, Any] | None = None, *, text: str | None = None
) -> tuple[HloModule, BufferAssignment]:
    """The optimized copy of `module` and the buffer assignment that `compile_module` lowers
    and the program executes (the memory reports read this, without generating code)."""
    from xlapy.memory.buffer_assignment import assign_buffers

    options = dict(options or {})
    prepared, _, planned = _prepared_module(
        module.to_text() if text is None else text, options, module
    )
    return prepared, planned if planned is not None else assign_buffers(prepared)


def _prepared_module(
    text: str, options: Mapping[str, Any], original: HloModule
) -> tuple[HloModule, str, BufferAssignment | None]:
    """A copy of `original` (whose text is `text`) optimized and prepared for buffer
    assignment, from the compiled-module cache when an earlier compile made it
    (module_cache.py) and it has `original`'s parameter and result shapes; its text; and
    its buffer assignment when preparing it made one (the memory-plan choice's winner)."""
    from xlapy.memory.buffer_assignment import prepare_with_plan
    from xlapy.passes.pipelines import default_cpu_pipeline

    key = module_cache.cache_key(text, options)
    cached = module_cache.read(key)
    if cached is not None:
        try:
            module = parse_module(cached)
        except XlapyError:
            module = None
        if module is not None and _entry_signature(module) == _entry_signature(original):
            return module, cached, None
    with phase("copying the module"):  # (what parsing `text` gives, 4-8x cheaper)
        module = original.copy()
    if options.get("optimize", True):
        with phase("HLO passes"):
            default_cpu_pipeline(verify=bool(options.get("verify", False))).run(module)
    with phase("schedule, copies, memory-plan choice"):
        module, assignment = prepare_with_plan(module, memory_scheduler(options))
    with phase("printing the module"):
        prepared_text = module.to_text()
    with phase("cache writes"):
        module_cache.write(key, prepared_text)
    return module, prepared_text, assignment


def _entry_signature(module: HloModule) -> tuple[str, ...] | None:
    """The entry computation's parameter and result shapes, as text without layouts."""
    entry = module.entry
    if entry is None or entry.root is None:
        return None
    shapes = [p.shape for p in entry.parameters] + [entry.root.shape]
    return tuple(s.to_text(with_layout=False) for s in shapes)


def _constant_memory(assignment: BufferAssignment) -> dict[int, np.ndarray]:
    memory = {}
    for alloc in assignment.allocations:
        if not alloc.is_constant:
            continue
        mem = np.zeros(alloc.size, np.uint8)
        for buffer, offset in alloc.buffers:
            for value in buffer.values:
                instr = value.instruction
                if instr.opcode is not Opcode.CONSTANT or not value.shape.is_array:
                    continue
                literal = instr.literal
                if literal is None:
                    raise EvaluationError(
                        f"{instr.name}: the constant's value was elided from the text "
                        f"(constant({{...}})), so it cannot be compiled"
                    )
                for i in value.index:
                    literal = literal.elements[i]
                assert literal.array is not None, "an array literal holds its data"
                shape = value.shape
                order = tuple(reversed(shape.layout_or_default.minor_to_major))
                data = np.ascontiguousarray(np.transpose(literal.array, order))
                raw = data.reshape(-1).view(np.uint8)
                mem[offset : offset + raw.size] = raw
        mem.flags.writeable = False
        memory[alloc.index] = mem
    return memory
