# Multi-process clients: processes on one or many hosts form one client, each owning its
# local devices; collectives between processes go through MPI (mpi4py over an MPI from PyPI:
# `pip install "xlapy[mpi]"` installs mpi4py and the mpich wheel, whose `mpiexec` starts
# the processes).
#
# Convention. Every process of an MPI job makes the same client,
#
#     client = Client("cpu", device_count=2, distributed="mpi")   # mpiexec -n 2 python prog.py
#
# where `device_count` is the number of devices of each process (as JAX's local device
# count). The client has device_count * world-size devices, numbered process by process
# (process k owns devices k*device_count ... (k+1)*device_count - 1): `devices()` lists them
# all, `addressable_devices()` this process's. Every process compiles the same programs
# and makes the same sequence of executions; `execute` takes one argument list per
# addressable device of the executable, and returns their outputs. A program's device
# assignment may mix devices of several processes.
#
# Exchange. A collective whose participants live in several processes first meets the local
# participants (as in one process); the last local one to arrive then sends the local
# operands to every other process taking part (non-blocking sends of the raw bytes, after a
# small header naming the rendezvous key: execution, instruction, occurrence, devices; up to
# 64 KiB of operands travel inside the header instead, one message) and
# receives theirs, so collectives that run concurrently on different devices never take
# each other's data. There is no receiver thread: a thread waiting for data pumps the
# incoming messages (one at a time, a header then its arrays from the same sender, which
# MPI keeps in order) into a mailbox keyed by rendezvous, sleeping a little between polls
# (MPICH's blocking receive would spin a core). Each device then computes its whole result
# from the gathered operands, in the same order as in one process, so the bits are the
# same. A send to a device of another process is one such message (the array, under a key
# naming the channel, the occurrence, the sender and the receiver), which the receiving
# device's recv waits for the same way. A device that fails sends an abort to the other
# processes, whose devices waiting in that execution fail with its error instead of waiting
# for the timeout.

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from xlapy.backends.collectives import CollectiveError, CollectiveRun, Contribution
from xlapy.runtime.errors import RuntimeApiError

_TAG, _DATA_TAG = 7411, 7412
_POLL_MIN, _POLL_MAX = 2e-5, 2e-4
SMALL_MESSAGE_BYTES = 1 << 16
"""Operands up to this many bytes in all travel inside their header message."""


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise RuntimeApiError(
            'distributed="mpi" needs mpi4py and an MPI: pip install "xlapy[mpi]" '
            f"(mpi4py and the mpich wheel), then start with mpiexec -n N ({e})"
        ) from e
    return MPI


