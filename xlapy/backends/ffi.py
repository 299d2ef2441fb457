"""Typed FFI: custom-call handlers that declare the types of what they take.

A handler names its arguments (one per operand leaf, pre-order), its results (one per
result leaf, pre-order) and its attributes (decoded from the instruction's backend_config,
the MLIR dictionary JAX writes for api_version=API_VERSION_TYPED_FFI):

    @ffi.handler(
        args=[ffi.Buffer("f32", rank=1)],
        results=[ffi.Buffer("f32", rank=1)],
        attrs={"scale": ffi.Attr(float)},
    )
    def scale(x, out, *, scale):
        out[...] = x * scale

The handler is called as `fn(*args, *results, **attrs)`: arguments are read-only NumPy
arrays, results are preallocated writable arrays (an aliased result starts as a copy of its
operand). It fills the results in place and returns None, or returns the result arrays
(one array, or a sequence with one per result), or returns `ffi.Error(message)` to fail.
An exception raised by the handler fails the call the same way.

`check_signature(handler, instr)` compares the declaration with an instruction: operand and
result counts, each buffer's element type and rank, and the attributes (missing, unknown,
wrong type). The compile-time check (`custom_calls.check_custom_calls`) reports these before
anything runs; the messages name the instruction, the argument and both types.

Attribute text grammar (a subset of MLIR attributes): `{name = value, ...}` where a value is
an integer or float with an optional `: type` suffix (`76 : ui8`, `1.0e-05 : f32`), `true` or
`false`, a quoted string, `array<i64: 1, 2>`, a list `[v, ...]`, or a nested dictionary.
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from xlapy.errors import CustomCallError
from xlapy.ir.types import PrimitiveType


@dataclass(frozen=True, slots=True)
class Buffer:
    """A typed array argument or result: `dtype` an element type name ("f32", "s32", ...)
    or None for any; `rank` a number of dimensions, or None for any; `min_rank` a lower
    bound (for batched operands)."""

    dtype: str | None = None
    rank: int | None = None
    min_rank: int | None = None
    name: str | None = None

    def __post_init__(self):
        if self.dtype is not None:
            try:
                PrimitiveType.from_text(self.dtype)
            except Exception as e:
                raise CustomCallError(f"ffi.Buffer: unknown element type {self.dtype!r}") from e

    def describe(self) -> str:
        text = self.dtype or "any"
        if self.rank is not None:
            return f"{text}[rank {self.rank}]"
        if self.min_rank is not None:
            return f"{text}[rank >= {self.min_rank}]"
        return f"{text}[any rank]"

    def mismatch(self, shape) -> bool:
        """Whether an array Shape does not fit this declaration."""
        if not shape.is_array:
            return True
        if self.dtype is not None and shape.element_type.text != self.dtype:
            return True
        if self.rank is not None and shape.rank != self.rank:
            return True
        return self.min_rank is not None and shape.rank < self.min_rank


_MISSING = object()
ATTR_KINDS = (int, float, bool, str, np.ndarray, list, dict)


@dataclass(frozen=True, slots=True)
class Attr:
    """A typed attribute: `kind` one of int, float, bool, str, np.ndarray, list, dict;
    `default` used when the attribute is absent (without one it is required)."""

    kind: type
    default: object = _MISSING

    def __post_init__(self):
        if self.kind not in ATTR_KINDS:
            names = ", ".join(k.__name__ for k in ATTR_KINDS)
            raise CustomCallError(f"ffi.Attr kind must be one of {names}, got {self.kind!r}")

    @property
    def required(self) -> bool:
        return self.default is _MISSING

    def convert(self, value):
        """The value as this kind, or raise TypeError saying what it is."""
        kind = self.kind
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if kind in (bool, str, dict) and isinstance(value, kind):
            return value
        if kind is np.ndarray and isinstance(value, np.ndarray | list):
            return np.asarray(value)
        if kind is list and isinstance(value, list | np.ndarray):
            return list(value)
        raise TypeError(f"expects {kind.__name__}, got {describe_value(value)}")


def describe_value(value) -> str:
    """A short type description of a decoded attribute value."""
    if isinstance(value, np.ndarray):
        return f"array<{value.dtype}>"
    return type(value).__name__


@dataclass(frozen=True, slots=True)
class Error:
    """What a handler returns to fail the call with `message`."""

    message: str


@dataclass(frozen=True, slots=True)
class FfiHandler:
    """A typed handler: the function and its declared arguments, results and attributes."""

    fn: Callable
    args: tuple[Buffer, ...]
    results: tuple[Buffer, ...]
    attrs: Mapping[str, Attr] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


class ForeignHandler(Protocol):
    """A typed handler not written in Python (xla_ffi.CHandler: XLA's FFI C ABI): it checks
    its own arguments and attributes when called."""

    name: str

    def call(self, instr, ins: Sequence, outs: list) -> None: ...


def handler(
    args: Sequence[Buffer] = (),
    results: Sequence[Buffer] = (),
    attrs: Mapping[str, Attr] | None = None,
) -> Callable[[Callable], FfiHandler]:
    """Decorator declaring a typed FFI handler (see the module docstring)."""

    def wrap(fn: Callable) -> FfiHandler:
        if not callable(fn):
            raise CustomCallError(f"ffi.handler: {fn!r} is not callable")
        names = _positional_names(fn)
        declared = list(args) + list(results)
        named = [
            spec if spec.name or i >= len(names) else _renamed(spec, names[i])
            for i, spec in enumerate(declared)
        ]
        for key, attr in (attrs or {}).items():
            if not isinstance(attr, Attr):
                raise CustomCallError(f"ffi.handler: attribute {key!r} must be an ffi.Attr")
        return FfiHandler(fn, tuple(named[: len(args)]), tuple(named[len(args) :]), attrs or {})

    return wrap


def _renamed(spec: Buffer, name: str) -> Buffer:
    return Buffer(spec.dtype, spec.rank, spec.min_rank, name)


def _positional_names(fn: Callable) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds]


# -- attribute text -----------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<str>"(?:[^"\\]|\\.)*")
    | (?P<num>[-+]?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|0x[0-9a-fA-F]+|\d+))
    | (?P<word>[A-Za-z_][\w.$-]*)
    | (?P<punct>[{}\[\]<>=,:])
    )""",
    re.VERBOSE,
)
_INT_TYPES = re.compile(r"^(?:[su]?i)(\d+)$")
_ARRAY_DTYPES = {
    "i1": np.bool_,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "f16": np.float16,
    "f32": np.float32,
    "f64": np.float64,
}


