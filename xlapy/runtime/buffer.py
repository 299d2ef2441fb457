"""Buffers: arrays living in a device memory space.

A Buffer holds one array (PJRT buffers are arrays; tuple results come back as one buffer per
leaf). Its memory is a `_Storage`, counted by the device's Allocator, with a reference count:
the buffer holds one reference, every queued execution reading it holds one, and every
external reference holds one, so memory is returned to the allocator only when the last
user lets go. Deleting, donating or garbage-collecting a buffer drops its reference; a
donated buffer hands its reference to the output that reuses its memory.

Host reads (`to_numpy`, `copy_to_host`, `copy_to_memory_space`, `external_reference`)
take a usage hold, as PJRT's do: under the device's lock they check that the buffer is
still live (else BufferDonatedError / BufferDeletedError) and count themselves on its
storage (`holds`) until they are done. An execution that is given the buffer as a donation
meanwhile still invalidates it, but writes its output into fresh memory instead of the held
one, so a read in progress never sees the bytes change. The count of external references
is taken under the same lock, so a donation either sees it (DonationError) or came first.

A buffer may not be ready yet: an execution's outputs are returned at once and filled in by
the device's worker (or already filled, when the execution ran inline on the caller's
thread). `ready()` is the future that says when; an error of the execution is
raised on first use (`to_numpy`, `ready().result()`, ...).
"""

from __future__ import annotations

import contextlib
import enum
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from xlapy.ir.shapes import Shape
from xlapy.runtime.errors import (
    BufferDeletedError,
    BufferDonatedError,
    RuntimeApiError,
    released,
)
from xlapy.runtime.futures import Future

if TYPE_CHECKING:
    from xlapy.runtime.device import Device, MemorySpace

_IDS = itertools.count()


class HostBufferSemantics(enum.Enum):
    """What `Client.buffer_from_pyval` may assume about the caller's host array."""

    IMMUTABLE_ONLY_DURING_CALL = "copy"
    """The array may change after the call returns: it is copied during the call."""
    IMMUTABLE_UNTIL_TRANSFER_COMPLETES = "copy-async"
    """The array stays unchanged until the transfer completes (here: copied during the call)."""
    IMMUTABLE_ZERO_COPY = "zero-copy"
    """The caller promises never to change the array while the buffer lives: the buffer uses
    the caller's memory without a copy (when dtype and layout allow; otherwise it copies)."""


class _Storage:
    """Memory holding one array, counted by a device allocator, shared by reference count.
    The count is guarded by the device's lock (`lock`)."""

    __slots__ = (
        "array",
        "device",
        "holds",
        "kind",
        "lock",
        "memory_space",
        "nbytes",
        "owned",
        "refs",
    )

    def __init__(
        self,
        memory_space: MemorySpace,
        nbytes: int,
        owned: bool = True,
        array: np.ndarray | None = None,
        counted: bool = False,
    ):
        """`counted`: the caller has already counted the allocation (under the lock)."""
        device = memory_space.device
        self.memory_space = memory_space
        self.device = device
        self.lock = device.lock
        self.kind = memory_space.kind
        self.nbytes = nbytes
        self.owned = owned
        self.array = array
        self.refs = 1
        self.holds = 0  # host reads in progress (each also holds a reference)
        if not counted:
            device.allocator.allocate(nbytes, self.kind)

    def acquire(self) -> _Storage:
        with self.lock:
            if self.refs <= 0:
                raise RuntimeApiError("internal: storage used after it was freed")
            self.refs += 1
        return self

    def contents(self) -> np.ndarray:
        """The stored array; RuntimeApiError when there is none (not yet written, or freed)."""
        if self.array is None:
            raise RuntimeApiError(
                "internal: storage read before it was written or after it was freed"
            )
        return self.array

    def release(self) -> None:
        with self.lock:
            self.refs -= 1
            if self.refs:
                return
            self.device.allocator.free_locked(self.nbytes, self.kind)
        self.array = None

    def release_locked(self) -> None:
        """`release` for a caller that holds the lock."""
        self.refs -= 1
        if not self.refs:
            self.device.allocator.free_locked(self.nbytes, self.kind)
            self.array = None


