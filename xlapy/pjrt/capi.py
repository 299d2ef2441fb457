"""xlapy's PJRT C API: the `PJRT_Api` function table, built in memory with cffi callbacks
over xlapy.runtime, handed to JAX as a PyCapsule.

The idea: every PJRT object JAX holds (client, device, device description, memory,
buffer, event, executable, loaded executable) is a small C struct allocated here whose
address keys `_OBJECTS`, the table of the Python objects behind them. A C call arrives as
a cffi callback with the call's argument struct; the implementation looks its objects up,
calls the runtime, writes the results into the struct and returns NULL, or returns a
PJRT_Error built from the exception (message + code): no Python exception ever reaches C.
Objects the caller destroys (buffers, events, executables, errors) leave the table in
their `*_Destroy`; the others live as long as the process. Every callback, every struct and
every string handed out is kept referenced here, since C only holds raw pointers.

Every slot of the table is filled: the functions xlapy does not implement return an
UNIMPLEMENTED error saying "xlapy does not implement PJRT_<name>".

Threads: JAX calls from any thread; cffi takes the GIL for each callback. Waiting
(`PJRT_Event_Await`) blocks on a runtime future, which lets go of the GIL.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from xlapy.errors import XlapyError
from xlapy.ir.shapes import Shape
from xlapy.ir.types import PrimitiveType
from xlapy.pjrt.abi import PJRT_API_MAJOR, PJRT_API_MINOR, SLOTS, ffi
from xlapy.pjrt.options import compile_options_from_proto, device_assignment_proto
from xlapy.pjrt.program import module_from_program
from xlapy.runtime import (
    Buffer,
    BufferDeletedError,
    Client,
    DonationError,
    Future,
    HostBufferSemantics,
    LoadedExecutable,
)
from xlapy.runtime.futures import COMPLETED

PLATFORM_NAME = "xlapy"

# PJRT_Error_Code values (absl status codes).
CANCELLED, UNKNOWN, INVALID_ARGUMENT, NOT_FOUND = 1, 2, 3, 5
FAILED_PRECONDITION, UNIMPLEMENTED, INTERNAL = 9, 12, 13

# PJRT_Buffer_Type, in enum order, as xlapy element types (None: not an array type).
BUFFER_TYPES: tuple[PrimitiveType | None, ...] = (
    None,
    PrimitiveType.PRED,
    PrimitiveType.S8,
    PrimitiveType.S16,
    PrimitiveType.S32,
    PrimitiveType.S64,
    PrimitiveType.U8,
    PrimitiveType.U16,
    PrimitiveType.U32,
    PrimitiveType.U64,
    PrimitiveType.F16,
    PrimitiveType.F32,
    PrimitiveType.F64,
    PrimitiveType.BF16,
    PrimitiveType.C64,
    PrimitiveType.C128,
    PrimitiveType.F8E5M2,
    PrimitiveType.F8E4M3FN,
    PrimitiveType.F8E4M3B11FNUZ,
    PrimitiveType.F8E5M2FNUZ,
    PrimitiveType.F8E4M3FNUZ,
    PrimitiveType.S4,
    PrimitiveType.U4,
    PrimitiveType.TOKEN,
    PrimitiveType.S2,
    PrimitiveType.U2,
    PrimitiveType.F8E4M3,
    PrimitiveType.F8E3M4,
    PrimitiveType.F8E8M0FNU,
    PrimitiveType.F4E2M1FN,
    PrimitiveType.S1,
    PrimitiveType.U1,
)
BUFFER_TYPE_OF = {t: i for i, t in enumerate(BUFFER_TYPES) if t is not None}

# PJRT_HostBufferSemantics, in enum order.
HOST_SEMANTICS = (
    HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL,
    HostBufferSemantics.IMMUTABLE_UNTIL_TRANSFER_COMPLETES,
    HostBufferSemantics.IMMUTABLE_ZERO_COPY,
    HostBufferSemantics.IMMUTABLE_ZERO_COPY,  # kMutableZeroCopy: xlapy never writes it
)

_OBJECTS: dict[int, Any] = {}
"""Address of a handle struct handed to C -> the Python object behind it."""
_ERRORS: dict[int, Any] = {}
"""Address of a live PJRT_Error -> (struct, message buffer)."""
_KEEP: list[Any] = []
"""Callbacks, tables and strings that must live as long as the process."""
_LOCK = threading.Lock()
_TRACE = os.environ.get("XLAPY_PJRT_TRACE") == "1"
"""Print every PJRT call (and the errors returned) on stdout."""


class PjrtError(XlapyError):
    """An error with a PJRT error code, raised by an implementation to choose the code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _addr(ptr) -> int:
    return int(ffi.cast("uintptr_t", ptr))


def _lookup(ptr, what: str):
    obj = _OBJECTS.get(ptr.index) if ptr != ffi.NULL else None
    if obj is None:
        raise PjrtError(INVALID_ARGUMENT, f"{what} is not a live xlapy PJRT object")
    return obj


_KEYS = itertools.count(1)


def _register(obj: Any, ctype: str):
    """A new handle struct of C type `ctype` for `obj`, keyed in _OBJECTS by its index."""
    c = ffi.new(ctype)
    c.index = key = next(_KEYS)
    _OBJECTS[key] = obj
    return c


def _forget(ptr) -> None:
    """Drop the handle `ptr` (a *_Destroy). C++ may call a destroy while a Python exception
    is pending (JAX arrays freed during unwinding); then any call of a C function from
    Python fails, so this uses bytecode operations only. The runtime work happens in the
    dropped object's __del__, which Python runs with the pending exception set aside."""
    if ptr != ffi.NULL:
        key = ptr.index
        # not dict.pop: that is a C call (see above)
        if key in _OBJECTS:
            del _OBJECTS[key]  # noqa: RUF051


def _cstr(text: str):
    data = text.encode()
    return ffi.new("char[]", data), len(data)


# -- errors ---------------------------------------------------------------------------------
def _new_error(code: int, message: str):
    msg, size = _cstr(message)
    err = ffi.new("PJRT_Error *")
    err.vtable = _ERROR_TABLE
    err.code = code
    err.message = msg
    err.message_size = size
    err.index = key = next(_KEYS)
    _ERRORS[key] = (err, msg)
    return err


def _error_of(exc: BaseException):
    if isinstance(exc, PjrtError):
        code = exc.code
    elif isinstance(exc, BufferDeletedError | DonationError):
        code = FAILED_PRECONDITION
    elif isinstance(exc, XlapyError | ValueError | TypeError | KeyError):
        code = INVALID_ARGUMENT
    elif isinstance(exc, NotImplementedError):
        code = UNIMPLEMENTED
    else:
        code = INTERNAL
    text = str(exc) or type(exc).__name__
    if not isinstance(exc, PjrtError | XlapyError):
        text = f"{type(exc).__name__}: {text}"
    return _new_error(code, f"xlapy: {text}")


