"""PJRT buffers over xlapy runtime Buffers: host transfers (every host-buffer semantics,
zero-copy included), shapes and layouts, readiness, deletion, external references, copies
between devices and memories."""

from __future__ import annotations

from typing import Any

import numpy as np

from xlapy.ir.types import PrimitiveType
from xlapy.pjrt.abi import ffi
from xlapy.pjrt.client import PClient, get_client, get_device, get_memory
from xlapy.pjrt.core import (
    FAILED_PRECONDITION,
    INVALID_ARGUMENT,
    OBJECTS,
    UNIMPLEMENTED,
    PEvent,
    PjrtError,
    export,
    forget,
    register,
)
from xlapy.pjrt.native_execute import adopt_handle, arm, free_native, materialize, retire
from xlapy.runtime import (
    Buffer,
    BufferDeletedError,
    Future,
    HostBufferSemantics,
)
from xlapy.runtime.futures import COMPLETED

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


# -- buffers ---------------------------------------------------------------------------------
class PBuffer:
    """A PJRT_Buffer over a runtime Buffer."""

    __slots__ = ("adopted", "buffer", "c", "client", "dims", "ext_refs", "layout", "retired")

    def __init__(self, buffer: Buffer, client: PClient):
        self.buffer = buffer
        self.client = client
        self.c = c = register(self, "PJRT_Buffer *")
        # what Buffer_Device / Buffer_Memory answer natively (NULL: ask Python)
        try:
            memory = client.by_space.get(id(buffer.memory_space))
        except BufferDeletedError:
            memory = None
        if memory is not None:
            c.device, c.memory = memory.device.c, memory.c
        self.dims: Any = None
        self.layout: Any = None
        self.ext_refs: list[Any] = []
        self.retired = self.adopted = False
        if memory is not None:
            arm(self)

    @classmethod
    def in_memory(cls, buffer: Buffer, client: PClient, memory: Any) -> PBuffer:
        """`PBuffer(buffer, client)` for a live buffer known to be in `memory` (a PMemory):
        the same handle without looking the memory up."""
        pb = cls.__new__(cls)
        pb.buffer, pb.client = buffer, client
        pb.c = c = register(pb, "PJRT_Buffer *")
        c.device, c.memory = memory.device.c, memory.c
        pb.dims = pb.layout = None
        pb.ext_refs = []
        pb.retired = pb.adopted = False
        arm(pb)
        return pb

    @classmethod
    def adopt(cls, c: Any, buffer: Buffer, memory: Any) -> PBuffer:
        """The PBuffer of a handle the native Execute made (`c`, allocated natively; see
        native_execute.materialize): registered under a new key, freed with this object."""
        pb = cls.__new__(cls)
        pb.buffer, pb.client, pb.c = buffer, memory.device.client, c
        pb.dims = pb.layout = None
        pb.ext_refs = []
        pb.retired, pb.adopted = False, True
        adopt_handle(pb, c)
        return pb

    @property
    def ptr(self):
        return self.c

    def __del__(self) -> None:
        # PJRT_Buffer_Destroy: delete the buffer (external references keep its memory).
        self.buffer.delete()
        if self.adopted:  # the handle struct is native memory: freed here, once
            self.adopted = False
            free_native(self.c)

    def retire(self) -> None:
        """Before the buffer is deleted or donated: no native reader may use it any more
        (see native_execute.retire)."""
        retire(self)


def get_buffer(ptr) -> PBuffer:
    obj = OBJECTS.get(ptr.index) if ptr != ffi.NULL else None
    if obj is None:
        obj = materialize(ptr)
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
    c = get_client(args.client)
    if args.memory != ffi.NULL:
        space = get_memory(args.memory).space
    elif args.device != ffi.NULL:
        space = get_device(args.device).device.default_memory_space
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
    c = get_client(args.client)
    dims, dtype = _shape_args(args.shape_dims, args.shape_num_dims, args.shape_element_type)
    if args.memory != ffi.NULL:
        space = get_memory(args.memory).space
    else:
        space = get_device(args.device).device.default_memory_space
    args.buffer = PBuffer(c.client.buffer_from_pyval(np.zeros(dims, dtype), space), c).ptr


@export("Client_CreateErrorBuffer")
def _client_error_buffer(args):
    c = get_client(args.client)
    dims, dtype = _shape_args(args.shape_dims, args.shape_num_dims, args.shape_element_type)
    space = get_memory(args.memory).space
    message = ffi.string(args.error_message, args.error_message_size).decode(errors="replace")
    good = c.client.buffer_from_pyval(np.zeros(dims, dtype), space)
    failed = Buffer(good.shape, good.donate(), Future.failed(PjrtError(args.error_code, message)))
    args.buffer = PBuffer(failed, c).ptr


@export("Buffer_Destroy", "PJRT_Buffer_Only_Args")
def _buffer_destroy(args):
    forget(args.buffer)


