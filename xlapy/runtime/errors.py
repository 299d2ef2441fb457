"""Errors of the runtime (client, buffers, executables). All derive from XlapyError."""

from __future__ import annotations

import traceback

from xlapy.errors import XlapyError


class RuntimeApiError(XlapyError):
    """The runtime API was used in a way it does not allow (wrong device, bad option...)."""


class BufferDeletedError(RuntimeApiError):
    """A buffer was used after `delete()`."""


class BufferDonatedError(BufferDeletedError):
    """A buffer was used after it was donated to an execution (its memory now belongs to
    that execution's output)."""


class DonationError(RuntimeApiError):
    """A donation request cannot be honoured (donated twice, donated and passed again,
    external reference held, must-alias parameter not donated, strict donation unusable).
    Raised before anything runs; no buffer is modified."""


class ExecutionError(RuntimeApiError):
    """An execution failed on its worker; raised on first use of its outputs."""


class SerializationError(RuntimeApiError):
    """Serialized executable bytes are truncated, corrupted, of another version or platform."""


def released(error: BaseException) -> BaseException:
    """`error`, its causes and contexts with their tracebacks turned into a note (text) and
    dropped. A failed execution's error is kept by its outputs' future; a traceback would
    keep the frames of the run alive, and through their locals the buffers and the future
    itself: a reference cycle holding the outputs' memory until the cyclic GC ran."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        exc = pending.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        tb = exc.__traceback__
        if tb is not None:
            text = "".join(traceback.format_tb(tb)).rstrip()
            exc.add_note(f"Traceback of the failure (frames released):\n{text}")
            exc.__traceback__ = None
        pending += [exc.__cause__, exc.__context__]
    return error