def _destroy_error(err) -> None:
    """Bytecode operations only (see _forget)."""
    if err != ffi.NULL:
        key = err.index
        if key in _ERRORS:  # not dict.pop (see _forget)
            del _ERRORS[key]  # noqa: RUF051


@ffi.callback("void(PJRT_Error *)")
def _vt_destroy(err):
    _destroy_error(err)


@ffi.callback("void(const PJRT_Error *, const char **, size_t *)")
def _vt_message(err, message, size):
    message[0] = err.message
    size[0] = err.message_size


@ffi.callback("int(const PJRT_Error *)")
def _vt_code(err):
    return err.code


@ffi.callback("void(const PJRT_Error *, PJRT_Error_PayloadVisitor, void *)")
def _vt_payload(err, visitor, user_arg):
    return None


_ERROR_TABLE = ffi.new("PJRT_Error_FunctionTable *")
_ERROR_TABLE.struct_size = ffi.sizeof("PJRT_Error_FunctionTable")
_ERROR_TABLE.instance_size = ffi.sizeof("PJRT_Error")
_ERROR_TABLE.destroy = _vt_destroy
_ERROR_TABLE.message = _vt_message
_ERROR_TABLE.get_code = _vt_code
_ERROR_TABLE.for_each_payload = _vt_payload


# -- the function table ----------------------------------------------------------------------
_IMPLS: dict[str, Any] = {}


def export(name: str, args_type: str | None = None) -> Callable:
    """Register the implementation of PJRT_<name>, taking the C argument struct
    `args_type` (default PJRT_<name>_Args). It returns None for success or raises."""

    def deco(fn: Callable) -> Callable:
        ctype = args_type or f"PJRT_{name}_Args"

        def entry(args):
            if _TRACE:
                print(f"xlapy pjrt: PJRT_{name}", flush=True)
            try:
                fn(args)
            except BaseException as exc:
                if _TRACE:
                    print(f"xlapy pjrt: PJRT_{name} failed: {exc!r}", flush=True)
                return _error_of(exc)
            return ffi.NULL

        _IMPLS[name] = ffi.callback(f"PJRT_Error *({ctype} *)", entry)
        return fn

    return deco


def _unimplemented(name: str):
    def entry(args):
        return _new_error(UNIMPLEMENTED, f"xlapy does not implement PJRT_{name}")

    return ffi.callback("PJRT_Error *(void *)", entry)


@ffi.callback("void(PJRT_Error_Destroy_Args *)")
def _error_destroy(args):
    _destroy_error(args.error)


@ffi.callback("void(PJRT_Error_Message_Args *)")
def _error_message(args):
    args.message = args.error.message
    args.message_size = args.error.message_size


@export("Error_GetCode")
def _error_get_code(args):
    args.code = args.error.code


@export("Error_ForEachPayload")
def _error_for_each_payload(args):
    return None


# -- plugin ----------------------------------------------------------------------------------
def _named_values(pairs: list[tuple[str, Any]]):
    """A PJRT_NamedValue array (and what keeps its strings alive)."""
    values = ffi.new("PJRT_NamedValue[]", max(len(pairs), 1))
    keep: list[Any] = [values]
    for v, (name, value) in zip(values, pairs):
        v.struct_size = ffi.sizeof("PJRT_NamedValue")
        cname, size = _cstr(name)
        keep.append(cname)
        v.name, v.name_size = cname, size
        if isinstance(value, bool):
            v.type, v.bool_value, v.value_size = 4, value, 1
        elif isinstance(value, int):
            v.type, v.int64_value, v.value_size = 1, value, 1
        elif isinstance(value, float):
            v.type, v.float_value, v.value_size = 3, value, 1
        elif isinstance(value, str):
            cvalue, vsize = _cstr(value)
            keep.append(cvalue)
            v.type, v.string_value, v.value_size = 0, cvalue, vsize
        else:
            ints = ffi.new("int64_t[]", list(value) or [0])
            keep.append(ints)
            v.type, v.int64_array_value, v.value_size = 2, ints, len(value)
    return values, len(pairs), keep


def _stablehlo_versions() -> tuple[list[int], list[int]]:
    try:
        from jaxlib.mlir.dialects import stablehlo

        current = [int(p) for p in stablehlo.get_current_version().split(".")]
        minimum = [int(p) for p in stablehlo.get_minimum_version().split(".")]
        return current, minimum
    except Exception:
        return [1, 0, 0], [0, 9, 0]


_ATTRIBUTES: Any = None


@export("Plugin_Initialize")
def _plugin_initialize(args):
    return None


@export("Plugin_Attributes")
def _plugin_attributes(args):
    global _ATTRIBUTES
    if _ATTRIBUTES is None:
        from xlapy import __version__

        current, minimum = _stablehlo_versions()
        _ATTRIBUTES = _named_values(
            [
                ("xla_version", 2),
                ("stablehlo_current_version", current),
                ("stablehlo_minimum_version", minimum),
                ("xlapy_version", __version__),
            ]
        )
    args.attributes, args.num_attributes = _ATTRIBUTES[0], _ATTRIBUTES[1]


# -- events ----------------------------------------------------------------------------------
class PEvent:
    """A PJRT_Event: a runtime future (its result is ignored, its error reported)."""

    __slots__ = ("c", "future")

    def __init__(self, future: Future):
        self.future = future
        self.c = _register(self, "PJRT_Event *")

    @property
    def ptr(self):
        return self.c


def _event_error(future: Future):
    error = future.exception()
    return ffi.NULL if error is None else _error_of(error)


@export("Event_Destroy")
def _event_destroy(args):
    _forget(args.event)


@export("Event_IsReady")
def _event_is_ready(args):
    args.is_ready = _lookup(args.event, "event").future.done()


@ffi.callback("PJRT_Error *(PJRT_Event_Error_Args *)")
def _event_error_entry(args):
    try:
        return _event_error(_lookup(args.event, "event").future)
    except BaseException as exc:
        return _error_of(exc)


@ffi.callback("PJRT_Error *(PJRT_Event_Await_Args *)")
def _event_await_entry(args):
    try:
        return _event_error(_lookup(args.event, "event").future)
    except BaseException as exc:
        return _error_of(exc)


@export("Event_OnReady")
def _event_on_ready(args):
    future = _lookup(args.event, "event").future
    callback, user_arg = args.callback, args.user_arg

    def on_done(fut: Future) -> None:
        callback(_event_error(fut), user_arg)

    future.add_done_callback(on_done)


@export("Event_Create")
def _event_create(args):
    args.event = PEvent(Future()).ptr


@export("Event_Set")
def _event_set(args):
    future = _lookup(args.event, "event").future
    if args.error_code == 0:
        future.set_result(None)
    else:
        message = ffi.string(args.error_message, args.error_message_size).decode(errors="replace")
        future.set_exception(PjrtError(args.error_code, message))