@export("Buffer_ElementType")
def _buffer_element_type(args):
    args.type = BUFFER_TYPE_OF[get_buffer(args.buffer).buffer.shape.element_type]


def _dims(pb: PBuffer):
    if pb.dims is None:
        dims = pb.buffer.shape.dims
        pb.dims = (ffi.new("int64_t[]", list(dims) or [0]), len(dims))
    return pb.dims


@export("Buffer_Dimensions")
def _buffer_dimensions(args):
    args.dims, args.num_dims = _dims(get_buffer(args.buffer))


@export("Buffer_UnpaddedDimensions", "PJRT_Buffer_Dimensions_Args")
def _buffer_unpadded_dimensions(args):
    args.dims, args.num_dims = _dims(get_buffer(args.buffer))


@export("Buffer_DynamicDimensionIndices")
def _buffer_dynamic_dims(args):
    get_buffer(args.buffer)
    args.num_dynamic_dims = 0


@export("Buffer_GetMemoryLayout")
def _buffer_memory_layout(args):
    pb = get_buffer(args.buffer)
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
    args.on_device_size_in_bytes = get_buffer(args.buffer).buffer.on_device_size_in_bytes()


@export("Buffer_Device")
def _buffer_device(args):
    pb = get_buffer(args.buffer)
    args.device = pb.client.device_of(pb.buffer.device).ptr


@export("Buffer_Memory")
def _buffer_memory(args):
    pb = get_buffer(args.buffer)
    args.memory = pb.client.memory_of(pb.buffer.memory_space).ptr


@export("Buffer_Delete", "PJRT_Buffer_Only_Args")
def _buffer_delete(args):
    pb = get_buffer(args.buffer)
    pb.retire()
    pb.buffer.delete()


@export("Buffer_IsDeleted", "PJRT_Buffer_Flag_Args")
def _buffer_is_deleted(args):
    args.flag = get_buffer(args.buffer).buffer.is_deleted


@export("Buffer_IsOnCpu", "PJRT_Buffer_Flag_Args")
def _buffer_is_on_cpu(args):
    get_buffer(args.buffer)
    args.flag = True


@export("Buffer_ReadyEvent")
def _buffer_ready_event(args):
    buffer = get_buffer(args.buffer).buffer
    try:
        future = buffer.ready()
    except BufferDeletedError as exc:
        future = Future.failed(exc)
    args.event = PEvent.of(future)


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
    pb = get_buffer(args.src)
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
        _copy_out(_host_order(buffer.device_array(), layout), dst, size)
        args.event = PEvent.of(COMPLETED)
        return
    host = buffer.copy_to_host()
    done = Future(host.producer)  # a wait from the producing device's own thread: re-entry
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
    buffer = get_buffer(args.buffer).buffer
    raw = np.ascontiguousarray(buffer.to_numpy()).reshape(-1).view(np.uint8)
    start, count = args.offset, args.transfer_size
    if start < 0 or start + count > raw.size:
        raise PjrtError(INVALID_ARGUMENT, f"raw copy [{start}, {start + count}) out of range")
    _copy_out(raw[start : start + count], args.dst, count)
    args.event = PEvent.of(COMPLETED)


@export("Buffer_UnsafePointer")
def _buffer_unsafe_pointer(args):
    args.buffer_pointer = get_buffer(args.buffer).buffer.unsafe_buffer_pointer()


@export("Buffer_OpaqueDeviceMemoryDataPointer")
def _buffer_opaque_pointer(args):
    pointer = get_buffer(args.buffer).buffer.unsafe_buffer_pointer()
    args.device_memory_ptr = ffi.cast("void *", pointer)


@export("Buffer_IncreaseExternalReferenceCount", "PJRT_Buffer_Only_Args")
def _buffer_inc_ref(args):
    pb = get_buffer(args.buffer)
    ref = pb.buffer.external_reference()
    ref.__enter__()
    pb.ext_refs.append(ref)


@export("Buffer_DecreaseExternalReferenceCount", "PJRT_Buffer_Only_Args")
def _buffer_dec_ref(args):
    pb = get_buffer(args.buffer)
    if not pb.ext_refs:
        raise PjrtError(FAILED_PRECONDITION, "buffer has no external reference to release")
    pb.ext_refs.pop().__exit__(None, None, None)


@export("Buffer_CopyToDevice")
def _buffer_copy_to_device(args):
    pb = get_buffer(args.buffer)
    target = get_device(args.dst_device)
    args.dst_buffer = PBuffer(pb.buffer.copy_to_device(target.device), pb.client).ptr


@export("Buffer_CopyToMemory")
def _buffer_copy_to_memory(args):
    pb = get_buffer(args.buffer)
    target = get_memory(args.dst_memory)
    args.dst_buffer = PBuffer(pb.buffer.copy_to_memory_space(target.space), pb.client).ptr
