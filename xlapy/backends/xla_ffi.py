"""XLA's FFI C ABI: typed custom-call handlers written in C (or C++ with XLA's `ffi.h`).

Such a handler is one C function, `XLA_FFI_Error* handler(XLA_FFI_CallFrame*)` (the header
is `xla/ffi/api/c_api.h`, shipped in jaxlib's `include/`; `jax.ffi.include_dir()`): the
call frame carries a pointer to the `XLA_FFI_Api` function table (errors, type
registration, context queries), the execution stage, the arguments and results (buffers:
element type, data pointer, dimensions) and the attributes (sorted by name; scalars,
dense arrays, strings and dictionaries). JAX hands such handlers over as PyCapsules
(`jax.ffi.register_ffi_target(name, capsule, platform="xlapy")`; jaxlib's own LAPACK
kernels are handlers of this kind).

`CHandler(name, address)` is such a handler as an xlapy typed-FFI target: registered with
API_VERSION_TYPED_FFI, the interpreter and the CPU backend call it through `call`, which
builds the call frame from the instruction's operand and result leaves and the
attributes of its backend_config, calls the handler (the GIL released), and turns an error
it returns into a CustomCallError carrying the handler's message. A handler that finishes
asynchronously (it creates an XLA_FFI_Future and sets it in the frame) is waited for.

xlapy's `XLA_FFI_Api` (version 0.3, the one jaxlib 0.10.2's headers declare) implements the
errors, type-id registration, device memory (host memory on the CPU), the thread pool, the
run id and device ordinal, futures, and per-instruction state: a handler with an
`instantiate` stage is called once per custom-call instruction, with its attributes and no
buffers, before the instruction first runs (XLA:CPU does it when it builds the thunk); the
state it stores there with State_Set (one object of a registered type) is what State_Get
returns to every execution of that instruction, and the type's deleter (its
XLA_FFI_TypeInfo) frees it when the compiled instruction is gone. There are no streams on
the CPU and no user data in the execution context: those functions return an error naming
themselves, which the handler reports.

Struct layouts are transcribed from the header (cffi declarations below); every struct a
handler checks carries its STRUCT_SIZE (the size up to its last field at this version).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import cffi
import numpy as np

from xlapy.backends import ffi as typed_ffi
from xlapy.errors import CustomCallError
from xlapy.ir.types import PrimitiveType

FFI_API_MAJOR, FFI_API_MINOR = 0, 3

CDEF = """
typedef struct XLA_FFI_Extension_Base {
  size_t struct_size; int type; struct XLA_FFI_Extension_Base* next; } XLA_FFI_Extension_Base;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  int major_version; int minor_version; } XLA_FFI_Api_Version;
typedef struct XLA_FFI_Error { int64_t index; } XLA_FFI_Error;
typedef struct XLA_FFI_Future { int64_t index; } XLA_FFI_Future;
typedef struct XLA_FFI_ExecutionContext { int64_t index; } XLA_FFI_ExecutionContext;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  const char* message; int errc; } XLA_FFI_Error_Create_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_Error* error; const char* message; } XLA_FFI_Error_GetMessage_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_Error* error; } XLA_FFI_Error_Destroy_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  int dtype; void* data; int64_t rank; int64_t* dims; } XLA_FFI_Buffer;
typedef struct { const char* ptr; size_t len; } XLA_FFI_ByteSpan;
typedef struct { int dtype; void* value; } XLA_FFI_Scalar;
typedef struct { int dtype; size_t size; void* data; } XLA_FFI_Array;
typedef struct { int64_t type_id; } XLA_FFI_TypeId;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  void (*deleter)(void* object); } XLA_FFI_TypeInfo;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_Future* future; } XLA_FFI_Future_Create_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_Future* future; } XLA_FFI_Future_SetAvailable_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_Future* future; XLA_FFI_Error* error; } XLA_FFI_Future_SetError_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  int64_t size; int* types; void** args; } XLA_FFI_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  int64_t size; int* types; void** rets; } XLA_FFI_Rets;
typedef struct XLA_FFI_Attrs { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  int64_t size; int* types; XLA_FFI_ByteSpan** names; void** attrs; } XLA_FFI_Attrs;
typedef struct XLA_FFI_Api XLA_FFI_Api;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  const XLA_FFI_Api* api; XLA_FFI_ExecutionContext* ctx; int stage;
  XLA_FFI_Args args; XLA_FFI_Rets rets; XLA_FFI_Attrs attrs;
  XLA_FFI_Future* future; } XLA_FFI_CallFrame;
