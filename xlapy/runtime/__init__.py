"""The PJRT-style runtime: Client, Device, MemorySpace, Buffer, Compiler, Executable,
LoadedExecutable, futures, and the custom-call API (`register_custom_call` for the global
registry, `Client.register_custom_call` per client, `ffi` for typed handlers). See
docs/runtime.md and docs/custom_calls.md."""

from xlapy.backends import ffi
from xlapy.backends.custom_calls import ApiVersion, CustomCallRegistry
from xlapy.backends.custom_calls import register as register_custom_call
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
from xlapy.runtime.host_callbacks import HostCallback
from xlapy.runtime.options import CompileOptions

__all__ = [
    "ApiVersion",
    "Buffer",
    "BufferDeletedError",
    "BufferDonatedError",
    "Client",
    "CompileOptions",
    "CompiledMemoryStats",
    "Compiler",
    "CustomCallRegistry",
    "Device",
    "DonationError",
    "DonationWarning",
    "Executable",
    "ExecutionError",
    "Future",
    "HostBufferSemantics",
    "HostCallback",
    "LoadedExecutable",
    "MemorySpace",
    "MemoryStats",
    "RuntimeApiError",
    "SerializationError",
    "as_completed",
    "ffi",
    "register_custom_call",
    "wait_all",
]
