# LLVM IR text -> native code in this process, through llvmlite.
#
# The target machine is the host CPU with all its features (so AVX/FMA are used where the
# machine has them). Optimization is LLVM's O3 pipeline built by the new pass manager
# (PassBuilder with loop and SLP vectorization on); $XLAPY_CPU_LLVM_OPT picks level 1 or 2
# instead (`opt_level`). The cost is in the code, not per object: linking a program's 77
# kernels into one module saved no LLVM time (benchmarks/RESULTS.md, compile time, third
# session), so each kernel stays its own object. The optimized module is emitted as an
# object file; objects are loaded in batches into one MCJIT execution engine shared by the
# whole process (`SharedEngine`: one finalization per batch, no engine per object).
#
# Code is emitted non-PIC with the large code model: constants, constant pools and libm
# functions are reached through absolute 64-bit addresses (R_X86_64_64), which MCJIT's
# loader resolves correctly wherever the sections land and however many objects share an
# engine. (Position-independent large-model code reaches its constant pools relative to
# the GOT; with several such objects in one engine the loader used the first object's GOT
# for all of them, and the other kernels read wrong constants. The small code model's
# 32-bit relative offsets would instead assume that code and data lie within 2 GiB.)
#
# Compiled objects are cached on disk, keyed by a SHA-256 of the IR text, the CPU name and
# features, the xlapy and llvmlite versions and the cache format. The files are read and
# written by disk_cache.py: a private directory, every entry authenticated with a per-user
# secret key (HMAC), regular files of bounded size only; anything else reads as a miss (and
# is compiled and written again).
#
# Threads: optimization and code emission of different modules may run concurrently (each
# compile parses into an LLVM context of its own and uses a target machine of its own
# thread, and calls the two long-running C entry points without llvmlite's global lock;
# ctypes releases the GIL). Loading is serialized. Objects are compiled with their kernel
# function renamed to a name derived from the key (`exported_symbol`), so the objects of
# one engine never export the same name.

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import os
import threading
import weakref
from dataclasses import dataclass

import llvmlite
import llvmlite.binding as llvm

import xlapy
from xlapy.backends.cpu.codegen.math import LIBM_FUNCTIONS
from xlapy.backends.cpu.jit.disk_cache import FORMAT, read_entry, write_entry
from xlapy.backends.cpu.jit.disk_cache import cache_dir as cache_dir  # where the files are
from xlapy.errors import XlapyError

_lock = threading.Lock()
_local = threading.local()


@functools.cache
def _initialize() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    libm = ctypes.util.find_library("m")
    if libm:
        lib = ctypes.CDLL(libm)
        for name in LIBM_FUNCTIONS | {"fmod", "fmodf"}:
            llvm.add_symbol(name, ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)


@dataclass(frozen=True, slots=True)
class HostTarget:
    """The host CPU as LLVM sees it."""

    triple: str
    cpu: str
    features: str


@functools.cache
def host_target() -> HostTarget:
    """Triple, CPU name and feature string of the machine running xlapy."""
    _initialize()
    return HostTarget(
        llvm.get_process_triple(), llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    )


@functools.cache
def target_machine():
    """The O3 target machine for the host CPU that optimization and code emission share."""
    return new_target_machine()


def new_target_machine():
    """A fresh O3 target machine for the host CPU (an execution engine takes ownership of
    the one it is given, so each engine needs its own); non-PIC, large code model (see
    the top of this file)."""
    host = host_target()
    target = llvm.Target.from_triple(host.triple)
    return target.create_target_machine(
        cpu=host.cpu, features=host.features, opt=3, reloc="static", codemodel="large"
    )


@functools.cache
def data_layout() -> str:
    """The host target's data layout string."""
    return str(target_machine().target_data)


OPT_LEVEL_ENV = "XLAPY_CPU_LLVM_OPT"
"""Environment variable: LLVM's optimization level for kernels, 1-3 (default DEFAULT_OPT_LEVEL)."""
DEFAULT_OPT_LEVEL = 3