typedef XLA_FFI_Error* XLA_FFI_Handler(XLA_FFI_CallFrame* call_frame);
typedef struct { XLA_FFI_Handler* instantiate; XLA_FFI_Handler* prepare;
  XLA_FFI_Handler* initialize; XLA_FFI_Handler* execute; } XLA_FFI_Handler_Bundle;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ByteSpan name; XLA_FFI_ByteSpan platform; XLA_FFI_Handler_Bundle bundle;
  uint32_t traits; } XLA_FFI_Handler_Register_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ByteSpan name; XLA_FFI_TypeId* type_id; const XLA_FFI_TypeInfo* type_info;
} XLA_FFI_Type_Register_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx; XLA_FFI_TypeId* type_id; void* data;
} XLA_FFI_ExecutionContext_Get_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx; int stage; XLA_FFI_TypeId* type_id; void* state;
} XLA_FFI_State_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx; void* stream; } XLA_FFI_Stream_Get_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx; size_t size; size_t alignment; void* data;
} XLA_FFI_DeviceMemory_Allocate_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx; size_t size; void* data; } XLA_FFI_DeviceMemory_Free_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx; void (*task)(void* data); void* data;
} XLA_FFI_ThreadPool_Schedule_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx; int64_t* num_threads; } XLA_FFI_ThreadPool_NumThreads_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx; int64_t run_id; } XLA_FFI_RunId_Get_Args;
typedef struct { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_ExecutionContext* ctx; int32_t device_ordinal; } XLA_FFI_DeviceOrdinal_Get_Args;
struct XLA_FFI_Api { size_t struct_size; XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_Api_Version api_version; const void* internal_api;
  void* slots[18]; };
"""

ffi = cffi.FFI()
ffi.cdef(CDEF)

# The order of the function pointers in XLA_FFI_Api (ABI: a name's position is fixed).
API_SLOTS = """
Error_Create Error_GetMessage Error_Destroy Handler_Register Stream_Get Type_Register
ExecutionContext_Get State_Set State_Get DeviceMemory_Allocate DeviceMemory_Free
ThreadPool_Schedule ThreadPool_NumThreads Future_Create Future_SetAvailable
Future_SetError RunId_Get DeviceOrdinal_Get
""".split()  # noqa: SIM905 (one name per slot, in table order)

# XLA_FFI_Error_Code (absl status codes) used here.
INVALID_ARGUMENT, NOT_FOUND, UNIMPLEMENTED, INTERNAL = 3, 5, 12, 13
ARG_BUFFER = RET_BUFFER = 1
ATTR_ARRAY, ATTR_DICTIONARY, ATTR_SCALAR, ATTR_STRING = 1, 2, 3, 4
STAGE_INSTANTIATE, STAGE_EXECUTE = 0, 3
FUTURE_TIMEOUT_SECONDS = 600.0
"""How long `call` waits for a handler's asynchronous result before failing the call."""


def struct_size(ctype: str, last_field: str) -> int:
    """XLA's STRUCT_SIZE of `ctype`: the size up to and including `last_field`."""
    for name, field in ffi.typeof(ctype).fields:
        if name == last_field:
            return field.offset + ffi.sizeof(field.type)
    raise KeyError(f"{ctype} has no field {last_field}")


