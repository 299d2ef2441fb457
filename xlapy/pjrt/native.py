"""Native fast paths for the PJRT functions JAX calls on every jitted call.

A jitted call makes about a dozen calls into the plugin; most of them only read a value
xlapy knows when it makes the handle (an executable's replica, partition and output
counts, a buffer's device and memory, a memory's kind) or act on an event that is
already complete. Each cffi callback into Python costs 1.5-3 us (taking the GIL, a frame,
converting the argument), several times what XLA:CPU spends on the whole call. So these
few functions are compiled to machine code with llvmlite at start-up: the handle structs
carry the values (abi.py declares the fields; the Python side fills them when it makes
the handle), the native function copies them into the argument struct, and falls back
to the Python implementation (tail call of its cffi callback) whenever the handle is
NULL or the value is not there (a buffer whose device is not recorded, an event not yet
complete). Behaviour is identical either way; XLAPY_PJRT_NATIVE=0 turns this off.

Each function is described as data: where the handle sits in the argument struct, which
handle field guards the fast path, and which fields to copy (handle offset -> argument
offset, bytes); the two event functions that call back (OnReady) or do nothing (Destroy
of the shared completed event) have their own small bodies.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from xlapy.pjrt.abi import ffi, struct_size

ENABLED = os.environ.get("XLAPY_PJRT_NATIVE", "1") != "0"


@dataclass(frozen=True)
class Getter:
    """PJRT_<name>: the handle is the pointer at `handle` in the argument struct `args`;
    when it is not NULL and (if `guard` names a handle field) that field is nonzero, copy
    each (handle field, argument field) pair, else call the Python implementation."""

    args: str
    handle_type: str
    handle: str
    copies: tuple[tuple[str, str], ...]
    guard: str | None = None


GETTERS: dict[str, Getter] = {
    "Executable_NumReplicas": Getter(
        "PJRT_Executable_Count_Args", "PJRT_Executable", "executable",
        (("num_replicas", "count"),),
    ),
    "Executable_NumPartitions": Getter(
        "PJRT_Executable_Count_Args", "PJRT_Executable", "executable",
        (("num_partitions", "count"),),
    ),
    "Executable_NumOutputs": Getter(
        "PJRT_Executable_Count_Args", "PJRT_Executable", "executable",
        (("num_outputs", "count"),),
    ),
    "Buffer_Device": Getter(
        "PJRT_Buffer_Device_Args", "PJRT_Buffer", "buffer", (("device", "device"),), "device"
    ),
    "Buffer_Memory": Getter(
        "PJRT_Buffer_Memory_Args", "PJRT_Buffer", "buffer", (("memory", "memory"),), "memory"
    ),
    "Memory_Kind": Getter(
        "PJRT_Memory_Text_Args", "PJRT_Memory", "memory",
        (("kind", "text"), ("kind_size", "text_size")), "kind",
    ),
    "Event_IsReady": Getter(
        "PJRT_Event_IsReady_Args", "PJRT_Event", "event", (("completed", "is_ready"),), "completed"
    ),
}  # fmt: skip

EVENT_FUNCTIONS = ("Event_OnReady", "Event_Destroy", "Event_Await", "Event_Error")
"""Event functions with a native path for a completed event (PJRT_Event.completed != 0)."""


def _offset(ctype: str, field: str) -> int:
    return ffi.offsetof(ctype, field)


def _size(ctype: str, field: str) -> int:
    for name, f in ffi.typeof(ctype).fields:
        if name == field:
            return ffi.sizeof(f.type)
    raise KeyError(f"{ctype}.{field}")


def _int(bytes_: int) -> str:
    return {1: "i8", 4: "i32", 8: "i64"}[bytes_]


def _args_guard(args_type: str) -> list[str]:
    """Branch to %slow (Python answers with a PJRT error) for NULL args or args smaller than
    this version's `args_type`; else go on at label %load."""
    return [
        "  %argsnull = icmp eq ptr %args, null",
        "  br i1 %argsnull, label %slow, label %sized",
        "sized:",
        "  %ss = load i64, ptr %args",
        f"  %small = icmp ult i64 %ss, {struct_size(args_type)}",
        "  br i1 %small, label %slow, label %load",
        "load:",
    ]