# -- client, devices, memories -------------------------------------------------------------
class PMemory:
    """A PJRT_Memory (its struct starts with the memory function table)."""

    def __init__(self, space, device: PDevice):
        self.space = space
        self.device = device
        self.c = _register(self, "PJRT_Memory *")
        self.c.vtable = _MEMORY_TABLE
        self.kind = _cstr(space.kind)
        text = f"{PLATFORM_NAME}:{device.device.id} {space.kind} memory (id {space.id})"
        self.debug = _cstr(text)
        self.text = _cstr(f"MEMORY_SPACE_{space.id}")
        self.user_data: dict[int, Any] = {}
        self.devices = ffi.new("PJRT_Device *[]", [device.ptr])

    @property
    def ptr(self):
        return self.c


@ffi.callback("void *(PJRT_Memory *, const void *)")
def _mem_get_user_data(memory, key):
    obj = _OBJECTS.get(memory.index)
    if obj is None:
        return ffi.NULL
    entry = obj.user_data.get(_addr(key))
    return ffi.NULL if entry is None else entry[0]


@ffi.callback("void(PJRT_Memory *, const void *, void *, void (*)(void *))")
def _mem_set_user_data(memory, key, data, dtor):
    obj = _OBJECTS.get(memory.index)
    if obj is not None:
        old = obj.user_data.pop(_addr(key), None)
        if old is not None and old[1] != ffi.NULL:
            old[1](old[0])
        obj.user_data[_addr(key)] = (data, dtor)


_MEMORY_TABLE = ffi.new("PJRT_Memory_FunctionTable *")
_MEMORY_TABLE.struct_size = ffi.sizeof("PJRT_Memory_FunctionTable")
_MEMORY_TABLE.instance_struct_size = ffi.sizeof("PJRT_Memory")
_MEMORY_TABLE.get_user_data = _mem_get_user_data
_MEMORY_TABLE.set_user_data = _mem_set_user_data


class PDevice:
    """A PJRT_Device and its PJRT_DeviceDescription (two handles, one object)."""

    def __init__(self, device, client: PClient):
        self.device = device
        self.client = client
        self.c = _register(self, "PJRT_Device *")
        self.desc_c = _register(self, "PJRT_DeviceDescription *")
        self.kind = _cstr(f"xlapy {device.kind}")
        self.debug = _cstr(f"{PLATFORM_NAME}:{device.id} ({device.kind} via xlapy)")
        self.text = _cstr(f"XlapyDevice(id={device.id})")
        self.attributes = _named_values([])
        self.memories: list[PMemory] = []
        self.memory_ptrs: Any = None

    @property
    def ptr(self):
        return self.c

    @property
    def desc_ptr(self):
        return self.desc_c

    def default_memory(self) -> PMemory:
        return self.memories[0]


class PClient:
    """A PJRT_Client over an xlapy runtime Client."""

    def __init__(self, device_count: int):
        self.client = Client("cpu", device_count=device_count)
        self.c = _register(self, "PJRT_Client *")
        self.name = _cstr(PLATFORM_NAME)
        self.version = _cstr(self.client.platform_version)
        self.devices = [PDevice(d, self) for d in self.client.devices()]
        self.by_device = {d.device.id: d for d in self.devices}
        self.memories: list[PMemory] = []
        for d in self.devices:
            d.memories = [PMemory(s, d) for s in d.device.memory_spaces]
            d.memory_ptrs = ffi.new("PJRT_Memory *[]", [m.ptr for m in d.memories])
            self.memories.extend(d.memories)
        self.by_space = {id(m.space): m for m in self.memories}
        self.device_ptrs = ffi.new("PJRT_Device *[]", [d.ptr for d in self.devices])
        self.memory_ptrs = ffi.new("PJRT_Memory *[]", [m.ptr for m in self.memories])
        self.topology = PTopology(self)

    @property
    def ptr(self):
        return self.c

    def device_of(self, device) -> PDevice:
        return self.by_device[device.id]

    def memory_of(self, space) -> PMemory:
        return self.by_space[id(space)]


class PTopology:
    """The client's PJRT_TopologyDescription."""

    def __init__(self, client: PClient):
        self.client = client
        self.c = _register(self, "PJRT_TopologyDescription *")
        self.descs = ffi.new("PJRT_DeviceDescription *[]", [d.desc_ptr for d in client.devices])
        self.attributes = _named_values([])

    @property
    def ptr(self):
        return self.c


def _device_count(args) -> int:
    count = int(os.environ.get("XLAPY_DEVICE_COUNT", "1"))
    for i in range(args.num_options):
        option = args.create_options[i]
        name = ffi.string(option.name, option.name_size).decode()
        if name == "device_count" and option.type == 1:
            count = int(option.int64_value)
        elif name == "device_count" and option.type == 0:  # jax_pjrt_client_create_options
            count = int(ffi.string(option.string_value, option.value_size))
    if count < 1:
        raise PjrtError(INVALID_ARGUMENT, f"device_count must be >= 1, got {count}")
    return count


@export("Client_Create")
def _client_create(args):
    args.client = PClient(_device_count(args)).ptr


@export("Client_Destroy")
def _client_destroy(args):
    # The client's devices and memories stay valid: buffers JAX still holds may refer to
    # them until the process ends. Its worker threads are daemons.
    return None


def _client(ptr) -> PClient:
    return _lookup(ptr, "client")


@export("Client_PlatformName")
def _client_platform_name(args):
    c = _client(args.client)
    args.platform_name, args.platform_name_size = c.name


@export("Client_ProcessIndex")
def _client_process_index(args):
    args.process_index = _client(args.client).client.process_index


@export("Client_PlatformVersion")
def _client_platform_version(args):
    c = _client(args.client)
    args.platform_version, args.platform_version_size = c.version


@export("Client_Devices")
def _client_devices(args):
    c = _client(args.client)
    args.devices, args.num_devices = c.device_ptrs, len(c.devices)


@export("Client_AddressableDevices")
def _client_addressable_devices(args):
    c = _client(args.client)
    args.addressable_devices, args.num_addressable_devices = c.device_ptrs, len(c.devices)


@export("Client_LookupDevice")
def _client_lookup_device(args):
    c = _client(args.client)
    args.device = c.device_of(c.client.lookup_device(args.id)).ptr


@export("Client_LookupAddressableDevice")
def _client_lookup_addressable_device(args):
    c = _client(args.client)
    args.addressable_device = c.device_of(c.client.lookup_device(args.local_hardware_id)).ptr


@export("Client_AddressableMemories")
def _client_addressable_memories(args):
    c = _client(args.client)
    args.addressable_memories, args.num_addressable_memories = c.memory_ptrs, len(c.memories)


@export("Client_DefaultDeviceAssignment")
def _client_default_device_assignment(args):
    c = _client(args.client)
    rows = c.client.default_device_assignment(args.num_replicas, args.num_partitions)
    flat = [d for row in rows for d in row]
    if args.default_assignment_size < len(flat):
        raise PjrtError(INVALID_ARGUMENT, "default_assignment_size is too small")
    for i, d in enumerate(flat):
        args.default_assignment[i] = d


@export("Client_TopologyDescription")
def _client_topology(args):
    args.topology = _client(args.client).topology.ptr


@export("TopologyDescription_Destroy")
def _topology_destroy(args):
    return None  # owned by the client