# XLA_FFI_DataType: XLA's PrimitiveType numbers.
DATA_TYPES: dict[PrimitiveType, int] = {
    PrimitiveType.PRED: 1, PrimitiveType.S1: 30, PrimitiveType.S2: 26, PrimitiveType.S4: 21,
    PrimitiveType.S8: 2, PrimitiveType.S16: 3, PrimitiveType.S32: 4, PrimitiveType.S64: 5,
    PrimitiveType.U1: 31, PrimitiveType.U2: 27, PrimitiveType.U4: 22, PrimitiveType.U8: 6,
    PrimitiveType.U16: 7, PrimitiveType.U32: 8, PrimitiveType.U64: 9, PrimitiveType.F16: 10,
    PrimitiveType.F32: 11, PrimitiveType.F64: 12, PrimitiveType.BF16: 16,
    PrimitiveType.C64: 15, PrimitiveType.C128: 18, PrimitiveType.TOKEN: 17,
    PrimitiveType.F8E5M2: 19, PrimitiveType.F8E3M4: 29, PrimitiveType.F8E4M3: 28,
    PrimitiveType.F8E4M3FN: 20, PrimitiveType.F8E4M3B11FNUZ: 23,
    PrimitiveType.F8E5M2FNUZ: 24, PrimitiveType.F8E4M3FNUZ: 25,
    PrimitiveType.F4E2M1FN: 32, PrimitiveType.F8E8M0FNU: 33,
}  # fmt: skip
_DTYPE_CODES = {np.dtype(t.dtype): c for t, c in DATA_TYPES.items() if t.value.dtype is not None}
# MLIR scalar attribute types -> element types.
_MLIR_SCALARS = {
    "i1": PrimitiveType.PRED, "i8": PrimitiveType.S8, "si8": PrimitiveType.S8,
    "i16": PrimitiveType.S16, "si16": PrimitiveType.S16, "i32": PrimitiveType.S32,
    "si32": PrimitiveType.S32, "i64": PrimitiveType.S64, "si64": PrimitiveType.S64,
    "index": PrimitiveType.S64, "ui8": PrimitiveType.U8, "ui16": PrimitiveType.U16,
    "ui32": PrimitiveType.U32, "ui64": PrimitiveType.U64, "f16": PrimitiveType.F16,
    "bf16": PrimitiveType.BF16, "f32": PrimitiveType.F32, "f64": PrimitiveType.F64,
}  # fmt: skip


# -- the XLA_FFI_Api: objects handed to C are small structs keyed by an index ------------------
_KEYS = itertools.count(1)
_LOCK = threading.Lock()
_ERRORS: dict[int, tuple[Any, Any, int]] = {}  # index -> (struct, message, code)
_FUTURES: dict[int, tuple[Any, threading.Event, list]] = {}  # index -> (struct, done, [error])
_MEMORY: dict[int, Any] = {}  # address handed out -> the cffi allocation holding it
_TYPES: dict[str, int] = {}  # registered type name -> type id
_DELETERS: dict[int, int] = {}  # type id -> address of its deleter (XLA_FFI_TypeInfo)
_CONTEXTS: dict[int, _Context] = {}
_KEEP: list[Any] = []


@dataclass
class _State:
    """The state a handler's instantiate stage set for one instruction (type id 0: none)."""

    type_id: int = 0
    address: int = 0


@dataclass
class _Context:
    """What a call's XLA_FFI_ExecutionContext answers."""

    device_ordinal: int
    run_id: int
    stage: int = 3  # STAGE_EXECUTE
    state: _State | None = None


def new_error(code: int, message: str):
    """A new XLA_FFI_Error (ours, as a handler would make it with Error_Create)."""
    err = ffi.new("XLA_FFI_Error *")
    err.index = key = next(_KEYS)
    text = ffi.new("char[]", message.encode(errors="replace"))
    with _LOCK:
        _ERRORS[key] = (err, text, code)
    return err


def take_error(err) -> tuple[int, str]:
    """(code, message) of an XLA_FFI_Error made by Error_Create, which is destroyed."""
    with _LOCK:
        entry = _ERRORS.pop(err.index, None)
    if entry is None:
        return INTERNAL, "the handler returned an error xlapy did not create"
    return entry[2], ffi.string(entry[1]).decode(errors="replace")


def _implementation(name: str, fn):
    """The C entry of XLA_FFI_<name>: `fn(args)` returns None or raises; an exception
    becomes an XLA_FFI_Error (code from FfiError, else INTERNAL)."""

    def entry(args):
        try:
            fn(args)
        except FfiError as e:
            return new_error(e.code, f"XLA_FFI_{name}: {e}")
        except Exception as e:
            return new_error(INTERNAL, f"XLA_FFI_{name}: {type(e).__name__}: {e}")
        return ffi.NULL

    return ffi.callback(f"XLA_FFI_Error *(XLA_FFI_{_ARGS.get(name, name + '_Args')} *)", entry)


_ARGS = {"State_Set": "State_Args", "State_Get": "State_Args"}