class MpiTransport:
    """The MPI side of a distributed client (see the file comment)."""

    def __init__(self, local_device_count: int):
        MPI = _mpi()
        self.comm = MPI.COMM_WORLD.Dup()
        self.process_index = self.comm.Get_rank()
        self.process_count = self.comm.Get_size()
        self.local_device_count = local_device_count
        self._byte = MPI.BYTE
        self._cond = threading.Condition()
        self._mail: dict[tuple, Any] = {}  # (key, process) -> {device: Contribution}
        self._aborted: dict[Any, tuple[int, str]] = {}  # run id -> (device, message)
        self._send_lock = threading.Lock()
        self._pump_lock = threading.Lock()
        self._pending: list = []  # sends not known to be complete: (request, buffers)
        self._status = MPI.Status()
        atexit.register(self.close)

    def process_of(self, device: int) -> int:
        return device // self.local_device_count

    def is_local(self, device: int) -> bool:
        return self.process_of(device) == self.process_index

    # -- moving bytes -----------------------------------------------------------------------
    def _send(self, process: int, header: tuple, arrays: Sequence[np.ndarray] = ()) -> None:
        """Post a header and its arrays to `process`, in that order (non-blocking). Arrays
        of at most SMALL_MESSAGE_BYTES in all travel inside the header: one message."""
        raw = [np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays]
        if raw and sum(b.nbytes for b in raw) <= SMALL_MESSAGE_BYTES:
            header, raw = (*header, [b.tobytes() for b in raw]), []
        with self._send_lock:
            requests: list[tuple[Any, Any]] = [
                (self.comm.isend(header, dest=process, tag=_TAG), None)
            ]
            for buf in raw:
                requests.append((self.comm.Isend([buf, self._byte], process, _DATA_TAG), buf))
            self._pending.extend(requests)

    def _pump(self) -> bool:
        """File every message that has arrived; whether there was any. One thread at a time
        (a header and its arrays are received together)."""
        if not self._pump_lock.acquire(blocking=False):
            return False
        got = False
        try:
            while True:
                message = self.comm.improbe(tag=_TAG, status=self._status)
                if message is None:
                    break
                got = True
                status_source = self._status.Get_source()
                kind, *body = message.recv()
                if kind == "abort":
                    run_id, device, text = body
                    with self._cond:
                        self._aborted.setdefault(run_id, (device, text))
                    continue
                key, process, layout, *carried = body
                payload = iter(carried[0]) if carried else None
                received = {}
                for device, shapes, signature in layout:
                    inputs = []
                    for dtype, shape in shapes:
                        if payload is not None:
                            data = bytearray(next(payload))
                            inputs.append(np.frombuffer(data, np.dtype(dtype)).reshape(shape))
                            continue
                        arr = np.empty(shape, np.dtype(dtype))
                        buf = arr.reshape(-1).view(np.uint8)
                        self.comm.Recv([buf, self._byte], source=status_source, tag=_DATA_TAG)
                        inputs.append(arr)
                    received[device] = Contribution(tuple(inputs), None, signature)
                with self._cond:
                    self._mail[(key, process)] = received
            with self._send_lock:
                self._pending = [(r, b) for r, b in self._pending if not r.Test()]
        finally:
            self._pump_lock.release()
        if got:
            with self._cond:
                self._cond.notify_all()
        return got

    # -- the Transport protocol -------------------------------------------------------------
    def exchange(
        self, run: CollectiveRun, key: tuple, members: Sequence[int], local: dict[int, Any]
    ) -> dict[int, Any]:
        """Send the local members' operands to the other processes of `members`; return the
        remote members' contributions (operands only)."""
        processes = sorted({self.process_of(d) for d in members} - {self.process_index})
        layout, arrays = [], []
        for d, c in local.items():
            layout.append((d, [(a.dtype.str, a.shape) for a in c.inputs], c.signature))
            arrays.extend(c.inputs)
        for p in processes:
            self._send(p, ("data", key, self.process_index, layout), arrays)
        received: dict[int, Any] = {}
        for p in processes:
            missing = [d for d in members if self.process_of(d) == p]
            who = f"devices {missing} (process {p})"
            received.update(self._wait_for(run, key, p, str(key[1]), who))
        return received

    def send_to(self, run: CollectiveRun, key: tuple, device: int, value: np.ndarray) -> None:
        """Post `value` (a send) for `device` in another process, under `key`."""
        layout = [(device, [(value.dtype.str, value.shape)], ())]
        self._send(self.process_of(device), ("data", key, self.process_index, layout), [value])

    def receive(self, run: CollectiveRun, key: tuple, source: int) -> np.ndarray:
        """The array device `source` of another process sent under `key` (a recv)."""
        p = self.process_of(source)
        what = f"recv on channel {key[2]}"
        found = self._wait_for(run, key, p, what, f"device {source} (process {p})")
        ((contribution,),) = [found.values()]
        return contribution.inputs[0]

    def _wait_for(
        self, run: CollectiveRun, key: tuple, p: int, what: str, who: str
    ) -> dict[int, Any]:
        """What process `p` sent under `key`, pumping the incoming messages meanwhile."""
        deadline = time.monotonic() + run.timeout
        pause = 0.0
        while True:
            with self._cond:
                found = self._mail.pop((key, p), None)
            if found is not None:
                return found
            self._raise_if_aborted(run, what)
            if time.monotonic() > deadline:
                raise CollectiveError(f"{what}: {who} did not arrive within {run.timeout:g} s")
            if self._pump():
                pause = 0.0
                continue
            with self._cond:
                self._cond.wait(pause)
            pause = min(pause * 2 or _POLL_MIN, _POLL_MAX)

    def _raise_if_aborted(self, run: CollectiveRun, what: str) -> None:
        run.raise_if_aborted(what)
        with self._cond:
            found = self._aborted.get(run.run_id)
        if found is not None:
            device, text = found
            raise CollectiveError(
                f"{what}: device {device} (process {self.process_of(device)}) failed, so "
                f"the collective cannot complete: {text}"
            )

    def abort(self, run_id: Any, device: int, error: BaseException) -> None:
        """Tell every other process that `device` failed in execution `run_id`."""
        text = f"{type(error).__name__}: {error}"
        for p in range(self.process_count):
            if p != self.process_index:
                self._send(p, ("abort", run_id, device, text))

    def close(self) -> None:
        """Wait (briefly) for the sends still in flight."""
        deadline = time.monotonic() + 5.0
        while self._pending and time.monotonic() < deadline:
            self._pump()
            time.sleep(_POLL_MIN)
