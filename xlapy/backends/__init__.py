"""Backends, found by name. Each turns a verified module into something that runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from xlapy.errors import XlapyError


def _interpreter(module, args: Sequence[Any]):
    from xlapy.backends.interpreter import evaluate

    return evaluate(module, args)


BACKENDS: dict[str, Callable] = {"interpreter": _interpreter}


def execute(module, args: Sequence[Any], backend: str = "interpreter"):
    """Run `module` on `args` with the backend called `backend`."""
    try:
        run = BACKENDS[backend]
    except KeyError:
        raise XlapyError(
            f"unknown backend '{backend}'; available: {', '.join(sorted(BACKENDS))}"
        ) from None
    return run(module, args)
