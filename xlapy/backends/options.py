"""Backend options: each backend lists the options it honours; any other is an error.

A compile's `backend_options` (CompileOptions.backend_options, or the options dict given to
`Backend.compile`) are checked against the backend's table before anything is compiled: an
unknown key raises BackendOptionError naming it and listing the valid ones, and a value of
the wrong kind raises one naming the option and what it takes. A setting that would change
nothing is never accepted silently (issue 16).

Each table row is an Option: what it does, and a check of its value. RUNTIME_OPTIONS are
honoured by the runtime for every backend; INTERNAL_OPTIONS are what the runtime itself
hands a backend (the replica and partition a program runs as, the client's custom-call
registry): a backend accepts them, a user may not set them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from xlapy.errors import XlapyError


class BackendOptionError(XlapyError, ValueError):
    """A backend option the backend does not honour, or a value it cannot take."""


@dataclass(frozen=True, slots=True)
class Option:
    """One option a backend honours: what it does, and `check(value)` -> None when the value
    is valid, else what the option takes."""

    doc: str
    check: Callable[[Any], str | None]


def boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = isinstance(value, str) and value.lower() in choices
        return None if ok else "one of " + ", ".join(choices)

    return check


def integer(lowest: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= lowest
        return None if ok else f"an integer >= {lowest}"

    return check


def seconds(value: Any) -> str | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return None if ok and 0 < float(value) < math.inf else "a number of seconds > 0"


def anything(value: Any) -> str | None:
    return None


MEMORY_SCHEDULERS = ("plan", "best", "post-order", "dfs", "list", "module")
"""xlapy.memory.buffer_assignment.PLAN_ORDERS, restated so that reading the option tables
loads no planner (tests/test_memory_report.py checks that the two agree)."""

MEMORY_SCHEDULER = Option(
    "the order buffer assignment plans over: 'plan' (default: the one of best, list, dfs "
    "and post-order whose plan has the fewest temp bytes), one of those, or 'module' (the "
    "module's text order); memory/buffer_assignment.py",
    one_of(*MEMORY_SCHEDULERS),
)
"""A backend that plans memory honours it: the plan it runs, and every memory figure."""


def memory_scheduler(options: Mapping[str, Any] | None) -> str:
    """The `memory_scheduler` of backend `options` ("plan" when not set)."""
    return str((options or {}).get("memory_scheduler", "plan")).lower()


RUNTIME_OPTIONS: dict[str, Option] = {
    "collective_timeout": Option(
        "seconds a collective waits for its peers before failing", seconds
    ),
}
"""Honoured by the runtime whatever the backend."""

INTERNAL_OPTIONS: dict[str, Option] = {
    "replica_id": Option("the replica the program runs as (set by the runtime)", integer(0)),
    "partition_id": Option("the partition the program runs as (set by the runtime)", integer(0)),
    "custom_calls": Option("the client's custom-call registry (set by the runtime)", anything),
}
"""What the runtime passes a backend beside the user's options; not for users to set."""


def check_options(
    table: Mapping[str, Option],
    options: Mapping[str, Any] | Iterable[tuple[str, Any]],
    backend: str,
) -> None:
    """BackendOptionError for the first option of `options` that is not in `table` (naming
    the valid ones) or whose value `table` rejects."""
    items = options.items() if isinstance(options, Mapping) else options
    for key, value in items:
        option = table.get(key)
        if option is None:
            valid = ", ".join(sorted(table)) or "none"
            raise BackendOptionError(
                f"backend option {key!r} is not honoured by the {backend} backend (it would "
                f"be ignored); valid options: {valid}"
            )
        wanted = option.check(value)
        if wanted is not None:
            raise BackendOptionError(
                f"backend option {key}={value!r} for the {backend} backend: expected {wanted}"
            )
