"""The reference interpreter: evaluates an HloModule on NumPy values, one instruction at a
time, with the per-opcode rules of `registry.EVAL_RULES`. It is the oracle every backend and
every optimization is checked against, so it favours plain, literal semantics over speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from xlapy.backends.interpreter import rules
from xlapy.backends.interpreter.registry import TOKEN, Value, rule_for
from xlapy.errors import EvaluationError
from xlapy.ir.computation import HloComputation
from xlapy.ir.module import HloModule
from xlapy.ir.shapes import Shape

rules.register_all()  # every opcode, custom calls and collectives included


class Interpreter:
    """Evaluates modules. `state` carries per-run settings rules may read:

    - "custom_calls": the custom-call registry to resolve targets in (default: the global one)
    - "replica_id", "partition_id": ids this run plays (default 0)
    - "rng_seed": seed of the legacy `rng` op's generator
    """

    def __init__(self, **state: Any):
        self.state: dict[str, Any] = {"replica_id": 0, "partition_id": 0, **state}
        self.state.setdefault("rng", np.random.default_rng(self.state.get("rng_seed", 0)))

    def run(self, module: HloModule, args: Sequence[Value]) -> Value:
        """Evaluate the entry computation of `module` on `args` (one value per parameter)."""
        entry = module.entry
        if entry is None:
            raise EvaluationError(f"module {module.name} has no entry computation")
        params = entry.parameters
        if len(args) != len(params):
            raise EvaluationError(
                f"{module.name} takes {len(params)} arguments, {len(args)} were given"
            )
        checked = [
            check_value(p.shape, a, f"parameter {p.parameter_number} ({p.name})")
            for p, a in zip(params, args, strict=True)
        ]
        return self.call(entry, checked)

    def call(self, computation: HloComputation, args: Sequence[Value]) -> Value:
        """Evaluate `computation` with its parameters bound to `args`."""
        values: dict[int, Value] = {}
        for instr in computation.post_order():
            if instr.parameter_number is not None:
                values[id(instr)] = args[instr.parameter_number]
                continue
            operands = [values[id(op)] for op in instr.operands]
            try:
                result = rule_for(instr.opcode)(instr, operands, self)
            except EvaluationError as e:
                if instr.name in str(e):
                    raise
                raise EvaluationError(f"in {computation.name}/{instr.name}: {e}") from e
            values[id(instr)] = result
        return values[id(computation.root)]


def evaluate(module: HloModule, args: Sequence[Value], **state: Any) -> Value:
    """Evaluate `module` on `args` with a fresh Interpreter."""
    return Interpreter(**state).run(module, args)


def check_value(shape: Shape, value: Value, what: str) -> Value:
    """Check that `value` has `shape` (dims and element type); return it as the interpreter's
    value (arrays as ndarrays of the exact dtype)."""
    if shape.is_tuple:
        if not isinstance(value, tuple | list) or len(value) != len(shape.tuple_shapes):
            raise EvaluationError(
                f"{what} must be a tuple of {len(shape.tuple_shapes)} values for {shape}"
            )
        return tuple(
            check_value(s, v, f"{what}{{{i}}}")
            for i, (s, v) in enumerate(zip(shape.tuple_shapes, value, strict=True))
        )
    if shape.is_token:
        return TOKEN
    arr = np.asarray(value)
    if arr.shape != shape.dims or arr.dtype != shape.dtype:
        raise EvaluationError(
            f"{what} expects {shape.to_text(with_layout=False)}, got {arr.dtype}{list(arr.shape)}"
        )
    return arr
