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
import contextlib
import contextvars
import ctypes
import ctypes.util
import functools
import hashlib
import os
import threading
from collections.abc import Iterator
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
# Without F16C (an x86 before AVX, or a maximum ISA of SSE4_2: `max_isa`) every f16 <-> f32
# conversion is such a call, __extendhfsf2 and __truncsfhf2: both are written here with
# integer operations (and SSE2 float ones), so they need no F16C themselves.
# Each is compiled here, once, the first time a loaded object names it (after the builtins
# its own text calls).
RUNTIME_BUILTINS = {
    # f16 bits -> f32 bits: rebias a normal's exponent, widen an infinity or NaN, and scale
    # a subnormal's mantissa by 2^-24 (exact, and a normal f32, so DAZ/FTZ leave it alone)
    "__extendhfsf2": """
define float @__extendhfsf2(half %h) {
  %b = bitcast half %h to i16
  %w = zext i16 %b to i32
  %sign = and i32 %w, 32768
  %s = shl i32 %sign, 16
  %e = lshr i32 %w, 10
  %exp = and i32 %e, 31
  %man = and i32 %w, 1023
  %m13 = shl i32 %man, 13
  %e2 = add i32 %exp, 112
  %e3 = shl i32 %e2, 23
  %normal = or i32 %e3, %m13
  %special = or i32 %m13, 2139095040
  %is_special = icmp eq i32 %exp, 31
  %ns = select i1 %is_special, i32 %special, i32 %normal
  %mf = uitofp i32 %man to float
  %sub = fmul float %mf, 0x3E70000000000000
  %subbits = bitcast float %sub to i32
  %is_sub = icmp eq i32 %exp, 0
  %mag = select i1 %is_sub, i32 %subbits, i32 %ns
  %r = or i32 %mag, %s
  %f = bitcast i32 %r to float
  ret float %f
}
""",
    # f32 -> f16 rounded to nearest even: |x| >= 65536 (or a carry past 65504) is an
    # infinity, a NaN the quiet NaN; a subnormal result comes out of adding 0.5 (whose
    # ulp is f16's smallest subnormal, so the f32 add rounds it); a normal one from
    # rebiasing the exponent and adding half an ulp less one, plus the kept last bit
    "__truncsfhf2": """
define half @__truncsfhf2(float %f) {
  %u = bitcast float %f to i32
  %sign = and i32 %u, -2147483648
  %a = and i32 %u, 2147483647
  %isnan = icmp ugt i32 %a, 2139095040
  %special = select i1 %isnan, i32 32256, i32 31744
  %big = icmp uge i32 %a, 1199570944
  %af = bitcast i32 %a to float
  %sum = fadd float %af, 5.000000e-01
  %sb = bitcast float %sum to i32
  %subr = sub i32 %sb, 1056964608
  %small = icmp ult i32 %a, 947912704
  %odd = lshr i32 %a, 13
  %oddb = and i32 %odd, 1
  %t1 = add i32 %a, -939520001
  %t2 = add i32 %t1, %oddb
  %nr = lshr i32 %t2, 13
  %m1 = select i1 %small, i32 %subr, i32 %nr
  %m2 = select i1 %big, i32 %special, i32 %m1
  %s16 = lshr i32 %sign, 16
  %r = or i32 %m2, %s16
  %h16 = trunc i32 %r to i16
  %h = bitcast i16 %h16 to half
  ret half %h
}
""",
    # round to odd in f32 (truncate toward zero, set the last bit when inexact), then the
    # one rounding to f16 gives the correctly rounded result
    "__truncdfhf2": """
declare double @llvm.fabs.f64(double)
declare half @__truncsfhf2(float)
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
  %h = call half @__truncsfhf2(float %pick)
  ret half %h
}
""",
}
_builtin_engines: dict[str, object] = {}