class FfiError(Exception):
    """An error an XLA_FFI_Api function returns, with its code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _error_create(args) -> Any:
    message = "" if args.message == ffi.NULL else ffi.string(args.message).decode(errors="replace")
    return new_error(args.errc, message)


def _error_get_message(args) -> None:
    with _LOCK:
        entry = _ERRORS.get(args.error.index)
    args.message = entry[1] if entry is not None else _UNKNOWN_ERROR


def _error_destroy(args) -> None:
    with _LOCK:
        _ERRORS.pop(args.error.index, None)


_UNKNOWN_ERROR = ffi.new("char[]", b"unknown XLA FFI error")


def _handler_register(args) -> None:
    from xlapy.backends.custom_calls import ApiVersion, register

    name = ffi.string(args.name.ptr, args.name.len).decode()
    platform = ffi.string(args.platform.ptr, args.platform.len).decode()
    if platform.lower() not in ("host", "cpu", "xlapy"):
        raise FfiError(INVALID_ARGUMENT, f"xlapy runs handlers for the CPU, not {platform!r}")
    execute = args.bundle.execute
    if execute == ffi.NULL:
        raise FfiError(INVALID_ARGUMENT, f"handler {name!r} has no execute stage")
    address = int(ffi.cast("uintptr_t", execute))
    instantiate = int(ffi.cast("uintptr_t", args.bundle.instantiate))
    register(name, CHandler(name, address, instantiate=instantiate), "Host", ApiVersion.TYPED_FFI)


def _stream_get(args) -> None:
    raise FfiError(UNIMPLEMENTED, "there are no streams on xlapy's CPU devices")


def _type_register(args) -> None:
    name = ffi.string(args.name.ptr, args.name.len).decode()
    register_type(name, args.type_id, args.type_info)


_OWN_TYPE_IDS = 1 << 40
"""xlapy numbers the types it names from here, so that an id XLA:CPU's registry gave
(numbered from 1, in the same process) never means another type to xlapy."""


def register_type(name: str, type_id, type_info=None) -> int:
    """Give type `name` an id (the same one each time for a name) and write it into the
    XLA_FFI_TypeId `type_id` points at; a nonzero id already there must be the same.
    `type_info` (an XLA_FFI_TypeInfo pointer, or None/NULL) gives the deleter that frees a
    state object of this type."""
    given = type_id.type_id
    with _LOCK:
        known = _TYPES.get(name)
        taken = set(_TYPES.values())
        if known is None and given and given not in taken:
            # already given an id by another registry (XLA:CPU's, for platform "cpu" in
            # the same process): xlapy keeps it, so the one XLA_FFI_TypeId serves both
            known = _TYPES[name] = given
        elif known is None:  # far from the small sequential ids XLA's registry gives
            known = _TYPES[name] = max(taken | {_OWN_TYPE_IDS}) + 1
    if given not in (0, known):
        raise FfiError(INVALID_ARGUMENT, f"type {name!r} has id {known}, not {given}")
    type_id.type_id = known
    if type_info is not None and type_info != ffi.NULL and type_info.deleter != ffi.NULL:
        with _LOCK:
            _DELETERS[known] = int(ffi.cast("uintptr_t", type_info.deleter))
    return known


def _context(ctx) -> _Context:
    context = _CONTEXTS.get(ctx.index) if ctx != ffi.NULL else None
    if context is None:
        raise FfiError(INVALID_ARGUMENT, "not the execution context of a running call")
    return context


def _execution_context_get(args) -> None:
    """User data of the execution (XLA's ExecutionContext): XLA:CPU answers from what the
    caller attached to the execution (ExecuteOptions.context) and returns NOT_FOUND for any
    other type. JAX attaches user data only to XLA:CPU's own executions (its host
    callbacks, which xlapy runs through its own custom call), never to a PJRT plugin's, so
    an xlapy execution carries none: every lookup is NOT_FOUND, naming the type."""
    _context(args.ctx)
    wanted = args.type_id.type_id if args.type_id != ffi.NULL else 0
    with _LOCK:
        names = [name for name, known in _TYPES.items() if known == wanted]
    what = f"type id {wanted}" + (f" ({names[0]!r})" if names else " (never registered)")
    raise FfiError(
        NOT_FOUND,
        f"user data with {what} not found in the execution context: xlapy's executions carry "
        "no user data (JAX attaches none to a PJRT plugin's executions)",
    )


def _state_set(args) -> None:
    context = _context(args.ctx)
    if context.stage != STAGE_INSTANTIATE or args.stage != STAGE_INSTANTIATE:
        raise FfiError(
            INVALID_ARGUMENT, "state is set in the instantiate stage, for that stage only"
        )
    state = context.state
    if state is None or state.type_id:
        raise FfiError(INVALID_ARGUMENT, "the instantiate stage's state is already set")
    if args.type_id == ffi.NULL or args.type_id.type_id not in _TYPES.values():
        raise FfiError(INVALID_ARGUMENT, "the state's type was not registered (Type_Register)")
    state.type_id = args.type_id.type_id
    state.address = int(ffi.cast("uintptr_t", args.state))


def _state_get(args) -> None:
    context = _context(args.ctx)
    if args.stage != STAGE_INSTANTIATE:
        raise FfiError(UNIMPLEMENTED, "xlapy keeps the state of the instantiate stage only")
    state = context.state
    if state is None or not state.type_id:
        raise FfiError(NOT_FOUND, "no state was set by this handler's instantiate stage")
    wanted = args.type_id.type_id if args.type_id != ffi.NULL else 0
    if wanted != state.type_id:
        raise FfiError(INVALID_ARGUMENT, f"the state has type id {state.type_id}, not {wanted}")
    args.state = ffi.cast("void *", state.address)


def _memory_allocate(args) -> None:
    alignment = max(1, args.alignment)
    if alignment & (alignment - 1):
        raise FfiError(INVALID_ARGUMENT, f"alignment {alignment} is not a power of two")
    block = ffi.new("char[]", args.size + alignment)
    start = int(ffi.cast("uintptr_t", block))
    aligned = (start + alignment - 1) // alignment * alignment
    with _LOCK:
        _MEMORY[aligned] = block
    args.data = ffi.cast("void *", aligned)


def _memory_free(args) -> None:
    with _LOCK:
        block = _MEMORY.pop(int(ffi.cast("uintptr_t", args.data)), None)
    if block is None:
        raise FfiError(INVALID_ARGUMENT, "memory not allocated by DeviceMemory_Allocate")


_POOL: ThreadPoolExecutor | None = None


def _thread_pool() -> ThreadPoolExecutor:
    global _POOL
    with _LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=_num_threads(), thread_name_prefix="xlapy-ffi")
        return _POOL


def _num_threads() -> int:
    import os

    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)


def _thread_pool_schedule(args) -> None:
    task, data = args.task, args.data
    _thread_pool().submit(task, data)


def _thread_pool_num_threads(args) -> None:
    args.num_threads[0] = _num_threads()


def _future_create(args) -> None:
    future = ffi.new("XLA_FFI_Future *")
    future.index = key = next(_KEYS)
    with _LOCK:
        _FUTURES[key] = (future, threading.Event(), [])
    args.future = future


def _future(ptr) -> tuple[Any, threading.Event, list]:
    with _LOCK:
        entry = _FUTURES.get(ptr.index) if ptr != ffi.NULL else None
    if entry is None:
        raise FfiError(INVALID_ARGUMENT, "not a future made by Future_Create")
    return entry


def _future_set_available(args) -> None:
    _future(args.future)[1].set()


def _future_set_error(args) -> None:
    _, done, error = _future(args.future)
    error.append(take_error(args.error))
    done.set()


def _run_id_get(args) -> None:
    args.run_id = _context(args.ctx).run_id


def _device_ordinal_get(args) -> None:
    args.device_ordinal = _context(args.ctx).device_ordinal


_IMPLS = {
    "Handler_Register": _handler_register,
    "Stream_Get": _stream_get,
    "Type_Register": _type_register,
    "ExecutionContext_Get": _execution_context_get,
    "State_Set": _state_set,
    "State_Get": _state_get,
    "DeviceMemory_Allocate": _memory_allocate,
    "DeviceMemory_Free": _memory_free,
    "ThreadPool_Schedule": _thread_pool_schedule,
    "ThreadPool_NumThreads": _thread_pool_num_threads,
    "Future_Create": _future_create,
    "Future_SetAvailable": _future_set_available,
    "Future_SetError": _future_set_error,
    "RunId_Get": _run_id_get,
    "DeviceOrdinal_Get": _device_ordinal_get,
}
_API: Any = None


def api():
    """xlapy's XLA_FFI_Api (made on first use, kept for the process)."""
    global _API
    with _LOCK:
        if _API is not None:
            return _API
        table = ffi.new("XLA_FFI_Api *")
        table.struct_size = ffi.sizeof("XLA_FFI_Api")
        table.api_version.struct_size = struct_size("XLA_FFI_Api_Version", "minor_version")
        table.api_version.major_version = FFI_API_MAJOR
        table.api_version.minor_version = FFI_API_MINOR
        special = {
            "Error_Create": ffi.callback(
                "XLA_FFI_Error *(XLA_FFI_Error_Create_Args *)", _error_create
            ),
            "Error_GetMessage": ffi.callback(
                "void(XLA_FFI_Error_GetMessage_Args *)", _error_get_message
            ),
            "Error_Destroy": ffi.callback("void(XLA_FFI_Error_Destroy_Args *)", _error_destroy),
        }
        for i, name in enumerate(API_SLOTS):
            fn = special.get(name) or _implementation(name, _IMPLS[name])
            _KEEP.append(fn)
            table.slots[i] = ffi.cast("void *", fn)
        _API = table
        return table


