"""Compile options: what a program is compiled for, as an immutable, hashable value."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from xlapy.runtime.errors import RuntimeApiError

OptionValue = str | int | float | bool


def _pairs(values: Mapping[str, OptionValue] | tuple | None, what: str) -> tuple:
    if not values:
        return ()
    items = values.items() if isinstance(values, Mapping) else values
    pairs = []
    for key, value in items:
        if not isinstance(key, str) or not isinstance(value, str | int | float | bool):
            raise RuntimeApiError(
                f"{what}: expected string keys and str/int/float/bool values, got "
                f"{key!r}: {value!r}"
            )
        pairs.append((key, value))
    return tuple(sorted(pairs))


def _integer(value: Any, what: str) -> int:
    """`value` as an int; RuntimeApiError when it is not an integer (bools, floats and
    strings are not)."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise RuntimeApiError(f"{what} must be an integer, got {value!r}")
    return operator.index(value)


def _assignment(rows: Any) -> tuple[tuple[int, ...], ...]:
    """A device assignment (rows of device ids) as nested tuples of ints, checked."""
    if isinstance(rows, str | bytes) or not isinstance(rows, Iterable):
        raise RuntimeApiError(f"device_assignment must be rows of device ids, got {rows!r}")
    assignment = []
    for row in rows:
        if isinstance(row, str | bytes) or not isinstance(row, Iterable):
            raise RuntimeApiError(f"device_assignment rows must hold device ids, got {row!r}")
        ids = tuple(_integer(d, "a device id in device_assignment") for d in row)
        if any(d < 0 for d in ids):
            raise RuntimeApiError(f"device_assignment has a negative device id: {ids}")
        assignment.append(ids)
    return tuple(assignment)


@dataclass(frozen=True, slots=True)
class CompileOptions:
    """Options of one compilation.

    `num_replicas` x `num_partitions` copies of the program run per execution;
    `device_assignment[replica][partition]` is the device id each runs on (the client's
    default assignment when None); `backend_options` are passed to the backend's compiler;
    `debug_options` are free-form settings (e.g. dumping); `strict_donation` makes a
    donation that cannot be used (the parameter has no alias) an error instead of a warning.
    """

    num_replicas: int = 1
    num_partitions: int = 1
    device_assignment: tuple[tuple[int, ...], ...] | None = None
    backend_options: tuple[tuple[str, OptionValue], ...] = ()
    debug_options: tuple[tuple[str, OptionValue], ...] = ()
    strict_donation: bool = False

    @staticmethod
    def make(
        *,
        num_replicas: int = 1,
        num_partitions: int = 1,
        device_assignment=None,
        backend_options: Mapping[str, OptionValue] | None = None,
        debug_options: Mapping[str, OptionValue] | None = None,
        strict_donation: bool = False,
    ) -> CompileOptions:
        """Options from plain Python values (dicts, nested lists); checks them."""
        num_replicas = _integer(num_replicas, "num_replicas")
        num_partitions = _integer(num_partitions, "num_partitions")
        if num_replicas < 1 or num_partitions < 1:
            raise RuntimeApiError(
                f"num_replicas and num_partitions must be >= 1, got {num_replicas} and "
                f"{num_partitions}"
            )
        assignment = None
        if device_assignment is not None:
            assignment = _assignment(device_assignment)
            if len(assignment) != num_replicas or any(
                len(row) != num_partitions for row in assignment
            ):
                raise RuntimeApiError(
                    f"device_assignment must be {num_replicas} rows (replicas) of "
                    f"{num_partitions} device ids (partitions), got {assignment}"
                )
            flat = [d for row in assignment for d in row]
            if len(set(flat)) != len(flat):
                raise RuntimeApiError(f"device_assignment uses a device twice: {assignment}")
        return CompileOptions(
            num_replicas,
            num_partitions,
            assignment,
            _pairs(backend_options, "backend_options"),
            _pairs(debug_options, "debug_options"),
            bool(strict_donation),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "num_replicas": self.num_replicas,
            "num_partitions": self.num_partitions,
            "device_assignment": (
                None
                if self.device_assignment is None
                else [list(r) for r in self.device_assignment]
            ),
            "backend_options": dict(self.backend_options),
            "debug_options": dict(self.debug_options),
            "strict_donation": self.strict_donation,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> CompileOptions:
        return CompileOptions.make(**data)
