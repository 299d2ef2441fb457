"""The NumPy reference interpreter (the oracle for every test).

`Interpreter` and `evaluate` load the evaluator (and with it every rule, custom calls and
collectives included) on first use, so that importing the rule registry alone (constant
folding does) loads only the rules of ops that compute on their operands."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xlapy.backends.interpreter.evaluator import Interpreter, evaluate

__all__ = ["Interpreter", "evaluate"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from xlapy.backends.interpreter import evaluator

    return getattr(evaluator, name)
