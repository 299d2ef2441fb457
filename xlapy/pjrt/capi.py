"""xlapy's PJRT C API: the `PJRT_Api` function table, built in memory with cffi callbacks
over xlapy.runtime (core: handles, errors, events; client; buffers; executables), handed to
JAX as a PyCapsule.

Every slot of the table is filled: the functions xlapy does not implement return an
UNIMPLEMENTED error saying "xlapy does not implement PJRT_<name>". A few trivial getters
JAX calls on every jitted call point at native code that answers from the handle and
falls back to the Python implementation (native.py).
"""

from __future__ import annotations

import ctypes
from typing import Any

from xlapy.pjrt import buffers, client, executables  # noqa: F401 (they export)
from xlapy.pjrt.abi import PJRT_API_MAJOR, PJRT_API_MINOR, SLOTS, ffi
from xlapy.pjrt.core import (
    IMPLS,
    KEEP,
    address,
    error_destroy,
    error_message,
    event_await_entry,
    event_error_entry,
    unimplemented_entry,
)
from xlapy.pjrt.native import compile_fast_paths

_API: Any = None


def api_pointer() -> int:
    """The address of xlapy's PJRT_Api (built on first use, kept for the process)."""
    global _API
    if _API is None:
        api = ffi.new("PJRT_Api *")
        api.struct_size = ffi.sizeof("PJRT_Api")
        api.pjrt_api_version.struct_size = ffi.sizeof("PJRT_Api_Version")
        api.pjrt_api_version.major_version = PJRT_API_MAJOR
        api.pjrt_api_version.minor_version = PJRT_API_MINOR
        special = {
            "Error_Destroy": error_destroy,
            "Error_Message": error_message,
            "Event_Error": event_error_entry,
            "Event_Await": event_await_entry,
        }
        python = {}
        for name in SLOTS:
            python[name] = special.get(name) or IMPLS.get(name) or unimplemented_entry(name)
            KEEP.append(python[name])
        from xlapy.pjrt import client

        table = client._MEMORY_TABLE
        native = compile_fast_paths({**python, "Memory_GetUserData": table.get_user_data})
        if native.get("Memory_GetUserData"):
            table.get_user_data = ffi.cast("void *", native["Memory_GetUserData"])
        for i, name in enumerate(SLOTS):
            fast = native.get(name)
            api.slots[i] = ffi.cast("void *", fast) if fast else ffi.cast("void *", python[name])
        KEEP.append(api)  # jaxlib reads the table until the process is gone (core.KEEP)
        _API = api
    return address(_API)


def implemented() -> list[str]:
    """The PJRT functions xlapy implements (the others return UNIMPLEMENTED errors)."""
    special = {"Error_Destroy", "Error_Message", "Event_Error", "Event_Await"}
    return [n for n in SLOTS if n in IMPLS or n in special]


def capsule() -> Any:
    """A PyCapsule named "pjrt_c_api" holding xlapy's `const PJRT_Api*`, as jaxlib's
    `register_plugin(c_api=...)` expects."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(api_pointer(), b"pjrt_c_api", None)
