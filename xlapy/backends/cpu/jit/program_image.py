# Program images: a whole compiled CPU program in one disk entry, so that a warm compile of
# a program seen before runs no pass, no buffer assignment and no lowering, and does not
# even parse the program's text.
#
# Key: a SHA-256 (engine.content_key: it also covers the CPU and its features, the xlapy
# and llvmlite versions and LLVM's optimization level) of the program exactly as the
# caller handed it (text or bytes, before parsing), the compile options as JSON, every
# $XLAPY_* setting but the cache's location (the denormal mode, thread counts, the
# concurrency mode, strict fallbacks...), the kernel pool's size, the Python and NumPy
# versions and a SHA-256 of every Python source of xlapy. Anything the compile read that
# could differ is in the key, so a change is a miss, never a stale program.
#
# Value ("<key>.image", authenticated with this user's key and written atomically like
# every entry, disk_cache.py):
#
#   {"pickle": <bytes>, "objects": [[object key, length], ...], "report": <bytes>}\n
#   <pickle><objects' bytes><report pickle>
#
# The pickle holds what running needs: what the runtime's executable needs without its
# module (name, text, parameter and result shapes, aliases) and the CPU program's run
# state (every thunk sequence, the constants' bytes, the memory plan the backend works out
# from the buffer assignment: CpuProgram.image_state). Kernels and other native functions
# pickle as their object's key (jit.kernel: Kernel.__reduce__, NativeFunction.__reduce__)
# and load from the entry's objects; what is an address in one process (a BLAS entry
# point, a native loop's table, a library thunk's NumPy closure) is left out and made
# again where the image is loaded (the thunks' __getstate__ and __setstate__).
#
# The report pickle holds the HLO graph: the optimized module, its buffer assignment and
# analyses, and every instruction the thunks implement (about two thirds of a large
# program's objects: fusion bodies, dataflow values, live ranges), which only reports
# read (listings, memory figures, dumps, profiles, errors naming an instruction). The
# pickle names them by number ("persistent ids"): an attribute a class lists in
# IMAGE_DEFERRED (a thunk's `instr`, the compiled module's `module` and `assignment`) is
# unpickled on first use (runtime/loadable.py); any other reference loads the report
# pickle at once. Both are read from the one authenticated entry, the report pickle kept
# in memory until it is needed. A thunk that needs its instruction to load or run (an
# interpreter rule and its planner, an FFT, a typed FFI call) lists it in IMAGE_DETACHED
# instead: it keeps a copy that shares nothing with the module (loadable.detached).
#
# Trust: only this user's authenticated entries are unpickled (the same trust as the
# object code the entry holds and the process runs), and even an authentic entry is read
# as untrusted input: the unpickler resolves only what `allowed` lists (builtin and C
# value types, a few NumPy constructors and scalar types, the classes of xlapy's compiled
# programs as defined in their own module, and xlapy functions marked `loadable`, none of
# which hands out an attribute or item by name), never a dotted path, a re-exported
# name, getattr or a module; the pickler checks the same list, so an image every load
# would reject is not written. A damaged, truncated, foreign or malformed entry is a
# CacheEntryWarning and a full compile that writes the entry again.
#
# A program is imaged only where nothing it holds depends on the process beyond the key
# or what its load looks up again: one device, no feeds or channels, no debug options; one
# that cannot pickle has no image. Custom calls hold no target: the backend's load_image
# looks each up again in the loading client's registries, as a compile would, and a change
# that would compile the call another way is a miss.

from __future__ import annotations

import contextlib
import copyreg
import dataclasses
import functools
import hashlib
import importlib
import io
import json
import os
import pickle
import platform
import re
import sys
import threading
from collections import deque
from itertools import repeat
from types import BuiltinFunctionType, FunctionType
from typing import Any

import numpy as np

from xlapy.backends.cpu.jit import engine as jit
from xlapy.backends.cpu.jit import executable_cache
from xlapy.backends.cpu.jit.disk_cache import (
    library_dir,
    read_entry_or_warn,
    trusted_dir,
    warn_rejected,
)
from xlapy.backends.cpu.jit.kernel import (
    collecting_objects,
    objects_of_image,
)
from xlapy.backends.cpu.jit.module_cache import package_fingerprint
from xlapy.backends.cpu.runtime.loadable import (
    PENDING,
    PENDING_BOX,
    detached,
    is_loadable,
    loadable,
)
from xlapy.backends.cpu.runtime.pool import pool_size
from xlapy.errors import XlapyError
from xlapy.gc_pause import collector_paused
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.module import HloModule

