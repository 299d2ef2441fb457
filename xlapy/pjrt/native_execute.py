"""The native Execute: a jitted call that never enters Python.

The common call of a cheap program (one device, nothing donated, every argument a live,
ready array on that device, the program native kernels in a row: the CPU backend's
`native_plan`) is replayed by a function compiled once per executable with llvmlite. It
runs on JAX's calling thread without the GIL:

1. checks the call (one device, no execute device, the argument count) and each argument
   handle: it counts itself as a reader of the handle (`readers`, atomically), then reads
   the handle's `plain` word, its shape key and memory; any mismatch undoes the counts and
   hands the whole call to the Python Execute, which runs as before;
2. allocates each output (aligned_alloc) and its handle (malloc), counting the bytes in
   the device allocator's native counters (native.NativeCounters), so memory statistics
   stay exact;
3. calls the kernels' entries on the allocation addresses, lets go of the arguments, and
   hands back the output handles (`native` set, `index` 0: no Python object behind them)
   and the shared completed event.

Mirror of the runtime's buffer state: a handle is `plain` only while its bytes may be read
natively: set when the plugin makes a handle over a ready, contiguous runtime buffer
(`arm`), cleared before the plugin deletes or donates that buffer (`retire`, which then
waits for the native readers already counted to finish), so a native read never races a
deletion or a donation (the runtime's usage holds, for native readers). Python meets a
native handle only when JAX asks something the native functions do not answer (to host,
delete, donation, its size...): `materialize` then gives it a runtime Buffer over the
same bytes, counted already, freed (and uncounted) when that Buffer lets go of them.
`PJRT_Buffer_Destroy` of a handle Python never saw frees it natively (native.py).
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from xlapy.ir.shapes import Shape
from xlapy.pjrt import native
from xlapy.pjrt.abi import ffi
from xlapy.pjrt.core import COMPLETED_EVENT, OBJECTS, address, register_at
from xlapy.runtime import Buffer
from xlapy.runtime.buffer import _Storage
from xlapy.runtime.futures import COMPLETED

if TYPE_CHECKING:
    from xlapy.pjrt.buffers import PBuffer
    from xlapy.pjrt.executables import ExecInfo

ALIGNMENT = 64
"""Bytes the native allocator aligns outputs to (what the kernels are compiled for)."""

_SHAPE_KEYS: dict[tuple[Any, tuple[int, ...]], int] = {}
SHAPES: dict[int, Shape] = {}
"""Shape key (the `shape_key` word of a handle) -> the array shape it stands for."""
_NEXT_KEY = itertools.count(1)


def shape_key(shape: Shape) -> int:
    """The nonzero word standing for `shape`'s element type and dimensions."""
    k = (shape.element_type, shape.dims)
    key = _SHAPE_KEYS.get(k)
    if key is None:
        key = _SHAPE_KEYS[k] = next(_NEXT_KEY)
        SHAPES[key] = shape
    return key


def enabled() -> bool:
    """Whether the native helpers were compiled (the plugin's native paths are on)."""
    return bool(native.ADDRESSES)


# -- the mirror of a Python-made handle ------------------------------------------------------
def arm(pb: PBuffer) -> None:
    """Make `pb` readable natively if its buffer is ready (see the module docstring); one
    not ready yet is armed when a call that takes the Python path meets it as an argument
    (`arm_pending`): no callback on the device's worker, which would contend for the GIL."""
    if native.ADDRESSES and pb.buffer.contents_ready.done():
        _arm_now(pb)


def arm_pending(pb: PBuffer) -> None:
    """`arm` for a handle met as an argument of the Python Execute."""
    if not pb.retired and not pb.c.plain and native.ADDRESSES and pb.buffer.contents_ready.done():
        _arm_now(pb)


_MIRROR_LOCK = threading.Lock()
"""Orders arming (maybe on a device worker, when an output becomes ready) and retiring."""


def _arm_now(pb: PBuffer) -> None:
    with _MIRROR_LOCK:
        _arm_locked(pb)


def _arm_locked(pb: PBuffer) -> None:
    buffer = pb.buffer
    storage = buffer.storage
    if pb.retired or storage is None or buffer.contents_ready.exception() is not None:
        return
    array = storage.array
    if (
        array is None
        or not storage.nbytes
        or array.nbytes != storage.nbytes
        or not array.flags.c_contiguous
    ):
        return
    c = pb.c
    c.data = ffi.cast("void *", array.__array_interface__["data"][0])
    c.nbytes = storage.nbytes
    c.shape_key = shape_key(buffer.shape)
    c.plain = 1