# -- calling a handler ------------------------------------------------------------------------
_RUN_IDS = itertools.count()


@dataclass(frozen=True, slots=True)
class CHandler:
    """A typed FFI handler in C: the address of its `XLA_FFI_Handler` (execute stage), and
    of its instantiate stage (0: none)."""

    name: str
    address: int
    column_major: bool = False
    """JAX's LAPACK convention (jaxlib's own handlers): with the call's frontend attribute
    num_batch_dims = k, every operand and result of rank k + 2 is a batch of column-major
    matrices, every other one row-major, whatever layouts the program kept."""
    instantiate: int = 0

    def call(self, instr, ins, outs, device_ordinal: int = 0) -> None:
        """Run the handler for custom-call `instr` on operand leaves `ins` and result leaves
        `outs` (NumPy arrays, None for tokens; results filled in place)."""
        where = f"{instr.name}: custom-call target {instr.custom_call_target!r}"
        attrs = _frame_attributes(instr, where)
        state = self.state_of(instr, attrs, where) if self.instantiate else None
        keep: list[Any] = []
        if self.column_major:
            arg_orders, ret_orders = _lapack_orders(instr, ins), _lapack_orders(instr, outs)
        else:
            arg_orders, ret_orders = _physical_orders(instr, len(ins), len(outs))
        results = [_physical(o, order) for o, order in zip(outs, ret_orders, strict=True)]
        args = [_physical(a, order) for a, order in zip(ins, arg_orders, strict=True)]
        frame = _frame(STAGE_EXECUTE, attrs, keep, where)
        _buffers(frame.args, "args", args, keep, arg_orders)
        _buffers(frame.rets, "rets", results, keep, ret_orders)
        _run(self.address, frame, _Context(device_ordinal, next(_RUN_IDS), state=state), where)
        for out, result, order in zip(outs, results, ret_orders, strict=True):
            if out is not None and result is not out:
                out[...] = result if order is None else result.transpose(np.argsort(order))

    def state_of(self, instr, attrs: dict, where: str) -> _State:
        """The state of `instr`: made by the instantiate stage on the first call (its
        attributes, no buffers), kept while the instruction lives, freed by the deleter of
        the state's type after it."""
        with _STATE_LOCK:
            state = _STATES.get(instr)
            if state is not None:
                return state
            state = _State()
            keep: list[Any] = []
            frame = _frame(STAGE_INSTANTIATE, attrs, keep, where)
            _buffers(frame.args, "args", [], keep, [])
            _buffers(frame.rets, "rets", [], keep, [])
            context = _Context(0, next(_RUN_IDS), stage=STAGE_INSTANTIATE, state=state)
            _run(self.instantiate, frame, context, f"{where} (instantiate stage)")
            _STATES[instr] = state
        if state.type_id:
            deleter = _DELETERS.get(state.type_id, 0)
            if deleter:
                weakref.finalize(instr, _delete_state, deleter, state.address).atexit = False
        return state