@export("TopologyDescription_PlatformName", "PJRT_TopologyDescription_Text_Args")
def _topology_platform_name(args):
    t = _lookup(args.topology, "topology")
    args.text, args.text_size = t.client.name


@export("TopologyDescription_PlatformVersion", "PJRT_TopologyDescription_Text_Args")
def _topology_platform_version(args):
    t = _lookup(args.topology, "topology")
    args.text, args.text_size = t.client.version


@export("TopologyDescription_GetDeviceDescriptions")
def _topology_descriptions(args):
    t = _lookup(args.topology, "topology")
    args.descriptions, args.num_descriptions = t.descs, len(t.client.devices)


@export("TopologyDescription_Fingerprint")
def _topology_fingerprint(args):
    t = _lookup(args.topology, "topology")
    digest = hashlib.sha256(f"{PLATFORM_NAME}:{len(t.client.devices)}".encode()).digest()
    args.fingerprint = int.from_bytes(digest[:8], "little")


@export("TopologyDescription_Attributes")
def _topology_attributes(args):
    t = _lookup(args.topology, "topology")
    args.attributes, args.num_attributes = t.attributes[0], t.attributes[1]


def _desc(ptr) -> PDevice:
    return _lookup(ptr, "device description")


@export("DeviceDescription_Id")
def _desc_id(args):
    args.id = _desc(args.device_description).device.id


@export("DeviceDescription_ProcessIndex")
def _desc_process_index(args):
    args.process_index = _desc(args.device_description).device.process_index


@export("DeviceDescription_Attributes")
def _desc_attributes(args):
    d = _desc(args.device_description)
    args.attributes, args.num_attributes = d.attributes[0], d.attributes[1]


@export("DeviceDescription_Kind", "PJRT_DeviceDescription_Text_Args")
def _desc_kind(args):
    args.text, args.text_size = _desc(args.device_description).kind


@export("DeviceDescription_DebugString", "PJRT_DeviceDescription_Text_Args")
def _desc_debug_string(args):
    args.text, args.text_size = _desc(args.device_description).debug


@export("DeviceDescription_ToString", "PJRT_DeviceDescription_Text_Args")
def _desc_to_string(args):
    args.text, args.text_size = _desc(args.device_description).text


def _device(ptr) -> PDevice:
    return _lookup(ptr, "device")


@export("Device_GetDescription")
def _device_get_description(args):
    args.device_description = _device(args.device).desc_ptr


@export("Device_IsAddressable")
def _device_is_addressable(args):
    args.is_addressable = _device(args.device).device.is_addressable()


@export("Device_LocalHardwareId")
def _device_local_hardware_id(args):
    args.local_hardware_id = _device(args.device).device.local_hardware_id


@export("Device_AddressableMemories")
def _device_memories(args):
    d = _device(args.device)
    args.memories, args.num_memories = d.memory_ptrs, len(d.memories)


@export("Device_DefaultMemory")
def _device_default_memory(args):
    args.memory = _device(args.device).default_memory().ptr


@export("Device_MemoryStats")
def _device_memory_stats(args):
    stats = _device(args.device).device.memory_stats()
    args.bytes_in_use = stats.bytes_in_use
    args.peak_bytes_in_use, args.peak_bytes_in_use_is_set = stats.peak_bytes_in_use, True
    args.num_allocs, args.num_allocs_is_set = stats.num_allocs, True
    args.largest_alloc_size, args.largest_alloc_size_is_set = stats.largest_alloc_size, True
    args.bytes_limit_is_set = args.bytes_reserved_is_set = False
    args.peak_bytes_reserved_is_set = args.bytes_reservable_limit_is_set = False
    args.largest_free_block_bytes_is_set = args.pool_bytes_is_set = False
    args.peak_pool_bytes_is_set = False


@ffi.callback("void(void *)")
def _attributes_deleter(handle):
    return None  # the attributes belong to the device


@export("Device_GetAttributes")
def _device_get_attributes(args):
    d = _device(args.device)
    args.attributes, args.num_attributes = d.attributes[0], d.attributes[1]
    args.device_attributes = ffi.NULL
    args.attributes_deleter = _attributes_deleter


@export("Device_ClearMemoryStats")
def _device_clear_memory_stats(args):
    _device(args.device).device.allocator.reset_peak()


def _memory(ptr) -> PMemory:
    return _lookup(ptr, "memory")


@export("Memory_Id")
def _memory_id(args):
    args.id = _memory(args.memory).space.id


@export("Memory_Kind", "PJRT_Memory_Text_Args")
def _memory_kind(args):
    args.text, args.text_size = _memory(args.memory).kind


@export("Memory_Kind_Id")
def _memory_kind_id(args):
    m = _memory(args.memory)
    args.kind_id = m.device.memories.index(m)


@export("Memory_DebugString", "PJRT_Memory_Text_Args")
def _memory_debug_string(args):
    args.text, args.text_size = _memory(args.memory).debug


@export("Memory_ToString", "PJRT_Memory_Text_Args")
def _memory_to_string(args):
    args.text, args.text_size = _memory(args.memory).text


@export("Memory_AddressableByDevices")
def _memory_devices(args):
    m = _memory(args.memory)
    args.devices, args.num_devices = m.devices, 1


# -- buffers ---------------------------------------------------------------------------------
class PBuffer:
    """A PJRT_Buffer over a runtime Buffer."""

    __slots__ = ("buffer", "c", "client", "dims", "ext_refs", "layout")

    def __init__(self, buffer: Buffer, client: PClient):
        self.buffer = buffer
        self.client = client
        self.c = _register(self, "PJRT_Buffer *")
        self.dims: Any = None
        self.layout: Any = None
        self.ext_refs: list[Any] = []

    @property
    def ptr(self):
        return self.c

    def __del__(self) -> None:
        # PJRT_Buffer_Destroy: delete the buffer (external references keep its memory).
        self.buffer.delete()


def _buffer(ptr) -> PBuffer:
    obj = _OBJECTS.get(ptr.index) if ptr != ffi.NULL else None
    if obj is None:
        raise PjrtError(INVALID_ARGUMENT, "buffer is not a live xlapy PJRT buffer")
    return obj


def _host_array(args) -> np.ndarray:
    """A NumPy view of the caller's host data described by BufferFromHostBuffer args."""
    etype = BUFFER_TYPES[args.type] if 0 <= args.type < len(BUFFER_TYPES) else None
    if etype is None or etype.dtype is None:
        raise PjrtError(INVALID_ARGUMENT, f"unsupported PJRT buffer type {args.type}")
    dtype = np.dtype(etype.dtype)
    dims = tuple(args.dims[i] for i in range(args.num_dims))
    count = int(np.prod(dims, dtype=np.int64)) if dims else 1
    if args.num_byte_strides and count:
        strides = tuple(args.byte_strides[i] for i in range(args.num_byte_strides))
        low = sum(min(0, (d - 1) * s) for d, s in zip(dims, strides))
        high = sum(max(0, (d - 1) * s) for d, s in zip(dims, strides)) + dtype.itemsize
        raw = ffi.buffer(ffi.cast("char *", args.data) + low, high - low)
        return np.ndarray(dims, dtype, buffer=raw, offset=-low, strides=strides)
    if count == 0:
        return np.zeros(dims, dtype)
    raw = np.frombuffer(ffi.buffer(args.data, count * dtype.itemsize), dtype=dtype)
    return raw.reshape(dims)


