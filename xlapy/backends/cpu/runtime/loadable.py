# The functions a program image (jit/program_image.py) may name and call while it is loaded:
# the library thunks' planners, the kernel and native-function loaders, the native loops'
# address lookups. The image's unpickler resolves a function of xlapy only when it was
# marked here, next to its definition; every other function (and every name outside
# xlapy but the few values program_image lists) is refused, so that even an authentic
# entry cannot reach code that was not meant to run at load time.

from __future__ import annotations

from collections.abc import Callable
from types import FunctionType
from typing import TypeVar

from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode

F = TypeVar("F", bound=Callable)

_LOADABLE: set[FunctionType] = set()


def loadable(fn: F) -> F:
    """Mark `fn` (a module-level function) as one a program image may call when it is
    loaded. It must not hand its caller an object named by its arguments (an attribute
    by name, an item by key): what an image can reach is what these functions return."""
    if not isinstance(fn, FunctionType) or "." in fn.__qualname__:
        raise TypeError(f"{fn!r}: only module-level functions can be loadable")
    _LOADABLE.add(fn)
    return fn


def is_loadable(obj: object) -> bool:
    """Whether `obj` is a function marked with `loadable`."""
    return isinstance(obj, FunctionType) and obj in _LOADABLE


# -- parts of a loaded program that are read only by reports ---------------------------------
# A program image keeps what only reports read (the optimized module, its buffer
# assignment, the instruction each thunk implements) apart from what running needs, and
# unpickles it on first use (program_image: "deferred"). A class whose instances may come
# back with such attributes lists them in `IMAGE_DEFERRED` and answers `__getattr__` with
# `deferred_attribute`: until it is first read, the attribute is absent, and where to find
# it waits under PENDING in the instance's __dict__: (a list holding the image's report
# part, which has `anchor(number)`, its number there) by name; or, for a class that defers
# one attribute (a thunk's `instr`: a thousand thunks in a large program), its number alone
# under PENDING and the list under PENDING_BOX, which makes no dict and no tuple per object.

PENDING = "_image_pending"
PENDING_BOX = "_image_box"


def deferred_attribute(obj: object, name: str) -> object:
    """The deferred attribute `name` of `obj` (resolved and stored on first use); the
    usual AttributeError for any other missing attribute."""
    state = obj.__dict__
    pending = state.get(PENDING)
    if type(pending) is int:  # the one attribute its class defers
        box = state.get(PENDING_BOX)
        if box is not None and getattr(type(obj), "IMAGE_DEFERRED", ())[:1] == (name,):
            value = state[name] = box[0].anchor(pending)
            state.pop(PENDING, None)
            state.pop(PENDING_BOX, None)
            return value
    elif pending is not None and name in pending:
        box, number = pending[name]
        value = state[name] = box[0].anchor(number)
        pending.pop(name, None)
        return value
    if name in state:  # (another thread resolved it meanwhile)
        return state[name]
    raise AttributeError(f"{type(obj).__name__!r} object has no attribute {name!r}")


def detached(instr: HloInstruction, made: list | None = None) -> HloInstruction:
    """A copy of `instr` that shares nothing with its module, for a thunk that needs its
    instruction to run (an interpreter rule and its planner): the operands are parameters
    of the same shapes, the computations it calls are copied alike. A program image keeps
    it with the thunk, so that loading and running it read no part of the module. `made`
    gets every instruction and computation made."""
    copies: dict[HloComputation, HloComputation] = {}
    operands = [
        HloInstruction(op.name, Opcode.PARAMETER, op.shape, parameter_number=i)
        for i, op in enumerate(instr.operands)
    ]
    clone = HloInstruction(
        instr.name,
        instr.opcode,
        instr.shape,
        operands,
        _copied_attrs(instr.attrs, copies),
        literal=instr.literal,
        parameter_number=instr.parameter_number,
    )
    if made is not None:
        made += [clone, *operands]
        for comp in copies.values():
            made += [comp, *comp.instructions]
    return clone


def _copied_attrs(attrs: dict, copies: dict) -> dict:
    return {key: _copied_value(value, copies) for key, value in attrs.items()}


def _copied_value(value: object, copies: dict) -> object:
    if isinstance(value, HloComputation):
        return _copied_computation(value, copies)
    if isinstance(value, tuple) and any(isinstance(v, HloComputation) for v in value):
        return tuple(_copied_value(v, copies) for v in value)
    return value


def _copied_computation(comp: HloComputation, copies: dict) -> HloComputation:
    made = copies.get(comp)
    if made is not None:
        return made
    mapping: dict[HloInstruction, HloInstruction] = {}
    for original in comp.post_order():
        mapping[original] = HloInstruction(
            original.name,
            original.opcode,
            original.shape,
            [mapping[op] for op in original.operands],
            _copied_attrs(original.attrs, copies),
            literal=original.literal,
            parameter_number=original.parameter_number,
            control_predecessors=[mapping[p] for p in original.control_predecessors],
        )
    assert comp.root is not None, "a called computation has a root"
    order = [mapping[i] for i in comp.instructions if i in mapping]
    made = copies[comp] = HloComputation(comp.name, order, mapping[comp.root])
    made.execution_thread = comp.execution_thread
    return made