_STATES: weakref.WeakKeyDictionary[Any, _State] = weakref.WeakKeyDictionary()
"""custom-call instruction -> the state its handler's instantiate stage set."""
_STATE_LOCK = threading.Lock()


def _delete_state(deleter: int, address: int) -> None:
    ffi.cast("void (*)(void *)", deleter)(ffi.cast("void *", address))


def _frame_attributes(instr, where: str) -> dict:
    config = typed_ffi.backend_config_text(instr)
    try:
        return typed_ffi.parse_attributes(config, typed=True)
    except ValueError as e:
        raise CustomCallError(f"{where}: cannot read backend_config {config!r}: {e}") from e


def _frame(stage: int, attrs: dict, keep: list, where: str):
    """A new XLA_FFI_CallFrame for `stage` carrying `attrs` (buffers filled by the caller)."""
    frame = ffi.new("XLA_FFI_CallFrame *")
    keep.append(frame)
    frame.struct_size = struct_size("XLA_FFI_CallFrame", "attrs")
    frame.api = api()
    frame.stage = stage
    try:
        _attributes(frame.attrs, attrs, keep)
    except CustomCallError as e:
        raise CustomCallError(f"{where}: {e}") from e
    return frame


def _run(address: int, frame, context: _Context, where: str) -> None:
    """Call the handler at `address` on `frame` in execution context `context`; its error
    (returned, or set on its future, which is waited for) raises CustomCallError."""
    ctx = ffi.new("XLA_FFI_ExecutionContext *")
    ctx.index = key = next(_KEYS)
    frame.ctx = ctx
    _CONTEXTS[key] = context
    try:
        err = ffi.cast("XLA_FFI_Handler *", address)(frame)
        if err != ffi.NULL:
            code, message = take_error(err)
            raise CustomCallError(f"{where} failed: {message} (error code {code})", code)
        if frame.future != ffi.NULL:
            _wait(frame.future, where)
    finally:
        del _CONTEXTS[key]


