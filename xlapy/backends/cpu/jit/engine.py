# LLVM IR text -> native code in this process, through llvmlite.
#
# The target machine is the host CPU with all its features (so AVX/FMA are used where the
# machine has them). Optimization is LLVM's O3 pipeline built by the new pass manager
# (PassBuilder with loop and SLP vectorization on); $XLAPY_CPU_LLVM_OPT picks level 1 or 2
# instead (`opt_level`); a hand-written kernel whose loops are already vectorized and tiled
# may ask for a short pipeline instead (`compile_object(light=True)`, the direct
# convolution: a third of O3's time, the same inner loop); code that only calls other code
# (a native loop or run, codegen/emit_loop.py) asks for the short pipeline and code
# generation at level 0 (`compile_object(driver=True)`: a tenth of the time). The cost is in
# the code, not per object: linking a program's 77 kernels into one module saved no LLVM
# time (benchmarks/RESULTS.md, compile time, third session; 81 of a BERT step's elementwise
# kernels in one module cost 12% less than apart, branch llvm2), so each kernel stays its
# own object.
# The optimized module is emitted as an object file; objects are loaded in batches into one
# MCJIT execution engine shared by the whole process (`SharedEngine`: one finalization per
# batch, no engine per object).
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

import collections
import ctypes
import ctypes.util
import functools
import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

import xlapy
from xlapy.backends.cpu.codegen.math import LIBM_FUNCTIONS
from xlapy.backends.cpu.jit.compile_timing import phase
from xlapy.backends.cpu.jit.disk_cache import FORMAT, read_entry, write_entry
from xlapy.backends.cpu.jit.disk_cache import cache_dir as cache_dir  # where the files are
from xlapy.errors import XlapyError

_lock = threading.Lock()
_local = threading.local()


LLVM_OPTIONS = ("-unswitch-threshold=1",)
"""LLVM command-line options xlapy sets once per process (part of every cache key).
Non-trivial loop unswitching off: the O3 pipeline otherwise copies a loop nest once per
loop-invariant condition in its body, 2^k copies for k conditions, each then vectorized and
unrolled. A kernel of JAX's rolled threefry loop has six (its shift amounts are state
elements, and a shift by an amount >= the bit width needs a select): 1.5 MB of IR and 14 s
of LLVM time for one 5 KB kernel, minutes for a GPT-2 training step with dropout, where
keeping the selects gives 8-lane code with the amounts splatted once (1.2 KB of object).
A threshold of 1 leaves trivial unswitching (no copies) alone."""


@functools.cache
def _initialize() -> None:
    for option in LLVM_OPTIONS:
        llvm.set_option("xlapy", option)
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    libm = ctypes.util.find_library("m")
    if libm:
        lib = ctypes.CDLL(libm)
        for name in LIBM_FUNCTIONS | {"fmod", "fmodf"}:
            llvm.add_symbol(name, ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)


# Compiler-runtime functions LLVM may call from a kernel that libc/libm do not provide.
# LLVM narrows f64 -> f16 with a call to __truncdfhf2 (x86 has no instruction for it); it
# makes one out of an f64 math result truncated to f32 and stored as f16 (an f16 cbrt over a
# transposed operand), and the JIT left the call unresolved: the kernel jumped to address 0.
# Each is compiled here, once, the first time a loaded object names it.
RUNTIME_BUILTINS = {
    # round to odd in f32 (truncate toward zero, set the last bit when inexact), then the
    # one rounding to f16 (native with F16C) gives the correctly rounded result
    "__truncdfhf2": """
declare double @llvm.fabs.f64(double)
define half @__truncdfhf2(double %x) {
  %y = fptrunc double %x to float
  %bits = bitcast float %y to i32
  %ay = call double @llvm.fabs.f64(double %x)
  %yd = fpext float %y to double
  %ayd = call double @llvm.fabs.f64(double %yd)
  %away = fcmp ogt double %ayd, %ay
  %less = sub i32 %bits, 1
  %toward = select i1 %away, i32 %less, i32 %bits
  %tf = bitcast i32 %toward to float
  %td = fpext float %tf to double
  %inexact = fcmp one double %td, %x
  %odd = or i32 %toward, 1
  %rbits = select i1 %inexact, i32 %odd, i32 %toward
  %r = bitcast i32 %rbits to float
  %nan = fcmp uno double %x, %x
  %pick = select i1 %nan, float %y, float %r
  %h = fptrunc float %pick to half
  ret half %h
}
""",
}
_builtin_engines: dict[str, object] = {}