_RETIRE: Any = None


def retire(pb: PBuffer) -> None:
    """No native reader may use `pb`'s bytes from now on; returns once none does (call
    before deleting or donating its buffer)."""
    if not pb.retired:
        retire_all([pb])


def retire_all(pbs: list[PBuffer]) -> None:
    """`retire` of each of `pbs` (the donated arguments of a call), under one hold of the
    mirror's lock."""
    global _RETIRE
    with _MIRROR_LOCK:
        for pb in pbs:
            if pb.retired:
                continue
            pb.retired = True
            if pb.c.plain:
                if _RETIRE is None:
                    address = native.ADDRESSES["xlapy_retire"]
                    _RETIRE = ffi.cast("void(*)(PJRT_Buffer *)", address)
                _RETIRE(pb.c)  # waits for native readers: they never need this lock


# -- native handles seen from Python ---------------------------------------------------------
class _NativeBlock:
    """Output bytes the native Execute allocated, lent to NumPy: freed with libc's free
    when the last array over them is gone."""

    def __init__(self, data: int, nbytes: int):
        self.__array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (data, False),
            "version": 3,
        }
        self._data = data

    def __del__(self) -> None:
        free = _FREE
        if free is not None:
            free(ffi.cast("void *", self._data))


_FREE: Any = None


def materialize(ptr: Any) -> PBuffer | None:
    """The PBuffer of a handle the native Execute made (registered now, over the same
    bytes, counted already); None when `ptr` is not such a handle."""
    if ptr == ffi.NULL or not ptr.native or ptr.index:
        return None
    with _MIRROR_LOCK:  # two threads meeting the same new handle make one PBuffer
        if ptr.index:
            return OBJECTS.get(ptr.index)
        return _materialize_locked(ptr)


def _materialize_locked(ptr: Any) -> PBuffer:
    global _FREE
    from xlapy.pjrt.buffers import PBuffer

    if _FREE is None:
        _FREE = ffi.cast("void(*)(void *)", native.libc_free())
    memory = OBJECTS[ffi.cast("PJRT_Memory *", ptr.memory).index]
    shape = SHAPES[ptr.shape_key]
    nbytes = ptr.nbytes
    data = address(ptr.data)
    raw = np.asarray(_NativeBlock(data, nbytes))
    array = raw.view(shape.dtype).reshape(shape.dims)
    storage = _Storage(memory.space, nbytes, array=array, counted=True)
    return PBuffer.adopt(ptr, Buffer(shape, storage, COMPLETED), memory)


# -- the per-executable entry ------------------------------------------------------------------
def build(info: ExecInfo) -> Any:
    """Compile the native Execute of `info`'s executable: (engine, address), or None when
    its calls cannot run natively (see the module docstring)."""
    if not native.ADDRESSES:
        return None
    executable = info.executable
    if not info.single or info.donated or len(executable.addressable_devices) != 1:
        return None
    signature = executable.call_signature
    if signature.inline_checks is None or signature.protected or not signature.output_leaves:
        return None
    if info.python_outputs:  # the Python Execute adds or moves them
        return None
    device = executable.addressable_devices[0]
    counters = device.allocator._counters
    if not device.inline_execution or counters is None:
        return None
    program = executable.backend_program()
    plan_of = getattr(program, "native_plan", None)
    plan = plan_of() if plan_of is not None else None
    if plan is None or program.temp_allocation_bytes:
        return None
    if len(plan.outputs) != len(signature.output_leaves) or len(plan.params) != len(
        signature.param_shapes
    ):
        return None
    if any(not n for _, _, n in signature.output_leaves) or any(
        not s.byte_size for s in signature.param_shapes
    ):
        return None
    space = device.default_memory_space
    memory = info.client.by_space[id(space)]
    ir = _entry_ir(info, plan, signature, memory, counters, counters.kinds[space.kind])
    engine = native.compile_ir(ir, immortal=False)
    return engine, engine.get_function_address("run")


