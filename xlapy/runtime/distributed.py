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
# operands to every other process taking part and receives theirs. Messages carry the
# rendezvous key (execution, instruction, occurrence, devices), so collectives that run
# concurrently on different devices never take each other's data; a receiver thread per
# process files incoming messages by key (polling with a short sleep: MPICH's blocking
# receive spins a core). Each device then computes its whole result from the gathered
# operands, in the same order as in one process, so the bits are the same. A device that
# fails sends an abort to the other processes, whose devices waiting in that execution
# fail with its error instead of waiting for the timeout.

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from xlapy.backends.collectives import CollectiveError, CollectiveRun, Contribution
from xlapy.runtime.errors import RuntimeApiError

_TAG = 7411
_POLL_MIN, _POLL_MAX = 2e-5, 1e-3


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
        self._cond = threading.Condition()
        self._mail: dict[tuple, Any] = {}  # (key, process) -> operands
        self._aborted: dict[Any, tuple[int, str]] = {}  # run id -> (device, message)
        self._closed = False
        self._send_lock = threading.Lock()
        self._thread = threading.Thread(target=self._receive, name="xlapy-mpi", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def process_of(self, device: int) -> int:
        return device // self.local_device_count

    def is_local(self, device: int) -> bool:
        return self.process_of(device) == self.process_index

    # -- receiving --------------------------------------------------------------------------
    def _receive(self) -> None:
        pause = _POLL_MIN
        while not self._closed:
            message = self.comm.improbe(tag=_TAG)
            if message is None:
                time.sleep(pause)
                pause = min(pause * 2, _POLL_MAX)
                continue
            pause = _POLL_MIN
            kind, *body = message.recv()
            with self._cond:
                if kind == "data":
                    key, process, payload = body
                    self._mail[(key, process)] = payload
                else:
                    run_id, device, text = body
                    self._aborted.setdefault(run_id, (device, text))
                self._cond.notify_all()

    def _send(self, message: tuple, process: int) -> None:
        with self._send_lock:  # whole messages, one at a time per process
            self.comm.send(message, dest=process, tag=_TAG)

    # -- the Transport protocol -------------------------------------------------------------
    def exchange(
        self, run: CollectiveRun, key: tuple, members: Sequence[int], local: dict[int, Any]
    ) -> dict[int, Any]:
        """Send the local members' operands to the other processes of `members`; return the
        remote members' contributions (operands only)."""
        processes = sorted({self.process_of(d) for d in members} - {self.process_index})
        payload = {
            d: (tuple(np.array(a, order="C") for a in c.inputs), c.signature)
            for d, c in local.items()
        }
        for p in processes:
            self._send(("data", key, self.process_index, payload), p)
        received: dict[int, Any] = {}
        deadline = time.monotonic() + run.timeout
        with self._cond:
            for p in processes:
                while (key, p) not in self._mail:
                    self._raise_if_aborted(run, key)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        missing = [d for d in members if self.process_of(d) == p]
                        raise CollectiveError(
                            f"{key[1]}: devices {missing} (process {p}) did not arrive "
                            f"within {run.timeout:g} s"
                        )
                    self._cond.wait(min(left, 0.5))
                for d, (inputs, signature) in self._mail.pop((key, p)).items():
                    received[d] = Contribution(inputs, None, signature)
        return received

    def _raise_if_aborted(self, run: CollectiveRun, key: tuple) -> None:
        found = self._aborted.get(run.run_id)
        if found is not None:
            device, text = found
            raise CollectiveError(
                f"{key[1]}: device {device} (process {self.process_of(device)}) failed, so "
                f"the collective cannot complete: {text}"
            )

    def abort(self, run_id: Any, device: int, error: BaseException) -> None:
        """Tell every other process that `device` failed in execution `run_id`."""
        text = f"{type(error).__name__}: {error}"
        for p in range(self.process_count):
            if p != self.process_index:
                self._send(("abort", run_id, device, text), p)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._thread.join(1.0)
