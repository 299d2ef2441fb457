# Compiled kernels as Python callables.
#
# A Kernel owns the loaded native code of one emitted computation. `kernel(*arrays)` takes
# logical NumPy arrays, lays each out physically as its parameter's layout says, runs the
# whole outer range and returns logical arrays. `kernel.run_raw(pointers, start, end)` is the
# entry a thunk executor uses on buffers it already owns. ctypes releases the GIL during the
# call, so chunks of one kernel run in parallel in a thread pool (`run_parallel`).
#
# Oversubscription: the pool has one thread per core; a caller mixing kernels with BLAS calls
# should cap BLAS at one thread inside pool workers (OMP_NUM_THREADS / threadpoolctl), or run
# BLAS calls outside the pool, so the two never compete for the same cores.
#
# Compiling: `compile_computation` first looks the computation up in the kernel cache, keyed
# by its canonical text (ir.printer.print_canonical: names replaced by positions, metadata
# left out, the bodies of the computations it calls included), the in-place pairs and a
# fingerprint of xlapy's sources (so any change to the code generator is a miss). Fusions
# that differ only in names (a model's layers) share one kernel, emitted once (XLA's kernel
# reuse). A hit names the object; the kernel's signature (outputs,
# parameters, in-place pairs, outer extent) is recomputed from the computation and must
# match the entry. The LLVM IR is emitted again only when a dump asks for it; the object is
# read from the disk cache at once (authenticated, disk_cache.py). A miss emits the IR,
# compiles it (the JIT's object cache is keyed by the IR text) and records the entry. With
# `defer=True` the LLVM work runs on a small compile pool and the kernel is bound when
# `wait()` is called, so the kernels of one program compile concurrently while the caller
# emits the next one.
# Objects whose code is ready (read or compiled) are queued, and the first kernel that waits
# loads every queued object into the process's shared execution engine (`flush_loads`: one
# finalization for the batch, ~0.1 ms for four objects against ~1.2 ms for an engine each).

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import hashlib
import json
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xlapy.backends.cpu.codegen.common import SYMBOL, KernelSpec, physical_dims, symbol_name
from xlapy.backends.cpu.codegen.emitter import (
    denormals_flushed,
    emit_kernel,
    outer_extent_of,
    output_leaves,
    understands_flushed_end,
)
from xlapy.backends.cpu.jit import engine as jit
from xlapy.backends.cpu.jit.compile_timing import phase
from xlapy.backends.cpu.jit.disk_cache import read_entry_or_warn
from xlapy.backends.cpu.jit.executable_cache import (
    ENABLE_ENV,
    KernelBook,
    KernelId,
    KernelRecord,
)
from xlapy.backends.cpu.runtime.loadable import loadable
from xlapy.backends.cpu.runtime.pool import even_blocks, pool_size, run_blocks
from xlapy.errors import XlapyError
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.printer import print_canonical
from xlapy.ir.shapes import Shape


def _major_to_minor(shape: Shape) -> tuple[int, ...]:
    return tuple(reversed(shape.layout_or_default.minor_to_major))


def to_physical(x: np.ndarray, shape: Shape) -> np.ndarray:
    """The dense buffer of logical array `x` laid out as `shape`'s layout says."""
    arr = np.asarray(x, dtype=shape.dtype)
    return np.ascontiguousarray(np.transpose(arr, _major_to_minor(shape)))


def from_physical(buf: np.ndarray, shape: Shape) -> np.ndarray:
    """The logical (row-major) array of the dense buffer `buf` of `shape`."""
    if shape.rank == 0:
        return np.asarray(buf).reshape(())
    return np.ascontiguousarray(np.transpose(buf, np.argsort(_major_to_minor(shape))))


@functools.cache
def source_fingerprint() -> str:
    """A SHA-256 of the code generator's Python sources (this package, and the IR whose
    text keys the cache): part of every kernel cache key, so an entry written by other
    code generator sources is never used."""
    root = Path(__file__).resolve().parents[3]
    h = hashlib.sha256()
    backend = Path(__file__).resolve().parents[1]
    for path in sorted([*backend.rglob("*.py"), *(root / "ir").glob("*.py")]):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


source_fingerprint()  # at import, the sources this process runs


@dataclass(frozen=True, slots=True)
class Signature:
    """What a caller needs of a compiled kernel besides its code."""

    outputs: tuple[Shape, ...]
    params: tuple[Shape, ...]
    outer_extent: int
    in_place: tuple[tuple[int, int], ...] = ()
    param_blocks: int = 0
    """Pointer arguments after the buffers': blocks of run-time parameters (a library
    kernel's geometry, jit/kernel_library.py), which its caller passes."""

    @staticmethod
    def of(spec: KernelSpec) -> Signature:
        return Signature(spec.outputs, spec.params, spec.outer_extent, spec.in_place)


