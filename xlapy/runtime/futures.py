"""Futures: values that an asynchronous execution or transfer will produce.

A Future is completed once, with a result or an exception; waiting re-raises the exception.
Callbacks added before completion run on the completing thread, those added after run at
once on the caller's thread.

Futures sit on the dispatch path of every execution, so they are cheap: one plain lock per
future guards its state, and the event a waiter sleeps on is made only when someone waits
on a future that is still pending. A future that is already done (every input made by
`buffer_from_pyval`, every output of an inline execution: these share `COMPLETED`) never
touches a lock or an event.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from xlapy.backends.custom_calls import current_call
from xlapy.runtime.checks import items
from xlapy.runtime.checks import timeout as check_timeout
from xlapy.runtime.errors import RuntimeApiError

if TYPE_CHECKING:
    from xlapy.runtime.device import Device

_PENDING, _DONE = 0, 1

CUSTOM_CALL_WAIT_SECONDS = 60.0
"""The longest a custom call may wait for a future it gave no timeout (see Future._wait)."""


class Future:
    """The eventual result of asynchronous work (PJRT's PjRtFuture)."""

    __slots__ = ("_callbacks", "_error", "_event", "_lock", "_producer", "_result", "_state")

    def __init__(self, producer: Device | None = None) -> None:
        """`producer`: the device whose execution completes this future (a wait on it from
        that device's own thread runs the queued work instead of blocking)."""
        self._lock = threading.Lock()
        self._state = _PENDING
        self._result: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Future], None]] | None = None
        self._event: threading.Event | None = None
        self._producer = producer

    @classmethod
    def completed(cls, value: Any = None) -> Future:
        """A future that already holds `value`."""
        fut = cls()
        fut._result, fut._state = value, _DONE
        return fut

    @classmethod
    def failed(cls, error: BaseException) -> Future:
        """A future that already holds `error`."""
        fut = cls()
        fut._error, fut._state = error, _DONE
        return fut

    @property
    def producer(self) -> Device | None:
        """The device whose execution completes this future, if any."""
        return self._producer

    def done(self) -> bool:
        """True once a result or an error is set."""
        return self._state == _DONE

    def result(self, timeout: float | None = None) -> Any:
        """Wait (at most `timeout` seconds) and return the result, or raise its error (a
        copy: see `_raise`). TimeoutError if it is not done in time."""
        if self._state != _DONE:
            self._wait(timeout)
        if self._error is not None:
            self._raise()
        return self._result

    def _raise(self) -> None:
        """Raise a copy of the stored error (same type, arguments, notes, cause and
        context). Raising the stored error itself would record the waiter's frames in its
        traceback, and those frames hold the buffer whose future holds the error: a cycle
        that kept a failed execution's memory until the cyclic GC ran."""
        error = self._error
        assert error is not None
        try:
            fresh = copy.copy(error)
        except Exception:  # an exception type that cannot be rebuilt from its arguments
            fresh = None
        if type(fresh) is not type(error) or fresh is error:
            raise error.with_traceback(None)
        fresh.__cause__ = error.__cause__
        fresh.__context__ = error.__context__
        fresh.__suppress_context__ = error.__suppress_context__
        fresh.__traceback__ = None
        try:
            raise fresh
        finally:
            del fresh, error

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait and return the error, or None if it succeeded."""
        if self._state != _DONE:
            self._wait(timeout)
        return self._error

    def add_done_callback(self, fn: Callable[[Future], None]) -> None:
        """Call `fn(self)` when done (at once if already done)."""
        if self._state == _DONE:
            fn(self)
            return
        with self._lock:
            if self._state == _PENDING:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    def set_result(self, value: Any) -> None:
        self._complete(value, None)

    def set_exception(self, error: BaseException) -> None:
        self._complete(None, error)

    def _complete(self, value: Any, error: BaseException | None) -> None:
        with self._lock:
            if self._state == _DONE:
                raise RuntimeError("future completed twice")
            self._result, self._error, self._state = value, error, _DONE
            callbacks, self._callbacks = self._callbacks, None
            event = self._event
        if event is not None:
            event.set()
        if callbacks:
            for fn in callbacks:
                fn(self)

    def _wait(self, timeout: float | None) -> None:
        timeout = check_timeout(timeout)
        producer = self._producer
        if producer is not None and producer.runs_on_current_thread():
            producer.check_not_running_here("waiting for a result of an execution")
        call = current_call()
        if call is not None and timeout is None:
            timeout = CUSTOM_CALL_WAIT_SECONDS
        # a caller that blocks for good runs the queued run itself when the worker has not
        # started it (Device.take_back): one thread wake-up fewer
        taken = timeout is None and producer is not None and producer.take_back(self)
        if taken and self._state == _DONE:
            return
        with self._lock:
            if self._state == _DONE:
                return
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        if event.wait(timeout):
            return
        what = "a result" if producer is None else f"a result of device {producer.id}"
        if call is not None:
            raise TimeoutError(
                f"custom-call target {call!r} waited {timeout} s for {what}, which may be "
                "queued behind the execution running the custom call itself; calling back "
                "into the runtime from a custom call is not supported"
            )
        raise TimeoutError(f"{what} was not ready after {timeout} s")

    def __repr__(self) -> str:
        if not self.done():
            return "<Future pending>"
        return f"<Future {'failed' if self._error else 'done'}>"


COMPLETED = Future.completed()
"""A future done with None, shared by everything that is ready when it is made (buffers of
host values, outputs of successful inline runs): a done future never changes."""


def _futures(futures: Any, what: str) -> list[Future]:
    """`futures` as a list of Futures; RuntimeApiError naming anything else."""
    listed = items(futures, f"{what}'s futures")
    for fut in listed:
        if not isinstance(fut, Future):
            raise RuntimeApiError(f"{what} takes Futures, got {fut!r}")
    return listed


def wait_all(futures: Iterable[Future], timeout: float | None = None) -> list[Any]:
    """Wait for every future and return their results in order; raises the first error
    (in the given order) after all have completed."""
    futures = _futures(futures, "wait_all")
    for fut in futures:
        fut.exception(timeout)
    return [fut.result() for fut in futures]


def as_completed(futures: Iterable[Future], timeout: float | None = None) -> Iterator[Future]:
    """Yield the futures as they complete (first done, first out)."""
    futures = _futures(futures, "as_completed")
    done_order: list[Future] = []
    cond = threading.Condition()

    def on_done(fut: Future) -> None:
        with cond:
            done_order.append(fut)
            cond.notify_all()

    def more_than(n: int) -> Callable[[], bool]:
        return lambda: len(done_order) > n

    for fut in futures:
        fut.add_done_callback(on_done)
    for i in range(len(futures)):
        with cond:
            if not cond.wait_for(more_than(i), timeout):
                raise TimeoutError(f"{len(futures) - i} futures not done after {timeout} s")
            fut = done_order[i]
        yield fut