def _physical_orders(instr, n_args: int, n_rets: int) -> tuple[list, list]:
    """The major-to-minor dimension order each operand and result leaf must have in memory
    (None: row-major): XLA hands a C handler its buffers in the layouts the custom call
    declares (`operand_layout_constraints`, the result shape's layouts); JAX's LAPACK
    calls declare column-major matrices."""

    def order(shape) -> tuple[int, ...] | None:
        layout = getattr(shape, "layout", None)
        if layout is None or shape.is_tuple or layout.is_default:
            return None
        return tuple(reversed(layout.minor_to_major))

    constraints = instr.operand_layout_constraints
    args = [order(c) for c in constraints] if len(constraints) == n_args else [None] * n_args
    leaves = [leaf for _, leaf in instr.shape.leaves()]
    rets = [order(leaf) for leaf in leaves] if len(leaves) == n_rets else [None] * n_rets
    return args, rets


def _lapack_orders(instr, arrays) -> list:
    """Major-to-minor orders under JAX's LAPACK convention (CHandler.column_major)."""
    batch = instr.frontend_attributes.get("num_batch_dims")
    if batch is None:
        raise CustomCallError(
            f"{instr.name}: a LAPACK call needs its frontend attribute num_batch_dims"
        )
    k = int(batch)
    orders: list = []
    for array in arrays:
        if array is None or array.ndim != k + 2:
            orders.append(None)
        else:
            orders.append((*range(k), k + 1, k))
    return orders


def _physical(array, order):
    """`array` with its bytes in major-to-minor `order` (C-contiguous when order is None)."""
    if array is None:
        return None
    if order is None:
        return np.ascontiguousarray(array)
    return np.ascontiguousarray(np.transpose(array, order))


def _wait(future, where: str) -> None:
    _, done, error = _future(future)
    try:
        if not done.wait(FUTURE_TIMEOUT_SECONDS):
            raise CustomCallError(
                f"{where}: its asynchronous result was not ready after "
                f"{FUTURE_TIMEOUT_SECONDS:.0f} s"
            )
    finally:
        with _LOCK:
            _FUTURES.pop(future.index, None)
    if error:
        code, message = error[0]
        raise CustomCallError(f"{where} failed: {message} (error code {code})", code)