__all__ = ["SUFFIX", "enabled", "image_key", "read", "refusal", "warn_rejected", "write"]

ENABLE_ENV = "XLAPY_PROGRAM_IMAGES"


def enabled() -> bool:
    """Whether compiles of program text read and write program images: yes unless
    $XLAPY_PROGRAM_IMAGES=0 or the whole-executable cache is off ($XLAPY_EXECUTABLE_CACHE=0)."""
    return executable_cache.enabled() and os.environ.get(ENABLE_ENV, "1").strip() != "0"


SUFFIX = ".image"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_NP_CORE = ("_reconstruct", "scalar")
_UNKEYED_ENV = frozenset({"XLAPY_CACHE_DIR"})
"""$XLAPY_* settings outside the key: where the cache is, which the entry is found in."""

_BUILTINS = frozenset(
    {"bool", "bytearray", "bytes", "complex", "dict", "float", "frozenset", "int", "list"}
    | {"range", "set", "slice", "str", "tuple", "object"}
)
_OTHERS = frozenset(
    {("functools", "partial"), ("collections", "deque"), ("collections", "OrderedDict")}
    | {("numpy", "dtype"), ("numpy", "ndarray")}
    | {(m, n) for m in ("numpy.core.numeric", "numpy._core.numeric") for n in ["_frombuffer"]}
    | {(m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray") for n in _NP_CORE}
)
_OPERATORS = frozenset({"lt", "le", "eq", "ne", "ge", "gt", "add", "sub", "mul", "neg"})
"""The comparisons and arithmetic a host compare or a reducer names (not attrgetter,
methodcaller, getitem: those reach any attribute or item by name)."""
_CTYPES = frozenset(
    {f"c_{t}" for t in ("bool", "float", "double", "longdouble", "size_t", "ssize_t")}
    | {f"c_{u}{t}" for u in ("", "u") for t in ("byte", "short", "int", "long", "longlong")}
    | {f"c_{u}int{b}" for u in ("", "u") for b in (8, 16, 32, 64)}
    | {"c_void_p"}
)
_CLASS_MODULES = ("xlapy.ir.", "xlapy.analysis.", "xlapy.memory.", "xlapy.backends.cpu.runtime.")
_CLASS_MODULES_EXACT = frozenset(
    {"xlapy.backends.base", "xlapy.backends.cpu.compiler", "xlapy.backends.cpu.jit.kernel"}
    | {"xlapy.backends.cpu.backend"}  # (the run plan: parameter and output leaves)
)
_RESOURCE_MODULES = frozenset(
    {f"xlapy.backends.cpu.runtime.{m}" for m in ("pool", "native_pool", "host_memory")}
)
"""Modules of process resources (thread pools, memory mappings): none of their classes is
part of a compiled program."""


def allowed(module: str, name: str, obj: Any) -> bool:
    """Whether a program image may name `obj`, found as `module`.`name`: the builtin and
    C value types, a few NumPy and ml_dtypes constructors and scalar types, the classes
    xlapy's compiled programs are made of (defined in that module: nothing re-exported, no
    dotted path), and xlapy's functions marked `loadable`. Nothing else, `getattr` and
    `eval` included, can be named, so nothing else can be called."""
    if "." in name or name.startswith("__"):
        return False
    if module == "builtins":
        return name in _BUILTINS
    if module in ("operator", "_operator"):
        return name in _OPERATORS
    if module == "ctypes":
        return name in _CTYPES
    if (module, name) in _OTHERS:
        return True
    if module == "numpy" or module.startswith(("numpy.", "ml_dtypes")):
        return isinstance(obj, type) and issubclass(obj, np.generic | np.dtype)
    if not module.startswith("xlapy."):
        return False
    if getattr(obj, "__module__", None) != module or getattr(obj, "__qualname__", None) != name:
        return False  # re-exported, or an instance
    if is_loadable(obj):
        return True
    in_program = module.startswith(_CLASS_MODULES) or module in _CLASS_MODULES_EXACT
    return isinstance(obj, type) and in_program and module not in _RESOURCE_MODULES


def image_key(program: str | bytes, options_json: str) -> str:
    """The entry name for compiling `program` (as handed over, unparsed) with the options
    whose JSON is `options_json`."""
    raw = program.encode() if isinstance(program, str) else bytes(program)
    kind = "text" if isinstance(program, str) else "bytes"
    env = sorted(
        (k, v) for k, v in os.environ.items() if k.startswith("XLAPY_") and k not in _UNKEYED_ENV
    )
    return jit.content_key(
        "program-image",
        kind,
        hashlib.sha256(raw).hexdigest(),
        options_json,
        json.dumps(env),
        str(pool_size()),
        platform.python_version(),
        np.__version__,
        package_fingerprint(),
    )


_LEAF = re.compile(r"[a-z][a-z0-9_]*")


def _imported(module: str) -> Any:
    """`module` from sys.modules, imported first when it is a module of one of the
    packages whose classes an image may name (thunks, the HLO graph, its analyses and
    buffer assignment: the backend imports no more than running needs, so a program's
    thunks and its report's classes may live in modules not imported yet); None for any
    other module not imported. (The names are written out: only these packages' own
    modules can be imported, and tests/test_architecture.py reads them.)"""
    loaded = sys.modules.get(module)
    package, _, leaf = module.rpartition(".")
    if loaded is not None or _LEAF.fullmatch(leaf) is None:
        return loaded
    try:
        if package == "xlapy.backends.cpu.runtime":
            return importlib.import_module(f"xlapy.backends.cpu.runtime.{leaf}")
        if package == "xlapy.memory":
            return importlib.import_module(f"xlapy.memory.{leaf}")
        if package == "xlapy.analysis":
            return importlib.import_module(f"xlapy.analysis.{leaf}")
        if package == "xlapy.ir":
            return importlib.import_module(f"xlapy.ir.{leaf}")
    except ImportError:
        return None
    return None


class _Unpickler(pickle.Unpickler):
    """Resolves only the names `allowed` lets an image hold, in xlapy's modules that may
    hold them (imported by name from xlapy's own package: `_imported`) or in modules
    already imported."""

    def find_class(self, module: str, name: str) -> Any:
        loaded = _imported(module)
        obj = getattr(loaded, name, None) if loaded is not None and "." not in name else None
        if obj is None or not allowed(module, name, obj):
            raise pickle.UnpicklingError(f"the image names {module}.{name}, which it may not")
        return obj


class _Pickler(pickle.Pickler):
    """Pickles frozen slotted dataclasses (shapes, slices, values: most of an image's
    objects) as their class and field values, which `_restore` sets directly: the
    default (dataclasses' __setstate__, which looks the fields up per object) took most of
    a load. Equal immutable values are pickled once (`canonical`)."""

    def __init__(self, file: Any):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._equal: dict[Any, Any] = {}
        self._tuples: dict[tuple, tuple] = {}
        self._fields: dict[int, tuple] = {}  # id of a first value -> its canonical fields

    def canonical(self, value: Any) -> Any:
        """`value`, or the first equal one this pickler met, which then stands for it: a
        frozen value (by equality), or a tuple of atoms (by type and value) and of such
        values or other objects (by identity). They are immutable, so nothing but their
        identity tells them apart, and each one pickled is one more object every load makes
        (the compiler makes a slice per operand and result of every thunk and an
        (allocation, offset) pair per kernel argument, most of them equal to another's)."""
        kind: Any = type(value)
        if kind is tuple:
            items = tuple(map(self.canonical, value))
            key = tuple((t, v) if (t := type(v)) in _ATOMS else id(v) for v in items)
            return self._tuples.setdefault(key, items)
        names = _frozen_slots(kind)
        if names is None or not kind.__dataclass_params__.eq:
            return value
        fields = self._fields.get(id(value))
        if fields is None:
            fields = tuple(self.canonical(getattr(value, n)) for n in names)
        try:
            first = self._equal.setdefault((kind, fields), value)
        except TypeError:  # unhashable fields
            return value
        if first is value:
            self._fields[id(value)] = fields
        return first

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, type | FunctionType | BuiltinFunctionType):
            _check_name(obj)
            return NotImplemented
        cls = type(obj)
        names = _frozen_slots(cls)  # type: ignore[arg-type]
        if names is None:
            return NotImplemented
        first = self.canonical(obj)
        if first is not obj:  # an equal value pickled before stands for this one
            return (_same, (first,))
        values = self._fields.get(id(obj))
        if values is None:  # (not compared: eq=False, or unhashable fields)
            values = tuple(getattr(obj, n) for n in names)
        return (_restore, (cls, values))


_ATOMS = frozenset({int, str, bytes, bool, type(None)})
"""Types whose equal values are interchangeable (not float: 0.0 == -0.0)."""


def _check_name(obj: Any) -> None:
    """PicklingError unless the unpickler will resolve `obj` (an image that would be
    rejected on every load is not written)."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if module is None or not allowed(module, name, obj):
        raise pickle.PicklingError(f"a program image may not name {module}.{name}")


@functools.cache
def _frozen_slots(cls: Any) -> tuple[str, ...] | None:
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        return None
    if "__reduce__" in cls.__dict__ or ("__getstate__" in cls.__dict__ and not _generated(cls)):
        return None
    return tuple(f.name for f in dataclasses.fields(cls))


def _generated(cls: type) -> bool:
    """Whether `cls.__getstate__` is the one dataclasses wrote for slots."""
    return getattr(cls.__getstate__, "__qualname__", "").startswith("_dataclass_")


@loadable
def _same(obj: Any) -> Any:
    return obj


@loadable
def _restore(cls: type, values: tuple) -> Any:
    names = _frozen_slots(cls)
    if names is None or type(values) is not tuple or len(values) != len(names):
        raise pickle.UnpicklingError(f"{cls!r} is not restored from {len(values)} values")
    obj: Any = object.__new__(cls)
    _consume(map(object.__setattr__, repeat(obj), names, values))  # (a loop in C)
    return obj


_consume: Any = deque(maxlen=0).extend


class _GraphPickler(_Pickler):
    """Pickles the HLO graph without following its edges down the pickler's stack: an
    instruction is pickled as an empty object of its class, and its attributes (operands,
    users, parent...) later, in a pickle of their own (`dump_graph`), where every
    instruction they name is a reference back or another empty object. The default
    recursed once per instruction along the longest chain of operands or users (a
    2,700-instruction training step: past Python's recursion limit, so no image)."""

    def __init__(self, file: Any):
        super().__init__(file)
        self._states: list[_StateOf] = []

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is HloInstruction:
            self._states.append(_StateOf(obj, _slot_values(obj)))
            return (_NEWOBJ, (kind,))
        if kind is _StateOf:
            return (_set_instruction_state, (obj.instr, obj.values))
        return super().reducer_override(obj)

    def dump_graph(self, value: Any) -> None:
        """`value`, then the attributes of every instruction it holds, as one pickle each
        round (read back by `_load_graph`; the pickles share one memo)."""
        self.dump(value)
        done = 0
        while done < len(self._states):
            round_, done = self._states[done:], len(self._states)
            self.dump(round_)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class _StateOf:
    instr: HloInstruction
    values: tuple


_INSTRUCTION_SLOTS = tuple(n for n in HloInstruction.__slots__ if n != "__weakref__")


def _slot_values(instr: HloInstruction) -> tuple:
    return tuple(getattr(instr, n) for n in _INSTRUCTION_SLOTS)


@loadable
def _set_instruction_state(instr: Any, values: Any) -> None:
    """Set the attributes of an instruction unpickled empty (`_GraphPickler`)."""
    if type(instr) is not HloInstruction or not isinstance(values, tuple):
        raise pickle.UnpicklingError("an instruction's state names no instruction")
    for name, value in zip(_INSTRUCTION_SLOTS, values, strict=True):
        setattr(instr, name, value)


def _load_graph(data: bytes) -> Any:
    """The value `_GraphPickler.dump_graph` pickled into `data`."""
    file = io.BytesIO(data)
    unpickler = _Unpickler(file)
    with collector_paused():
        value = unpickler.load()
        while file.tell() < len(data):
            unpickler.load()
    return value


def _report_types() -> tuple[type, ...]:
    """What the report pickle holds (the HLO graph): the run pickle names them by number.
    (Buffer assignment is imported by the pickler only: loading an image never needs it.)"""
    from xlapy.memory.buffer_assignment import BufferAssignment

    return (HloInstruction, HloComputation, HloModule, BufferAssignment)


_NEWOBJ: Any = getattr(copyreg, "__newobj__")  # noqa: B009  (pickle's NEWOBJ: no call)
_REPORT = object()
"""Stands for the report pickle in the run pickle (persistent id ("report", -1))."""


class _RunPickler(_Pickler):
    """Pickles what running needs; every HLO graph object it meets goes to `anchors` (the
    report pickle) and is named by its number there, IMAGE_DEFERRED attributes as values
    to unpickle on first use."""

    def __init__(self, file: Any):
        super().__init__(file)
        self.anchors: list[Any] = []
        self._numbers: dict[int, int] = {}
        self._detached: list[Any] = []  # (the copies, alive while their ids are kept)
        self._box = [_REPORT]
        """What every deferred attribute's (box, number) holds: one list, pickled once,
        whose item (the report pickle) the unpickler puts in once."""
        self._inline: set[int] = set()
        self._report_types = _report_types()

    def _anchor(self, obj: Any) -> int:
        number = self._numbers.get(id(obj))
        if number is None:
            number = self._numbers[id(obj)] = len(self.anchors)
            self.anchors.append(obj)
        return number

    def persistent_id(self, obj: Any) -> Any:
        if obj is _REPORT:
            return ("report", -1)
        if isinstance(obj, self._report_types) and id(obj) not in self._inline:
            return ("report", self._anchor(obj))
        return None

    def reducer_override(self, obj: Any) -> Any:
        cls = type(obj)
        deferred = getattr(cls, "IMAGE_DEFERRED", ())
        detach = getattr(cls, "IMAGE_DETACHED", ())
        if (deferred or detach) and not isinstance(obj, type):
            reduced = obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
            state = reduced[2] if isinstance(reduced, tuple) and len(reduced) > 2 else None
            if isinstance(state, dict) and PENDING not in state:
                state = dict(state)
                for name in detach:
                    if isinstance(state.get(name), HloInstruction):
                        made: list[Any] = []
                        state[name] = detached(state[name], made)
                        self._detached += made
                        self._inline.update(map(id, made))
                for name, value in state.items():
                    state[name] = self._shared(value)
                numbers = {n: self._anchor(state.pop(n)) for n in deferred if n in state}
                if len(deferred) == 1 and numbers:  # (loadable.PENDING_BOX)
                    state[PENDING], state[PENDING_BOX] = next(iter(numbers.values())), self._box
                elif numbers:
                    state[PENDING] = {n: (self._box, number) for n, number in numbers.items()}
                return (_NEWOBJ, (cls,), state)
        return super().reducer_override(obj)

    def _shared(self, value: Any) -> Any:
        """`value` (a thunk's attribute) with each frozen value and tuple in it, or in the
        list it is, replaced by the first equal one pickled (`canonical`): the pickle then
        refers back to that one instead of making another."""
        if type(value) is list and value and all(_frozen_slots(type(v)) for v in value):  # type: ignore[arg-type]
            return [self.canonical(v) for v in value]
        return self.canonical(value)


class _Report:
    """The report pickle of one image: its bytes (from the authenticated entry) until
    something asks for a value, then the values."""

    def __init__(self, key: str, data: bytes):
        self.key, self._data = key, data
        self._anchors: tuple | None = None
        self._lock = threading.Lock()
        self.loads = 0
        """How many times the pickle was unpickled (0 or 1: a test's way to see that a
        warm compile and a run left it alone)."""

    def anchor(self, number: int) -> Any:
        anchors = self._anchors
        if anchors is None:
            anchors = self._load()
        if not 0 <= number < len(anchors):
            raise pickle.UnpicklingError(f"the image names report value {number} it lacks")
        return anchors[number]

    def _load(self) -> tuple:
        with self._lock:
            if self._anchors is not None:
                return self._anchors
            try:
                anchors = _load_graph(self._data)
                if not isinstance(anchors, tuple):
                    raise pickle.UnpicklingError("the report pickle is not a tuple")
            except Exception as e:  # anything an entry can make the unpickler raise
                _discard(self.key)
                raise XlapyError(
                    f"the program image {self.key}{SUFFIX} holds a malformed report part "
                    f"({type(e).__name__}: {e}); the entry was removed: compile the program "
                    "again"
                ) from e
            self._anchors, self._data = anchors, b""
            self.loads += 1
            return anchors


class _RunUnpickler(_Unpickler):
    """Unpickles the run pickle: numbers name the report pickle's values."""

    def __init__(self, file: Any, report: _Report):
        super().__init__(file)
        self.report = report

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 2 and type(pid[1]) is int):
            raise pickle.UnpicklingError(f"bad persistent id {pid!r}")
        kind, number = pid
        if kind == "report":
            return self.report if number == -1 else self.report.anchor(number)
        raise pickle.UnpicklingError(f"bad persistent id {pid!r}")


def _discard(key: str) -> None:
    directory = trusted_dir()
    if directory is not None:
        with contextlib.suppress(OSError):
            (directory / f"{key}{SUFFIX}").unlink()


_NOT_IMAGEABLE = (
    pickle.PicklingError,
    TypeError,
    AttributeError,
    ValueError,
    KeyError,
    RecursionError,
)


def _dump(value: Any) -> tuple[bytes, bytes, set[str]]:
    """The run and report pickles of `value` as an image holds them, and the keys of the
    objects they run."""
    run, report = io.BytesIO(), io.BytesIO()
    with collecting_objects() as keys:
        pickler = _RunPickler(run)
        pickler.dump(value)
    if pickler.anchors:
        with collecting_objects() as code:
            _GraphPickler(report).dump_graph(tuple(pickler.anchors))
        if code:  # (the HLO graph holds no kernel: its part loads without objects)
            raise pickle.PicklingError("the report part of the image refers to native code")
    return run.getvalue(), report.getvalue(), set(keys)


def refusal(value: Any) -> str | None:
    """Why `value` could not be imaged (what its pickling refuses), or None: a test's way
    to see that a program is not silently left without an image."""
    try:
        _dump(value)
    except _NOT_IMAGEABLE as e:
        return f"{type(e).__name__}: {e}"
    return None


def write(key: str, value: Any) -> bool:
    """Write the image `key` of `value` (what `read` gives back); False, and nothing written,
    when it does not pickle (a thunk with process state that cannot be made again) or an
    object it runs is not in the disk cache."""
    try:
        run, report, keys = _dump(value)
    except _NOT_IMAGEABLE:
        return False
    objects = []
    for object_key in sorted(keys):  # a kernel cache object, or a kernel library one
        data = jit.read_entry(object_key, ".o") or jit.read_entry(object_key, ".o", library_dir())
        if data is None:
            return False
        objects.append((object_key, data))
    head = {
        "pickle": len(run),
        "objects": [[k, len(v)] for k, v in objects],
        "report": len(report),
    }
    blobs = b"".join(v for _, v in objects)
    jit.write_entry(key, SUFFIX, json.dumps(head).encode() + b"\n" + run + blobs + report)
    return True


def _load_pickle(data: Any, objects: dict[str, bytes], report: _Report | None = None) -> Any:
    """Unpickle `data` (the run pickle when `report` is given), its kernels' code loaded."""
    with collector_paused(), objects_of_image(objects):  # (thousands of objects)
        file = io.BytesIO(data)
        value = (_Unpickler(file) if report is None else _RunUnpickler(file, report)).load()
    return value


def read(key: str) -> Any | None:
    """The value imaged under `key` (its kernels' code loaded; what only reports read is
    unpickled when first asked for), or None: missing, or rejected (damaged, truncated,
    forged, malformed: a CacheEntryWarning says which)."""
    if not enabled():
        return None
    payload = read_entry_or_warn(key, SUFFIX, "compiled program")
    if payload is None:
        return None
    try:
        head, sep, rest = payload.partition(b"\n")
        if not sep:
            raise ValueError("no header line")
        doc = json.loads(head.decode())
        offset, report_length = int(doc["pickle"]), int(doc["report"])
        if not (0 <= offset <= len(rest) and 0 <= report_length <= len(rest) - offset):
            raise ValueError("the pickles' lengths exceed the entry (truncated?)")
        end = len(rest) - report_length
        view = memoryview(rest)
        objects: dict[str, bytes] = {}
        at = offset
        for object_key, length in doc["objects"]:
            if not (isinstance(object_key, str) and _HEX64.fullmatch(object_key)):
                raise ValueError(f"bad object key {object_key!r}")
            if not isinstance(length, int) or length <= 0 or at + length > end:
                raise ValueError("object lengths exceed the entry (truncated?)")
            objects[object_key] = bytes(view[at : at + length])
            at += length
        if at != end:
            raise ValueError(f"{end - at} bytes between the objects and the report pickle")
        report = _Report(key, rest[end:])
        value = _load_pickle(view[:offset], objects, report)
    except Exception as e:  # anything an entry can make the unpickler raise
        warn_rejected(key + SUFFIX, f"its contents are malformed ({type(e).__name__}: {e})")
        return None
    return value
