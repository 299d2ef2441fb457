"""The NumPy reference interpreter (the oracle for every test)."""

from xlapy.backends.interpreter.evaluator import Interpreter, evaluate

__all__ = ["Interpreter", "evaluate"]