@export("Client_BufferFromHostBuffer")
def _client_buffer_from_host(args):
    c = _client(args.client)
    if args.memory != ffi.NULL:
        space = _memory(args.memory).space
    elif args.device != ffi.NULL:
        space = _device(args.device).device.default_memory_space
    else:
        space = c.devices[0].device.default_memory_space
    if args.device_layout != ffi.NULL:
        _check_default_layout(args.device_layout, args.num_dims)
    array = _host_array(args)
    semantics = HOST_SEMANTICS[args.host_buffer_semantics]
    done = Future()
    if semantics is HostBufferSemantics.IMMUTABLE_ZERO_COPY and array.flags.c_contiguous:
        # The buffer uses the caller's memory; it is done with it when the last view of
        # that memory dies (every view's base is the _HostMemory, see there).
        owner = _HostMemory(array, done)
        array = np.asarray(owner).view(array.dtype).reshape(array.shape)
        buffer = c.client.buffer_from_pyval(array, space, semantics)
        del owner, array
    else:
        buffer = c.client.buffer_from_pyval(
            array, space, HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL
        )
        done.set_result(None)
    args.done_with_host_buffer = PEvent(done).ptr
    args.buffer = PBuffer(buffer, c).ptr


class _HostMemory:
    """The caller's host memory lent to a zero-copy buffer: arrays made from it keep it as
    their base, so it dies (and completes `done`, telling the caller it may free the
    memory) only when the last array using that memory is gone."""

    def __init__(self, array: np.ndarray, done: Future):
        self.__array_interface__ = {
            "shape": (array.nbytes,),
            "typestr": "|u1",
            "data": (array.__array_interface__["data"][0], True),
            "version": 3,
        }
        self._done = done

    def __del__(self) -> None:
        self._done.set_result(None)


def _check_default_layout(layout, rank: int) -> None:
    if layout.type == 0:
        m2m = [layout.tiled.minor_to_major[i] for i in range(layout.tiled.minor_to_major_size)]
        if m2m and m2m != list(range(rank - 1, -1, -1)):
            raise PjrtError(
                UNIMPLEMENTED, f"xlapy buffers are row-major; layout {{{m2m}}} was requested"
            )
        if layout.tiled.num_tiles:
            raise PjrtError(UNIMPLEMENTED, "xlapy buffers have no tiled layouts")
    elif layout.type == 1:
        raise PjrtError(UNIMPLEMENTED, "xlapy buffers have no strided device layouts")


def _shape_args(dims_ptr, num_dims: int, etype_code: int) -> tuple[tuple[int, ...], Any]:
    etype = BUFFER_TYPES[etype_code] if 0 <= etype_code < len(BUFFER_TYPES) else None
    if etype is None or etype.dtype is None:
        raise PjrtError(INVALID_ARGUMENT, f"unsupported PJRT buffer type {etype_code}")
    return tuple(dims_ptr[i] for i in range(num_dims)), etype.dtype


@export("Client_CreateUninitializedBuffer")
def _client_uninitialized_buffer(args):
    c = _client(args.client)
    dims, dtype = _shape_args(args.shape_dims, args.shape_num_dims, args.shape_element_type)
    if args.memory != ffi.NULL:
        space = _memory(args.memory).space
    else:
        space = _device(args.device).device.default_memory_space
    args.buffer = PBuffer(c.client.buffer_from_pyval(np.zeros(dims, dtype), space), c).ptr


@export("Client_CreateErrorBuffer")
def _client_error_buffer(args):
    c = _client(args.client)
    dims, dtype = _shape_args(args.shape_dims, args.shape_num_dims, args.shape_element_type)
    space = _memory(args.memory).space
    message = ffi.string(args.error_message, args.error_message_size).decode(errors="replace")
    good = c.client.buffer_from_pyval(np.zeros(dims, dtype), space)
    failed = Buffer(good.shape, good._donate(), Future.failed(PjrtError(args.error_code, message)))
    args.buffer = PBuffer(failed, c).ptr


@export("Buffer_Destroy", "PJRT_Buffer_Only_Args")
def _buffer_destroy(args):
    _forget(args.buffer)


@export("Buffer_ElementType")
def _buffer_element_type(args):
    args.type = BUFFER_TYPE_OF[_buffer(args.buffer).buffer.shape.element_type]


def _dims(pb: PBuffer):
    if pb.dims is None:
        dims = pb.buffer.shape.dims
        pb.dims = (ffi.new("int64_t[]", list(dims) or [0]), len(dims))
    return pb.dims


@export("Buffer_Dimensions")
def _buffer_dimensions(args):
    args.dims, args.num_dims = _dims(_buffer(args.buffer))


@export("Buffer_UnpaddedDimensions", "PJRT_Buffer_Dimensions_Args")
def _buffer_unpadded_dimensions(args):
    args.dims, args.num_dims = _dims(_buffer(args.buffer))


@export("Buffer_DynamicDimensionIndices")
def _buffer_dynamic_dims(args):
    _buffer(args.buffer)
    args.num_dynamic_dims = 0


@export("Buffer_GetMemoryLayout")
def _buffer_memory_layout(args):
    pb = _buffer(args.buffer)
    if pb.layout is None:
        rank = len(pb.buffer.shape.dims)
        pb.layout = ffi.new("int64_t[]", list(range(rank - 1, -1, -1)) or [0])
    layout = args.layout
    layout.struct_size = ffi.sizeof("PJRT_Buffer_MemoryLayout")
    layout.type = 0
    layout.tiled.struct_size = ffi.sizeof("PJRT_Buffer_MemoryLayout_Tiled")
    layout.tiled.minor_to_major = pb.layout
    layout.tiled.minor_to_major_size = len(pb.buffer.shape.dims)
    layout.tiled.num_tiles = 0


@export("Buffer_OnDeviceSizeInBytes")
def _buffer_size(args):
    args.on_device_size_in_bytes = _buffer(args.buffer).buffer.on_device_size_in_bytes()


@export("Buffer_Device")
def _buffer_device(args):
    pb = _buffer(args.buffer)
    args.device = pb.client.device_of(pb.buffer.device).ptr


@export("Buffer_Memory")
def _buffer_memory(args):
    pb = _buffer(args.buffer)
    args.memory = pb.client.memory_of(pb.buffer.memory_space).ptr


@export("Buffer_Delete", "PJRT_Buffer_Only_Args")
def _buffer_delete(args):
    _buffer(args.buffer).buffer.delete()


@export("Buffer_IsDeleted", "PJRT_Buffer_Flag_Args")
def _buffer_is_deleted(args):
    args.flag = _buffer(args.buffer).buffer.is_deleted


