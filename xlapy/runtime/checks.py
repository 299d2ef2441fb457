"""Argument checks at the runtime's public boundary. Every public call that takes a number,
a flag, a device, a memory space, a name or a timeout from its caller checks it here first,
so a wrong type or value is a RuntimeApiError naming the argument and what was expected,
never an AttributeError or TypeError from deep inside, and never a silent coercion
(`bool("no")` is True; `True` is the integer 1; `1.5` is not a device id)."""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from xlapy.runtime.errors import RuntimeApiError

if TYPE_CHECKING:
    from xlapy.runtime.device import Device, MemorySpace


def integer(value: Any, what: str, low: int | None = None, high: int | None = None) -> int:
    """`value` as an int in [low, high]; bools, floats, strings and None are not integers."""
    if isinstance(value, bool | np.bool_) or not hasattr(type(value), "__index__"):
        raise RuntimeApiError(f"{what} must be an integer, got {value!r}")
    number = operator.index(value)
    if low is not None and number < low:
        raise RuntimeApiError(f"{what} must be at least {low}, got {number}")
    if high is not None and number > high:
        raise RuntimeApiError(f"{what} must be at most {high}, got {number}")
    return number


def flag(value: Any, what: str) -> bool:
    """`value` as a bool: only True or False (NumPy's too)."""
    if not isinstance(value, bool | np.bool_):
        raise RuntimeApiError(f"{what} must be True or False, got {value!r}")
    return bool(value)


def timeout(value: Any, what: str = "timeout") -> float | None:
    """None (wait without limit) or a number of seconds, not negative and not NaN."""
    if value is None:
        return None
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.number):
        raise RuntimeApiError(f"{what} must be a number of seconds or None, got {value!r}")
    seconds = float(value)
    if math.isnan(seconds) or seconds < 0:
        raise RuntimeApiError(f"{what} must be a number of seconds >= 0, got {value!r}")
    return seconds


def name(value: Any, what: str) -> str:
    """A non-empty str (bytes are not names)."""
    if not isinstance(value, str) or not value:
        raise RuntimeApiError(f"{what} must be a non-empty string, got {value!r}")
    return value


def sequence(value: Any, what: str) -> Sequence[Any]:
    """A list or tuple (a lone buffer, a string, None or an iterator is not one)."""
    if not isinstance(value, list | tuple):
        raise RuntimeApiError(f"{what} must be a list or tuple, got {type(value).__name__}")
    return value


def items(value: Any, what: str) -> list[Any]:
    """Any iterable but a string, as a list."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise RuntimeApiError(f"{what} must be an iterable, got {type(value).__name__}")
    return list(value)


def device(client: Any, value: Any, what: str) -> Device:
    """`value` as a Device of `client` (not an id, a memory space or another client's)."""
    from xlapy.runtime.device import Device

    if not isinstance(value, Device):
        hint = " (client.lookup_device(id) gives the device)" if isinstance(value, int) else ""
        raise RuntimeApiError(f"{what} must be a Device, got {value!r}{hint}")
    if value.client is not client:
        raise RuntimeApiError(f"{what}: device {value.id} belongs to another client")
    return value


def memory_space(client: Any, value: Any, what: str) -> MemorySpace:
    """`value` as a MemorySpace of `client`."""
    from xlapy.runtime.device import MemorySpace

    if not isinstance(value, MemorySpace):
        raise RuntimeApiError(f"{what} must be a MemorySpace, got {value!r}")
    if value.client is not client:
        raise RuntimeApiError(f"{what}: {value} belongs to another client")
    return value