def _provide_builtins(data: bytes) -> None:
    """Compile and register the RUNTIME_BUILTINS that object `data` names (under _lock)."""
    for name, text in RUNTIME_BUILTINS.items():
        if name in _builtin_engines or name.encode() not in data:
            continue
        module = llvm.parse_assembly(text)
        module.triple = llvm.get_process_triple()
        module.verify()
        target = llvm.Target.from_triple(module.triple)
        machine = target.create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=2
        )
        engine = llvm.create_mcjit_compiler(module, machine)
        engine.finalize_object()
        llvm.add_symbol(name, engine.get_function_address(name))
        _builtin_engines[name] = engine  # kept: loaded kernels call into it


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


def new_target_machine(level: int = 3):
    """A fresh target machine for the host CPU, code generation at `level` (3 unless said:
    see DRIVER_CODEGEN_LEVEL); an execution engine takes ownership of the one it is given,
    so each engine needs its own; non-PIC, large code model (see the top of this file)."""
    host = host_target()
    target = llvm.Target.from_triple(host.triple)
    return target.create_target_machine(
        cpu=host.cpu, features=host.features, opt=level, reloc="static", codemodel="large"
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
    for part in (*parts, host.triple, host.cpu, host.features, xlapy.__version__, level,
                 *LLVM_OPTIONS):  # fmt: skip
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


DRIVER_CODEGEN_LEVEL = 0
"""Code generation level of driver code (`compile_object(driver=True)`): FastISel and the
fast register allocator. A native run of 552 kernel calls in one basic block (5,232 lines of
IR) took 305 ms of code generation at level 3 (instruction selection 35%, the post-RA
scheduler 20%, greedy register allocation 15%) and 13 ms at level 0, for an object 40%
larger: a few more moves around each call (benchmarks/RESULTS.md, branch llvm2)."""


def _thread_target_machine(level: int = 3):
    machines = getattr(_local, "machines", None)
    if machines is None:
        machines = _local.machines = {}
    tm = machines.get(level)
    if tm is None:
        tm = machines[level] = new_target_machine(level)
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


def _run_pipeline(mod: llvm.ModuleRef, tm, locked: bool, light: bool = False) -> None:
    pto = llvm.PipelineTuningOptions(speed_level=opt_level())
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_interleaving = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    mpm = _light_pipeline() if light else pb.getModulePassManager()
    if locked:
        mpm.run(mod, pb)
    else:
        _unlocked("LLVMPY_RunNewModulePassManager")(mpm, mod, pb)


def _light_pipeline():
    """The light pipeline (see compile_object): promote allocas to registers, simplify,
    unroll the loops whose metadata asks for it, drop dead code."""
    mpm = llvm.create_new_module_pass_manager()
    mpm.add_sroa_pass()
    mpm.add_instruction_combine_pass()
    mpm.add_simplify_cfg_pass()
    mpm.add_loop_rotate_pass()
    mpm.add_loop_unroll_pass()
    mpm.add_instruction_combine_pass()
    mpm.add_simplify_cfg_pass()
    mpm.add_dead_code_elimination_pass()
    return mpm


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
class LinkedIR:
    """IR for one object made of several modules: `main` with each of `linked` linked into
    it, and then the functions named in `internal` given internal linkage (so that they are
    not exported, and LLVM drops them once it has inlined every call): a native loop with
    its small kernels compiled into it (codegen/emit_loop.py)."""

    main: str
    linked: tuple[str, ...]
    internal: tuple[str, ...]


def _parse_linked(ir: LinkedIR, context, rename: tuple[str, str]) -> llvm.ModuleRef:
    mod = llvm.parse_assembly(ir.main, context)
    for text in ir.linked:
        other = llvm.parse_assembly(text, context)
        other.triple, other.data_layout = host_target().triple, data_layout()
        mod.link_in(other)
    for name in ir.internal:
        mod.get_function(name).linkage = "internal"
    mod.triple = host_target().triple
    mod.data_layout = data_layout()
    mod.get_function(rename[0]).name = rename[1]
    mod.verify()
    return mod


@dataclass(frozen=True, slots=True)
class CompiledObject:
    """An object file and where it came from."""

    key: str
    data: bytes
    from_cache: bool


def compile_object(
    ir_text: str | LinkedIR,
    use_cache: bool = True,
    symbol: str = "xla_kernel",
    key: str | None = None,
    light: bool = False,
    directory: Path | None = None,
    driver: bool = False,
) -> CompiledObject:
    """The native object for `ir_text` (whose kernel function is named `symbol`; the object
    exports it as `exported_symbol(key)`), from the disk cache (or `directory`: the kernel
    library's) when it is there. Safe to call from several threads at once. `light`:
    optimize with a short pipeline instead of O3 (_light_pipeline), for hand-written code
    whose loops are already vectorized and tiled for registers, where O3 makes the same
    inner loops at two to three times the cost; `driver`: code that only calls other code
    and moves bytes (a native loop, codegen/emit_loop.py), optimized by the short pipeline
    and generated at DRIVER_CODEGEN_LEVEL (not for LinkedIR: kernels linked into a loop's
    object are real code, compiled as usual). The caller's key must say which (`key` is
    required for any of them, as for LinkedIR)."""
    linked = isinstance(ir_text, LinkedIR)
    if (light or driver or linked) and key is None:
        raise ValueError("a light, driver or linked compile needs the key its caller made for it")
    driver = driver and not linked
    key = key or cache_key(str(ir_text))
    if use_cache:
        data = read_entry(key, ".o", directory)
        if data is not None:
            return CompiledObject(key, data, True)
    tm = _thread_target_machine(DRIVER_CODEGEN_LEVEL if driver else 3)
    with phase("LLVM parse and verify"):
        rename = (symbol, exported_symbol(key))
        if isinstance(ir_text, LinkedIR):
            mod = _parse_linked(ir_text, llvm.create_context(), rename)
        else:
            mod = _parse(ir_text, llvm.create_context(), rename)
    with phase("LLVM optimization"):
        _run_pipeline(mod, tm, locked=False, light=light or driver)
    with phase("LLVM code generation"):
        data = _emit_object_unlocked(mod, tm)
    if use_cache:
        with phase("cache writes"):
            write_entry(key, ".o", data, directory)
    return CompiledObject(key, data, False)


def _new_engine() -> llvm.ExecutionEngine:
    empty = llvm.parse_assembly("")
    empty.triple = host_target().triple
    return llvm.create_mcjit_compiler(empty, new_target_machine())


class CodeHold:
    """One user's hold on a loaded object: the address of its kernel function. The code
    stays mapped while any hold on it lives; dropping the last hold on every object of an
    engine frees the engine's code (SharedEngine)."""

    __slots__ = ("_engine", "address", "code", "key")

    def __init__(self, engine: SharedEngine, code: _EngineCode, key: str, address: int):
        self._engine, self.code, self.key, self.address = engine, code, key, address

    def __del__(self) -> None:
        self._engine.release(self.code, self.key)


class _EngineCode:
    """One MCJIT execution engine and the holds on the objects loaded into it."""

    __slots__ = ("engine", "holds", "keys", "size")

    def __init__(self) -> None:
        self.engine: llvm.ExecutionEngine | None = _new_engine()
        self.keys: list[str] = []  # every object loaded, held or not
        self.holds: dict[str, int] = {}  # key -> live CodeHolds on it
        self.size = 0  # bytes of object files loaded


class SharedEngine:
    """The execution engines that hold the kernel objects of the process: objects are
    added in batches to the current engine, each batch finalized once (MCJIT relocates and
    protects only the new sections, so code already running is untouched). A batch of four
    objects loads in ~0.1 ms, against ~1.2 ms for a new engine (a target machine, an empty
    module and a finalization each). An object is loaded once per key while its engine
    lives (the same key is the same code, whether it came from the disk cache or not).

    Lifetime: `load` hands out a CodeHold per object; users (kernels, native loops) keep
    theirs while they may run the code. MCJIT cannot unload one object, so code is freed a
    whole engine at a time: when no hold on any of its objects is left and it is not the
    current engine, or it is the current one and nothing in it is held. The current engine
    is retired after ENGINE_OBJECTS objects (or a failed batch), which bounds the dead code
    a live kernel can keep mapped. Holds are dropped from any thread, even inside a garbage
    collection that runs while this thread holds the lock: a dropped hold is queued and the
    queue is drained by whoever takes the lock next (at once when it is free)."""

    ENGINE_OBJECTS = 64

    def __init__(self) -> None:
        self._current: _EngineCode | None = None
        self._loaded: dict[str, tuple[_EngineCode, int]] = {}  # key -> (engine, address)
        self._released: collections.deque[tuple[_EngineCode, str]] = collections.deque()

    def load(self, objects: list[tuple[str, bytes]]) -> dict[str, CodeHold]:
        """Load the objects (key, data) not loaded yet; a hold on every given object's
        kernel function (`exported_symbol(key)`), by key."""
        _initialize()
        with _lock:
            self._drain()
            unique = dict(objects)
            holds = {k: self._hold(k) for k in unique if k in self._loaded}
            fresh = [(k, d) for k, d in unique.items() if k not in holds]
            if fresh:
                self._load(fresh)
                holds.update((k, self._hold(k)) for k, _ in fresh)
            return {k: holds[k] for k in unique}

    def _hold(self, key: str) -> CodeHold:
        code, address = self._loaded[key]
        code.holds[key] = code.holds.get(key, 0) + 1
        return CodeHold(self, code, key, address)

    def release(self, code: _EngineCode, key: str) -> None:
        """Drop one hold on object `key` of `code` (CodeHold.__del__)."""
        self._released.append((code, key))
        if _lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                _lock.release()

    def stats(self) -> dict[str, int]:
        """Engines alive, objects loaded in them, held objects and object bytes mapped."""
        with _lock:
            self._drain()
            codes = {id(c): c for c, _ in self._loaded.values()}
            if self._current is not None:
                codes[id(self._current)] = self._current
            return {
                "engines": len(codes),
                "objects": len(self._loaded),
                "held": sum(len(c.holds) for c in codes.values()),
                "bytes": sum(c.size for c in codes.values()),
            }

    def _drain(self) -> None:
        while self._released:
            code, key = self._released.popleft()
            code.holds[key] -= 1
            if not code.holds[key]:
                del code.holds[key]
                if not code.holds:
                    self._free(code)

    def _free(self, code: _EngineCode) -> None:
        if code is self._current:
            self._current = None
        for key in code.keys:
            if self._loaded.get(key, (None,))[0] is code:
                del self._loaded[key]
        engine, code.engine = code.engine, None
        if engine is not None:
            engine.close()

    def _load(self, fresh: list[tuple[str, bytes]]) -> None:
        if self._current is not None and len(self._current.keys) >= self.ENGINE_OBJECTS:
            self._retire()
        if self._current is None:
            self._current = _EngineCode()
        code = self._current
        engine = code.engine
        assert engine is not None, "the current engine is never closed"
        try:
            for _, data in fresh:
                _provide_builtins(data)
                engine.add_object_file(llvm.ObjectFileRef.from_data(data))
                code.size += len(data)
            engine.finalize_object()
            addresses = {k: engine.get_function_address(exported_symbol(k)) for k, _ in fresh}
        except BaseException:
            self._retire()  # its state is unknown: code in use stays, nothing new goes in
            raise
        missing = [k for k, a in addresses.items() if not a]
        if missing:
            raise RuntimeError(f"symbol {exported_symbol(missing[0])} is not in its object")
        code.keys += addresses
        self._loaded.update((k, (code, a)) for k, a in addresses.items())

    def _retire(self) -> None:
        code, self._current = self._current, None
        if code is not None and not code.holds:
            self._free(code)


@functools.cache
def shared_engine() -> SharedEngine:
    """The process's SharedEngine."""
    return SharedEngine()