class Buffer:
    """An array on a device (PJRT's PjRtBuffer). Made by `Client.buffer_from_pyval` or by
    executions; read back with `to_numpy()` or `copy_to_host()`."""

    __slots__ = ("__weakref__", "_ext_refs", "_id", "_ready", "_shape", "_state", "_storage")

    def __init__(self, shape: Shape, storage: _Storage, ready: Future):
        self._id = next(_IDS)
        self._shape = shape
        self._storage: _Storage | None = storage
        self._ready = ready
        self._state = "live"
        self._ext_refs = 0

    # -- description -----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return f"buffer #{self._id} {self._shape.to_text(with_layout=False)}"

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._shape.dtype

    @property
    def memory_space(self) -> MemorySpace:
        return self.live_storage("memory_space").memory_space

    @property
    def device(self) -> Device:
        return self.memory_space.device

    @property
    def client(self):
        return self.device.client

    def on_device_size_in_bytes(self) -> int:
        return self.live_storage("on_device_size_in_bytes").nbytes

    @property
    def storage(self) -> _Storage | None:
        """The storage the buffer holds, None once it was deleted or donated (the execution
        engine's unchecked read; `live_storage` raises instead)."""
        return self._storage

    @property
    def is_deleted(self) -> bool:
        return self._state != "live"

    @property
    def is_donated(self) -> bool:
        return self._state == "donated"

    def __repr__(self) -> str:
        where = "deleted" if self.is_deleted else f"{self.device.platform}:{self.device.id}"
        return f"<Buffer #{self._id} {self._shape.to_text(with_layout=False)} {where}>"

    # -- readiness and reading -------------------------------------------------------------
    def ready(self) -> Future:
        """The future completed when the buffer's contents are defined (or failed)."""
        self.live_storage("ready")
        return self._ready

    @property
    def contents_ready(self) -> Future:
        """The same future as `ready()`, without the check that the buffer is still live
        (the execution engine's read: it checks liveness itself, under the device's lock)."""
        return self._ready

    def block_until_ready(self) -> Buffer:
        """Wait for the contents; raises the producing execution's error if it failed."""
        if self._storage is None:
            self.live_storage("ready")
        self._ready.result()
        return self

    def to_numpy(self) -> np.ndarray:
        """A host copy of the contents (waits for them; raises their execution's error)."""
        storage = self._hold("to_numpy")
        try:
            self._ready.result()
            return np.array(storage.contents(), copy=True)
        finally:
            _unhold(storage)

    def copy_to_host(self) -> Future:
        """Start copying the contents to the host; the future's result is a NumPy array."""
        storage = self._hold("copy_to_host")
        result = Future(self._ready.producer)  # done when the contents are

        def on_ready(fut: Future) -> None:
            try:
                error = fut.exception()
                if error is None:
                    copy = np.array(storage.array, copy=True)
            except BaseException as e:  # MemoryError: the copy's future fails
                error = released(e)
            finally:
                _unhold(storage)
            if error is not None:
                result.set_exception(error)
            else:
                result.set_result(copy)

        self._ready.add_done_callback(on_ready)
        return result

    def unsafe_buffer_pointer(self) -> int:
        """The address of the contents (waits for them)."""
        storage = self.live_storage("unsafe_buffer_pointer")
        self._ready.result()
        return int(storage.contents().__array_interface__["data"][0])

    # -- transfers -------------------------------------------------------------------------
    def copy_to_device(self, device: Device) -> Buffer:
        """A new buffer with the same contents in `device`'s default memory space."""
        from xlapy.runtime.device import Device

        if not isinstance(device, Device):
            raise RuntimeApiError(f"copy_to_device takes a Device, got {device!r}")
        return self.copy_to_memory_space(device.default_memory_space)

    def copy_to_memory_space(self, memory_space: MemorySpace) -> Buffer:
        """A new buffer with the same contents in `memory_space` (a copy, even on the same
        device, so the two buffers never share memory)."""
        from xlapy.runtime.device import MemorySpace

        if not isinstance(memory_space, MemorySpace):
            raise RuntimeApiError(f"copy_to_memory_space takes a MemorySpace, got {memory_space!r}")
        memory_space.client.check_open("copy_to_memory_space")
        source = self._hold("copy_to_memory_space")
        target = _Storage(memory_space, source.nbytes)
        ready = Future(self._ready.producer)  # done when the contents are
        out = Buffer(self._shape, target, ready)

        def on_ready(fut: Future) -> None:
            try:
                error = fut.exception()
                if error is None:
                    target.array = np.array(source.array, copy=True)
            except BaseException as e:  # MemoryError: the copy's buffer fails, not the caller
                error = released(e)
            finally:
                _unhold(source)
            if error is not None:
                ready.set_exception(error)
            else:
                ready.set_result(None)

        self._ready.add_done_callback(on_ready)
        return out

    # -- lifetime --------------------------------------------------------------------------
    def delete(self) -> None:
        """Free the buffer's memory (once no queued execution or external reference uses
        it). Later use raises BufferDeletedError; deleting twice is allowed."""
        if self._state != "live":
            return
        self._state = "deleted"
        self._drop_storage()

    def _drop_storage(self) -> None:
        storage, self._storage = self._storage, None
        if storage is not None:
            storage.release()

    def donate(self) -> _Storage:
        """Mark donated and hand over the buffer's reference to its storage."""
        storage = self.live_storage("donate")
        self._storage = None
        self._state = "donated"
        return storage

    def __del__(self) -> None:
        storage = getattr(self, "_storage", None)
        if storage is not None:
            self._storage = None
            storage.release()

    @contextlib.contextmanager
    def external_reference(self) -> Iterator[np.ndarray]:
        """Lend the contents as a read-only NumPy view without a copy. While held the memory
        stays allocated (even if the buffer is deleted) and the buffer cannot be donated."""
        storage = self._hold("external_reference", external=True)
        try:
            self._ready.result()
            view = storage.contents().view()
            view.flags.writeable = False
        except BaseException:
            _unhold(storage, self)
            raise
        try:
            yield view
        finally:
            _unhold(storage, self)

    @property
    def has_external_references(self) -> bool:
        return self._ext_refs > 0

    def _hold(self, what: str, external: bool = False) -> _Storage:
        """A usage hold on the storage for a host read (see the module docstring), taken
        under the device's lock; `external`: also count an external reference."""
        storage = self._storage
        if storage is None:
            return self.live_storage(what)  # raises
        with storage.lock:
            if self._storage is not storage:  # donated or deleted by another thread
                self.live_storage(what)
            storage.refs += 1
            storage.holds += 1
            if external:
                self._ext_refs += 1
        return storage

    def live_storage(self, what: str) -> _Storage:
        """The storage the buffer holds; BufferDonatedError / BufferDeletedError (naming
        `what`) once it was donated or deleted."""
        storage = self._storage
        if storage is not None:
            return storage
        if self._state == "donated":
            raise BufferDonatedError(
                f"{what}: {self.name} was donated to an execution and can no longer be used; "
                "its memory now belongs to that execution's output"
            )
        raise BufferDeletedError(f"{what}: {self.name} was deleted")

    def device_array(self) -> np.ndarray:
        """The stored array itself (the runtime's view; callers get copies)."""
        return self.live_storage("read").contents()

    # -- interop ---------------------------------------------------------------------------
    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = self.to_numpy()
        return arr if dtype is None else arr.astype(dtype, copy=False)

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any):
        return self.to_numpy().__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU, device 0: the contents live in host memory


def _unhold(storage: _Storage, external_of: Buffer | None = None) -> None:
    """Let go of a usage hold taken by `Buffer._hold` (and of the external reference of
    `external_of`)."""
    with storage.lock:
        storage.holds -= 1
        if external_of is not None:
            external_of._ext_refs -= 1
        storage.release_locked()


def host_storage(
    array: np.ndarray, memory_space: MemorySpace, semantics: HostBufferSemantics
) -> _Storage:
    """Storage in `memory_space` holding `array` (copied, or shared for zero-copy). The
    bytes are counted once the copy exists, so a failed copy (MemoryError) counts nothing."""
    zero_copy = semantics is HostBufferSemantics.IMMUTABLE_ZERO_COPY and array.flags.c_contiguous
    if zero_copy:
        contents = array.view()
        contents.flags.writeable = False
    else:
        contents = np.array(array, copy=True, order="C")
    return _Storage(memory_space, array.nbytes, owned=not zero_copy, array=contents)
