"""Backends, found by name. Each turns a verified module into a CompiledProgram
(xlapy.backends.base) that runs on host values.

`get_backend(name)` returns the backend registered under `name`; `register_backend` adds
one (a later CPU backend registers itself here). `execute(module, args, backend)` compiles
and runs once, without donation (the command line and the demo use it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from xlapy.backends.base import Backend, CompiledProgram
from xlapy.errors import XlapyError


def _interpreter() -> Backend:
    from xlapy.backends.interpreter.backend import InterpreterBackend

    return InterpreterBackend()


def _cpu() -> Backend:
    from xlapy.backends.cpu.backend import CpuBackend

    return CpuBackend()


BACKENDS: dict[str, Callable[[], Backend]] = {"interpreter": _interpreter, "cpu": _cpu}
_INSTANCES: dict[str, Backend] = {}


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    """Make `factory()` the backend found under `name` (replacing any earlier one)."""
    BACKENDS[name] = factory
    _INSTANCES.pop(name, None)


def get_backend(name: str) -> Backend:
    """The backend registered under `name`; XlapyError listing the known ones otherwise."""
    if name not in BACKENDS:
        raise XlapyError(f"unknown backend '{name}'; available: {', '.join(sorted(BACKENDS))}")
    if name not in _INSTANCES:
        _INSTANCES[name] = BACKENDS[name]()
    return _INSTANCES[name]


def execute(module, args: Sequence[Any], backend: str = "interpreter"):
    """Run `module` on `args` with the backend called `backend` (no donation)."""
    return get_backend(backend).compile(module).run(args)


__all__ = ["BACKENDS", "Backend", "CompiledProgram", "execute", "get_backend", "register_backend"]
