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