def _load_handle(args_type: str, field: str, handle_type: str, result: str = "isnull") -> list[str]:
    """Load the handle `field` of the argument struct into %h; %isnull is true when Python
    must answer instead: NULL args, args smaller than this version's struct, a NULL handle
    or a destroyed one (index 0, see core.forget)."""
    index_t = _int(_size(handle_type, "index"))
    return [
        *_args_guard(args_type),
        f"  %hp = getelementptr i8, i8* %args, i64 {_offset(args_type, field)}",
        "  %hpp = bitcast i8* %hp to i8**",
        "  %h = load i8*, i8** %hpp",
        "  %hnull = icmp eq i8* %h, null",
        "  br i1 %hnull, label %slow, label %live",
        "live:",
        f"  %ip = getelementptr i8, i8* %h, i64 {_offset(handle_type, 'index')}",
        f"  %ipp = bitcast i8* %ip to {index_t}*",
        f"  %iv = load {index_t}, {index_t}* %ipp",
        f"  %{result} = icmp eq {index_t} %iv, 0",
    ]


def _getter_ir(name: str, g: Getter, fallback: int) -> str:
    lines = [f"define i8* @{name}(i8* %args) {{", "entry:"]
    buffer = g.handle_type == "PJRT_Buffer"
    lines += _load_handle(g.args, g.handle, g.handle_type, "indexnull" if buffer else "isnull")
    if buffer:  # a native Execute's output (index 0, `native` set) is live and carries
        # its fields: answered here, not materialized in Python to be asked
        lines += [
            f"  %np = getelementptr i8, i8* %h, i64 {_offset('PJRT_Buffer', 'native')}",
            "  %npp = bitcast i8* %np to i64*",
            "  %nv = load i64, i64* %npp",
            "  %pyonly = icmp eq i64 %nv, 0",
            "  %isnull = and i1 %indexnull, %pyonly",
        ]
    lines.append("  br i1 %isnull, label %slow, label %check")
    lines.append("check:")
    if g.guard is not None:
        guard_t = _int(_size(g.handle_type, g.guard))
        lines += [
            f"  %gp = getelementptr i8, i8* %h, i64 {_offset(g.handle_type, g.guard)}",
            f"  %gpp = bitcast i8* %gp to {guard_t}*",
            f"  %gv = load {guard_t}, {guard_t}* %gpp",
            f"  %gzero = icmp eq {guard_t} %gv, 0",
            "  br i1 %gzero, label %slow, label %fast",
        ]
    else:
        lines.append("  br label %fast")
    lines.append("fast:")
    for i, (src, dst) in enumerate(g.copies):
        size = _size(g.handle_type, src)
        if size != _size(g.args, dst) and not (g.guard == src and _size(g.args, dst) == 1):
            raise ValueError(f"{name}: {src} and {dst} differ in size")
        src_t, dst_t = _int(size), _int(_size(g.args, dst))
        lines += [
            f"  %s{i} = getelementptr i8, i8* %h, i64 {_offset(g.handle_type, src)}",
            f"  %sp{i} = bitcast i8* %s{i} to {src_t}*",
            f"  %v{i} = load {src_t}, {src_t}* %sp{i}",
            f"  %d{i} = getelementptr i8, i8* %args, i64 {_offset(g.args, dst)}",
            f"  %dp{i} = bitcast i8* %d{i} to {dst_t}*",
        ]
        if src_t != dst_t:  # a flag into a bool: nonzero -> 1
            lines += [
                f"  %nz{i} = icmp ne {src_t} %v{i}, 0",
                f"  %c{i} = zext i1 %nz{i} to {dst_t}",
            ]
            lines.append(f"  store {dst_t} %c{i}, {dst_t}* %dp{i}")
        else:
            lines.append(f"  store {src_t} %v{i}, {src_t}* %dp{i}")
    lines += ["  ret i8* null", "slow:", *_fallback(fallback), "}"]
    return "\n".join(lines)


def _fallback(address: int, destroy: bool = False) -> list[str]:
    """Call the Python implementation; for a `destroy`, none once the interpreter is exiting
    (`EXITING`): the call returns success and leaves the object to the process's end."""
    lines = []
    if destroy:
        lines += [
            "  %exiting = load atomic i64, i64* @xlapy_exiting seq_cst, align 8",
            "  %gone = icmp ne i64 %exiting, 0",
            "  br i1 %gone, label %atexit, label %python",
            "atexit:",
            "  ret i8* null",
            "python:",
        ]
    return [
        *lines,
        f"  %py = inttoptr i64 {address} to i8* (i8*)*",
        "  %r = tail call i8* %py(i8* %args)",
        "  ret i8* %r",
    ]


