"""One execution of a program on one device: argument checks, donation, async dispatch.

Planning checks everything a caller can get wrong (argument count, shapes, devices,
deleted buffers, donation requests) and raises before anything is touched. Committing then
marks donated buffers, allocates the outputs, and queues the run on the device's worker:

- donated parameter (the caller names it in `donate` and it has an alias): its buffers are
  invalidated (a parameter with any aliased leaf is donated whole); each aliased output
  takes over the input leaf's memory and the program writes the result there in place;
- aliased but not donated: copy-protection (seeds 000/001): the output gets fresh memory,
  the input is copied into it and the program runs on the copy; the caller's buffer is
  untouched;
- must-alias and not donated: DonationError;
- donated but unaliased: a DonationWarning and the buffer stays valid (an error under
  `strict_donation`).

Outputs are returned at once; the worker fills them and completes their ready future, or
fails it with an ExecutionError that is raised on first use.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from xlapy.backends.base import CompiledProgram, LeafAlias
from xlapy.ir.shapes import Shape, ShapeIndex
from xlapy.runtime.buffer import Buffer, _Storage
from xlapy.runtime.errors import DonationError, ExecutionError, RuntimeApiError
from xlapy.runtime.futures import Future

if TYPE_CHECKING:
    from xlapy.runtime.device import Device

_COMMIT_LOCK = threading.Lock()


class DonationWarning(UserWarning):
    """A donation was requested for a parameter that no output aliases (it is not used)."""


@dataclass(slots=True)
class _Leaf:
    param: int
    index: ShapeIndex
    shape: Shape
    buffer: Buffer | None  # None for token leaves


@dataclass(slots=True)
class CallPlan:
    """A checked execution on one device, not yet committed."""

    name: str
    device: Device
    program: CompiledProgram
    leaves: list[_Leaf]
    param_shapes: list[Shape]
    donated: frozenset[int]  # parameters whose buffers the caller gives up
    aliased: frozenset[int]  # parameters with an aliased leaf (donated or copy-protected)
    aliases: tuple[LeafAlias, ...]
    output_leaves: list[tuple[ShapeIndex, Shape]]
    storages: dict[int, _Storage] = field(default_factory=dict)  # id(leaf) -> storage


def _where(name: str, param: int, index: ShapeIndex) -> str:
    sub = "{" + ",".join(map(str, index)) + "}" if index else ""
    return f"{name}: parameter {param}{sub}"


def _flatten(name: str, param: int, shape: Shape, arg: Any, index=()) -> Iterable[_Leaf]:
    if shape.is_tuple:
        if not isinstance(arg, tuple | list) or len(arg) != len(shape.tuple_shapes):
            raise RuntimeApiError(
                f"{_where(name, param, index)} expects a tuple of {len(shape.tuple_shapes)} "
                f"buffers for {shape.to_text(with_layout=False)}, got {type(arg).__name__}"
            )
        for i, (sub, item) in enumerate(zip(shape.tuple_shapes, arg, strict=True)):
            yield from _flatten(name, param, sub, item, (*index, i))
        return
    if not shape.is_array:
        yield _Leaf(param, index, shape, None)
        return
    if not isinstance(arg, Buffer):
        raise RuntimeApiError(
            f"{_where(name, param, index)} expects a Buffer holding "
            f"{shape.to_text(with_layout=False)}, got {type(arg).__name__} "
            "(make one with Client.buffer_from_pyval)"
        )
    yield _Leaf(param, index, shape, arg)


def plan_call(
    name: str,
    program: CompiledProgram,
    param_shapes: Sequence[Shape],
    output_shape: Shape,
    aliases: tuple[LeafAlias, ...],
    args: Sequence[Any],
    device: Device,
    donate: Iterable[int],
    non_donatable: Iterable[int],
    strict_donation: bool,
) -> CallPlan:
    """Check one device's arguments and donation request; raise before touching anything."""
    if len(args) != len(param_shapes):
        raise RuntimeApiError(f"{name} takes {len(param_shapes)} arguments, {len(args)} were given")
    leaves: list[_Leaf] = []
    for p, (shape, arg) in enumerate(zip(param_shapes, args, strict=True)):
        leaves.extend(_flatten(name, p, shape, arg))
    for leaf in leaves:
        buf = leaf.buffer
        if buf is None:
            continue
        where = _where(name, leaf.param, leaf.index)
        storage = buf._live_storage(where)
        if storage.memory_space.device is not device:
            raise RuntimeApiError(
                f"{where}: {buf.name} is on device {storage.memory_space.device.id}, but "
                f"this execution runs on device {device.id}; use copy_to_device first"
            )
        if buf.shape.dims != leaf.shape.dims or buf.dtype != leaf.shape.dtype:
            raise RuntimeApiError(
                f"{where} expects {leaf.shape.to_text(with_layout=False)}, got {buf.name}"
            )
    donated = _donation(
        name, len(param_shapes), aliases, leaves, donate, non_donatable, strict_donation
    )
    return CallPlan(
        name,
        device,
        program,
        leaves,
        list(param_shapes),
        donated,
        frozenset(a.param_number for a in aliases),
        aliases,
        [(i, s) for i, s in output_shape.leaves() if s.is_array],
    )


