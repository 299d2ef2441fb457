"""Host callbacks: a program calls a Python callable of this process by number.

A frontend that lives in the same process as the runtime (JAX through xlapy's PJRT plugin:
`jax.debug.print`, `jax.pure_callback`, `io_callback`) registers the callable here and gets
a `HostCallback` whose `id` it writes into the program, as the backend_config of a
custom-call to TARGET:

    %r = (token[], f32[3]) custom-call(token[] %t, f32[3] %x),
         custom_call_target="xlapy_host_callback", backend_config="8812739172",
         custom_call_has_side_effect=true

The target calls `callback.fn(*arrays)` on copies of the operand arrays (a leading token
operand, when `callback.token`, is not passed) and expects one array per result leaf that
is an array, of the declared shape and dtype; a leading token result is produced.
Whatever the callable raises becomes a CustomCallError carrying the exception's type,
message and traceback, so the execution fails with it (the device stays usable).

Ids are random 63-bit numbers, not a counter: the same text compiled in another process
(a disk cache entry, a deserialized executable) can never name a different callable of that
process; it names none, which is reported. The table holds its entries weakly: the owner
of the program (the JAX lowering, the executables compiled from it) keeps them alive, so
dropping those frees the callable. An executable holding host callbacks serializes (its
text names them by id, as XLA:CPU's names them by index): the bytes load and run in this
process while the callbacks live, and fail with that message anywhere else.
"""

from __future__ import annotations

import secrets
import threading
import traceback
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from xlapy.backends.custom_calls import register
from xlapy.backends.interpreter.registry import TOKEN
from xlapy.errors import CustomCallError
from xlapy.ir.opcodes import Opcode

TARGET = "xlapy_host_callback"
PARTITIONED_TARGET = "xlapy_partitioned_host_callback"
"""The same call, made by each device on its own pieces of the operands when the program
is SPMD-partitioned (JAX's partitioned debug callbacks); it returns no arrays."""


class HostCallback:
    """A callable a program may call (see the module comment). `results` is the
    (shape, dtype) of each array result; `token`: the call threads a token (first operand,
    first result); `name` says what it is in messages."""

    __slots__ = ("__weakref__", "fn", "id", "name", "results", "token")

    def __init__(
        self,
        fn: Callable[..., Sequence[Any]],
        results: Sequence[tuple[tuple[int, ...], Any]],
        token: bool = False,
        name: str = "host callback",
    ):
        self.fn = fn
        self.results = tuple((tuple(shape), np.dtype(dtype)) for shape, dtype in results)
        self.token = token
        self.name = name
        self.id = _register(self)

    def __call__(self, *args: Any) -> Sequence[Any]:
        return self.fn(*args)

    def __repr__(self) -> str:
        return f"<HostCallback {self.name} id={self.id}>"


_table: weakref.WeakValueDictionary[int, HostCallback] = weakref.WeakValueDictionary()
_lock = threading.Lock()


def _register(callback: HostCallback) -> int:
    with _lock:
        while True:
            number = secrets.randbits(63) or 1
            if number not in _table:
                _table[number] = callback
                return number


def lookup(number: int | str) -> HostCallback:
    """The live callback with this id; CustomCallError when there is none."""
    try:
        key = int(number)
    except (TypeError, ValueError):
        raise CustomCallError(
            f"{TARGET}: backend_config must be a host callback id, got {number!r}"
        ) from None
    callback = _table.get(key)
    if callback is None:
        raise CustomCallError(
            f"{TARGET}: no host callback {key} in this process (the program was made by "
            "another process, or whatever registered the callback is gone: host callbacks "
            "cannot be carried by serialized or cached programs)"
        )
    return callback


def callbacks_of(module) -> list[HostCallback]:
    """The live callbacks `module`'s custom calls name (missing ones raise)."""
    found = []
    for instr in module.instructions():
        if _calls_back(instr):
            config = instr.backend_config
            found.append(lookup(config.text if config is not None else ""))
    return found


def _calls_back(instr) -> bool:
    return instr.opcode is Opcode.CUSTOM_CALL and instr.custom_call_target in (
        TARGET,
        PARTITIONED_TARGET,
    )


def _call(ins: tuple, opaque: str):
    """The TARGET custom call (a Python target of the global registry)."""
    callback = lookup(opaque)
    args = ins[1:] if callback.token else ins
    arrays = [np.array(a, copy=True) for a in args]  # the callable may keep them
    try:
        out = callback.fn(*arrays)
    except Exception as e:
        text = "".join(traceback.format_exception(e)).rstrip()
        raise CustomCallError(f"{callback.name} failed: {type(e).__name__}: {e}\n{text}") from e
    out = [] if out is None else list(out)
    if len(out) != len(callback.results):
        raise CustomCallError(
            f"{callback.name} returned {len(out)} values, expected {len(callback.results)}"
        )
    results = []
    for i, (value, (shape, dtype)) in enumerate(zip(out, callback.results, strict=True)):
        arr = np.asarray(value)
        if arr.shape != shape or arr.dtype != dtype:
            raise CustomCallError(
                f"{callback.name} result {i} is {arr.dtype}{list(arr.shape)}, expected "
                f"{dtype}{list(shape)}"
            )
        results.append(arr)
    leaves = [TOKEN, *results] if callback.token else results
    return leaves[0] if len(leaves) == 1 else tuple(leaves)


register(TARGET, _call, "Host")
register(PARTITIONED_TARGET, _call, "Host")