@dataclass(frozen=True, slots=True)
class TypedScalar:
    """A scalar attribute with its MLIR type ("i64", "ui8", "f32", "i1", ...), as
    `parse_attributes(text, typed=True)` gives it (C handlers need the type)."""

    value: int | float | bool
    type: str


class _AttrParser:
    def __init__(self, text: str, typed: bool = False):
        self.tokens = self._tokenize(text)
        self.pos = 0
        self.typed = typed

    @staticmethod
    def _tokenize(text: str) -> list[tuple[str, str]]:
        tokens: list[tuple[str, str]] = []
        i = 0
        while i < len(text):
            if text[i:].strip() == "":
                break
            m = _TOKEN.match(text, i)
            if m is None:
                raise ValueError(f"unexpected character {text[i:].lstrip()[:1]!r}")
            kind = m.lastgroup
            assert kind is not None, "every alternative of _TOKEN is a named group"
            tokens.append((kind, m.group(kind)))
            i = m.end()
        return tokens

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ("end", "")

    def take(self, expected: str | None = None) -> str:
        kind, text = self.peek()
        if kind == "end" or (expected is not None and text != expected):
            want = repr(expected) if expected else "a value"
            raise ValueError(f"expected {want}, found {text or 'end of text'!r}")
        self.pos += 1
        return text

    def dictionary(self) -> dict:
        self.take("{")
        out = {}
        while self.peek()[1] != "}":
            kind, key = self.peek()
            if kind not in ("word", "str"):
                raise ValueError(f"expected an attribute name, found {key!r}")
            self.take()
            key = _unquote(key) if kind == "str" else key
            if self.peek()[1] == "=":
                self.take("=")
                out[key] = self.value()
            else:
                out[key] = True  # a unit attribute
            if self.peek()[1] != ",":
                break
            self.take(",")
        self.take("}")
        return out

    def value(self):
        kind, text = self.peek()
        if text == "{":
            return self.dictionary()
        if text == "[":
            self.take("[")
            items = []
            while self.peek()[1] != "]":
                items.append(self.value())
                if self.peek()[1] != ",":
                    break
                self.take(",")
            self.take("]")
            return items
        self.take()
        if kind == "str":
            return _unquote(text)
        if kind == "num":
            return self._typed_number(text)
        if text in ("true", "false"):
            return TypedScalar(text == "true", "i1") if self.typed else text == "true"
        if text == "unit":
            return True
        if text == "array":
            return self._array()
        if text == "dense":
            return self._dense()
        raise ValueError(f"unexpected {text!r}")

    def _typed_number(self, text: str):
        is_float = "x" not in text and re.search(r"[.eE]", text) is not None
        value = float(text) if is_float else int(text, 0)
        if self.peek()[1] != ":":
            return TypedScalar(value, "f64" if is_float else "i64") if self.typed else value
        self.take(":")
        mlir_type = self.take()
        if _INT_TYPES.match(mlir_type) or mlir_type == "index":
            value = int(value)
        else:
            value = float(value)
        return TypedScalar(value, mlir_type) if self.typed else value

    def _dense(self) -> np.ndarray:
        """`dense<[1, 2, 3]> : tensor<3xi64>` (or a splat `dense<0> : tensor<2x2xf32>`)."""
        self.take("<")
        values = self._dense_values() if self.peek()[1] == "[" else self._dense_scalar()
        self.take(">")
        self.take(":")
        if self.take() != "tensor":
            raise ValueError("expected a tensor type after a dense attribute")
        self.take("<")
        spelled = []
        while self.peek()[1] != ">":
            spelled.append(self.take())
        self.take(">")
        *dims, element = "".join(spelled).split("x")
        scalar_type = _ARRAY_DTYPES.get(element.removeprefix("u").removeprefix("s"))
        if scalar_type is None or not all(d.isdigit() for d in dims):
            raise ValueError(f"unsupported dense attribute type tensor<{''.join(spelled)}>")
        dtype = np.dtype(scalar_type)
        if element.startswith("ui"):
            dtype = np.dtype(dtype.str.replace("i", "u"))
        shape = tuple(int(d) for d in dims)
        if not isinstance(values, list):
            return np.full(shape, values, dtype)
        return np.array(values, dtype).reshape(shape)

    def _dense_values(self) -> list:
        self.take("[")
        items: list = []
        while self.peek()[1] != "]":
            items.append(self._dense_values() if self.peek()[1] == "[" else self._dense_scalar())
            if self.peek()[1] != ",":
                break
            self.take(",")
        self.take("]")
        return items

    def _dense_scalar(self) -> int | float | bool:
        kind, text = self.peek()
        self.take()
        if text in ("true", "false"):
            return text == "true"
        if kind != "num":
            raise ValueError(f"expected a number in a dense attribute, found {text!r}")
        is_float = "x" not in text and re.search(r"[.eE]", text) is not None
        return float(text) if is_float else int(text, 0)

    def _array(self) -> np.ndarray:
        self.take("<")
        element = self.take()
        scalar_type = _ARRAY_DTYPES.get(element.lstrip("u"))
        if scalar_type is None:
            raise ValueError(f"unsupported array element type {element!r}")
        dtype = np.dtype(scalar_type)
        if element.startswith("ui"):
            dtype = np.dtype(dtype.str.replace("i", "u"))
        values = []
        if self.peek()[1] == ":":
            self.take(":")
            while self.peek()[1] != ">":
                token = self.take()
                values.append(token == "true" if token in ("true", "false") else token)
                if self.peek()[1] != ",":
                    break
                self.take(",")
        self.take(">")
        return np.array([float(v) if isinstance(v, str) else v for v in values], dtype)