class _Loaded:
    """A loaded object: the hold on its code (jit.CodeHold: the code is freed when the last
    hold goes) and the address of its kernel function."""

    __slots__ = ("address", "from_cache", "hold")

    def __init__(self, hold: jit.CodeHold, from_cache: bool):
        self.hold, self.address, self.from_cache = hold, hold.address, from_cache

    @property
    def engine(self) -> object:
        """The execution engine holding the code (engines are compared by identity)."""
        return self.hold.code


# object key -> Future[_Loaded], while anything (a kernel, a native loop, a queued load)
# keeps the future: a process-wide table must not keep dead programs' code mapped
_objects: weakref.WeakValueDictionary[str, Future] = weakref.WeakValueDictionary()
_entries: dict[str, tuple[str, Signature]] = {}  # kernel key -> (object key, signature)
_MAX_ENTRIES = 4096  # kernel entries remembered (then forgotten and read from disk again)
_loaded_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class _Queued:
    """An object whose code is ready (read from the disk cache or just compiled) and waits
    for `flush_loads`; `on_loaded` runs once it is loaded, before its future resolves."""

    future: Future
    key: str
    data: bytes
    from_cache: bool
    on_loaded: Callable[[], None] | None = None


_queued: list[_Queued] = []
_queue_changed = threading.Condition(_loaded_lock)  # an object queued or a future resolved

_pickled_objects: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar(
    "xlapy_pickled_objects", default=None
)
"""While a program image is pickled (`collecting_objects`): the key of every object its
kernels and native functions run."""
_image_objects: contextvars.ContextVar[Mapping[str, _Loaded] | None] = contextvars.ContextVar(
    "xlapy_image_objects", default=None
)
"""While a program image is unpickled (`objects_of_image`): its objects, loaded, by key."""
_done_futures: contextvars.ContextVar[dict[str, Future] | None] = contextvars.ContextVar(
    "xlapy_image_futures", default=None
)
"""... and the resolved Future made for each object a native function runs."""


def _note_pickled(key: str) -> None:
    collected = _pickled_objects.get()
    if collected is not None:
        collected.add(key)


@contextlib.contextmanager
def collecting_objects() -> Iterator[set[str]]:
    """Within the block, kernels and native functions that pickle add their object's key to
    the set yielded: the objects a program image must hold (jit/program_image.py)."""
    collected: set[str] = set()
    token = _pickled_objects.set(collected)
    try:
        yield collected
    finally:
        _pickled_objects.reset(token)


@contextlib.contextmanager
def objects_of_image(objects: Mapping[str, bytes]) -> Iterator[None]:
    """Load `objects` (key -> bytes: a program image's, authenticated) into the shared
    engine as one batch; within the block, kernels and native functions unpickled from the
    image (`Kernel.__reduce__`, `NativeFunction.__reduce__`) are bound to their code at
    once. No Future, queue or flush per object: an image's ~300 objects and ~400 kernels
    were a third of a warm compile that way."""
    with phase("object loading"):
        holds = jit.shared_engine().load(list(objects.items()))
    loaded = {key: _Loaded(hold, True) for key, hold in holds.items()}
    token, token_futures = _image_objects.set(loaded), _done_futures.set({})
    try:
        yield
    finally:
        _image_objects.reset(token)
        _done_futures.reset(token_futures)


def _image_object(key: str) -> _Loaded:
    loaded = _image_objects.get()
    if loaded is None or key not in loaded:
        raise ValueError(f"the image names object {key[:16]}... it does not hold")
    return loaded[key]


def clear_loaded_objects() -> None:
    """Forget the objects loaded and the kernel entries read in this process (see
    compiler.clear_kernel_cache); kernels already built keep their code."""
    with _loaded_lock:
        _objects.clear()
        _entries.clear()


@functools.cache
def _compile_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=pool_size(), thread_name_prefix="xlapy-jit")


def _load_object(ir_text: str, key: str, symbol: str, use_cache: bool) -> _Loaded:
    """Compile `ir_text` (or read its object from the disk cache) and load the object
    `key` at once (for kernels built outside the kernel cache)."""
    obj = jit.compile_object(ir_text, use_cache, symbol, key)
    return _Loaded(jit.shared_engine().load([(key, obj.data)])[key], obj.from_cache)


def _enqueue(item: _Queued) -> None:
    with _queue_changed:
        _queued.append(item)
        _queue_changed.notify_all()


def _request_cached(key: str) -> tuple[Future, bool] | None:
    """(the Future of the loaded object `key`, whether an earlier request made it), the
    object read from the disk cache now and queued for flush_loads(); None when it is not
    in the cache (missing, or damaged or forged: its MAC is checked here)."""
    with _loaded_lock:
        future = _objects.get(key)
        if future is not None:
            return future, True
    data = jit.read_entry(key, ".o")
    if data is None:
        return None
    with _loaded_lock:
        future = _objects.get(key)
        if future is not None:
            return future, True
        future = _objects[key] = Future()
    _enqueue(_Queued(future, key, data, True))
    return future, False


