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


def _load_handle(args_type: str, field: str, handle_type: str) -> list[str]:
    """Load the handle `field` of the argument struct into %h; %isnull is true when Python
    must answer instead: NULL args, args smaller than this version's struct, a NULL handle
    or a destroyed one (index 0, see core.forget)."""
    index_t = _int(_size(handle_type, "index"))
    return [
        "  %argsnull = icmp eq i8* %args, null",
        "  br i1 %argsnull, label %slow, label %sized",
        "sized:",
        "  %ssp = bitcast i8* %args to i64*",
        "  %ss = load i64, i64* %ssp",
        f"  %small = icmp ult i64 %ss, {struct_size(args_type)}",
        "  br i1 %small, label %slow, label %load",
        "load:",
        f"  %hp = getelementptr i8, i8* %args, i64 {_offset(args_type, field)}",
        "  %hpp = bitcast i8* %hp to i8**",
        "  %h = load i8*, i8** %hpp",
        "  %hnull = icmp eq i8* %h, null",
        "  br i1 %hnull, label %slow, label %live",
        "live:",
        f"  %ip = getelementptr i8, i8* %h, i64 {_offset(handle_type, 'index')}",
        f"  %ipp = bitcast i8* %ip to {index_t}*",
        f"  %iv = load {index_t}, {index_t}* %ipp",
        f"  %isnull = icmp eq {index_t} %iv, 0",
    ]


def _getter_ir(name: str, g: Getter, fallback: int) -> str:
    lines = [f"define i8* @{name}(i8* %args) {{", "entry:"]
    lines += _load_handle(g.args, g.handle, g.handle_type)
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


def _fallback(address: int) -> list[str]:
    return [
        f"  %py = inttoptr i64 {address} to i8* (i8*)*",
        "  %r = tail call i8* %py(i8* %args)",
        "  ret i8* %r",
    ]


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
    lines += ["  ret i8* null", "slow:", *_fallback(fallback), "}"]
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


_ENGINE: Any = None


def compile_fast_paths(python: dict[str, Any]) -> dict[str, int]:
    """Native entries (name -> address) for the functions above, each falling back to the
    cffi callback `python[name]`. Empty when disabled or when llvmlite cannot compile."""
    global _ENGINE
    if not ENABLED:
        return {}
    try:
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        bodies = []
        for name, getter in GETTERS.items():
            bodies.append(_getter_ir(name, getter, _address(python[name])))
        for name in EVENT_FUNCTIONS:
            bodies.append(_event_ir(name, _address(python[name])))
        bodies.append(_user_data_ir(_address(python["Memory_GetUserData"])))
        module = llvm.parse_assembly("\n\n".join(bodies))
        module.verify()
        target = llvm.Target.from_default_triple().create_target_machine(opt=2)
        engine = llvm.create_mcjit_compiler(module, target)
        engine.finalize_object()
    except Exception as e:  # never fatal: the Python implementations serve
        import warnings

        warnings.warn(f"xlapy's PJRT plugin runs without native fast paths: {e}", stacklevel=2)
        return {}
    _ENGINE = (engine, module)  # keeps the code alive for the process
    names = [*GETTERS, *EVENT_FUNCTIONS, "Memory_GetUserData"]
    return {name: engine.get_function_address(name) for name in names}


def _address(callback) -> int:
    return int(ffi.cast("uintptr_t", callback))