def _unquote(text: str) -> str:
    return bytes(text[1:-1], "utf-8").decode("unicode_escape")


@functools.lru_cache(maxsize=512)
def _parse_cached(text: str, typed: bool = False) -> tuple[tuple[str, object], ...]:
    parser = _AttrParser(text, typed)
    result = parser.dictionary()
    if parser.peek()[0] != "end":
        raise ValueError(f"unexpected {parser.peek()[1]!r} after the dictionary")
    return tuple(result.items())


def parse_attributes(text: str, typed: bool = False) -> dict:
    """Decode a backend_config attribute dictionary (`{n = 10 : i64, ...}`) into Python
    values: int, float, bool, str, np.ndarray (from `array<...>`), list and dict; with
    `typed`, scalars (numbers and booleans) are TypedScalars keeping their MLIR type. An
    empty text is an empty dictionary. Raises ValueError on malformed text."""
    text = text.strip()
    if not text:
        return {}
    return {k: _copy(v) for k, v in _parse_cached(text, typed)}


def _copy(value):
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, list | dict):
        return copy.deepcopy(value)
    return value


# -- checking and calling -----------------------------------------------------------------


def _leaf_shapes(shape) -> list:
    return [leaf for _, leaf in shape.leaves()]


def _type_text(shape) -> str:
    return shape.to_text(with_layout=False)