DESTROY_FUNCTIONS = ("Executable_Destroy", "LoadedExecutable_Destroy")
"""Destroys with no native path of their own but the exit check (see `_destroy_ir`)."""


def _destroy_ir(name: str, fallback: int) -> str:
    """PJRT_<name> once the interpreter is exiting (`EXITING`): success, nothing done. JAX
    destroys executables and buffers from its own threads too (an Eigen pool's); after
    Python set out to finalize, a thread entering a cffi callback is ended with
    pthread_exit, whose unwinding through jaxlib's noexcept destructor called
    std::terminate ("terminate called without an active exception", SIGABRT at exit)."""
    return "\n".join(
        [f"define i8* @{name}(i8* %args) {{", "entry:", *_fallback(fallback, True), "}"]
    )


EXITING: list[int] = []
"""The address of the word native destroys read (`_fallback`); set by `_set_exiting`, the
atexit hook registered when the table is compiled (atexit hooks run before Python starts
finalizing and ending threads)."""


def _set_exiting() -> None:
    import ctypes

    if EXITING:
        ctypes.c_int64.from_address(EXITING[0]).value = 1


def _event_ir(name: str, fallback: int) -> str:
    """Completed event: OnReady calls the callback with no error, Destroy/Await/Error
    return at once (the completed event is shared and never destroyed)."""
    args = f"PJRT_{name}_Args"
    flag = _offset("PJRT_Event", "completed")
    lines = [f"define i8* @{name}(i8* %args) {{", "entry:"]
    lines += _load_handle(args, "event", "PJRT_Event")
    lines += [
        "  br i1 %isnull, label %slow, label %check",
        "check:",
        f"  %fp = getelementptr i8, i8* %h, i64 {flag}",
        "  %fpp = bitcast i8* %fp to i64*",
        "  %f = load i64, i64* %fpp",
        "  %incomplete = icmp eq i64 %f, 0",
        "  br i1 %incomplete, label %slow, label %fast",
        "fast:",
    ]
    if name == "Event_OnReady":
        lines += [
            f"  %cbp = getelementptr i8, i8* %args, i64 {_offset(args, 'callback')}",
            "  %cbpp = bitcast i8* %cbp to void (i8*, i8*)**",
            "  %cb = load void (i8*, i8*)*, void (i8*, i8*)** %cbpp",
            f"  %up = getelementptr i8, i8* %args, i64 {_offset(args, 'user_arg')}",
            "  %upp = bitcast i8* %up to i8**",
            "  %u = load i8*, i8** %upp",
            "  call void %cb(i8* null, i8* %u)",
        ]
    destroy = name == "Event_Destroy"
    lines += ["  ret i8* null", "slow:", *_fallback(fallback, destroy), "}"]
    return "\n".join(lines)


def _user_data_ir(fallback: int, slots: int = 4) -> str:
    """PJRT_Memory's get_user_data: the (key, data) pairs set last are kept in the handle
    (`slots` of them), looked up in order; any other key asks Python."""
    keys = _offset("PJRT_Memory", "user_keys")
    data = _offset("PJRT_Memory", "user_data")
    lines = [
        "define i8* @Memory_GetUserData(i8* %m, i8* %key) {",
        "entry:",
        "  %isnull = icmp eq i8* %m, null",
        "  %nokey = icmp eq i8* %key, null",
        "  %skip = or i1 %isnull, %nokey",
        "  br i1 %skip, label %slow, label %try0",
    ]
    for i in range(slots):
        miss = f"try{i + 1}" if i + 1 < slots else "slow"
        lines += [
            f"try{i}:",
            f"  %kp{i} = getelementptr i8, i8* %m, i64 {keys + 8 * i}",
            f"  %kpp{i} = bitcast i8* %kp{i} to i8**",
            f"  %k{i} = load i8*, i8** %kpp{i}",
            f"  %hit{i} = icmp eq i8* %k{i}, %key",
            f"  br i1 %hit{i}, label %found{i}, label %{miss}",
            f"found{i}:",
            f"  %dp{i} = getelementptr i8, i8* %m, i64 {data + 8 * i}",
            f"  %dpp{i} = bitcast i8* %dp{i} to i8**",
            f"  %d{i} = load i8*, i8** %dpp{i}",
            f"  ret i8* %d{i}",
        ]
    lines += [
        "slow:",
        f"  %py = inttoptr i64 {fallback} to i8* (i8*, i8*)*",
        "  %r = tail call i8* %py(i8* %m, i8* %key)",
        "  ret i8* %r",
        "}",
    ]
    return "\n".join(lines)


