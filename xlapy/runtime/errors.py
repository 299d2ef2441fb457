"""Errors of the runtime (client, buffers, executables). All derive from XlapyError."""

from __future__ import annotations

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
