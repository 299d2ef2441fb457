"""The compact parts of a program image (xlapy/backends/cpu/jit/program_image.py): equal
immutable values and tuples pickled once, a thunk's deferred instruction kept as a number,
a native loop's entries as one flat table. Each comes back as the compile made it, and a
malformed one in an authentic entry is rejected with a clear error (a CacheEntryWarning
and a full compile), never a crash or a wrong run."""

from __future__ import annotations

import functools
import io
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from xlapy.backends.cpu.jit import program_image
from xlapy.backends.cpu.jit.disk_cache import CacheEntryWarning
from xlapy.backends.cpu.jit.kernel import clear_kernel_cache
from xlapy.backends.cpu.runtime import control_flow_thunk
from xlapy.backends.cpu.runtime.control_flow_thunk import NativeLoop, WhileThunk
from xlapy.backends.cpu.runtime.kernel_thunk import KernelThunk
from xlapy.backends.cpu.runtime.loadable import PENDING, PENDING_BOX
from xlapy.backends.cpu.runtime.thunk import BufferSlice, walk_thunks
from xlapy.ir.shapes import Shape
from xlapy.ir.types import PrimitiveType
from xlapy.runtime import Client


def loop_and_run(x, w):
    """A while loop that becomes a native loop, and kernels and gemms in native runs."""

    def body(i, h):
        return jnp.tanh(h @ w) + 0.1 * i

    y = lax.fori_loop(0, 3, body, x)
    return jnp.tanh(jnp.tanh(y @ w) * 2.0 + 1.0) @ w


SHAPES = [(8, 16), (16, 16)]


@pytest.fixture(scope="module")
def text() -> str:
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in SHAPES]
    return jax.jit(loop_and_run).lower(*args).as_text(dialect="hlo")


def run(exe, args):
    client = exe.client
    return [o.to_numpy() for o in exe.execute([[client.buffer_from_pyval(a) for a in args]])[0]]


def inputs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def _slice(offset: int) -> BufferSlice:
    return BufferSlice(1, offset, 64, Shape(PrimitiveType.F32, (4, 4)))


def _round_trip(value):
    data = io.BytesIO()
    program_image._Pickler(data).dump(value)
    return program_image._Unpickler(io.BytesIO(data.getvalue())).load()


def test_equal_values_and_tuples_are_pickled_once():
    pickler = program_image._Pickler(io.BytesIO())
    a, b = pickler.canonical(((1, 0), (1, 0), _slice(0))), pickler.canonical(((1, 0), _slice(0)))
    assert a[0] is a[1] is b[0] and a[2] is b[1]
    # equal but not interchangeable: another type, or a float's sign
    assert type(pickler.canonical((True, 0))[0]) is bool
    assert type(pickler.canonical((1.0, 0))[0]) is float
    assert pickler.canonical((0.0,)) is pickler.canonical((0.0,))
    assert str(pickler.canonical((-0.0,))[0]) == "-0.0"
    assert pickler.canonical(([1], [1]))[0] is not pickler.canonical(([1], [1]))[0]  # mutable

    loaded = _round_trip([_slice(0), _slice(0), _slice(64), (_slice(0).shape, _slice(64).shape)])
    assert loaded[0] is loaded[1] and loaded[0] == _slice(0) and loaded[2] == _slice(64)
    assert loaded[3][0] is loaded[3][1] is loaded[0].shape
    assert loaded[2]._view == _slice(64)._view  # (a field the class does not compare)


@pytest.mark.parametrize("values", [(1, 2), (1, 2, 3, 4, 5, 6), [1, 2, 3, 4, None]])
def test_a_frozen_value_with_the_wrong_fields_is_refused(values):
    with pytest.raises(pickle.UnpicklingError, match="is not restored"):
        program_image._restore(BufferSlice, values)


def test_a_value_of_another_class_is_refused():
    with pytest.raises(pickle.UnpicklingError, match="is not restored"):
        program_image._restore(KernelThunk, ())


def _entry(value: int) -> int:
    return value


def test_a_native_loop_keeps_its_entries_as_one_table():
    entries = [functools.partial(_entry, 5), functools.partial(_entry, 7), lambda: 9]
    loop = NativeLoop(None, entries)
    assert [e() for e in loop.entries] == [5, 7, 9]
    assert [f(*args) for f, args in control_flow_thunk._calls(loop._table)] == [5, 7, 9]
    again = control_flow_thunk._native_loop(None, loop._table, False)
    assert [e() for e in again.entries] == [5, 7, 9]


@pytest.mark.parametrize(
    "table",
    [
        (_entry,),  # no count
        (_entry, 2, 1),  # fewer arguments than its count
        (_entry, -1),
        (_entry, "1", 3),
        (_entry, 1.0, 3),
        (3, 0),  # not a function
        (_entry, 1, 3, _entry),  # a second entry without its count
    ],
)
def test_a_malformed_native_loop_table_is_refused(table):
    with pytest.raises(ValueError, match="table is malformed"):
        control_flow_thunk._native_loop(None, table, False)


def _image_thunks(exe):
    return list(walk_thunks(exe.backend_program().compiled.entry))


def test_a_thunk_from_an_image_reads_its_instruction_on_first_use(image_cache, text):
    args = inputs(1)
    cold_exe = Client("cpu").compile(text)
    cold = run(cold_exe, args)
    names = [t.instr.name for t in _image_thunks(cold_exe)]
    clear_kernel_cache()
    exe = Client("cpu").compile(text)
    assert exe._module is None  # from the image
    thunks = _image_thunks(exe)
    kernel = next(t for t in thunks if isinstance(t, KernelThunk))
    assert type(vars(kernel)[PENDING]) is int and PENDING_BOX in vars(kernel)
    for a, c in zip(run(exe, args), cold, strict=True):
        np.testing.assert_array_equal(a, c)
    assert not hasattr(kernel, "no_such_attribute")
    assert [t.instr.name for t in thunks] == names
    assert PENDING not in vars(kernel) and PENDING_BOX not in vars(kernel)
    assert any(isinstance(t, WhileThunk) and t.native is not None for t in thunks)


def test_an_authentic_image_with_a_malformed_loop_table_is_rejected(image_cache, text, monkeypatch):
    """An image whose native loop's table says an entry has more arguments than the table
    holds (what a truncated table reads as) is rejected as it loads: a CacheEntryWarning, a
    full compile with the same bits, and the entry written again."""
    args = inputs(2)

    def truncated(loop):
        first = loop._table[0]
        return (control_flow_thunk._native_loop, (loop.code, (*loop._table, first, 3), False))

    with monkeypatch.context() as m:
        m.setattr(NativeLoop, "__reduce__", truncated)
        cold = run(Client("cpu").compile(text), args)
    clear_kernel_cache()
    with pytest.warns(CacheEntryWarning, match="table is malformed"):
        exe = Client("cpu").compile(text)
    assert exe._module is not None  # compiled again, not loaded
    for a, c in zip(run(exe, args), cold, strict=True):
        np.testing.assert_array_equal(a, c)
    clear_kernel_cache()
    again = Client("cpu").compile(text)
    assert again._module is None  # the rewritten image is used
    for a, c in zip(run(again, args), cold, strict=True):
        np.testing.assert_array_equal(a, c)