def flush_loads() -> dict[Future, _Loaded]:
    """Load every queued object into the shared execution engine, as one batch. Called by
    any kernel that waits for its code, so the kernels of a compile share one finalization.
    The futures resolved, with their results."""
    with _loaded_lock:
        batch = list(_queued)
        _queued.clear()
    done: dict[Future, _Loaded] = {}
    if not batch:
        return done
    try:
        with phase("object loading"):
            addresses = jit.shared_engine().load([(item.key, item.data) for item in batch])
    except BaseException as e:
        for item in batch:
            _fail(item.future, item.key, e)
        addresses = {}
    for item in batch:
        if item.key not in addresses:
            continue
        try:
            if item.on_loaded is not None:
                item.on_loaded()
            result = done[item.future] = _Loaded(addresses[item.key], item.from_cache)
            item.future.set_result(result)
        except BaseException as e:
            _fail(item.future, item.key, e)
    with _queue_changed:
        _queue_changed.notify_all()
    return done


def _await_loaded(future: Future) -> None:
    """Block until `future` resolves, loading queued objects (this one's among them once
    its compile finishes) on the way."""
    while not future.done():
        flush_loads()
        with _queue_changed:
            while not future.done() and not _queued:
                _queue_changed.wait()


def _fail(future: Future, key: str, error: BaseException) -> None:
    with _loaded_lock:
        if _objects.get(key) is future:
            del _objects[key]
    future.set_exception(error)
    with _queue_changed:
        _queue_changed.notify_all()


def _request_bytes(key: str, data: bytes) -> tuple[Future, bool]:
    """(the Future of the loaded object `key`, whether an earlier request made it), `data`
    (its bytes, from an authenticated whole-executable entry) queued for flush_loads()
    unless the object is loaded or queued already."""
    return _queue_bytes(key, data)


def _queue_bytes(key: str, data: bytes) -> tuple[Future, bool]:
    """`_request_bytes` for bytes from anywhere authenticated (an entry, the library)."""
    with _loaded_lock:
        future = _objects.get(key)
        if future is not None:
            return future, True
        future = _objects[key] = Future()
    _enqueue(_Queued(future, key, data, True))
    return future, False


def _request(
    ir_text: str | jit.LinkedIR,
    key: str,
    symbol: str,
    defer: bool,
    on_loaded: Callable[[], None] | None = None,
    light: bool = False,
    directory: Path | None = None,
    driver: bool = False,
) -> tuple[Future, bool]:
    """(the Future of the loaded object `key`, shared by every request in this process;
    whether an earlier request made it). `on_loaded` runs once the object is loaded, before
    the Future resolves (so whoever waits for it sees its effect); `light`, `driver`: see
    jit.compile_object."""
    with _loaded_lock:
        known = _objects.get(key)
        future = _objects[key] = Future() if known is None else known
    if known is not None:  # (outside the lock: a done future runs the callback at once)
        if on_loaded is not None:
            callback = on_loaded
            future.add_done_callback(lambda f: None if f.exception() else callback())
        return future, True
    args = (future, ir_text, key, symbol, on_loaded, light, directory, driver)
    if defer:  # in this context: the compile's ISA level (engine.compiling_for)
        context = contextvars.copy_context()
        _compile_pool().submit(lambda: context.run(_compile_and_queue, *args))
    else:
        _compile_and_queue(*args)
    return future, False


def _compile_and_queue(
    future: Future,
    ir_text: str | jit.LinkedIR,
    key: str,
    symbol: str,
    on_loaded: Callable[[], None] | None,
    light: bool = False,
    directory: Path | None = None,
    driver: bool = False,
) -> None:
    try:
        obj = jit.compile_object(ir_text, True, symbol, key, light, directory, driver)
    except BaseException as e:
        _fail(future, key, e)
        return
    _enqueue(_Queued(future, key, obj.data, obj.from_cache, on_loaded))


def _prototype(signature: Signature) -> type:
    """The ctypes function type of kernels with `signature`'s arguments."""
    return _prototype_of(len(signature.outputs) + len(signature.params) + signature.param_blocks)


@functools.cache
def _prototype_of(pointers: int) -> type:
    return ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * pointers), ctypes.c_int64, ctypes.c_int64)


