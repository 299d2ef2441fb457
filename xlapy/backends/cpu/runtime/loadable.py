# The functions a program image (jit/program_image.py) may name and call while it is loaded:
# the library thunks' planners, the kernel and native-function loaders, the native loops'
# address lookups. The image's unpickler resolves a function of xlapy only when it was
# marked here, next to its definition; every other function (and every name outside
# xlapy but the few values program_image lists) is refused, so that even an authentic
# entry cannot reach code that was not meant to run at load time.

from __future__ import annotations

from collections.abc import Callable
from types import FunctionType
from typing import TypeVar

F = TypeVar("F", bound=Callable)

_LOADABLE: set[FunctionType] = set()


def loadable(fn: F) -> F:
    """Mark `fn` (a module-level function) as one a program image may call when it is
    loaded. It must not hand its caller an object named by its arguments (an attribute
    by name, an item by key): what an image can reach is what these functions return."""
    if not isinstance(fn, FunctionType) or "." in fn.__qualname__:
        raise TypeError(f"{fn!r}: only module-level functions can be loadable")
    _LOADABLE.add(fn)
    return fn


def is_loadable(obj: object) -> bool:
    """Whether `obj` is a function marked with `loadable`."""
    return isinstance(obj, FunctionType) and obj in _LOADABLE


# -- parts of a loaded program that are read only by reports ---------------------------------
# A program image keeps what only reports read (the optimized module, its buffer
# assignment, the instruction each thunk implements) apart from what running needs, and
# unpickles it on first use (program_image: "deferred"). A class whose instances may come
# back with such attributes lists them in `IMAGE_DEFERRED` and answers `__getattr__` with
# `deferred_attribute`: until it is first read, the attribute is absent and its pending
# value (something with `resolve()`) waits under PENDING in the instance's __dict__.

PENDING = "_image_pending"


def deferred_attribute(obj: object, name: str) -> object:
    """The deferred attribute `name` of `obj` (resolved and stored on first use); the
    usual AttributeError for any other missing attribute."""
    pending = obj.__dict__.get(PENDING)
    if pending is None or name not in pending:
        raise AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}")
    value = pending[name].resolve()
    obj.__dict__[name] = value
    pending.pop(name, None)
    return value