def _donation(name, num_params, aliases, leaves, donate, non_donatable, strict) -> frozenset:
    requested: list[int] = []
    for p in donate:
        if not isinstance(p, int | np.integer) or not 0 <= p < num_params:
            raise DonationError(
                f"{name}: donate names parameter {p}, which does not exist "
                f"(the program has {num_params})"
            )
        if p in requested:
            raise DonationError(f"{name}: parameter {p} is donated twice in one call")
        requested.append(int(p))
    vetoed = {int(p) for p in non_donatable}
    aliased = {a.param_number for a in aliases}
    donated = set()
    for p in requested:
        if p in vetoed:
            continue
        if p not in aliased:
            msg = (
                f"{name}: parameter {p} was donated but no output aliases it, so its "
                "buffer cannot be reused (it stays valid)"
            )
            if strict:
                raise DonationError(msg + "; strict_donation is on")
            warnings.warn(msg, DonationWarning, stacklevel=4)
            continue
        donated.add(p)
    for alias in aliases:
        if alias.must_alias and alias.param_number not in donated:
            why = (
                "is listed in non_donatable" if alias.param_number in vetoed else "was not donated"
            )
            raise DonationError(
                f"{name}: parameter {alias.param_number} must alias output "
                f"{{{','.join(map(str, alias.output_index))}}} (must-alias) but {why}"
            )
    seen: dict[int, _Leaf] = {}
    for leaf in leaves:
        buf = leaf.buffer
        if buf is None:
            continue
        first = seen.get(id(buf))
        if first is not None and (leaf.param in donated or first.param in donated):
            both_donated = leaf.param in donated and first.param in donated
            what = "donated twice" if both_donated else "donated and also passed again"
            raise DonationError(
                f"{name}: {buf.name} is {what} (as {_where(name, first.param, first.index)} "
                f"and {_where(name, leaf.param, leaf.index)}); pass a copy instead"
            )
        seen[id(buf)] = leaf
        if leaf.param in donated and buf.has_external_references:
            raise DonationError(
                f"{_where(name, leaf.param, leaf.index)}: {buf.name} cannot be donated while "
                "an external reference to it is held"
            )
    return frozenset(donated)


def commit(plans: Sequence[CallPlan]) -> list[list[Buffer]]:
    """Donate, allocate outputs and queue every planned execution; return their outputs."""
    with _COMMIT_LOCK:
        for plan in plans:  # a buffer may have changed since planning (another thread)
            for leaf in plan.leaves:
                if leaf.buffer is not None:
                    leaf.buffer._live_storage(_where(plan.name, leaf.param, leaf.index))
                    if leaf.param in plan.donated and leaf.buffer.has_external_references:
                        raise DonationError(
                            f"{_where(plan.name, leaf.param, leaf.index)}: {leaf.buffer.name} "
                            "cannot be donated while an external reference to it is held"
                        )
        results = []
        for plan in plans:
            results.append(_commit_one(plan))
        return results