class Kernel:
    """A compiled kernel. Dumps: `llvm_ir` (as emitted), `optimized_ir`, `asm`."""

    _pending: Future | None
    target: jit.HostTarget
    """What the code is generated for (the dumps optimize and assemble for it)."""
    cache_keys: tuple[str, str] | None = None
    """(kernel entry key, object key) of a kernel from the disk cache, recorded in a
    whole-executable entry (executable_cache.py)."""
    flushed_end = False
    """Whether the kernel understands emitter.understands_flushed_end (a computation's kernel that
    flushes subnormals on x86): a native loop that has set the flush mode calls it with
    `~end` and it leaves the MXCSR alone."""

    def __init__(self, spec: KernelSpec, name: str | None = None, use_cache: bool = True):
        self._spec: KernelSpec | None = spec
        self._emit: Callable[[], KernelSpec] | None = None
        self.signature = Signature.of(spec)
        self.name = name or spec.name
        self.target = jit.host_target()
        self.object_key = key = jit.cache_key(spec.llvm_ir)
        if use_cache:
            self._pending, self._reused = _request(spec.llvm_ir, key, spec.name, defer=False)
        else:
            self._reused = False
            self._pending = Future()
            self._pending.set_result(_load_object(spec.llvm_ir, key, spec.name, False))
        self.wait()

    @classmethod
    def _deferred(
        cls,
        signature: Signature,
        name: str,
        request: tuple[Future | None, bool],
        spec: KernelSpec | None,
        emit: Callable[[], KernelSpec] | None,
        object_key: str,
    ) -> Kernel:
        kernel = cls.__new__(cls)
        kernel._spec, kernel._emit, kernel.signature = spec, emit, signature
        kernel.name, (kernel._pending, kernel._reused) = name, request
        kernel.object_key, kernel.target = object_key, jit.host_target()
        return kernel

    def __reduce__(self):
        """A kernel pickles as its object's key, signature and name: a program image
        (executable_cache.py) holds the object's bytes, which `objects_of_image` hands to
        the kernel unpickled (its LLVM IR is not kept: `spec` cannot be emitted again)."""
        _note_pickled(self.object_key)
        return (_kernel_from_image, (self.object_key, self.signature, self.name))

    def wait(self) -> Kernel:
        """Block until the kernel's code is loaded (re-raising a compile failure)."""
        pending = self._pending  # read once: threads sharing the kernel may wait at once
        if pending is not None:
            _await_loaded(pending)
            self.bind(pending, pending.result())
        return self

    def bind(self, future: Future | None, loaded: _Loaded) -> None:
        """Run the code `future` loaded (`loaded`, its result) from now on."""
        self._loaded, self.from_cache = loaded, loaded.from_cache or self._reused
        self._fn = None  # (made on first use: a kernel that native code calls needs none)
        self._future, self._pending = future, None  # `loaded` keeps the code

    @property
    def spec(self) -> KernelSpec:
        """The emitted kernel (emitted again on first use when the kernel came from the
        kernel cache)."""
        if self._spec is None:
            if self._emit is None:
                raise XlapyError(
                    f"kernel {self.name} was loaded from a compiled-program image, which keeps "
                    f"no LLVM IR; compile with ${ENABLE_ENV}=0 to dump it"
                )
            self._spec = self._emit()
        return self._spec

    @property
    def has_ir(self) -> bool:
        """Whether `spec` can answer (a kernel from a program image keeps no IR)."""
        return self._spec is not None or self._emit is not None

    @property
    def llvm_ir(self) -> str:
        """The emitted LLVM IR, the function named after the kernel."""
        spec = self.spec
        if self.name == spec.name:
            return spec.llvm_ir
        return spec.llvm_ir.replace(f'@"{spec.name}"', f'@"{self.name}"').replace(
            f'ModuleID = "{spec.name}"', f'ModuleID = "{self.name}"'
        )

    @functools.cached_property
    def _optimized(self):
        return jit.optimize(self.llvm_ir, self.target)

    @property
    def optimized_ir(self) -> str:
        return str(self._optimized)

    @property
    def asm(self) -> str:
        return jit.assembly(self._optimized, self.target)

    @property
    def in_place(self) -> tuple[tuple[int, int], ...]:
        """(output leaf, parameter) pairs whose buffers the caller must make the same bytes:
        the kernel reads each such parameter through its output pointer and ignores the
        parameter's own pointer, so a thunk needs no scratch copy for them."""
        return self.signature.in_place

    @property
    def outer_extent(self) -> int:
        """The size of the range [start, end) the kernel's entry point splits on."""
        return self.signature.outer_extent

    def vector_types(self) -> set[str]:
        """LLVM vector types (`<8 x float>`) in the optimized IR: evidence of vectorization."""
        return set(re.findall(r"<\d+ x [a-z0-9]+>", self.optimized_ir))

    @property
    def function(self) -> Callable[..., object]:
        """The loaded entry point as a ctypes function: (output and parameter addresses...,
        start, end), what run_raw calls (waiting for the code first)."""
        fn = self.wait()._fn
        if fn is None:
            fn = self._fn = _prototype(self.signature)(self._loaded.address)
        return fn

    @property
    def address(self) -> int:
        """The address of the loaded entry point (for native code that calls the kernel)."""
        return self.wait()._loaded.address

    def run_raw(self, pointers: Sequence[int], start: int = 0, end: int | None = None) -> None:
        """Run rows [start, end) of the outer dimension on raw buffer addresses (outputs
        first, then parameters)."""
        fn = self._fn
        if fn is None:
            fn = self.function
        fn(*pointers, start, self.outer_extent if end is None else end)

    def prepare(self, args: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(output buffers, input buffers) in physical layout for logical `args`."""
        params = self.signature.params
        if len(args) != len(params):
            raise XlapyError(f"kernel {self.name} takes {len(params)} arguments, got {len(args)}")
        inputs = []
        for i, (a, shape) in enumerate(zip(args, params, strict=True)):
            arr = np.asarray(a)
            if arr.shape != shape.dims:
                raise XlapyError(
                    f"kernel {self.name}: argument {i} must be {shape.to_text(False)}, "
                    f"got {arr.dtype}{list(arr.shape)}"
                )
            inputs.append(to_physical(arr, shape))
        outputs = [np.empty(physical_dims(s), s.dtype) for s in self.signature.outputs]
        return outputs, inputs

    @staticmethod
    def pointers(outputs, inputs) -> list[int]:
        return [a.ctypes.data for a in (*outputs, *inputs)]

    def finish(self, outputs) -> np.ndarray | tuple[np.ndarray, ...]:
        outs = self.signature.outputs
        results = [from_physical(o, s) for o, s in zip(outputs, outs, strict=True)]
        return results[0] if len(results) == 1 else tuple(results)

    def __call__(self, *args: np.ndarray):
        """Run on logical arrays; returns the output (a tuple for several outputs)."""
        outputs, inputs = self.prepare(args)
        self.run_raw(self.pointers(outputs, inputs))
        return self.finish(outputs)


def compile_computation(
    comp: HloComputation,
    name: str = "xla_kernel",
    use_cache: bool = True,
    in_place: Sequence[tuple[int, int]] = (),
    defer: bool = False,
    comp_text: str | None = None,
    flush_denormals: int | None = None,
    checked: bool = False,
) -> Kernel:
    """Emit, optimize (or fetch from the caches) and load the kernel of `comp`.
    `in_place`: (output leaf, parameter) pairs that will be given the same bytes (see
    emitter.in_place_reason); the kernel reads those parameters through the outputs.
    `defer`: compile on the compile pool; the kernel is usable after `kernel.wait()`.
    `comp_text`: `print_canonical(comp)` when the caller has it.
    `flush_denormals`: subnormals flushed to zero (XLA:CPU's behaviour; emitter.FLUSH_IN_LOOP
    for a kernel of a while loop: also callable with the flush mode set) or kept (IEEE);
    None: as $XLAPY_CPU_DENORMALS says (emitter.denormals_flushed).
    `checked`: the caller ran the emitter's checks (emit_kernel's `checked`).
    Raises UnsupportedForCodegen (at once) when the emitter cannot lower `comp`."""
    pairs = tuple(sorted({(int(o), int(i)) for o, i in in_place}))
    symbol = symbol_name(name)
    if flush_denormals is None:
        flush_denormals = denormals_flushed({})

    def emit() -> KernelSpec:
        with phase("LLVM IR emission (Python)"):
            return emit_kernel(comp, SYMBOL, pairs, flush_denormals, checked)

    if not use_cache:
        return Kernel(emit(), symbol, use_cache=False)
    key = jit.content_key(
        "kernel",
        comp_text or print_canonical(comp),
        repr(pairs),
        ("ieee-denormals", "flush-denormals", "flush-denormals-in-loop")[int(flush_denormals)],
        source_fingerprint(),
    )
    hit = _read_entry(key, comp, pairs)
    if hit is not None:
        object_key, signature = hit
        request = _request_cached(object_key)
        if request is not None:
            kernel = Kernel._deferred(signature, symbol, request, None, emit, object_key)
            kernel.cache_keys = key, object_key
            kernel.flushed_end = understands_flushed_end(flush_denormals)
            return kernel if defer else kernel.wait()
        # the entry outlived its object (or the object is damaged): compile again
    spec = emit()
    object_key = jit.cache_key(spec.llvm_ir)
    signature = Signature.of(spec)
    store_entry = None
    if _derived(comp) == (signature.outputs, signature.params):

        def store_entry() -> None:
            _write_entry(key, object_key, signature)

    request = _request(spec.llvm_ir, object_key, SYMBOL, defer, store_entry)
    kernel = Kernel._deferred(signature, symbol, request, spec, emit, object_key)
    kernel.flushed_end = understands_flushed_end(flush_denormals)
    if store_entry is not None:
        kernel.cache_keys = key, object_key
    return kernel if defer else kernel.wait()


def _derived(comp: HloComputation) -> tuple[tuple[Shape, ...], tuple[Shape, ...]]:
    """The output and parameter shapes of `comp`'s kernel, as the emitter lays them out."""
    return tuple(s for _, _, s in output_leaves(comp)), tuple(p.shape for p in comp.parameters)