@export("Buffer_IsOnCpu", "PJRT_Buffer_Flag_Args")
def _buffer_is_on_cpu(args):
    _buffer(args.buffer)
    args.flag = True


@export("Buffer_ReadyEvent")
def _buffer_ready_event(args):
    buffer = _buffer(args.buffer).buffer
    try:
        future = buffer.ready()
    except BufferDeletedError as exc:
        future = Future.failed(exc)
    args.event = PEvent(future).ptr


def _copy_out(array: np.ndarray, dst, size: int) -> None:
    out = np.frombuffer(ffi.buffer(dst, size), dtype=np.uint8)
    data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    out[: data.size] = data


def _host_order(array: np.ndarray, layout) -> np.ndarray:
    """`array` rearranged for a host layout (minor_to_major) the caller asked for."""
    if layout == ffi.NULL:
        return array
    if layout.type != 0:
        raise PjrtError(UNIMPLEMENTED, "xlapy copies to host in tiled layouts only")
    rank = array.ndim
    m2m = [layout.tiled.minor_to_major[i] for i in range(layout.tiled.minor_to_major_size)]
    if not m2m or m2m == list(range(rank - 1, -1, -1)):
        return array
    return np.ascontiguousarray(array.transpose(list(reversed(m2m))))


@export("Buffer_ToHostBuffer")
def _buffer_to_host(args):
    pb = _buffer(args.src)
    buffer = pb.buffer
    nbytes = buffer.shape.byte_size
    if args.dst == ffi.NULL:
        args.dst_size = nbytes
        return
    if args.dst_size < nbytes:
        raise PjrtError(
            INVALID_ARGUMENT, f"host buffer of {args.dst_size} bytes is too small ({nbytes})"
        )
    dst, size, layout = args.dst, args.dst_size, args.host_layout
    ready = buffer.ready()
    if ready.done() and ready.exception() is None:
        _copy_out(_host_order(buffer._array(), layout), dst, size)
        args.event = PEvent(COMPLETED).ptr
        return
    host = buffer.copy_to_host()
    done = Future()
    order = _host_order if layout == ffi.NULL else None
    if order is None:
        # The layout struct only lives during this call: rearrange with what it says now.
        m2m = [layout.tiled.minor_to_major[i] for i in range(layout.tiled.minor_to_major_size)]

        def order(array, _layout, m2m=m2m):
            if not m2m or m2m == list(range(array.ndim - 1, -1, -1)):
                return array
            return np.ascontiguousarray(array.transpose(list(reversed(m2m))))

    def on_done(fut: Future) -> None:
        error = fut.exception()
        if error is None:
            _copy_out(order(fut.result(), ffi.NULL), dst, size)
            done.set_result(None)
        else:
            done.set_exception(error)

    host.add_done_callback(on_done)
    args.event = PEvent(done).ptr


@export("Buffer_CopyRawToHost")
def _buffer_copy_raw_to_host(args):
    buffer = _buffer(args.buffer).buffer
    raw = np.ascontiguousarray(buffer.to_numpy()).reshape(-1).view(np.uint8)
    start, count = args.offset, args.transfer_size
    if start < 0 or start + count > raw.size:
        raise PjrtError(INVALID_ARGUMENT, f"raw copy [{start}, {start + count}) out of range")
    _copy_out(raw[start : start + count], args.dst, count)
    args.event = PEvent(COMPLETED).ptr


@export("Buffer_UnsafePointer")
def _buffer_unsafe_pointer(args):
    args.buffer_pointer = _buffer(args.buffer).buffer.unsafe_buffer_pointer()


@export("Buffer_OpaqueDeviceMemoryDataPointer")
def _buffer_opaque_pointer(args):
    pointer = _buffer(args.buffer).buffer.unsafe_buffer_pointer()
    args.device_memory_ptr = ffi.cast("void *", pointer)


@export("Buffer_IncreaseExternalReferenceCount", "PJRT_Buffer_Only_Args")
def _buffer_inc_ref(args):
    pb = _buffer(args.buffer)
    ref = pb.buffer.external_reference()
    ref.__enter__()
    pb.ext_refs.append(ref)


@export("Buffer_DecreaseExternalReferenceCount", "PJRT_Buffer_Only_Args")
def _buffer_dec_ref(args):
    pb = _buffer(args.buffer)
    if not pb.ext_refs:
        raise PjrtError(FAILED_PRECONDITION, "buffer has no external reference to release")
    pb.ext_refs.pop().__exit__(None, None, None)


@export("Buffer_CopyToDevice")
def _buffer_copy_to_device(args):
    pb = _buffer(args.buffer)
    target = _device(args.dst_device)
    args.dst_buffer = PBuffer(pb.buffer.copy_to_device(target.device), pb.client).ptr


@export("Buffer_CopyToMemory")
def _buffer_copy_to_memory(args):
    pb = _buffer(args.buffer)
    target = _memory(args.dst_memory)
    args.dst_buffer = PBuffer(pb.buffer.copy_to_memory_space(target.space), pb.client).ptr


# -- executables -----------------------------------------------------------------------------
class PExecutable:
    """A PJRT_Executable or PJRT_LoadedExecutable over a runtime LoadedExecutable; the
    per-executable C arrays are shared between the two."""

    def __init__(self, info: ExecInfo, loaded: bool):
        self.info = info
        self.loaded = loaded
        self.deleted = False
        self.c = _register(self, "PJRT_LoadedExecutable *" if loaded else "PJRT_Executable *")

    @property
    def ptr(self):
        return self.c


class ExecInfo:
    """What JAX asks about one compiled program, as C values made once."""

    def __init__(self, executable: LoadedExecutable, client: PClient):
        self.executable = executable
        self.client = client
        self.name = _cstr(executable.name)
        self.fingerprint = _cstr(executable.fingerprint)
        leaves = [s for _, s in executable.output_shape.leaves() if s.is_array]
        self.outputs: list[Shape] = leaves
        self.types = ffi.new("int[]", [BUFFER_TYPE_OF[s.element_type] for s in leaves] or [0])
        dims = [d for s in leaves for d in s.dims]
        self.dims = ffi.new("int64_t[]", dims or [0])
        self.dim_sizes = ffi.new("size_t[]", [len(s.dims) for s in leaves] or [0])
        self.devices = [client.device_of(d) for d in executable.addressable_devices]
        self.device_ptrs = ffi.new("PJRT_Device *[]", [d.ptr for d in self.devices])
        assignment = executable.device_assignment
        self.logical_ids = ffi.new(
            "PJRT_LogicalDeviceIds[]",
            [(r, p) for r, row in enumerate(assignment) for p, _ in enumerate(row)],
        )
        params = executable.parameter_shapes
        kind = _cstr("device")
        self.kind = kind
        self.param_kinds = ffi.new("const char *[]", [kind[0]] * max(len(params), 1))
        self.param_kind_sizes = ffi.new("size_t[]", [kind[1]] * max(len(params), 1))
        self.num_params = len(params)
        self.out_kinds = ffi.new("const char *[]", [kind[0]] * max(len(leaves), 1))
        self.out_kind_sizes = ffi.new("size_t[]", [kind[1]] * max(len(leaves), 1))
        self.aliased = frozenset(a.param_number for a in _aliases(executable))
        self.cost: Any = None
        self.proto: bytes | None = None
        self.options = b""
        """The serialized CompileOptionsProto it was compiled with."""