@functools.cache
def opt_level() -> int:
    """LLVM's optimization level (the new pass manager's speed level) for every object this
    process compiles: $XLAPY_CPU_LLVM_OPT, read once, else DEFAULT_OPT_LEVEL. Part of every
    cache key, so objects made at another level are not reused."""
    raw = os.environ.get(OPT_LEVEL_ENV, "").strip()
    if not raw:
        return DEFAULT_OPT_LEVEL
    if raw not in ("1", "2", "3"):
        raise XlapyError(f"${OPT_LEVEL_ENV} must be 1, 2 or 3, got {raw!r}")
    return int(raw)


def content_key(*parts: str) -> str:
    """A SHA-256 over `parts`, this machine's CPU and features, the xlapy and llvmlite
    versions, LLVM's optimization level and the cache format: what every cache file is
    named by."""
    host = host_target()
    h = hashlib.sha256()
    level = f"O{opt_level()}"
    for part in (*parts, host.triple, host.cpu, host.features, xlapy.__version__, level):
        h.update(part.encode())
        h.update(b"\0")
    h.update(llvmlite.__version__.encode())
    h.update(FORMAT)
    return h.hexdigest()


def cache_key(ir_text: str) -> str:
    """The content hash naming the object compiled from `ir_text` on this machine."""
    return content_key(ir_text)


def exported_symbol(key: str) -> str:
    """The name the kernel function of the object with cache key `key` is compiled under."""
    return f"xlapy_{key[:40]}"


def _thread_target_machine():
    tm = getattr(_local, "tm", None)
    if tm is None:
        tm = _local.tm = new_target_machine()
    return tm


def optimize(ir_text: str) -> llvm.ModuleRef:
    """Parse `ir_text` and run LLVM's O3 pipeline on it for the host CPU."""
    mod = _parse(ir_text, llvm.get_global_context())
    _run_pipeline(mod, target_machine(), locked=True)
    return mod


def _parse(ir_text: str, context, rename: tuple[str, str] | None = None) -> llvm.ModuleRef:
    mod = llvm.parse_assembly(ir_text, context)
    mod.triple = host_target().triple
    mod.data_layout = data_layout()
    if rename is not None:
        mod.get_function(rename[0]).name = rename[1]
    mod.verify()
    return mod


def _run_pipeline(mod: llvm.ModuleRef, tm, locked: bool) -> None:
    pto = llvm.PipelineTuningOptions(speed_level=opt_level())
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_interleaving = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    mpm = pb.getModulePassManager()
    if locked:
        mpm.run(mod, pb)
    else:
        _unlocked("LLVMPY_RunNewModulePassManager")(mpm, mod, pb)


def _unlocked(name: str):
    """The C entry point `name` of llvmlite without llvmlite's process-wide lock. Only for
    work on a module in a context of its own with a target machine of this thread's: LLVM
    compiles such modules concurrently."""
    fn = getattr(llvm.ffi.lib, name)
    return getattr(fn, "_cfn", fn)  # an llvmlite without the wrapper: the locked call


def _emit_object_unlocked(mod: llvm.ModuleRef, tm) -> bytes:
    with llvm.ffi.OutputString() as err:
        buf = _unlocked("LLVMPY_TargetMachineEmitToMemory")(tm, mod, 1, err)
        if not buf:
            raise RuntimeError(str(err))
    try:
        start = llvm.ffi.lib.LLVMPY_GetBufferStart(buf)
        return ctypes.string_at(start, llvm.ffi.lib.LLVMPY_GetBufferSize(buf))
    finally:
        llvm.ffi.lib.LLVMPY_DisposeMemoryBuffer(buf)


def assembly(mod: llvm.ModuleRef) -> str:
    return target_machine().emit_assembly(mod)


@dataclass(frozen=True, slots=True)
class CompiledObject:
    """An object file and where it came from."""

    key: str
    data: bytes
    from_cache: bool