def _commit_one(plan: CallPlan) -> list[Buffer]:
    inputs_ready: list[Future] = []
    for leaf in plan.leaves:
        buf = leaf.buffer
        if buf is None:
            continue
        inputs_ready.append(buf._ready)
        if leaf.param in plan.donated:
            plan.storages[id(leaf)] = buf._donate()
        else:
            plan.storages[id(leaf)] = buf._storage.acquire()
    by_param_leaf = {(lf.param, lf.index): lf for lf in plan.leaves}
    alias_of = {a.output_index: a for a in plan.aliases}
    space = plan.device.default_memory_space
    out_storages: list[_Storage] = []
    in_place: set[int] = set()
    for index, shape in plan.output_leaves:
        alias = alias_of.get(index)
        storage = None
        if alias is not None and alias.param_number in plan.donated:
            src = plan.storages[id(by_param_leaf[(alias.param_number, alias.param_index)])]
            if src.owned:
                storage = src
                in_place.add(id(src))
        if storage is None:
            storage = _Storage(space, shape.byte_size)
        out_storages.append(storage)
    ready = Future()
    outputs = [
        Buffer(shape, storage, ready)
        for (_, shape), storage in zip(plan.output_leaves, out_storages, strict=True)
    ]
    plan.device.submit(lambda: _run(plan, inputs_ready, out_storages, in_place, ready))
    return outputs


def _run(plan: CallPlan, inputs_ready, out_storages, in_place: set[int], ready: Future) -> None:
    error: BaseException | None = None
    try:
        for fut in inputs_ready:
            failed = fut.exception()
            if failed is not None:
                raise ExecutionError(f"an input of {plan.name} failed: {failed}") from failed
        out = plan.program.run(_argument_values(plan), plan.aliased)
        for (index, _), storage in zip(plan.output_leaves, out_storages, strict=True):
            leaf = out
            for i in index:
                leaf = leaf[i]
            storage.array = leaf
    except BaseException as e:  # every failure travels to the outputs
        error = e if isinstance(e, ExecutionError) else _wrapped(plan, e)
    finally:  # inputs are let go before anyone waiting on the outputs wakes up
        for leaf in plan.leaves:
            storage = plan.storages.get(id(leaf))
            if storage is not None and id(storage) not in in_place:
                storage.release()
        plan.storages.clear()
        plan.leaves.clear()  # the plan must not keep the argument buffers alive
    if error is not None:
        ready.set_exception(error)
    else:
        ready.set_result(None)


def _wrapped(plan: CallPlan, error: BaseException) -> ExecutionError:
    wrapped = ExecutionError(
        f"execution of {plan.name} on device {plan.device.id} failed: "
        f"{type(error).__name__}: {error}"
    )
    wrapped.__cause__ = error
    return wrapped


def _argument_values(plan: CallPlan) -> list[Any]:
    aliased_leaves = {(a.param_number, a.param_index) for a in plan.aliases}
    flat: dict[int, list[tuple[ShapeIndex, Any]]] = {}
    for leaf in plan.leaves:
        if leaf.buffer is None:
            value: Any = None
        else:
            storage = plan.storages[id(leaf)]
            value = storage.array
            writable = leaf.param in plan.donated and storage.owned
            if (leaf.param, leaf.index) in aliased_leaves and not writable:
                value = np.array(value, copy=True)  # copy-protection
        flat.setdefault(leaf.param, []).append((leaf.index, value))
    return [_rebuild(shape, dict(flat.get(p, []))) for p, shape in enumerate(plan.param_shapes)]


def _rebuild(shape: Shape, leaves: dict[ShapeIndex, Any], index: ShapeIndex = ()) -> Any:
    if shape.is_tuple:
        return tuple(_rebuild(s, leaves, (*index, i)) for i, s in enumerate(shape.tuple_shapes))
    if shape.is_token:
        from xlapy.backends.interpreter.registry import TOKEN

        return TOKEN
    return leaves[index]
