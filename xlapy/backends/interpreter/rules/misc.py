"""Evaluation rules of constants, tuples, copies, markers (opt-barrier, domain, ...), async
wrappers and host/peer communication.

Async pairs run eagerly: `async-start` evaluates the wrapped computation and holds the result
in its tuple `((operands...), result, context...)`; `async-update` passes it on and
`async-done` takes the result out. `copy-start` yields `(copy, operand, u32 context)`.

Infeed, outfeed, send and recv use queues in the interpreter state:
  state["infeed"]    a list of values; infeed takes the first
  state["outfeed"]   a list that outfeed appends its operand to
  state["channels"]  a dict channel_id -> list; send appends, recv takes the first
Without the queue they need, they raise EvaluationError.
"""

from __future__ import annotations

import numpy as np

from xlapy.backends.interpreter.registry import TOKEN, evaluates
from xlapy.errors import EvaluationError
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape


def copy_value(value):
    """A deep copy of an interpreter value (arrays copied, tuples rebuilt, tokens kept)."""
    if isinstance(value, tuple):
        return tuple(copy_value(v) for v in value)
    if isinstance(value, np.ndarray):
        return value.copy()
    return value


def zero_value(shape: Shape):
    """A value of `shape` filled with zeros (tokens for token shapes)."""
    if shape.is_tuple:
        return tuple(zero_value(s) for s in shape.tuple_shapes)
    if shape.is_token:
        return TOKEN
    if not shape.is_array:
        return None
    return np.zeros(shape.dims, shape.dtype)


@evaluates(Opcode.CONSTANT)
def _constant(instr, operands, ctx):
    if instr.literal is None:
        raise EvaluationError(
            f"{instr.name}: the constant's value was elided from the text "
            f"(constant({{...}})), so it cannot be evaluated"
        )
    return copy_value(instr.literal.to_value()) if not instr.shape.is_token else TOKEN


@evaluates(Opcode.TUPLE)
def _tuple(instr, operands, ctx):
    return tuple(operands)


@evaluates(Opcode.GET_TUPLE_ELEMENT)
def _get_tuple_element(instr, operands, ctx):
    value = operands[0]
    index = instr.tuple_index
    if not isinstance(value, tuple) or not 0 <= index < len(value):
        raise EvaluationError(
            f"{instr.name}: get-tuple-element index={index} of a value with "
            f"{len(value) if isinstance(value, tuple) else 'no'} elements"
        )
    return value[index]


@evaluates(Opcode.COPY)
def _copy(instr, operands, ctx):
    return copy_value(operands[0])


@evaluates(Opcode.OPTIMIZATION_BARRIER, Opcode.DOMAIN)
def _identity(instr, operands, ctx):
    return operands[0]


@evaluates(Opcode.ADD_DEPENDENCY)
def _add_dependency(instr, operands, ctx):
    return operands[0]


@evaluates(Opcode.AFTER_ALL)
def _after_all(instr, operands, ctx):
    return TOKEN


@evaluates(Opcode.COPY_START)
def _copy_start(instr, operands, ctx):
    context = zero_value(instr.shape.tuple_shapes[2]) if instr.shape.is_tuple else None
    return (copy_value(operands[0]), operands[0], context)


@evaluates(Opcode.COPY_DONE)
def _copy_done(instr, operands, ctx):
    return operands[0][0]


@evaluates(Opcode.ASYNC_START)
def _async_start(instr, operands, ctx):
    comp = instr.calls_or_none
    if comp is None:
        called = instr.custom_call_computations
        comp = called[0] if called else None
    if comp is None:
        raise EvaluationError(f"{instr.name}: async-start needs calls=")
    result = ctx.call(comp, operands)
    contexts = tuple(zero_value(s) for s in instr.shape.tuple_shapes[2:])
    return (tuple(operands), result, *contexts)


@evaluates(Opcode.ASYNC_UPDATE)
def _async_update(instr, operands, ctx):
    return operands[0]


@evaluates(Opcode.ASYNC_DONE)
def _async_done(instr, operands, ctx):
    return operands[0][1]


def queue(ctx, instr, key):
    """The interpreter state's list (or dict) `key` that `instr` reads or writes."""
    found = ctx.state.get(key)
    if found is None:
        raise EvaluationError(
            f"{instr.name}: {instr.opcode.text} needs state['{key}'] (a list) in the interpreter"
        )
    return found


@evaluates(Opcode.INFEED)
def _infeed(instr, operands, ctx):
    pending = queue(ctx, instr, "infeed")
    if not pending:
        raise EvaluationError(f"{instr.name}: infeed queue (state['infeed']) is empty")
    return (pending.pop(0), TOKEN)


@evaluates(Opcode.OUTFEED)
def _outfeed(instr, operands, ctx):
    queue(ctx, instr, "outfeed").append(copy_value(operands[0]))
    return TOKEN