def check_signature(h: FfiHandler | ForeignHandler, instr) -> list[str]:
    """The problems matching handler `h` against custom-call `instr` (empty when it fits):
    counts, element types and ranks of arguments and results, and the attributes."""
    if not isinstance(h, FfiHandler):  # a handler in C (xla_ffi.CHandler) checks itself
        return []
    where = f"{instr.name} (target {instr.custom_call_target!r})"
    problems = []
    operands = [leaf for op in instr.operands for leaf in _leaf_shapes(op.shape)]
    results = _leaf_shapes(instr.shape)
    for what, specs, shapes in (("argument", h.args, operands), ("result", h.results, results)):
        if len(specs) != len(shapes):
            problems.append(
                f"{where}: handler {h.name!r} takes {len(specs)} {what}s, "
                f"the instruction has {len(shapes)}"
            )
            continue
        for i, (spec, shape) in enumerate(zip(specs, shapes, strict=True)):
            if spec.mismatch(shape):
                label = f"{what} {i}" + (f" {spec.name!r}" if spec.name else "")
                problems.append(
                    f"{where}: {label} expects {spec.describe()}, got {_type_text(shape)}"
                )
    try:
        decode_attributes(h, instr)
    except CustomCallError as e:
        problems.append(str(e))
    return problems


def backend_config_text(instr) -> str:
    config = instr.backend_config
    return config.text if config is not None else ""


def decode_attributes(h: FfiHandler, instr) -> dict:
    """The handler's keyword attributes for `instr`, checked against the declaration."""
    where = f"{instr.name} (target {instr.custom_call_target!r})"
    text = backend_config_text(instr)
    try:
        given = parse_attributes(text)
    except ValueError as e:
        raise CustomCallError(f"{where}: cannot read backend_config {text!r}: {e}") from e
    extra = sorted(set(given) - set(h.attrs))
    missing = sorted(k for k, a in h.attrs.items() if a.required and k not in given)
    if extra or missing:
        parts = []
        if missing:
            parts.append("missing attribute(s) " + ", ".join(missing))
        if extra:
            parts.append("unexpected attribute(s) " + ", ".join(extra))
        raise CustomCallError(f"{where}: handler {h.name!r}: " + "; ".join(parts))
    decoded = {}
    for key, attr in h.attrs.items():
        if key not in given:
            decoded[key] = attr.default
            continue
        try:
            decoded[key] = attr.convert(given[key])
        except TypeError as e:
            raise CustomCallError(f"{where}: attribute {key!r} {e}") from e
    return decoded


def call_handler(h: FfiHandler | ForeignHandler, instr, ins: Sequence, outs: list) -> None:
    """Run handler `h` for `instr` on operand leaves `ins` and preallocated result leaves
    `outs` (filled in place). Type problems and handler failures raise CustomCallError.
    A handler in C (xla_ffi.CHandler) is called through XLA's FFI call frame."""
    if not isinstance(h, FfiHandler):
        h.call(instr, ins, outs)
        return
    invoke_handler(h, instr, prepare_handler(h, instr), ins, outs)


def prepare_handler(h: FfiHandler, instr) -> dict:
    """The keyword attributes of handler `h` for `instr`, after checking its signature:
    what a backend does once, at compile time. Problems raise CustomCallError."""
    problems = check_signature(h, instr)
    if problems:
        raise CustomCallError("\n".join(problems))
    return decode_attributes(h, instr)


def invoke_handler(h: FfiHandler, instr, attrs: dict, ins: Sequence, outs: list) -> None:
    """Run handler `h` (checked by `prepare_handler`, which gave `attrs`) on operand leaves
    `ins` and result leaves `outs`, filled in place; failures raise CustomCallError."""
    target = instr.custom_call_target
    try:
        returned = h.fn(*ins, *outs, **attrs)
    except CustomCallError:
        raise
    except Exception as e:
        raise CustomCallError(
            f"{instr.name}: custom-call target {target!r} failed: {type(e).__name__}: {e}"
        ) from e
    if isinstance(returned, Error):
        raise CustomCallError(
            f"{instr.name}: custom-call target {target!r} failed: {returned.message}"
        )
    if returned is None:
        return
    values = [returned] if len(outs) == 1 and not isinstance(returned, tuple | list) else returned
    if len(values) != len(outs):
        raise CustomCallError(
            f"{instr.name}: handler {h.name!r} returned {len(values)} values, "
            f"the instruction has {len(outs)} results"
        )
    for i, (out, value) in enumerate(zip(outs, values, strict=True)):
        if value is None or value is out:
            continue
        value = np.asarray(value)
        if value.shape != out.shape:
            raise CustomCallError(
                f"{instr.name}: handler {h.name!r} result {i} has shape {value.shape}, "
                f"expected {out.shape}"
            )
        out[...] = value