def _aliases(executable: LoadedExecutable):
    from xlapy.backends.base import alias_leaves

    return alias_leaves(executable.module)


def _exec(ptr) -> PExecutable:
    return _lookup(ptr, "executable")


def _compile(c: PClient, code: bytes, fmt: str, options: bytes) -> PExecutable:
    module = module_from_program(code, fmt)
    compile_options = compile_options_from_proto(options)
    if compile_options.num_partitions > 1:
        raise PjrtError(
            UNIMPLEMENTED,
            f"{module.name} is partitioned over {compile_options.num_partitions} devices "
            "(jit with shardings, shard_map, pmap); xlapy has no SPMD partitioner yet, so it "
            "runs programs on one device each (or replicated: num_replicas)",
        )
    executable = c.client.compile(module, compile_options)
    info = ExecInfo(executable, c)
    info.options = options
    return PExecutable(info, loaded=True)


@export("Client_Compile")
def _client_compile(args):
    c = _client(args.client)
    program = args.program
    code = bytes(ffi.buffer(program.code, program.code_size))
    fmt = ffi.string(program.format, program.format_size).decode()
    options = bytes(ffi.buffer(args.compile_options, args.compile_options_size))
    args.executable = _compile(c, code, fmt, options).ptr


@export("Executable_Destroy")
def _executable_destroy(args):
    _forget(args.executable)


@export("LoadedExecutable_Destroy")
def _loaded_destroy(args):
    _forget(args.executable)


@export("LoadedExecutable_GetExecutable")
def _loaded_get_executable(args):
    e = _exec(args.loaded_executable)
    args.executable = PExecutable(e.info, loaded=False).ptr


@export("Executable_Name", "PJRT_Executable_Text_Args")
def _executable_name(args):
    args.text, args.text_size = _exec(args.executable).info.name


@export("Executable_NumReplicas", "PJRT_Executable_Count_Args")
def _executable_num_replicas(args):
    args.count = _exec(args.executable).info.executable.num_replicas


@export("Executable_NumPartitions", "PJRT_Executable_Count_Args")
def _executable_num_partitions(args):
    args.count = _exec(args.executable).info.executable.num_partitions


@export("Executable_NumOutputs", "PJRT_Executable_Count_Args")
def _executable_num_outputs(args):
    args.count = len(_exec(args.executable).info.outputs)


@export("Executable_SizeOfGeneratedCodeInBytes")
def _executable_code_size(args):
    args.size_in_bytes = len(_exec(args.executable).info.executable.hlo_text())


@export("Executable_OutputElementTypes")
def _executable_output_types(args):
    info = _exec(args.executable).info
    args.output_types, args.num_output_types = info.types, len(info.outputs)


@export("Executable_OutputDimensions")
def _executable_output_dims(args):
    info = _exec(args.executable).info
    args.num_outputs, args.dims, args.dim_sizes = len(info.outputs), info.dims, info.dim_sizes


@export("Executable_OutputMemoryKinds", "PJRT_Executable_MemoryKinds_Args")
def _executable_output_kinds(args):
    info = _exec(args.executable).info
    args.num_kinds = len(info.outputs)
    args.memory_kinds, args.memory_kind_sizes = info.out_kinds, info.out_kind_sizes


@export("Executable_ParameterMemoryKinds", "PJRT_Executable_MemoryKinds_Args")
def _executable_param_kinds(args):
    info = _exec(args.executable).info
    args.num_kinds = info.num_params
    args.memory_kinds, args.memory_kind_sizes = info.param_kinds, info.param_kind_sizes


@export("Executable_Fingerprint")
def _executable_fingerprint(args):
    e = _exec(args.executable)
    args.executable_fingerprint, args.executable_fingerprint_size = e.info.fingerprint


@export("LoadedExecutable_Fingerprint")
def _loaded_fingerprint(args):
    e = _exec(args.executable)
    args.executable_fingerprint, args.executable_fingerprint_size = e.info.fingerprint


@export("Executable_GetCostAnalysis")
def _executable_cost(args):
    info = _exec(args.executable).info
    if info.cost is None:
        costs = info.executable.cost_analysis()
        info.cost = _named_values([(k, float(v)) for k, v in sorted(costs.items())])
    args.properties, args.num_properties = info.cost[0], info.cost[1]


@export("Executable_GetCompiledMemoryStats")
def _executable_memory_stats(args):
    executable = _exec(args.executable).info.executable
    stats = executable.memory_stats()
    args.generated_code_size_in_bytes = len(executable.hlo_text())
    args.argument_size_in_bytes = stats.argument_bytes
    args.output_size_in_bytes = stats.output_bytes
    args.alias_size_in_bytes = stats.alias_bytes
    args.temp_size_in_bytes = stats.temp_bytes
    args.host_generated_code_size_in_bytes = 0
    args.host_argument_size_in_bytes = 0
    args.host_output_size_in_bytes = 0
    args.host_alias_size_in_bytes = 0
    args.host_temp_size_in_bytes = 0
    if args.struct_size > ffi.offsetof(
        "PJRT_Executable_GetCompiledMemoryStats_Args", "peak_memory_in_bytes"
    ):
        args.peak_memory_in_bytes = stats.peak_bytes
        args.total_size_in_bytes = stats.peak_bytes
        args.total_allocation_bytes = stats.peak_bytes
        args.indefinite_allocations = 0
        args.peak_unpadded_heap_bytes = stats.temp_bytes


_MLIR_FORMAT = _cstr("mlir")


def _hlo_proto(info: ExecInfo) -> bytes:
    """xlapy's compiled module as MLIR bytecode (what JAX reads for `compiled.as_text()`):
    XLA's HLO parser reads xlapy's HLO text, jaxlib converts that to StableHLO."""
    if info.proto is None:
        from jax._src.lib import _jax, xla_client

        text = info.executable.hlo_text()
        try:
            module = xla_client.hlo.hlo_module_from_text(text)
        except Exception as e:
            raise PjrtError(
                UNIMPLEMENTED,
                f"XLA's parser does not read xlapy's HLO text of "
                f"{info.executable.name} ({e}); xlapy's text:\n{text}",
            ) from e
        proto = module.as_serialized_hlo_module_proto()
        info.proto = _jax.mlir.hlo_to_stablehlo(proto)
    return info.proto


@export("Executable_OptimizedProgram")
def _executable_optimized_program(args):
    data = _hlo_proto(_exec(args.executable).info)
    program = args.program
    program.format, program.format_size = _MLIR_FORMAT
    if program.code == ffi.NULL:
        program.code_size = len(data)
        return
    if program.code_size < len(data):
        raise PjrtError(INVALID_ARGUMENT, "program buffer too small for the optimized HLO")
    ffi.memmove(program.code, data, len(data))
    program.code_size = len(data)