# -- native buffers ---------------------------------------------------------------------------
# Counters: the allocator of a device whose buffers native code makes and frees keeps its
# figures in one block of int64 words in native memory (COUNTER_FIELDS, then the bytes of
# each memory kind), updated only by atomic read-modify-writes, from Python under the
# device's lock and from native code without it, so every figure stays exact: the peak is
# the atomic maximum of the in-use values each allocation produced.
COUNTER_FIELDS = ("in_use", "peak", "num_allocs", "largest", "live")

HELPERS = ("xlapy_count_alloc", "xlapy_count_free", "xlapy_retire")
"""Native helpers called from Python too (see NativeCounters and executes.retire)."""


def _field(name: str) -> int:
    return _offset("PJRT_Buffer", name)


def _helpers_ir() -> str:
    kinds = len(COUNTER_FIELDS)
    return f"""
define void @xlapy_count_alloc(ptr %c, i64 %n, i64 %k) {{
  %old = atomicrmw add ptr %c, i64 %n seq_cst
  %new = add i64 %old, %n
  %pp = getelementptr i64, ptr %c, i64 1
  %p0 = atomicrmw max ptr %pp, i64 %new seq_cst
  %ap = getelementptr i64, ptr %c, i64 2
  %a0 = atomicrmw add ptr %ap, i64 1 seq_cst
  %lp = getelementptr i64, ptr %c, i64 3
  %l0 = atomicrmw max ptr %lp, i64 %n seq_cst
  %vp = getelementptr i64, ptr %c, i64 4
  %v0 = atomicrmw add ptr %vp, i64 1 seq_cst
  %ki = add i64 %k, {kinds}
  %kp = getelementptr i64, ptr %c, i64 %ki
  %k0 = atomicrmw add ptr %kp, i64 %n seq_cst
  ret void
}}

define void @xlapy_count_free(ptr %c, i64 %n, i64 %k) {{
  %old = atomicrmw sub ptr %c, i64 %n seq_cst
  %vp = getelementptr i64, ptr %c, i64 4
  %v0 = atomicrmw sub ptr %vp, i64 1 seq_cst
  %ki = add i64 %k, {kinds}
  %kp = getelementptr i64, ptr %c, i64 %ki
  %k0 = atomicrmw sub ptr %kp, i64 %n seq_cst
  ret void
}}

; No native reader may start on the buffer after this returns, and none is still reading.
define void @xlapy_retire(ptr %h) {{
entry:
  %pp = getelementptr i8, ptr %h, i64 {_field("plain")}
  %old = atomicrmw xchg ptr %pp, i64 0 seq_cst
  %rp = getelementptr i8, ptr %h, i64 {_field("readers")}
  br label %wait
wait:
  %r = load atomic i64, ptr %rp seq_cst, align 8
  %idle = icmp eq i64 %r, 0
  br i1 %idle, label %done, label %wait
done:
  ret void
}}
"""


def _native_unseen_handle(args_struct: str) -> str:
    """The IR that sends a call on a handle native code made and Python never saw
    (`native` set, `index` 0) to the block `fast` (with `%h` the handle), any other (a null
    handle included) to `slow`; `args_struct` is the call's args struct (`buffer` field)."""
    return f"""{chr(10).join(_args_guard(args_struct))}
  %hp = getelementptr i8, ptr %args, i64 {_offset(args_struct, "buffer")}
  %h = load ptr, ptr %hp
  %isnull = icmp eq ptr %h, null
  br i1 %isnull, label %slow, label %check
check:
  %np = getelementptr i8, ptr %h, i64 {_field("native")}
  %n = load i64, ptr %np
  %ip = getelementptr i8, ptr %h, i64 {_field("index")}
  %i = load atomic i64, ptr %ip acquire, align 8
  %isnative = icmp ne i64 %n, 0
  %unseen = icmp eq i64 %i, 0
  %mine = and i1 %isnative, %unseen
  br i1 %mine, label %fast, label %slow"""