def _entry_ir(info, plan, signature, memory, counters, kind: int) -> str:
    off = ffi.offsetof
    args_t = "PJRT_LoadedExecutable_Execute_Args"
    buf = native._field
    n = len(signature.param_shapes)
    keys = [shape_key(s) for s in signature.param_shapes]
    mem = address(memory.c)
    dev = address(memory.device.c)
    python = native.ADDRESSES["python_execute"]
    L = [
        "declare ptr @aligned_alloc(i64, i64)",
        "declare ptr @malloc(i64)",
        "declare void @free(ptr)",
        "",
        "define ptr @run(ptr %args) {",
        "entry:",
        f"  %ndp = getelementptr i8, ptr %args, i64 {off(args_t, 'num_devices')}",
        "  %nd = load i64, ptr %ndp",
        f"  %edp = getelementptr i8, ptr %args, i64 {off(args_t, 'execute_device')}",
        "  %ed = load ptr, ptr %edp",
        f"  %nap = getelementptr i8, ptr %args, i64 {off(args_t, 'num_args')}",
        "  %na = load i64, ptr %nap",
        "  %c1 = icmp eq i64 %nd, 1",
        "  %c2 = icmp eq ptr %ed, null",
        f"  %c3 = icmp eq i64 %na, {n}",
        "  %c12 = and i1 %c1, %c2",
        "  %ok = and i1 %c12, %c3",
        "  br i1 %ok, label %lists, label %slow",
        "lists:",
        f"  %alp = getelementptr i8, ptr %args, i64 {off(args_t, 'argument_lists')}",
        "  %al = load ptr, ptr %alp",
        "  %row = load ptr, ptr %al",
        "  br label %a0",
    ]
    for i in range(n):
        nxt = f"a{i + 1}" if i + 1 < n else "alloc"
        L += [
            f"a{i}:",
            f"  %hp{i} = getelementptr ptr, ptr %row, i64 {i}",
            f"  %h{i} = load ptr, ptr %hp{i}",
            f"  %hn{i} = icmp eq ptr %h{i}, null",
            f"  br i1 %hn{i}, label %fail{i}, label %b{i}",
            f"b{i}:",
            f"  %rp{i} = getelementptr i8, ptr %h{i}, i64 {buf('readers')}",
            f"  %r{i} = atomicrmw add ptr %rp{i}, i64 1 seq_cst",
            f"  %pp{i} = getelementptr i8, ptr %h{i}, i64 {buf('plain')}",
            f"  %pl{i} = load atomic i64, ptr %pp{i} seq_cst, align 8",
            f"  %kp{i} = getelementptr i8, ptr %h{i}, i64 {buf('shape_key')}",
            f"  %k{i} = load i64, ptr %kp{i}",
            f"  %mp{i} = getelementptr i8, ptr %h{i}, i64 {buf('memory')}",
            f"  %m{i} = load ptr, ptr %mp{i}",
            f"  %dp{i} = getelementptr i8, ptr %h{i}, i64 {buf('data')}",
            f"  %d{i} = load ptr, ptr %dp{i}",
            f"  %okp{i} = icmp ne i64 %pl{i}, 0",
            f"  %okk{i} = icmp eq i64 %k{i}, {keys[i]}",
            f"  %okm{i} = icmp eq ptr %m{i}, inttoptr (i64 {mem} to ptr)",
            f"  %okpk{i} = and i1 %okp{i}, %okk{i}",  # not ok1{i}: ok1 + "0" is ok + "10"
            f"  %ok{i} = and i1 %okpk{i}, %okm{i}",
            f"  br i1 %ok{i}, label %{nxt}, label %fail{i + 1}",
        ]
    if n == 0:
        L += ["a0:", "  br label %alloc"]
    for k in range(n, 0, -1):  # fail{k}: undo the reader counts of arguments 0..k-1
        L += [
            f"fail{k}:",
            f"  %u{k} = atomicrmw sub ptr %rp{k - 1}, i64 1 seq_cst",
            f"  br label %fail{k - 1}",
        ]
    L += ["fail0:", "  br label %slow", "alloc:"]
    handle_size = ffi.sizeof("PJRT_Buffer")
    outs = plan.outputs
    bad = "false"
    for j, (_, size) in enumerate(outs):
        rounded = -(-size // ALIGNMENT) * ALIGNMENT
        L += [
            f"  %o{j} = call ptr @aligned_alloc(i64 {ALIGNMENT}, i64 {rounded})",
            f"  %s{j} = call ptr @malloc(i64 {handle_size})",
            f"  %on{j} = icmp eq ptr %o{j}, null",
            f"  %sn{j} = icmp eq ptr %s{j}, null",
            f"  %bad{j}a = or i1 {bad}, %on{j}",
            f"  %bad{j} = or i1 %bad{j}a, %sn{j}",
        ]
        bad = f"%bad{j}"
    L += [f"  br i1 {bad}, label %nomem, label %run", "nomem:"]
    for j in range(len(outs)):
        L += [f"  call void @free(ptr %o{j})", f"  call void @free(ptr %s{j})"]
    L += [f"  br label %fail{n}", "run:"]
    count = native.ADDRESSES["xlapy_count_alloc"]
    words = counters.address
    for _, _, nbytes in signature.output_leaves:
        L.append(
            f"  call void inttoptr (i64 {count} to ptr)(ptr inttoptr (i64 {words} to ptr), "
            f"i64 {nbytes}, i64 {kind})"
        )
    base = {alloc: f"%d{number}" for alloc, number in plan.params}
    base.update({alloc: f"inttoptr (i64 {addr} to ptr)" for alloc, addr in plan.constants})
    base.update({alloc: f"%o{j}" for j, (alloc, _) in enumerate(outs)})
    for t, (entry, slots, extent) in enumerate(plan.kernels):
        ptrs = []
        for s, (alloc, offset) in enumerate(slots):
            L.append(f"  %q{t}_{s} = getelementptr i8, ptr {base[alloc]}, i64 {offset}")
            ptrs.append(f"ptr %q{t}_{s}")
        L.append(
            f"  call void inttoptr (i64 {entry} to ptr)({', '.join(ptrs)}, i64 0, i64 {extent})"
        )
    for i in range(n):
        L.append(f"  %v{i} = atomicrmw sub ptr %rp{i}, i64 1 seq_cst")
    L += [
        f"  %olp = getelementptr i8, ptr %args, i64 {off(args_t, 'output_lists')}",
        "  %ol = load ptr, ptr %olp",
        "  %orow = load ptr, ptr %ol",
    ]
    for j, ((_, shape, nbytes), _) in enumerate(zip(signature.output_leaves, outs, strict=True)):
        fields = [
            ("index", "i64 0"),
            ("device", f"ptr inttoptr (i64 {dev} to ptr)"),
            ("memory", f"ptr inttoptr (i64 {mem} to ptr)"),
            ("data", f"ptr %o{j}"),
            ("nbytes", f"i64 {nbytes}"),
            ("plain", "i64 1"),
            ("readers", "i64 0"),
            ("shape_key", f"i64 {shape_key(shape)}"),
            ("native", "i64 1"),
            ("counters", f"ptr inttoptr (i64 {words} to ptr)"),
        ]
        for name, value in fields:
            L += [
                f"  %f{j}_{name} = getelementptr i8, ptr %s{j}, i64 {buf(name)}",
                f"  store {value}, ptr %f{j}_{name}",
            ]
        L += [
            f"  %or{j} = getelementptr ptr, ptr %orow, i64 {j}",
            f"  store ptr %s{j}, ptr %or{j}",
        ]
    L += [
        f"  %evp = getelementptr i8, ptr %args, i64 {off(args_t, 'device_complete_events')}",
        "  %ev = load ptr, ptr %evp",
        "  %noev = icmp eq ptr %ev, null",
        "  br i1 %noev, label %count, label %event",
        "event:",
        f"  store ptr inttoptr (i64 {address(COMPLETED_EVENT.c)} to ptr), ptr %ev",
        "  br label %count",
        "count:",
        f"  %exp = getelementptr i8, ptr %args, i64 {off(args_t, 'executable')}",
        "  %ex = load ptr, ptr %exp",
        f"  %fcp = getelementptr i8, ptr %ex, i64 {off('PJRT_LoadedExecutable', 'fast_calls')}",
        "  %fc = atomicrmw add ptr %fcp, i64 1 seq_cst",
        "  ret ptr null",
        "slow:",
        f"  %r = tail call ptr inttoptr (i64 {python} to ptr)(ptr %args)",
        "  ret ptr %r",
        "}",
    ]
    return "\n".join(L)


def adopt_handle(pb: PBuffer, c: Any) -> None:
    """Key the natively made handle `c` in OBJECTS for `pb` (Python sees it from now on:
    its Buffer_Destroy goes to Python, which frees it with `free_native`)."""
    register_at(pb, c)


def free_native(c: Any) -> None:
    """Free a handle struct the native Execute allocated (left alone at interpreter exit,
    when the process is about to give all its memory back)."""
    free = _FREE
    if free is not None:
        free(ffi.cast("void *", c))