_OBJECT_KEY = re.compile(r"[0-9a-f]{64}")


def _read_entry(
    key: str, comp: HloComputation, in_place: tuple[tuple[int, int], ...]
) -> tuple[str, Signature] | None:
    """The object key and signature of cached kernel entry `key` for `comp`: the shapes,
    the in-place pairs and the outer extent are those of `comp`, recomputed here; an entry
    that says otherwise is a miss."""
    with _loaded_lock:
        hit = _entries.get(key)
    if hit is not None:
        return hit
    payload = jit.read_entry(key, ".kernel")
    if payload is None:
        return None
    try:  # authenticated (disk_cache.py), and still checked against `comp`:
        entry = json.loads(payload)
        if not _OBJECT_KEY.fullmatch(entry["object"]):
            return None
        pairs = [tuple(p) for p in entry["in_place"]]
        signature = _validated(
            comp, in_place, entry["outputs"], entry["params"], entry["outer_extent"], pairs
        )
        if signature is None:
            return None
        hit = entry["object"], signature
    except (ValueError, KeyError, TypeError, XlapyError):
        return None
    _remember(key, hit)
    return hit


def _validated(
    comp: HloComputation,
    in_place: Sequence[tuple[int, int]],
    outputs: Sequence[str],
    params: Sequence[str],
    outer_extent: int,
    pairs: Sequence[tuple[int, int]],
) -> Signature | None:
    """The signature of `comp`'s kernel with `in_place` pairs, recomputed, when a cache
    entry's outputs, params, outer extent and pairs agree with it; else None."""
    derived_outputs, derived_params = _derived(comp)
    want_pairs = tuple(sorted({(int(o), int(i)) for o, i in in_place}))
    signature = Signature(
        derived_outputs, derived_params, outer_extent_of(comp, want_pairs), want_pairs
    )
    if (
        list(outputs) != [s.to_text() for s in derived_outputs]
        or list(params) != [s.to_text() for s in derived_params]
        or outer_extent != signature.outer_extent
        or list(pairs) != list(want_pairs)
    ):
        return None
    return signature


