"""The PJRT-style runtime: Client, Device, MemorySpace, Buffer, Compiler, Executable,
LoadedExecutable, futures. See docs/runtime.md."""

from xlapy.runtime.buffer import Buffer, HostBufferSemantics
from xlapy.runtime.client import Client
from xlapy.runtime.compiler import Compiler
from xlapy.runtime.device import Device, MemorySpace, MemoryStats
from xlapy.runtime.errors import (
    BufferDeletedError,
    BufferDonatedError,
    DonationError,
    ExecutionError,
    RuntimeApiError,
    SerializationError,
)
from xlapy.runtime.executable import CompiledMemoryStats, Executable, LoadedExecutable
from xlapy.runtime.execution import DonationWarning
from xlapy.runtime.futures import Future, as_completed, wait_all
from xlapy.runtime.options import CompileOptions

__all__ = [
    "Buffer",
    "BufferDeletedError",
    "BufferDonatedError",
    "Client",
    "CompileOptions",
    "CompiledMemoryStats",
    "Compiler",
    "Device",
    "DonationError",
    "DonationWarning",
    "Executable",
    "ExecutionError",
    "Future",
    "HostBufferSemantics",
    "LoadedExecutable",
    "MemorySpace",
    "MemoryStats",
    "RuntimeApiError",
    "SerializationError",
    "as_completed",
    "wait_all",
]
