"""The machinery of xlapy's PJRT C API: handles, errors, events and the `export` table.

Every PJRT object JAX holds (client, device, device description, memory, buffer, event,
executable, loaded executable) is a small C struct allocated here holding one `index`, the
key in `OBJECTS` of the Python object behind it. A C call arrives as a cffi callback with
the call's argument struct; the implementation (registered with `export`) looks its
objects up, calls the runtime, writes the results into the struct and returns NULL, or
returns a PJRT_Error built from the exception (message + code): no Python exception ever
reaches C. Objects the caller destroys (buffers, events, executables, errors) leave the
table in their `*_Destroy`; the others live as long as the process. Every callback, struct
and string handed out stays referenced from Python, since C only holds raw pointers.

Threads: JAX calls from any thread; cffi takes the GIL for each callback. Waiting
(`PJRT_Event_Await`) blocks on a runtime future, which lets go of the GIL.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from xlapy.errors import CustomCallError, XlapyError
from xlapy.pjrt.abi import ffi, struct_size
from xlapy.runtime import (
    BufferDeletedError,
    DonationError,
    Future,
)
from xlapy.runtime.futures import COMPLETED

PLATFORM_NAME = "xlapy"

# PJRT_Error_Code values (absl status codes).
CANCELLED, UNKNOWN, INVALID_ARGUMENT, NOT_FOUND = 1, 2, 3, 5
FAILED_PRECONDITION, UNIMPLEMENTED, INTERNAL = 9, 12, 13

OBJECTS: dict[int, Any] = {}
"""Address of a handle struct handed to C -> the Python object behind it."""
QUARANTINE_SIZE = 4096
_QUARANTINE: list[Any] = [None] * QUARANTINE_SIZE
_QUARANTINED = [0]
"""The memory of the last QUARANTINE_SIZE destroyed handles and errors (the handle
object's `c`; the error's struct and message), kept with their index zeroed: a use after
destroy (or a second destroy) within that window reads a dead handle and gets a PJRT
error instead of reading freed memory (see `forget`)."""
ERRORS: dict[int, Any] = {}
"""Address of a live PJRT_Error -> (struct, message buffer)."""
KEEP: list[Any] = []
"""Callbacks, tables and strings that must live as long as the process. The list (and the
module globals it reaches through the callbacks' functions: OBJECTS, the handles) is
immortal: at interpreter exit the modules are torn down and garbage collected in no
particular order while jaxlib's clients and arrays are destroyed in the same collections,
calling PJRT_Client_Destroy / Buffer_Destroy through the table: a table or callback freed
first crashed every process that exited with JAX on xlapy (SIGSEGV / SIGILL in
~PjRtCApiClient)."""
ctypes.pythonapi.Py_IncRef(ctypes.py_object(KEEP))
_LOCK = threading.Lock()
TRACE = os.environ.get("XLAPY_PJRT_TRACE") == "1"
"""Print every PJRT call (and the errors returned) on stdout."""
PROFILE = os.environ.get("XLAPY_PJRT_PROFILE") == "1"
"""Count the calls of each PJRT function and the time spent in them (see `profile`)."""
COUNTERS: dict[str, list[float]] = {}
"""PJRT function name -> [calls, seconds inside], kept while PROFILE or TRACE is on."""


def profile(reset: bool = False) -> dict[str, tuple[int, float]]:
    """Per PJRT function: (calls, seconds spent inside xlapy), counted since the process
    started or the last reset; empty unless XLAPY_PJRT_PROFILE=1 (or XLAPY_PJRT_TRACE=1)
    was set when xlapy.pjrt was imported (off, the calls are not timed at all)."""
    counts = {name: (int(c[0]), c[1]) for name, c in COUNTERS.items()}
    if reset:
        COUNTERS.clear()
    return counts


class PjrtError(XlapyError):
    """An error with a PJRT error code, raised by an implementation to choose the code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def address(ptr) -> int:
    return int(ffi.cast("uintptr_t", ptr))


def lookup(ptr, what: str):
    obj = OBJECTS.get(ptr.index) if ptr != ffi.NULL else None
    if obj is None:
        raise PjrtError(INVALID_ARGUMENT, f"{what} is not a live xlapy PJRT object")
    return obj


_KEYS = itertools.count(1)


def register(obj: Any, ctype: str):
    """A new handle struct of C type `ctype` for `obj`, keyed in OBJECTS by its index."""
    c = ffi.new(ctype)
    c.index = key = next(_KEYS)
    OBJECTS[key] = obj
    return c


def register_at(obj: Any, c: Any) -> None:
    """Key the existing handle struct `c` (not made by `register`) for `obj`."""
    key = next(_KEYS)
    OBJECTS[key] = obj
    c.index = key


def forget(ptr) -> None:
    """Drop the handle `ptr` (a *_Destroy). C++ may call a destroy while a Python exception
    is pending (JAX arrays freed during unwinding); then any call of a C function from
    Python fails, so this uses bytecode operations only. The runtime work happens in the
    dropped object's __del__, which Python runs with the pending exception set aside."""
    if ptr != ffi.NULL:
        key = ptr.index
        # not dict.pop: that is a C call (see above)
        if key in OBJECTS:
            # its memory (the object's `c`) outlives it for a while, marked dead (index 0);
            # _quarantine inlined: a call is not bytecode only
            slot = _QUARANTINED[0]
            _QUARANTINE[slot] = OBJECTS[key].c
            _QUARANTINED[0] = (slot + 1) % QUARANTINE_SIZE
            ptr.index = 0
            del OBJECTS[key]


def cstr(text: str):
    data = text.encode()
    return ffi.new("char[]", data), len(data)


# -- errors ---------------------------------------------------------------------------------
def new_error(code: int, message: str):
    msg, size = cstr(message)
    err = ffi.new("PJRT_Error *")
    err.vtable = _ERROR_TABLE
    err.code = code
    err.message = msg
    err.message_size = size
    err.index = key = next(_KEYS)
    ERRORS[key] = (err, msg)
    return err


def _target_status(error: BaseException) -> int | None:
    """The status code a failed custom-call target returned, if `exc` is (or was raised
    from) its CustomCallError: XLA reports a failed FFI handler with the handler's code."""
    seen, exc = 0, error  # type: tuple[int, BaseException | None]
    while exc is not None and seen < 16:
        code = getattr(exc, "status_code", None) if isinstance(exc, CustomCallError) else None
        if isinstance(code, int) and 1 <= code <= 16:
            return code
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def error_of(exc: BaseException):
    target_code = _target_status(exc)
    if isinstance(exc, PjrtError):
        code = exc.code
    elif target_code is not None:
        code = target_code
    elif isinstance(exc, BufferDeletedError | DonationError):
        code = FAILED_PRECONDITION
    elif isinstance(exc, XlapyError | ValueError | TypeError | KeyError):
        code = INVALID_ARGUMENT
    elif isinstance(exc, NotImplementedError):
        code = UNIMPLEMENTED
    else:
        code = INTERNAL
    text = str(exc) or type(exc).__name__
    if not isinstance(exc, PjrtError | XlapyError):
        text = f"{type(exc).__name__}: {text}"
    return new_error(code, f"xlapy: {text}")


def _destroy_error(err) -> None:
    """Bytecode operations only (see forget)."""
    if err != ffi.NULL:
        key = err.index
        if key in ERRORS:  # not dict.pop (see forget); kept a while as in forget
            slot = _QUARANTINED[0]
            _QUARANTINE[slot] = ERRORS[key]
            _QUARANTINED[0] = (slot + 1) % QUARANTINE_SIZE
            err.index = 0
            del ERRORS[key]


@ffi.callback("void(PJRT_Error *)")
def _vt_destroy(err):
    _destroy_error(err)


@ffi.callback("void(const PJRT_Error *, const char **, size_t *)")
def _vt_message(err, message, size):
    if message == ffi.NULL or size == ffi.NULL:
        return
    if err == ffi.NULL or err.index not in ERRORS:
        message[0], size[0] = _NO_MESSAGE, len(ffi.string(_NO_MESSAGE))
        return
    message[0] = err.message
    size[0] = err.message_size


@ffi.callback("int(const PJRT_Error *)")
def _vt_code(err):
    if err == ffi.NULL or err.index not in ERRORS:
        return INVALID_ARGUMENT
    return err.code


@ffi.callback("void(const PJRT_Error *, PJRT_Error_PayloadVisitor, void *)")
def _vt_payload(err, visitor, user_arg):
    return None


_ERROR_TABLE = ffi.new("PJRT_Error_FunctionTable *")
_ERROR_TABLE.struct_size = ffi.sizeof("PJRT_Error_FunctionTable")
_ERROR_TABLE.instance_size = ffi.sizeof("PJRT_Error")
_ERROR_TABLE.destroy = _vt_destroy
_ERROR_TABLE.message = _vt_message
_ERROR_TABLE.get_code = _vt_code
_ERROR_TABLE.for_each_payload = _vt_payload


# -- the function table ----------------------------------------------------------------------
IMPLS: dict[str, Any] = {}
KEEP.append(IMPLS)


def export(name: str, args_type: str | None = None) -> Callable:
    """Register the implementation of PJRT_<name>, taking the C argument struct
    `args_type` (default PJRT_<name>_Args). It returns None for success or raises."""

    def deco(fn: Callable) -> Callable:
        ctype = args_type or f"PJRT_{name}_Args"
        size = struct_size(ctype)

        def entry(args):
            if args == ffi.NULL or args.struct_size < size:
                return bad_args(name, args, size)
            try:
                fn(args)
            except BaseException as exc:
                return error_of(exc)
            return ffi.NULL

        def traced(args):
            if TRACE:
                print(f"xlapy pjrt: PJRT_{name}", flush=True)
            if args == ffi.NULL or args.struct_size < size:
                return bad_args(name, args, size)
            start = time.perf_counter()
            try:
                fn(args)
            except BaseException as exc:
                if TRACE:
                    print(f"xlapy pjrt: PJRT_{name} failed: {exc!r}", flush=True)
                return error_of(exc)
            finally:
                counter = COUNTERS.setdefault(name, [0, 0.0])
                counter[0] += 1
                counter[1] += time.perf_counter() - start
            return ffi.NULL

        chosen = traced if TRACE or PROFILE else entry
        IMPLS[name] = ffi.callback(f"PJRT_Error *({ctype} *)", chosen)
        return fn

    return deco


def bad_args(name: str, args, size: int):
    """The error for a NULL argument struct or one smaller than this version's (a caller
    built against an older PJRT header, or garbage): nothing of it is read."""
    if args == ffi.NULL:
        return new_error(INVALID_ARGUMENT, f"xlapy: PJRT_{name} was called with NULL args")
    return new_error(
        INVALID_ARGUMENT,
        f"xlapy: PJRT_{name}: args.struct_size is {args.struct_size}, expected at least {size}",
    )


def unimplemented_entry(name: str):
    def entry(args):
        return new_error(UNIMPLEMENTED, f"xlapy does not implement PJRT_{name}")

    return ffi.callback("PJRT_Error *(void *)", entry)


@ffi.callback("void(PJRT_Error_Destroy_Args *)")
def error_destroy(args):
    if args != ffi.NULL:
        _destroy_error(args.error)


_NO_MESSAGE = ffi.new("char[]", b"xlapy: not a live PJRT_Error")
KEEP.append(_NO_MESSAGE)


@ffi.callback("void(PJRT_Error_Message_Args *)")
def error_message(args):
    if args == ffi.NULL:
        return
    err = args.error
    if err == ffi.NULL or err.index not in ERRORS:  # NULL, destroyed or not ours
        args.message, args.message_size = _NO_MESSAGE, len(ffi.string(_NO_MESSAGE))
        return
    args.message = err.message
    args.message_size = err.message_size


@export("Error_GetCode")
def _error_get_code(args):
    err = args.error
    if err == ffi.NULL or err.index not in ERRORS:
        raise PjrtError(INVALID_ARGUMENT, "Error_GetCode: not a live PJRT_Error")
    args.code = err.code


@export("Error_ForEachPayload")
def _error_for_each_payload(args):
    return None


# -- named values ---------------------------------------------------------------------------
def named_values(pairs: list[tuple[str, Any]]):
    """A PJRT_NamedValue array (and what keeps its strings alive)."""
    values = ffi.new("PJRT_NamedValue[]", max(len(pairs), 1))
    keep: list[Any] = [values]
    for v, (name, value) in zip(values, pairs):
        v.struct_size = ffi.sizeof("PJRT_NamedValue")
        cname, size = cstr(name)
        keep.append(cname)
        v.name, v.name_size = cname, size
        if isinstance(value, bool):
            v.type, v.bool_value, v.value_size = 4, value, 1
        elif isinstance(value, int):
            v.type, v.int64_value, v.value_size = 1, value, 1
        elif isinstance(value, float):
            v.type, v.float_value, v.value_size = 3, value, 1
        elif isinstance(value, str):
            cvalue, vsize = cstr(value)
            keep.append(cvalue)
            v.type, v.string_value, v.value_size = 0, cvalue, vsize
        else:
            ints = ffi.new("int64_t[]", list(value) or [0])
            keep.append(ints)
            v.type, v.int64_array_value, v.value_size = 2, ints, len(value)
    return values, len(pairs), keep


# -- events ----------------------------------------------------------------------------------
class PEvent:
    """A PJRT_Event: a runtime future (its result is ignored, its error reported)."""

    __slots__ = ("c", "future")

    def __init__(self, future: Future):
        self.future = future
        self.c = register(self, "PJRT_Event *")

    @property
    def ptr(self):
        return self.c

    @staticmethod
    def of(future: Future):
        """The handle of an event for `future`: the one shared completed event (never
        destroyed; `completed` set, so the native fast paths answer for it) when the
        future is the runtime's COMPLETED one, else a new event."""
        if future is COMPLETED:
            return COMPLETED_EVENT.c
        return PEvent(future).c


def event_error(future: Future):
    error = future.exception()
    return ffi.NULL if error is None else error_of(error)


COMPLETED_EVENT = PEvent(COMPLETED)
COMPLETED_EVENT.c.completed = 1


@export("Event_Destroy")
def _event_destroy(args):
    if args.event != ffi.NULL and args.event.completed:
        return  # the shared completed event lives as long as the process
    forget(args.event)


@export("Event_IsReady")
def _event_is_ready(args):
    args.is_ready = lookup(args.event, "event").future.done()


@ffi.callback("PJRT_Error *(PJRT_Event_Error_Args *)")
def event_error_entry(args):
    if args == ffi.NULL:
        return bad_args("Event_Error", args, 0)
    try:
        return event_error(lookup(args.event, "event").future)
    except BaseException as exc:
        return error_of(exc)


@ffi.callback("PJRT_Error *(PJRT_Event_Await_Args *)")
def event_await_entry(args):
    if args == ffi.NULL:
        return bad_args("Event_Await", args, 0)
    try:
        return event_error(lookup(args.event, "event").future)
    except BaseException as exc:
        return error_of(exc)


@export("Event_OnReady")
def _event_on_ready(args):
    future = lookup(args.event, "event").future
    callback, user_arg = args.callback, args.user_arg

    def on_done(fut: Future, finalizing=sys.is_finalizing, null=ffi.NULL) -> None:
        # at interpreter exit (a zero-copy host buffer's memory let go while the modules
        # are torn down) JAX's side is gone too: nobody is left to tell
        if finalizing():
            return
        error = fut.exception()
        callback(null if error is None else error_of(error), user_arg)

    future.add_done_callback(on_done)


@export("Event_Create")
def _event_create(args):
    args.event = PEvent(Future()).ptr


@export("Event_Set")
def _event_set(args):
    future = lookup(args.event, "event").future
    if args.error_code == 0:
        future.set_result(None)
    else:
        message = ffi.string(args.error_message, args.error_message_size).decode(errors="replace")
        future.set_exception(PjrtError(args.error_code, message))