def _provide_builtins(data: bytes) -> None:
    """Compile and register the RUNTIME_BUILTINS that object `data` names (under _lock), for
    the host CPU (they run on it, whatever level the kernels calling them were made for)."""
    for name, text in RUNTIME_BUILTINS.items():
        if name in _builtin_engines or name.encode() not in data:
            continue
        _provide_builtins(text.replace(f"@{name}(", "").encode())  # those it calls, first
        module = llvm.parse_assembly(text)
        host = native_target()
        module.triple = host.triple
        module.verify()
        machine = llvm.Target.from_triple(host.triple).create_target_machine(
            cpu=host.cpu, features=host.features, opt=2
        )
        engine = llvm.create_mcjit_compiler(module, machine)
        engine.finalize_object()
        llvm.add_symbol(name, engine.get_function_address(name))
        _builtin_engines[name] = engine  # kept: loaded kernels call into it


@dataclass(frozen=True, slots=True)
class HostTarget:
    """A target LLVM generates code for: the host CPU, or the host CPU with the features
    above a maximum ISA level turned off (`max_isa`)."""

    triple: str
    cpu: str
    features: str


MAX_ISA_ENV = "XLAPY_CPU_MAX_ISA"
"""Environment variable: the widest x86 ISA level kernels may use (ISA_LEVELS; default: all
the host has). The CPU backend's option `max_isa` sets it for one compile."""

ISA_LEVELS = ("SSE4_2", "AVX", "AVX2", "AVX512", "AVX512_VNNI", "AVX512_BF16", "AMX")
"""The levels of XLA:CPU's `xla_cpu_max_isa`, oldest first; each allows the features of the
levels before it. AMX, the last, also allows every newer vector feature LLVM knows."""

_INTRODUCED_AT: tuple[tuple[str, str], ...] = (
    # (LLVM feature, or a prefix ending in '*'; the level that brings it): first match wins
    ("avx512vnni", "AVX512_VNNI"),
    ("avx512bf16", "AVX512_BF16"),
    ("avx512fp16", "AMX"),
    ("avx512*", "AVX512"),
    ("evex512", "AVX512"),
    ("avx10*", "AMX"),
    ("amx*", "AMX"),
    ("avxvnni*", "AMX"),
    ("avxifma", "AMX"),
    ("avxneconvert", "AMX"),
    ("sha512", "AMX"),
    ("sm3", "AMX"),
    ("sm4", "AMX"),
    ("avx2", "AVX2"),
    ("fma", "AVX2"),
    ("vaes", "AVX2"),
    ("vpclmulqdq", "AVX2"),
    ("avx", "AVX"),
    ("f16c", "AVX"),
    ("fma4", "AVX"),
    ("xop", "AVX"),
)
"""Which level brings each vector feature above SSE4.2 (FMA3 comes with AVX2, as in XLA;
the VEX forms of later AVX-512 features, AVX10 and AMX with the last level). A feature not
listed (scalar ones: popcnt, bmi, ...) is kept at every level."""