def _buffer_is_deleted_ir(fallback: int) -> str:
    """Buffer_IsDeleted of a handle native code made and Python never saw (`native` set,
    `index` 0): live (deleting or donating one materializes it first), so false; any other
    asks Python. JAX asks it of every array it checks (`x.devices()`, `x.is_deleted()`)."""
    return f"""
define ptr @Buffer_IsDeleted(ptr %args) {{
entry:
{_native_unseen_handle("PJRT_Buffer_Flag_Args")}
fast:
  %fp = getelementptr i8, ptr %args, i64 {_offset("PJRT_Buffer_Flag_Args", "flag")}
  store i8 0, ptr %fp
  ret ptr null
slow:
{chr(10).join(_fallback(fallback))}
}}
"""


def _buffer_destroy_ir(fallback: int) -> str:
    """Buffer_Destroy of a handle native code made and Python never saw (`native` set,
    `index` 0): free its bytes and itself and count the free; any other asks Python."""
    return f"""
define ptr @Buffer_Destroy(ptr %args) {{
entry:
{_native_unseen_handle("PJRT_Buffer_Only_Args")}
fast:
  %dp = getelementptr i8, ptr %h, i64 {_field("data")}
  %d = load ptr, ptr %dp
  call void @free(ptr %d)
  %cp = getelementptr i8, ptr %h, i64 {_field("counters")}
  %c = load ptr, ptr %cp
  %sp = getelementptr i8, ptr %h, i64 {_field("nbytes")}
  %s = load i64, ptr %sp
  call void @xlapy_count_free(ptr %c, i64 %s, i64 0)
  call void @free(ptr %h)
  ret ptr null
slow:
{chr(10).join(_fallback(fallback, True))}
}}
"""


def _execute_ir(fallback: int) -> str:
    """LoadedExecutable_Execute: the executable's own native entry when it has one (it
    falls back to Python itself when the call is not its case), else Python (which also
    answers NULL args and structs smaller than this version's with a PJRT error)."""
    executable = _offset("PJRT_LoadedExecutable_Execute_Args", "executable")
    return f"""
define ptr @LoadedExecutable_Execute(ptr %args) {{
entry:
{chr(10).join(_args_guard("PJRT_LoadedExecutable_Execute_Args"))}
  %ep = getelementptr i8, ptr %args, i64 {executable}
  %e = load ptr, ptr %ep
  %isnull = icmp eq ptr %e, null
  br i1 %isnull, label %slow, label %check
check:
  %fp = getelementptr i8, ptr %e, i64 {_offset("PJRT_LoadedExecutable", "fast")}
  %f = load ptr, ptr %fp
  %nofast = icmp eq ptr %f, null
  br i1 %nofast, label %slow, label %fast
fast:
  %r0 = tail call ptr %f(ptr %args)
  ret ptr %r0
slow:
{chr(10).join(_fallback(fallback))}
}}
"""


_ENGINE: Any = None
ADDRESSES: dict[str, int] = {}
"""Name -> address of every function compiled by `compile_fast_paths` (empty: none)."""


def compile_fast_paths(python: dict[str, Any]) -> dict[str, int]:
    """Native entries (name -> address) for the functions above, each falling back to the
    cffi callback `python[name]`. Empty when disabled or when llvmlite cannot compile."""
    global _ENGINE
    if not ENABLED:
        return {}
    try:
        _llvm()
        bodies = ["declare void @free(ptr)", "@xlapy_exiting = global i64 0", _helpers_ir()]
        for name, getter in GETTERS.items():
            bodies.append(_getter_ir(name, getter, _address(python[name])))
        for name in EVENT_FUNCTIONS:
            bodies.append(_event_ir(name, _address(python[name])))
        bodies.append(_user_data_ir(_address(python["Memory_GetUserData"])))
        bodies.append(_buffer_destroy_ir(_address(python["Buffer_Destroy"])))
        bodies.append(_buffer_is_deleted_ir(_address(python["Buffer_IsDeleted"])))
        bodies.append(_execute_ir(_address(python["LoadedExecutable_Execute"])))
        for name in DESTROY_FUNCTIONS:
            bodies.append(_destroy_ir(name, _address(python[name])))
        engine = compile_ir("\n\n".join(bodies))
    except Exception as e:  # never fatal: the Python implementations serve
        import warnings

        warnings.warn(f"xlapy's PJRT plugin runs without native fast paths: {e}", stacklevel=2)
        return {}
    _ENGINE = engine
    names = [
        *GETTERS, *EVENT_FUNCTIONS, "Memory_GetUserData", "Buffer_Destroy",
        "Buffer_IsDeleted", "LoadedExecutable_Execute", *DESTROY_FUNCTIONS, *HELPERS,
    ]  # fmt: skip
    ADDRESSES.update({name: engine.get_function_address(name) for name in names})
    if not EXITING:
        import atexit

        EXITING.append(engine.get_global_value_address("xlapy_exiting"))
        atexit.register(_set_exiting)
    ADDRESSES["python_execute"] = _address(python["LoadedExecutable_Execute"])
    return {name: ADDRESSES[name] for name in names if name not in HELPERS}