def compile_object(
    ir_text: str, use_cache: bool = True, symbol: str = "xla_kernel", key: str | None = None
) -> CompiledObject:
    """The native object for `ir_text` (whose kernel function is named `symbol`; the object
    exports it as `exported_symbol(key)`), from the disk cache when it is there. Safe to call
    from several threads at once."""
    key = key or cache_key(ir_text)
    if use_cache:
        data = read_entry(key, ".o")
        if data is not None:
            return CompiledObject(key, data, True)
    tm = _thread_target_machine()
    mod = _parse(ir_text, llvm.create_context(), (symbol, exported_symbol(key)))
    _run_pipeline(mod, tm, locked=False)
    data = _emit_object_unlocked(mod, tm)
    if use_cache:
        write_entry(key, ".o", data)
    return CompiledObject(key, data, False)


def _new_engine() -> llvm.ExecutionEngine:
    empty = llvm.parse_assembly("")
    empty.triple = host_target().triple
    return llvm.create_mcjit_compiler(empty, new_target_machine())


class CodeBlock:
    """One batch of objects loaded into an execution engine of its own. The code lives as
    long as the block: every kernel (and native loop) that runs it holds the block, and
    when the last one dies the engine is disposed and its code memory freed."""

    __slots__ = ("__weakref__", "addresses", "engine")

    def __init__(self, engine: llvm.ExecutionEngine, addresses: dict[str, int]):
        self.engine, self.addresses = engine, addresses


class SharedEngine:
    """Loads kernel objects for the process. Objects are added in batches, each batch into
    a new engine finalized once (a CodeBlock: ~1 ms for a target machine, an empty module
    and a finalization, paid once per batch, and a compile's kernels mostly load as one
    batch). An object is loaded once while its code is alive: a key already loaded in a
    living block is answered from that block (the same key is the same code, whether it
    came from the disk cache or not), so the new user keeps that block alive too. The
    blocks are held weakly here: a program's code is freed when its last executable dies.
    A batch that fails to load is dropped with its engine (nothing runs its code)."""

    def __init__(self) -> None:
        self._blocks: weakref.WeakValueDictionary[str, CodeBlock] = weakref.WeakValueDictionary()
        self.blocks_created = 0  # counters for tests and memory reports
        self.blocks_freed = 0

    def load(self, objects: list[tuple[str, bytes]]) -> dict[str, tuple[int, CodeBlock]]:
        """Load the objects (key, data) not loaded in a living block; the address of every
        given object's kernel function (`exported_symbol(key)`) and the block holding it,
        by key. The caller keeps the block for as long as it runs the code."""
        _initialize()
        with _lock:
            found = {k: self._blocks.get(k) for k, _ in objects}
            fresh = [(k, d) for k, d in dict(objects).items() if found[k] is None]
            if fresh:
                block = self._load(fresh)
                found.update({k: block for k, _ in fresh})
            return {k: (b.addresses[k], b) for k, b in found.items() if b is not None}

    def live_blocks(self) -> int:
        """How many blocks of code are alive (loaded and still used)."""
        with _lock:
            return len({id(b) for b in self._blocks.values()})

    def _load(self, fresh: list[tuple[str, bytes]]) -> CodeBlock:
        engine = _new_engine()
        for _, data in fresh:
            engine.add_object_file(llvm.ObjectFileRef.from_data(data))
        engine.finalize_object()
        addresses = {k: engine.get_function_address(exported_symbol(k)) for k, _ in fresh}
        missing = [k for k, a in addresses.items() if not a]
        if missing:
            raise RuntimeError(f"symbol {exported_symbol(missing[0])} is not in its object")
        block = CodeBlock(engine, addresses)
        self.blocks_created += 1
        weakref.finalize(block, self._freed)
        for k in addresses:
            self._blocks[k] = block
        return block

    def _freed(self) -> None:
        self.blocks_freed += 1


@functools.cache
def shared_engine() -> SharedEngine:
    """The process's SharedEngine."""
    return SharedEngine()
