"""The interpreter as a Backend: "compiling" keeps the module; running evaluates it with the
reference interpreter, then honours the donation contract of xlapy.backends.base (aliased
outputs of donated parameters are copied into the argument arrays and returned as them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xlapy.backends.base import (
    Backend,
    CompiledProgram,
    alias_leaves,
    leaf_at,
    replace_leaf,
)
from xlapy.backends.interpreter.evaluator import Interpreter
from xlapy.backends.options import MEMORY_SCHEDULER, Option, integer, memory_scheduler
from xlapy.ir.module import HloModule

# options passed on to the interpreter's state (see Interpreter)
_INTERPRETER_STATE = (
    "replica_id",
    "partition_id",
    "custom_calls",
    "max_while_iterations",
    "rng_seed",
)


class InterpreterProgram(CompiledProgram):
    """A module run by the NumPy reference interpreter."""

    def __init__(self, module: HloModule, options: Mapping[str, Any] | None = None):
        self.module = module
        self.options = dict(options or {})
        self.aliases = alias_leaves(module)
        self.memory_scheduler = memory_scheduler(options)

    def run(
        self, args: Sequence[Any], donated: frozenset[int] = frozenset(), collectives=None
    ) -> Any:
        """Evaluate, make every output leaf a fresh array, then write aliased outputs of
        donated parameters into the argument arrays."""
        state = {k: v for k, v in self.options.items() if k in _INTERPRETER_STATE}
        if collectives is not None:
            state.update(collectives.state)
        out = Interpreter(**state).run(self.module, args)
        out = _fresh(out)
        for alias in self.aliases:
            if alias.param_number not in donated:
                continue
            target = leaf_at(args[alias.param_number], alias.param_index)
            np.copyto(target, leaf_at(out, alias.output_index), casting="no")
            out = replace_leaf(out, alias.output_index, target)
        return out


def _fresh(value: Any) -> Any:
    """A copy of every array leaf: no output shares memory with an argument or constant."""
    if isinstance(value, tuple):
        return tuple(_fresh(v) for v in value)
    if isinstance(value, np.ndarray):
        return np.array(value, copy=True, order="C")
    return value


class InterpreterBackend(Backend):
    """The reference interpreter behind the Backend interface."""

    options = {
        "max_while_iterations": Option(
            "a while loop that runs more iterations fails (ExecutionError)", integer(0)
        ),
        "rng_seed": Option("the seed of the legacy `rng` op's generator", integer(0)),
        "memory_scheduler": MEMORY_SCHEDULER,
    }

    def __init__(self, name: str = "interpreter", platform: str = "interpreter"):
        self.name = name
        self.platform = platform

    def compile(
        self,
        module: HloModule,
        options: Mapping[str, Any] | None = None,
        *,
        text: str | None = None,
    ) -> InterpreterProgram:
        self.check_options(options)
        return InterpreterProgram(module, options)