_SERIALIZED: dict[int, Any] = {}


@ffi.callback("void(void *)")
def _serialized_deleter(handle):
    _SERIALIZED.pop(_addr(handle), None)


@export("Executable_Serialize")
def _executable_serialize(args):
    data = _exec(args.executable).info.executable.serialize()
    blob = ffi.new("char[]", data)
    handle = ffi.new("XlapyHandle *")
    _SERIALIZED[_addr(handle)] = (blob, handle)
    args.serialized_bytes, args.serialized_bytes_size = blob, len(data)
    args.serialized_executable = ffi.cast("void *", handle)
    args.serialized_executable_deleter = _serialized_deleter


@export("Executable_GetCompileOptions")
def _executable_compile_options(args):
    data = _exec(args.executable).info.options
    blob = ffi.new("char[]", data or b"\0")
    handle = ffi.new("XlapyHandle *")
    _SERIALIZED[_addr(handle)] = (blob, handle)
    args.serialized_bytes, args.serialized_bytes_size = blob, len(data)
    args.serialized_compile_options = ffi.cast("void *", handle)
    args.serialized_compile_options_deleter = _serialized_deleter


@export("Client_Load")
def _client_load(args):
    e = _exec(args.executable)
    args.loaded_executable = PExecutable(e.info, loaded=True).ptr


@export("Executable_DeserializeAndLoad")
def _executable_deserialize(args):
    c = _client(args.client)
    data = bytes(ffi.buffer(args.serialized_executable, args.serialized_executable_size))
    executable = c.client.deserialize_executable(data)
    args.loaded_executable = PExecutable(ExecInfo(executable, c), loaded=True).ptr


@export("LoadedExecutable_AddressableDevices")
def _loaded_devices(args):
    info = _exec(args.executable).info
    args.addressable_devices = info.device_ptrs
    args.num_addressable_devices = len(info.devices)


@export("LoadedExecutable_AddressableDeviceLogicalIds")
def _loaded_logical_ids(args):
    info = _exec(args.executable).info
    args.addressable_device_logical_ids = info.logical_ids
    args.num_addressable_device_logical_ids = len(info.devices)


@export("LoadedExecutable_GetDeviceAssignment")
def _loaded_device_assignment(args):
    info = _exec(args.executable).info
    data = device_assignment_proto(info.executable.device_assignment)
    blob = ffi.new("char[]", data)
    handle = ffi.new("XlapyHandle *")
    _SERIALIZED[_addr(handle)] = (blob, handle)
    args.serialized_bytes, args.serialized_bytes_size = blob, len(data)
    args.serialized_device_assignment = ffi.cast("void *", handle)
    args.serialized_device_assignment_deleter = _serialized_deleter


@export("LoadedExecutable_Delete")
def _loaded_delete(args):
    _exec(args.executable).deleted = True


@export("LoadedExecutable_IsDeleted")
def _loaded_is_deleted(args):
    args.is_deleted = _exec(args.executable).deleted


def _all_ready(buffers: list[Buffer]) -> Future:
    pending = [b.ready() for b in buffers if not b.ready().done()]
    failed = [f for f in (b.ready() for b in buffers) if f.done() and f.exception()]
    if failed:
        return failed[0]
    if not pending:
        return COMPLETED
    done = Future()
    remaining = [len(pending)]
    lock = threading.Lock()

    def on_done(fut: Future) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
            if done.done():
                return
            error = fut.exception()
            if error is not None:
                done.set_exception(error)
                return
        if last:
            done.set_result(None)

    for f in pending:
        f.add_done_callback(on_done)
    return done


@export("LoadedExecutable_Execute")
def _loaded_execute(args):
    e = _exec(args.executable)
    if e.deleted:
        raise PjrtError(FAILED_PRECONDITION, f"executable {e.info.executable.name} was deleted")
    info = e.info
    executable = info.executable
    num_args = args.num_args
    lists = [
        [_buffer(args.argument_lists[d][i]).buffer for i in range(num_args)]
        for d in range(args.num_devices)
    ]
    non_donatable: tuple[int, ...] = ()
    options = args.options
    if options != ffi.NULL and options.num_non_donatable_input_indices:
        non_donatable = tuple(
            options.non_donatable_input_indices[i]
            for i in range(options.num_non_donatable_input_indices)
        )
    donate = [p for p in info.aliased if p not in non_donatable]
    if args.execute_device != ffi.NULL:
        device = _device(args.execute_device).device
        if executable.num_replicas * executable.num_partitions == 1:
            results = [executable.execute_portable(lists[0], device, donate=donate)]
        else:
            results = [executable.execute_sharded(lists[0], device, donate=donate)]
    else:
        results = executable.execute(lists, donate=donate)
    client = info.client
    for d, outputs in enumerate(results):
        row = args.output_lists[d]
        for i, out in enumerate(outputs):
            row[i] = PBuffer(out, client).ptr
        if args.device_complete_events != ffi.NULL:
            args.device_complete_events[d] = PEvent(_all_ready(outputs)).ptr


# -- execute contexts (accepted, unused) -----------------------------------------------------
@export("ExecuteContext_Create")
def _execute_context_create(args):
    c = _register(object(), "PJRT_ExecuteContext *")
    args.context = c
    _KEEP.append(c)


@export("ExecuteContext_Destroy")
def _execute_context_destroy(args):
    _forget(args.context)


# -- the table and the capsule ----------------------------------------------------------------
_API: Any = None


def api_pointer() -> int:
    """The address of xlapy's PJRT_Api (built on first use, kept for the process)."""
    global _API
    if _API is None:
        api = ffi.new("PJRT_Api *")
        api.struct_size = ffi.sizeof("PJRT_Api")
        api.pjrt_api_version.struct_size = ffi.sizeof("PJRT_Api_Version")
        api.pjrt_api_version.major_version = PJRT_API_MAJOR
        api.pjrt_api_version.minor_version = PJRT_API_MINOR
        special = {
            "Error_Destroy": _error_destroy,
            "Error_Message": _error_message,
            "Event_Error": _event_error_entry,
            "Event_Await": _event_await_entry,
        }
        for i, name in enumerate(SLOTS):
            fn = special.get(name) or _IMPLS.get(name) or _unimplemented(name)
            _KEEP.append(fn)
            api.slots[i] = ffi.cast("void *", fn)
        _API = api
    return _addr(_API)


def implemented() -> list[str]:
    """The PJRT functions xlapy implements (the others return UNIMPLEMENTED errors)."""
    special = {"Error_Destroy", "Error_Message", "Event_Error", "Event_Await"}
    return [n for n in SLOTS if n in _IMPLS or n in special]


def capsule() -> Any:
    """A PyCapsule named "pjrt_c_api" holding xlapy's `const PJRT_Api*`, as jaxlib's
    `register_plugin(c_api=...)` expects."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(api_pointer(), b"pjrt_c_api", None)