def _remember(key: str, hit: tuple[str, Signature]) -> None:
    with _loaded_lock:
        if len(_entries) >= _MAX_ENTRIES:
            _entries.clear()
        _entries[key] = hit


def _write_entry(key: str, object_key: str, signature: Signature) -> None:
    with phase("cache writes"):
        _write_kernel_entry(key, object_key, signature)


def _write_kernel_entry(key: str, object_key: str, signature: Signature) -> None:
    _remember(key, (object_key, signature))
    entry = {
        "object": object_key,
        "outputs": [s.to_text() for s in signature.outputs],
        "params": [s.to_text() for s in signature.params],
        "outer_extent": signature.outer_extent,
        "in_place": [list(p) for p in signature.in_place],
    }
    jit.write_entry(key, ".kernel", json.dumps(entry).encode())


# (computation text, in-place pairs, flush) -> Kernel, while some program uses the kernel
_kernel_cache: weakref.WeakValueDictionary[tuple, Kernel] = weakref.WeakValueDictionary()
_kernel_lock = threading.Lock()


def clear_kernel_cache() -> None:
    """Forget the kernels compiled in this process (the disk cache stays), so the next
    compile loads them from disk or compiles them again: what `xlapy bench` times."""
    with _kernel_lock:
        _kernel_cache.clear()
    clear_loaded_objects()


_book: contextvars.ContextVar[KernelBook | None] = contextvars.ContextVar(
    "xlapy_kernel_book", default=None
)


@contextlib.contextmanager
def using_book(book: KernelBook) -> Iterator[KernelBook]:
    """Within the block, `kernel_for` takes kernels from `book.known` where it can and
    records every kernel it returns in `book.used` (a whole-executable cache entry's
    kernels, executable_cache.py)."""
    token = _book.set(book)
    try:
        yield book
    finally:
        _book.reset(token)


def kernel_site(instr: HloInstruction) -> str:
    """Where `instr` sits in its module, "computation/instruction": what a whole-executable
    entry names its kernel by. Instruction names alone need not be unique across a module
    (the verifier asks for it, the CPU compiler does not run it, and text with an `r` in
    each of three branches compiles), and an entry keyed by them gave one branch's kernel to
    all three; computation names are unique (the parser rejects a duplicate)."""
    comp = instr.parent
    return instr.name if comp is None else f"{comp.name}/{instr.name}"


def book_knows(site: str) -> bool:
    """Whether the kernel book in use (see `using_book`) came from an entry in which the
    instruction at `site` (kernel_site) ran a kernel."""
    book = _book.get()
    return book is not None and site in book.known_names