def parse_isa(value: object, where: str = MAX_ISA_ENV) -> str | None:
    """The ISA level `value` names (case-insensitive; "AVX512F" is AVX512), or None for no
    cap ("", None or "host"); anything else is a XlapyError naming `where`."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise XlapyError(f"{where} must be one of {', '.join(ISA_LEVELS)}, got {value!r}")
    name = value.strip().upper().replace(".", "_")
    if name in ("", "HOST"):
        return None
    name = {"AVX512F": "AVX512", "SSE42": "SSE4_2"}.get(name, name)
    if name not in ISA_LEVELS:
        raise XlapyError(f"{where} must be one of {', '.join(ISA_LEVELS)}, got {value!r}")
    return name


def _level_of(feature: str) -> int:
    for pattern, level in _INTRODUCED_AT:
        if feature == pattern or (pattern.endswith("*") and feature.startswith(pattern[:-1])):
            return ISA_LEVELS.index(level)
    return -1


@functools.cache
def native_target() -> HostTarget:
    """Triple, CPU name and feature string of the machine running xlapy, all features on."""
    _initialize()
    return HostTarget(
        llvm.get_process_triple(), llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    )


@functools.cache
def capped_target(level: str | None) -> HostTarget:
    """The host target with the features above ISA level `level` off (None: native_target).
    The features turned off are listed after all the others: LLVM applies the string in
    order, and turning one off also turns off every feature that implies it. A level on a
    host that is not x86 is a XlapyError (the levels are x86's)."""
    host = native_target()
    if level is None:
        return host
    if not host.triple.startswith(("x86_64", "i386", "i686")):
        raise XlapyError(
            f"the maximum ISA {level} (${MAX_ISA_ENV} or the option max_isa) names an x86 "
            f"level; this host is {host.triple}: leave it unset"
        )
    cap = ISA_LEVELS.index(level)
    kept, off = [], []
    for flag in host.features.split(","):
        name = flag[1:]
        if _level_of(name) > cap:
            off.append(f"-{name}")
        elif flag:
            kept.append(flag)
    return HostTarget(host.triple, host.cpu, ",".join(kept + off))


_max_isa: contextvars.ContextVar[str | bool | None] = contextvars.ContextVar(
    "xlapy_max_isa", default=False
)
"""A compile's maximum ISA level (`compiling_for`); False outside one: $XLAPY_CPU_MAX_ISA."""


@functools.cache
def _env_isa() -> str | None:
    return parse_isa(os.environ.get(MAX_ISA_ENV))


def max_isa() -> str | None:
    """The maximum ISA level code is generated for now: the compile's (`compiling_for`),
    else $XLAPY_CPU_MAX_ISA (read once); None: the host's every feature."""
    level = _max_isa.get()
    return _env_isa() if level is False else level  # type: ignore[return-value]


@contextlib.contextmanager
def compiling_for(level: str | bool | None) -> Iterator[None]:
    """Within the block (and the compile-pool work it submits: kernel.py passes its
    context on), code is generated for ISA level `level` (None: the host's every feature;
    False: $XLAPY_CPU_MAX_ISA)."""
    token = _max_isa.set(level)
    try:
        yield
    finally:
        _max_isa.reset(token)


def host_target() -> HostTarget:
    """The target every kernel is generated for: the host CPU with the features above
    `max_isa()` turned off. Its CPU name and features are part of every cache key
    (content_key), so code made for one level is never used at another."""
    return capped_target(max_isa())


def target_machine(target: HostTarget | None = None):
    """The O3 target machine for `target` (default: host_target()) that optimization and
    code emission share."""
    return _shared_target_machine(target or host_target())


@functools.cache
def _shared_target_machine(target: HostTarget):
    return new_target_machine(target)


def new_target_machine(target: HostTarget | None = None, level: int = 3):
    """A fresh target machine for `target` (default: host_target()), code generation at
    `level` (3 unless said: see DRIVER_CODEGEN_LEVEL); an execution engine takes ownership
    of the one it is given, so each engine needs its own; non-PIC, large code model (see
    the top of this file)."""
    host = target or host_target()
    machine = llvm.Target.from_triple(host.triple)
    return machine.create_target_machine(
        cpu=host.cpu, features=host.features, opt=level, reloc="static", codemodel="large"
    )


@functools.cache
def data_layout() -> str:
    """The host target's data layout string (the same at every ISA level)."""
    return str(target_machine(native_target()).target_data)


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
    target = host_target()
    tm = machines.get((target, level))
    if tm is None:
        tm = machines[(target, level)] = new_target_machine(target, level)
    return tm


def optimize(ir_text: str, target: HostTarget | None = None) -> llvm.ModuleRef:
    """Parse `ir_text` and run LLVM's O3 pipeline on it for `target` (default:
    host_target())."""
    mod = _parse(ir_text, llvm.get_global_context())
    _run_pipeline(mod, target_machine(target), locked=True)
    return mod


def _parse(
    ir_text: str, context, rename: tuple[str, str] | None = None, verify: bool = True
) -> llvm.ModuleRef:
    mod = llvm.parse_assembly(ir_text, context)
    mod.triple = host_target().triple
    mod.data_layout = data_layout()
    if rename is not None:
        mod.get_function(rename[0]).name = rename[1]
    if verify:
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


def assembly(mod: llvm.ModuleRef, target: HostTarget | None = None) -> str:
    """The assembly of `mod` (optimized) for `target` (default: host_target())."""
    return target_machine(target).emit_assembly(mod)


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
    mod = _parse(ir.main, context, rename, verify=False)  # (the kernels never call it)
    for text in ir.linked:
        mod.link_in(_parse(text, context, verify=False))
    for name in ir.internal:
        mod.get_function(name).linkage = "internal"
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
    empty.triple = native_target().triple
    return llvm.create_mcjit_compiler(empty, new_target_machine(native_target()))


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