def _buffers(dest, field: str, arrays: list, keep: list, orders: list) -> None:
    """Fill XLA_FFI_Args/Rets `dest` with one XLA_FFI_Buffer per array (None: a token);
    an array stored in a major-to-minor `order` is described by its logical dims."""
    n = len(arrays)
    dest.struct_size = struct_size(f"XLA_FFI_{field.capitalize()}", field)
    dest.size = n
    types = ffi.new("int[]", [ARG_BUFFER] * max(n, 1))
    pointers = ffi.new("void *[]", max(n, 1))
    keep += [types, pointers]
    for i, (array, order) in enumerate(zip(arrays, orders, strict=True)):
        buf = ffi.new("XLA_FFI_Buffer *")
        buf.struct_size = struct_size("XLA_FFI_Buffer", "dims")
        if array is None:
            buf.dtype, buf.data, buf.rank = DATA_TYPES[PrimitiveType.TOKEN], ffi.NULL, 0
            buf.dims = ffi.NULL
        else:
            code = _DTYPE_CODES.get(array.dtype)
            if code is None:
                raise CustomCallError(f"XLA's FFI has no element type for {array.dtype}")
            shape = array.shape if order is None else np.array(array.shape)[np.argsort(order)]
            dims = ffi.new("int64_t[]", [int(d) for d in shape] or [0])
            keep.append(dims)
            buf.dtype = code
            buf.data = ffi.cast("void *", array.__array_interface__["data"][0])
            buf.rank, buf.dims = array.ndim, dims
        keep.append(buf)
        pointers[i] = buf
    dest.types = types
    setattr(dest, field, pointers)


def _attributes(dest, attrs: dict, keep: list) -> None:
    """Fill XLA_FFI_Attrs `dest` with `attrs` (TypedScalar, str, np.ndarray, dict), sorted
    by name as XLA's handlers expect."""
    names = sorted(attrs)
    n = len(names)
    dest.struct_size = struct_size("XLA_FFI_Attrs", "attrs")
    dest.size = n
    types = ffi.new("int[]", max(n, 1))
    spans = ffi.new("XLA_FFI_ByteSpan *[]", max(n, 1))
    values = ffi.new("void *[]", max(n, 1))
    keep += [types, spans, values]
    for i, name in enumerate(names):
        spans[i] = _span(name.encode(), keep)
        types[i], values[i] = _attribute(name, attrs[name], keep)
    dest.types, dest.names, dest.attrs = types, spans, values


def _span(data: bytes, keep: list):
    text = ffi.new("char[]", data)
    span = ffi.new("XLA_FFI_ByteSpan *")
    span.ptr, span.len = text, len(data)
    keep += [text, span]
    return span


def _attribute(name: str, value, keep: list) -> tuple[int, Any]:
    if isinstance(value, typed_ffi.TypedScalar):
        etype = _MLIR_SCALARS.get(value.type)
        if etype is None:
            raise CustomCallError(f"attribute {name!r}: no XLA FFI scalar of type {value.type}")
        data = np.array(value.value, dtype=etype.dtype)
        keep.append(data)
        scalar = ffi.new("XLA_FFI_Scalar *")
        scalar.dtype = DATA_TYPES[etype]
        scalar.value = ffi.cast("void *", data.__array_interface__["data"][0])
        keep.append(scalar)
        return ATTR_SCALAR, scalar
    if isinstance(value, str):
        return ATTR_STRING, _span(value.encode(), keep)
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value)
        code = _DTYPE_CODES.get(data.dtype)
        if code is None or data.ndim != 1:
            raise CustomCallError(f"attribute {name!r}: no XLA FFI array of {data.dtype}")
        keep.append(data)
        array = ffi.new("XLA_FFI_Array *")
        array.dtype, array.size = code, data.size
        array.data = ffi.cast("void *", data.__array_interface__["data"][0])
        keep.append(array)
        return ATTR_ARRAY, array
    if isinstance(value, dict):
        nested = ffi.new("XLA_FFI_Attrs *")
        keep.append(nested)
        _attributes(nested, value, keep)
        return ATTR_DICTIONARY, nested
    raise CustomCallError(
        f"attribute {name!r} ({typed_ffi.describe_value(value)}) has no XLA FFI encoding "
        "(scalars, strings, dense arrays array<...> and dictionaries do)"
    )