def kernel_for(
    comp: HloComputation,
    name: str,
    in_place: tuple[tuple[int, int], ...] = (),
    defer: bool = False,
    flush_denormals: int = True,
    site: str | None = None,
    text: str | None = None,
    checked: bool = False,
) -> Kernel:
    """The compiled kernel of `comp`, compiled once per process per canonical text
    (print_canonical: computations that differ only in names share it; `text`, when the
    caller has it).
    `in_place` asks for the variant whose (output leaf, parameter) pairs share their bytes
    (the caller has checked emitter.in_place_reason and passes the same slice for both).
    `defer`: the LLVM work may still be running; `kernel.wait()` before running it (and
    `forget_kernel` when that fails). `flush_denormals`: see `denormals_flushed`.
    Inside `using_book(book)`, the kernel of the instruction at `site` (kernel_site; default
    `name`) may come from `book` (without printing `comp`), and is recorded there.
    `checked`: the caller ran the emitter's checks on `comp` and `in_place` (emit_kernel)."""
    book = _book.get()
    kid = (name if site is None else site, tuple(in_place), flush_denormals)
    kernel = _from_book(book, kid, comp, name) if book is not None else None
    if kernel is None:
        text = print_canonical(comp) if text is None else text
        key = (text, tuple(in_place), flush_denormals, jit.host_target())
        with _kernel_lock:
            kernel = _kernel_cache.get(key)
        if kernel is None:
            kernel = compile_computation(
                comp,
                name,
                in_place=in_place,
                defer=True,
                comp_text=text,
                flush_denormals=flush_denormals,
                checked=checked,
            )
            with _kernel_lock:
                kernel = _kernel_cache.setdefault(key, kernel)
    if book is not None and kernel.cache_keys is not None:
        sig = kernel.signature
        book.record(
            kid,
            KernelRecord(
                *kernel.cache_keys,
                tuple(s.to_text() for s in sig.outputs),
                tuple(s.to_text() for s in sig.params),
                sig.outer_extent,
            ),
        )
    if defer:
        return kernel
    try:
        return kernel.wait()
    except Exception:
        forget_kernel(kernel)
        raise


def _from_book(book: KernelBook, kid: KernelId, comp: HloComputation, name: str) -> Kernel | None:
    """Kernel `kid` (of instruction `name`) as `book` (an authenticated entry) names it, when
    its shapes, pairs and outer extent are those of `comp` (recomputed); None when the book
    has no such kernel or disagrees (the disagreement is noted in `book.rejected`)."""
    record = book.known.get(kid)
    if record is None:
        return None
    site, pairs, flush = kid
    memo = ("entry", record.kernel_key, pairs, flush)
    with _kernel_lock:
        kernel = _kernel_cache.get(memo)
    if kernel is not None:
        return kernel
    try:
        signature = _validated(
            comp, pairs, record.outputs, record.params, record.outer_extent, pairs
        )
    except XlapyError as e:
        signature, why = None, str(e)
    else:
        why = "its shapes or outer extent differ from the computation's"
    if signature is None:
        book.rejected.append(f"the kernel of {site}: {why}")
        return None
    _remember(record.kernel_key, (record.object_key, signature))
    request = _request_bytes(record.object_key, book.objects[record.object_key])

    def emit() -> KernelSpec:
        return emit_kernel(comp, SYMBOL, pairs, flush)

    kernel = Kernel._deferred(signature, symbol_name(name), request, None, emit, record.object_key)
    kernel.cache_keys = record.kernel_key, record.object_key
    kernel.flushed_end = understands_flushed_end(flush)
    with _kernel_lock:
        return _kernel_cache.setdefault(memo, kernel)


def forget_kernel(kernel: Kernel) -> None:
    """Drop `kernel` (one whose compile failed) from the process's kernel cache."""
    with _kernel_lock:
        for key in [k for k, v in list(_kernel_cache.items()) if v is kernel]:
            _kernel_cache.pop(key, None)


def wrap_instruction(instr: HloInstruction) -> HloComputation:
    """A computation whose parameters are `instr`'s operands and whose root is a copy of it."""
    params = [
        HloInstruction(f"p{i}", Opcode.PARAMETER, op.shape, parameter_number=i)
        for i, op in enumerate(instr.operands)
    ]
    clone = HloInstruction(
        instr.name, instr.opcode, instr.shape, params, instr.attrs, literal=instr.literal
    )
    return HloComputation(f"wrapped.{instr.name}", [*params, clone], clone)


def compile_instruction(instr: HloInstruction, use_cache: bool = True) -> Kernel:
    """Compile one unfused instruction (elementwise, shape op or reduce) as a kernel."""
    return compile_computation(wrap_instruction(instr), instr.name, use_cache)


def run_parallel(kernel: Kernel, args: Sequence[np.ndarray], chunks: int | None = None):
    """Run `kernel` on logical `args`, its outer range split into `chunks` blocks (default:
    one per pool worker) run as run_blocks runs them."""
    outputs, inputs = kernel.prepare(args)
    ptrs = kernel.pointers(outputs, inputs)
    parts = max(1, chunks or pool_size())
    run_blocks(lambda lo, hi: kernel.run_raw(ptrs, lo, hi), even_blocks(kernel.outer_extent, parts))
    return kernel.finish(outputs)