def _llvm() -> Any:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    if not _LIBC:
        import ctypes

        libc = ctypes.CDLL(None)
        for name in ("malloc", "free", "aligned_alloc"):
            _LIBC[name] = ctypes.cast(getattr(libc, name), ctypes.c_void_p).value or 0
            llvm.add_symbol(name, _LIBC[name])
    return llvm


_LIBC: dict[str, int] = {}
"""libc's malloc, free and aligned_alloc (name -> address), as native code calls them."""


def compile_ir(text: str, immortal: bool = True) -> Any:
    """An MCJIT engine with the LLVM IR `text` compiled. `immortal`: never freed, for the
    plugin's table functions, which JAX's C++ side may call (freeing a buffer) until the
    process is gone, after Python has torn its objects down."""
    import ctypes

    llvm = _llvm()
    module = llvm.parse_assembly(text)
    module.verify()
    target = llvm.Target.from_default_triple().create_target_machine(opt=2)
    engine = llvm.create_mcjit_compiler(module, target)
    engine.finalize_object()
    if immortal:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(engine))
    return engine


def libc_free() -> int:
    """The address of libc's free (0 before native code was compiled)."""
    return _LIBC.get("free", 0)


def _address(callback) -> int:
    return int(ffi.cast("uintptr_t", callback))


class NativeCounters:
    """A device allocator's figures in native memory (see COUNTER_FIELDS), for
    `Allocator.use_counters`: Python's allocations and frees go through the same atomic
    helpers the native Execute and Buffer_Destroy call."""

    def __init__(self, kinds: tuple[str, ...]):
        import ctypes

        self.kinds = {kind: i for i, kind in enumerate(kinds)}
        size = 8 * (len(COUNTER_FIELDS) + len(kinds))
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        address = libc.malloc(size)  # never freed: native frees may come at process exit
        if not address:
            raise MemoryError("xlapy: no memory for a device's allocator counters")
        self.address = address
        self.words = ffi.cast("int64_t *", address)
        for i in range(size // 8):
            self.words[i] = 0
        fn = "void(*)(int64_t *, int64_t, int64_t)"
        self._alloc = ffi.cast(fn, ADDRESSES["xlapy_count_alloc"])
        self._free = ffi.cast(fn, ADDRESSES["xlapy_count_free"])

    def load(self, in_use: int, peak: int, num_allocs: int, largest: int, live: int,
             by_kind: dict[str, int]) -> None:  # fmt: skip
        """Start from these figures (the allocator's so far; the caller holds its lock)."""
        for i, value in enumerate((in_use, peak, num_allocs, largest, live)):
            self.words[i] = value
        for kind, i in self.kinds.items():
            self.words[len(COUNTER_FIELDS) + i] = by_kind.get(kind, 0)

    def allocate(self, nbytes: int, kind: str) -> None:
        self._alloc(self.words, nbytes, self.kinds[kind])

    def free(self, nbytes: int, kind: str) -> None:
        self._free(self.words, nbytes, self.kinds[kind])

    def figures(self) -> tuple[int, int, int, int, int, dict[str, int]]:
        """(in_use, peak, num_allocs, largest, live, bytes by kind)."""
        w = self.words
        base = len(COUNTER_FIELDS)
        by_kind = {kind: w[base + i] for kind, i in self.kinds.items()}
        return w[0], w[1], w[2], w[3], w[4], by_kind

    def reset_peak(self) -> None:
        self.words[1] = self.words[0]
