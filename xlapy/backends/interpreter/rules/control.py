"""Evaluation rules of control flow and calls: while, conditional, call, map and fusion.

Called computations run through `ctx.call`. `map` applies its scalar computation to every
element; when the computation is made only of elementwise ops and scalar constants it runs
once on the whole arrays (every elementwise rule broadcasts), otherwise element by element.
"""

from __future__ import annotations

import numpy as np

from xlapy.backends.interpreter.registry import evaluates
from xlapy.errors import EvaluationError
from xlapy.ir.computation import HloComputation
from xlapy.ir.opcodes import Opcode

_MAX_WHILE_ITERATIONS_KEY = "max_while_iterations"


def _as_bool(value, instr, what) -> bool:
    if not isinstance(value, np.ndarray) or value.shape != () or value.dtype != np.bool_:
        raise EvaluationError(f"{instr.name}: {what} must return pred[], got {value!r}")
    return bool(value)


@evaluates(Opcode.WHILE)
def _while(instr, operands, ctx):
    condition = instr.while_condition
    body = instr.while_body
    limit = ctx.state.get(_MAX_WHILE_ITERATIONS_KEY)
    state = operands[0]
    iterations = 0
    while _as_bool(ctx.call(condition, [state]), instr, f"condition {condition.name}"):
        if limit is not None and iterations >= limit:
            raise EvaluationError(
                f"{instr.name}: while loop ran past {limit} iterations "
                f"(state['{_MAX_WHILE_ITERATIONS_KEY}'])"
            )
        state = ctx.call(body, [state])
        iterations += 1
    return state


@evaluates(Opcode.CONDITIONAL)
def _conditional(instr, operands, ctx):
    selector, *branch_args = operands
    branches = instr.branches
    if instr.conditional_is_predicated:
        if selector.dtype != np.bool_:
            raise EvaluationError(
                f"{instr.name}: a conditional with true_computation/"
                f"false_computation needs a pred selector"
            )
        index = 0 if bool(selector) else 1
    else:
        if selector.shape != () or selector.dtype != np.int32:
            raise EvaluationError(
                f"{instr.name}: branch_computations needs an s32[] index, "
                f"got {selector.dtype}{list(selector.shape)}"
            )
        index = int(selector)
        if not 0 <= index < len(branches):
            index = len(branches) - 1
    if len(branch_args) != len(branches):
        raise EvaluationError(
            f"{instr.name}: {len(branches)} branches but {len(branch_args)} branch operands"
        )
    return ctx.call(branches[index], [branch_args[index]])


@evaluates(Opcode.CALL)
def _call(instr, operands, ctx):
    return ctx.call(instr.to_apply, operands)


@evaluates(Opcode.FUSION)
def _fusion(instr, operands, ctx):
    return ctx.call(instr.calls, operands)


def is_elementwise_scalar_computation(comp: HloComputation) -> bool:
    """True when `comp` holds only parameters, scalar constants and elementwise ops, so that
    evaluating it on whole arrays applies it to every element."""
    for instr in comp.instructions:
        if instr.opcode is Opcode.PARAMETER:
            continue
        if instr.opcode is Opcode.CONSTANT and instr.shape.is_scalar:
            continue
        if (
            instr.opcode.is_elementwise
            and instr.shape.is_scalar
            and (instr.opcode not in (Opcode.BITCAST_CONVERT, Opcode.STOCHASTIC_CONVERT))
        ):
            continue
        return False
    return True


@evaluates(Opcode.MAP)
def _map(instr, operands, ctx):
    comp = instr.to_apply
    out_dims = instr.shape.dims
    dtype = instr.shape.dtype
    if is_elementwise_scalar_computation(comp):
        result = ctx.call(comp, operands)
        return np.broadcast_to(np.asarray(result, dtype), out_dims).copy()
    out = np.empty(out_dims, dtype)
    for index in np.ndindex(*out_dims):
        out[index] = ctx.call(comp, [np.asarray(x[index]) for x in operands])
    return out