class NativeFunction:
    """A function of native code that is not a kernel (a native while loop, a direct
    convolution): its object's key and the Future of the loaded object; `address()` (or a
    call) waits for it. It pickles as its key, for a program image (see Kernel.__reduce__)."""

    __slots__ = ("future", "key")

    def __init__(self, key: str, future: Future):
        self.key, self.future = key, future

    def address(self) -> int:
        """The function's address, once loaded (re-raising a compile failure)."""
        return function_address(self.future)

    __call__ = address

    def __reduce__(self):
        _note_pickled(self.key)
        return (_function_from_image, (self.key,))


@loadable
def _function_from_image(key: str) -> NativeFunction:
    loaded, futures = _image_object(key), _done_futures.get()
    future = None if futures is None else futures.get(key)
    if future is None:
        future = Future()
        future.set_result(loaded)
        if futures is not None:
            futures[key] = future
    return NativeFunction(key, future)


def request_function(
    description: str,
    emit: Callable[[], str | jit.LinkedIR],
    symbol: str,
    light: bool = False,
    driver: bool = False,
) -> NativeFunction:
    """Start loading function `symbol` of the IR `emit()` makes, for code that is not a
    kernel of the kernel ABI (a native while loop, codegen.emit_loop); `address()` waits
    for it. The object is cached under `description` (which must determine the IR) and the
    code generator's sources, so a warm compile reads it without emitting the IR; a cold
    one compiles it on the JIT's pool, beside the kernels. One load per process for the
    same description. `light`: optimized by the short pipeline; `driver`: code that only
    calls other code, optimized and generated cheaply (both: jit.compile_object)."""
    tags = ["light"] * light + ["driver"] * driver
    key = jit.content_key(source_fingerprint(), symbol, description, *tags)
    found = _request_cached(key)
    if found is None:
        future = _request(emit(), key, symbol, defer=True, light=light, driver=driver)[0]
    else:
        future = found[0]
    return NativeFunction(key, future)


def pending_kernel(spec: KernelSpec, name: str) -> Kernel:
    """The kernel of emitted `spec`, its LLVM work (or the read of its object from the disk
    cache) on the JIT's pool like the program's other kernels: `wait()` before running it.
    One object per IR text in the process (for kernels not keyed by a computation: a
    scatter)."""
    key = jit.cache_key(spec.llvm_ir)
    request = _request(spec.llvm_ir, key, spec.name, defer=True)
    return Kernel._deferred(Signature.of(spec), name, request, spec, None, key)


def described_kernel(
    description: str, signature: Signature, name: str, emit: Callable[[], KernelSpec]
) -> Kernel:
    """The kernel `emit()` makes (a kernel of the kernel ABI that is not a computation's:
    a scan, a scatter), cached under `description` (which must determine the IR) and the
    code generator's sources like request_function: a warm compile loads it without
    emitting the IR; a cold one emits it now and compiles it on the JIT's pool (`wait()`
    before running it). `signature` must be the one `emit()` gives."""
    key = jit.content_key(source_fingerprint(), "kernel", description)
    request = _request_cached(key)
    spec = None
    if request is None:
        spec = emit()
        if Signature.of(spec) != signature:
            raise XlapyError(f"kernel {name}: emitted {Signature.of(spec)}, expected {signature}")
        request = _request(spec.llvm_ir, key, SYMBOL, defer=True)
    return Kernel._deferred(signature, name, request, spec, emit, key)


def library_request(key: str, emit: Callable[[], str], directory: Path) -> tuple[Future, bool]:
    """(the Future of the loaded object `key` of the kernel library in `directory`,
    whether an earlier request made it): read from there (authenticated; a damaged or
    forged object is a CacheEntryWarning and a miss), else compiled from `emit()` on the
    JIT's pool and written there (jit/kernel_library.py)."""
    with _loaded_lock:
        future = _objects.get(key)
        if future is not None:
            return future, True
    data = read_entry_or_warn(key, ".o", "kernel library object", directory)
    if data is not None:
        return _queue_bytes(key, data)
    return _request(emit(), key, SYMBOL, defer=True, directory=directory)


@loadable
def _kernel_from_image(object_key: str, signature: Signature, name: str) -> Kernel:
    """A kernel of a program image being unpickled, bound to its code (`objects_of_image`)."""
    kernel = Kernel._deferred(signature, name, (None, True), None, None, object_key)
    kernel.bind(None, _image_object(object_key))
    return kernel


def function_address(future: Future) -> int:
    """The address of the function `future` (from request_function) loads, once loaded
    (re-raising a compile failure)."""
    _await_loaded(future)
    return future.result().address
