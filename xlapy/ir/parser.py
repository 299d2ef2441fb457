"""The HLO text parser: XLA's text format (what JAX's `as_text()` and XLA's dumps print) in,
an HloModule out.

The parser is scannerless recursive descent: it walks the text with a cursor, skipping
whitespace and `/* */` comments between items and matching each item with a small regular
expression at the cursor. HLO's grammar is context sensitive (`b01f_01io->b01f`, `3x3`,
`0_1x1_1` and `[2,2]<=[4]` only mean something after a particular attribute name), so the
attribute's kind from ATTRIBUTE_KINDS picks the rule that reads its value.

Speed comes from doing little per character: whitespace and comments are skipped by one
regular expression, and the common forms (`name = f32[2,3]{1,0} add(a, b), dimensions={0}`)
are recognized by a few larger ones: the start of an instruction up to its opcode, plain
operand names, `, key =`, integer lists, a parameter number. Shapes and scalar constants
are immutable, so each distinct shape text (and scalar constant) is read by the general
rules once and then reused from a cache. A fast path only ever finds the extent of a
form whose meaning the general rules fixed; anything else (comments, tuple shapes, first
sightings, errors) goes through the general rules, which alone produce the error messages.

Names are resolved late: operands and control predecessors once their whole computation
has been read (XLA allows any text order), called computations once the whole module has
been read (so forward references work). Every failure is an HloParseError carrying the
line and column; nesting deeper than MAX_DEPTH is rejected instead of recursing on.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from xlapy.errors import HloParseError
from xlapy.ir import attributes as A
from xlapy.ir.attributes import ATTRIBUTE_KINDS, AttrKind
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.literal import Literal
from xlapy.ir.module import (
    AliasEntry,
    AliasKind,
    BufferDonor,
    HloModule,
    ModuleConfig,
    StackFrameTables,
)
from xlapy.ir.opcodes import VARIADIC, Opcode
from xlapy.ir.shapes import UNBOUNDED, Layout, ProgramShape, Shape, Tile
from xlapy.ir.types import Kind, PrimitiveType

MAX_DEPTH = 64
"""Deepest nesting of braces, parentheses and tuple shapes the parser accepts."""

_IDENT_TEXT = r"[A-Za-z_][A-Za-z0-9_.]*(?:-(?!>)[A-Za-z0-9_.]*)*"
_IDENT = re.compile(_IDENT_TEXT)
_NAME = re.compile(rf"%?({_IDENT_TEXT})")
_INT = re.compile(r"[-+]?[0-9]+(?![0-9A-Za-z_.])")
_FLOAT = re.compile(
    r"[-+]?(?:nan(?:\(0x[0-9a-fA-F]+\))?|inf"
    r"|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)(?![0-9A-Za-z_.])"
)
_WS = re.compile(r"(?:\s+|//[^\n]*|/\*.*?\*/)*", re.DOTALL)
_GAP = re.compile(r"(?:\s+|//[^\n]*)+")
_DIM_LABELS = re.compile(r"([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)")
_DIGITS = re.compile(r"-?[0-9]+")
_PAD_DIM = re.compile(r"(-?[0-9]+)_(-?[0-9]+)(?:_(-?[0-9]+))?")
_ELEMENT_TYPES = {t.text for t in PrimitiveType if t is not PrimitiveType.TUPLE}

# Fast paths. Each regex only finds the extent of a common form; its meaning (and every
# error) comes from the general rules, so a form outside the fast path is still read right.
_ARRAY_TEXT = (
    "(?:"
    + "|".join(sorted(map(re.escape, _ELEMENT_TYPES), key=len, reverse=True))
    + r")\[[0-9,<=?]*\](?:\{[0-9,:TES()*]*\}|(?!\{))"
)
_ARRAY_SHAPE_TEXT = rf"{_ARRAY_TEXT}|\((?:{_ARRAY_TEXT}(?:, ?{_ARRAY_TEXT})*)?\)"  # or a flat tuple
_ARRAY_SHAPE = re.compile(_ARRAY_SHAPE_TEXT)
_COMPUTATION_START = re.compile(rf"\s*(?:(ENTRY)\s+)?(?>%?({_IDENT_TEXT}))\s*\{{")  # [ENTRY] name {
_INSTRUCTION_START = re.compile(  # `[ROOT] name = shape opcode(`
    rf"\s*(?:(ROOT)\s+)?(?>%?({_IDENT_TEXT}))\s*=\s*"
    rf"({_ARRAY_SHAPE_TEXT})[ \t]+(?>({_IDENT_TEXT}))\s*\("
)
_OPERAND = re.compile(rf"\s*(?>(%?({_IDENT_TEXT})))\s*([,)])")  # name, then ',' or ')'
_ATTRIBUTE_KEY = re.compile(  # `, key =` and the whitespace and comments after it
    rf"\s*,\s*(?>({_IDENT_TEXT}))\s*=(?>(?:\s+|//[^\n]*|(?s:/\*.*?\*/))*)(?!/\*)"
)
_PARAMETER_NUMBER = re.compile(r"[ \t]*([0-9]+)[ \t]*\)")
_INT_LIST = re.compile(r"\s*\{([-+0-9, \t]*)\}")
_DECIMAL = re.compile(r"[ \t]*[-+]?[0-9]+[ \t]*")
_SCALAR_TEXT = re.compile(r"[-+.0-9A-Za-z]+(?=\))")
_SCALARS: dict[tuple[Shape, str], Literal] = {}
"""Scalar constants read by the general rules, by shape and text (literals are immutable)."""
_MAX_SCALARS = 4096
_SHAPES: dict[str, Shape] = {}
"""Shapes read by the general rules, by their text (shapes are immutable, so shared)."""
_MAX_SHAPES = 4096
_TABLE_NAMES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'", "0": "\0"}


@dataclass(slots=True)
class _PendingInstr:
    """An instruction whose operand and predecessor names are not resolved yet."""

    instr: HloInstruction
    pos: int
    operand_names: list[tuple[str, int]]
    predecessor_names: list[tuple[str, int]] = field(default_factory=list)


@dataclass(slots=True)
class _ComputationRef:
    """A called computation named before the whole module is read."""

    name: str
    pos: int


class _Parser:
    def __init__(self, text: str, filename: str | None):
        self.text = text
        self.filename = filename
        self.pos = 0
        self.depth = 0
        self._line_starts: list[int] | None = None
        self.computation_refs: list[tuple[HloInstruction, str, Any]] = []

    # -- errors ----------------------------------------------------------------------------
    def error(self, message: str, pos: int | None = None) -> HloParseError:
        pos = self.pos if pos is None else pos
        if self._line_starts is None:
            self._line_starts = [0] + [m.end() for m in re.finditer(r"\n", self.text)]
        line = bisect.bisect_right(self._line_starts, pos)
        start = self._line_starts[line - 1]
        end = self.text.find("\n", start)
        source = self.text[start : end if end >= 0 else len(self.text)]
        return HloParseError(message, line, pos - start + 1, source, self.filename)

    def describe_here(self) -> str:
        if self.pos >= len(self.text):
            return "end of input"
        m = _IDENT.match(self.text, self.pos) or _FLOAT.match(self.text, self.pos)
        token = m.group(0) if m else self.text[self.pos]
        return f"'{token}'"

    def expected(self, what: str) -> HloParseError:
        """An error for a missing `what`. When the unexpected token starts a later line and
        the previous line stopped inside a construct (not after a closing '}'), the missing
        piece belongs at the end of that line, so point there."""
        message = f"expected {what}, found {self.describe_here()}"
        end_of_previous = len(self.text[: self.pos].rstrip())
        if (
            end_of_previous
            and self.text[end_of_previous - 1] != "}"
            and "\n" in self.text[end_of_previous : self.pos]
        ):
            return self.error(message, end_of_previous)
        return self.error(message)

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"nesting deeper than {MAX_DEPTH} levels")

    def leave(self) -> None:
        self.depth -= 1

    # -- low-level scanning ----------------------------------------------------------------
    def skip(self) -> None:
        ws = _WS.match(self.text, self.pos)
        assert ws is not None, "the whitespace pattern matches the empty string"
        pos = self.pos = ws.end()
        if self.text.startswith("/*", pos):
            raise self.error("unterminated comment")

    def peek(self, s: str) -> bool:
        self.skip()
        return self.text.startswith(s, self.pos)

    def accept(self, s: str) -> bool:
        self.skip()
        if self.text.startswith(s, self.pos):
            self.pos += len(s)
            return True
        return False

    def expect(self, s: str, what: str | None = None) -> None:
        if not self.accept(s):
            raise self.expected(what or f"'{s}'")

    def match(self, regex: re.Pattern) -> re.Match | None:
        self.skip()
        m = regex.match(self.text, self.pos)
        if m:
            self.pos = m.end()
        return m

    def at_end(self) -> bool:
        self.skip()
        return self.pos >= len(self.text)

    def ident(self, what: str = "an identifier") -> str:
        m = self.match(_IDENT)
        if not m:
            raise self.expected(what)
        return m.group(0)

    def peek_ident(self) -> str | None:
        self.skip()
        m = _IDENT.match(self.text, self.pos)
        return m.group(0) if m else None

    def name(self, what: str = "a name") -> str:
        m = self.match(_NAME)
        if not m:
            raise self.expected(what)
        return m.group(1)

    def integer(self, what: str = "an integer") -> int:
        m = self.match(_INT)
        if not m:
            raise self.expected(what)
        return int(m.group(0))

    def boolean(self) -> bool:
        word = self.peek_ident()
        if word not in ("true", "false"):
            raise self.expected("'true' or 'false'")
        self.pos += len(word)
        return word == "true"

    def string(self) -> str:
        self.skip()
        start = self.pos
        if not self.text.startswith('"', start):
            raise self.expected("a quoted string")
        i = start + 1
        out: list[str] = []
        text = self.text
        while True:
            j = i
            while j < len(text) and text[j] not in '"\\\n':
                j += 1
            out.append(text[i:j])
            if j >= len(text) or text[j] == "\n":
                raise self.error("unterminated string", start)
            if text[j] == '"':
                self.pos = j + 1
                return "".join(out)
            esc = text[j + 1 : j + 2]
            if esc in _ESCAPES:
                out.append(_ESCAPES[esc])
                i = j + 2
            elif esc == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", text[j + 2 : j + 4]):
                out.append(chr(int(text[j + 2 : j + 4], 16)))
                i = j + 4
            elif re.fullmatch(r"[0-7]{3}", text[j + 1 : j + 4]):
                out.append(chr(int(text[j + 1 : j + 4], 8)))
                i = j + 4
            else:
                raise self.error("bad escape sequence in string", j)

    def balanced(self, stop: str = ",") -> str:
        """Text up to the matching close bracket (or a top-level `stop`/newline), verbatim."""
        self.skip()
        text = self.text
        start = i = self.pos
        stack: list[str] = []
        pairs = {"{": "}", "(": ")", "[": "]"}
        while i < len(text):
            c = text[i]
            if c == '"':
                self.pos = i
                self.string()
                i = self.pos
                continue
            if c in pairs:
                stack.append(pairs[c])
                if len(stack) > MAX_DEPTH:
                    raise self.error(f"nesting deeper than {MAX_DEPTH} levels", i)
            elif c in ")]}":
                if not stack:
                    break
                if stack.pop() != c:
                    raise self.error(f"unbalanced '{c}'", i)
                if not stack and text[start] in pairs:
                    i += 1
                    break
            elif not stack and (c in stop or c == "\n"):
                break
            i += 1
        else:
            if stack:
                raise self.error(f"unterminated '{text[start]}'", start)
        self.pos = i
        value = text[start:i].strip()
        if not value:
            raise self.expected("a value")
        return value

    # -- shapes ----------------------------------------------------------------------------
    def shape_starts_here(self) -> bool:
        self.skip()
        if self.text.startswith("(", self.pos):
            return True
        word = self.peek_ident()
        if word not in _ELEMENT_TYPES:
            return False
        after = self.pos + len(word)
        if self.text.startswith("[", after):
            return True
        if word in ("token", "opaque"):
            rest = _GAP.match(self.text, after)
            nxt = rest.end() if rest else after
            return rest is not None and _NAME.match(self.text, nxt) is not None
        return False

    def shape(self) -> Shape:
        m = _ARRAY_SHAPE.match(self.text, self.pos)
        if m is None:
            self.skip()
            m = _ARRAY_SHAPE.match(self.text, self.pos)
        if m is None:
            return self.general_shape()
        text = m.group(0)
        shape = _SHAPES.get(text)
        if shape is None:
            shape = self.general_shape()
            if self.pos != m.end():
                return shape
            if len(_SHAPES) >= _MAX_SHAPES:
                _SHAPES.clear()
            _SHAPES[text] = shape
        self.pos = m.end()
        return shape

    def general_shape(self) -> Shape:
        self.skip()
        start = self.pos
        if self.accept("("):
            self.enter()
            elements = []
            if not self.accept(")"):
                while True:
                    elements.append(self.shape())
                    if self.accept(")"):
                        break
                    self.expect(",", "',' or ')' in tuple shape")
            self.leave()
            return Shape.tuple(elements)
        word = self.peek_ident()
        if word is None:
            raise self.expected("a shape")
        if word not in _ELEMENT_TYPES:
            raise self.error(f"unknown element type '{word}'", start)
        self.pos += len(word)
        etype = PrimitiveType.from_text(word)
        if not etype.is_array_type:
            if self.text.startswith("[]", self.pos):
                self.pos += 2
            return Shape(etype)
        if not self.text.startswith("[", self.pos):
            raise self.expected("'[' after element type")
        self.pos += 1
        dims: list[int] = []
        dynamic: list[bool] = []
        if not self.accept("]"):
            while True:
                if self.accept("?"):
                    dims.append(UNBOUNDED)
                    dynamic.append(True)
                else:
                    bounded = self.accept("<=")
                    if bounded and self.accept("?"):
                        dims.append(UNBOUNDED)
                    else:
                        size_pos = self.pos
                        size = self.integer("a dimension size")
                        if size < 0 or size >= 2**63:
                            raise self.error(f"dimension size {size} out of range", size_pos)
                        dims.append(size)
                    dynamic.append(bounded)
                if self.accept("]"):
                    break
                self.expect(",", "',' or ']' in dimensions")
        layout = None
        if self.text.startswith("{", self.pos):
            layout = self.layout(len(dims))
        return Shape.array(etype, dims, layout, dynamic)

    def layout(self, rank: int) -> Layout:
        self.skip()
        start = self.pos
        self.expect("{")
        minor_to_major: list[int] = []
        if not self.peek("}") and not self.peek(":"):
            while True:
                minor_to_major.append(self.integer("a dimension number in layout"))
                if not self.accept(","):
                    break
        if sorted(minor_to_major) != list(range(rank)) and not (rank == 0 or not minor_to_major):
            raise self.error(
                f"layout {{{','.join(map(str, minor_to_major))}}} is not a permutation of the "
                f"{rank} dimensions",
                start,
            )
        if minor_to_major and rank == 0:
            raise self.error("layout of a scalar must be empty", start)
        tiles: list[Tile] = []
        element_bits = 0
        memory_space = 0
        if self.accept(":"):
            while not self.peek("}"):
                if self.accept("T"):
                    while self.peek("("):
                        tiles.append(self.tile())
                elif self.accept("E"):
                    element_bits = self.paren_int()
                elif self.accept("S"):
                    memory_space = self.paren_int()
                else:
                    raise self.expected("layout attribute T(...), E(...) or S(...)")
        self.expect("}", "'}' closing layout")
        if len(minor_to_major) != rank and minor_to_major:
            raise self.error(f"layout has {len(minor_to_major)} dimensions, shape {rank}", start)
        return Layout(
            tuple(minor_to_major or range(rank - 1, -1, -1)),
            tuple(tiles),
            element_bits,
            memory_space,
        )

    def tile(self) -> Tile:
        self.expect("(")
        dims = []
        if not self.accept(")"):
            while True:
                dims.append(Tile.COMBINE_DIM if self.accept("*") else self.integer("tile size"))
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' in tile")
        return Tile(tuple(dims))

    def paren_int(self) -> int:
        self.expect("(")
        value = self.integer()
        self.expect(")")
        return value

    # -- literals --------------------------------------------------------------------------
    def literal(self, shape: Shape) -> Literal:
        self.enter()
        try:
            if shape.is_tuple:
                return self.tuple_literal(shape)
            if not shape.is_array:
                raise self.error(f"constant of shape {shape} cannot have a value")
            if shape.is_dynamic:
                raise self.error(f"constant of dynamic shape {shape} is not supported")
            self.skip()
            if self.shape_starts_here() and not self.peek("("):
                self.shape()
            return self.dense_literal(shape)
        finally:
            self.leave()

    def tuple_literal(self, shape: Shape) -> Literal:
        if self.shape_starts_here() and self.peek("("):
            save = self.pos
            try:
                self.shape()
            except HloParseError:
                self.pos = save
        self.expect("(", "'(' opening tuple constant")
        elements = []
        for i, sub in enumerate(shape.tuple_shapes):
            if i:
                self.expect(",", f"',' before tuple constant element {i}")
            elements.append(self.literal(sub))
        self.expect(")", f"')' closing tuple constant of {len(shape.tuple_shapes)} elements")
        return Literal(shape, elements=tuple(elements))

    def dense_literal(self, shape: Shape) -> Literal:
        etype = shape.element_type
        values: list = []
        positions: list[int] = []
        if shape.rank == 0:
            self.skip()
            positions.append(self.pos)
            values.append(self.scalar_value(etype))
        else:
            self.nested_values(shape, 0, values, positions)
        return Literal(shape, self.to_array(values, positions, shape))

    def nested_values(self, shape: Shape, dim: int, values: list, positions: list) -> None:
        self.skip()
        start = self.pos
        self.expect("{", f"'{{' opening dimension {dim} of constant {shape.to_text(False)}")
        count = 0
        if not self.peek("}"):
            while True:
                if dim + 1 < shape.rank:
                    self.enter()
                    self.nested_values(shape, dim + 1, values, positions)
                    self.leave()
                else:
                    self.skip()
                    positions.append(self.pos)
                    values.append(self.scalar_value(shape.element_type))
                count += 1
                if not self.accept(","):
                    break
        self.expect("}", f"',' or '}}' in constant {shape.to_text(False)}")
        if count != shape.dims[dim]:
            raise self.error(
                f"constant has {count} elements in dimension {dim}, shape "
                f"{shape.to_text(False)} needs {shape.dims[dim]}",
                start,
            )

    def scalar_value(self, etype: PrimitiveType):
        kind = etype.kind
        if kind is Kind.PRED:
            word = self.peek_ident()
            if word in ("true", "false"):
                self.pos += len(word)
                return word == "true"
            m = _INT.match(self.text, self.pos)
            if m and m.group(0) in ("0", "1"):
                self.pos = m.end()
                return m.group(0) == "1"
            raise self.expected("'true' or 'false'")
        if kind in (Kind.SIGNED, Kind.UNSIGNED):
            return self.integer(f"an integer of type {etype.text}")
        if kind is Kind.FLOAT:
            return self.float_value(etype)
        self.expect("(", f"'(' opening a {etype.text} value (real, imag)")
        real = self.float_value(etype)
        self.expect(",", "',' between real and imaginary parts")
        imag = self.float_value(etype)
        self.expect(")", "')' closing a complex value")
        return (real, imag)

    def float_value(self, etype: PrimitiveType):
        m = self.match(_FLOAT)
        if not m:
            raise self.expected(f"a number of type {etype.text}")
        return m.group(0)

    def to_array(self, values: list, positions: list[int], shape: Shape) -> np.ndarray:
        etype = shape.element_type
        dtype = etype.dtype
        kind = etype.kind
        if kind is Kind.PRED:
            return np.array(values, dtype=np.bool_).reshape(shape.dims)
        if kind in (Kind.SIGNED, Kind.UNSIGNED):
            info = ml_dtypes.iinfo(dtype)
            for v, p in zip(values, positions):
                if not info.min <= v <= info.max:
                    raise self.error(f"value {v} is out of range for {etype.text}", p)
            return np.array(values, dtype=dtype).reshape(shape.dims)
        if kind is Kind.FLOAT:
            return self.float_array(values, positions, dtype, etype).reshape(shape.dims)
        part = etype.complex_component_type
        real = self.float_array([v[0] for v in values], positions, part.dtype, part)
        imag = self.float_array([v[1] for v in values], positions, part.dtype, part)
        array = np.empty(len(values), dtype=dtype)
        array.real = real
        array.imag = imag
        return array.reshape(shape.dims)

    def float_array(self, texts: list[str], positions, dtype, etype) -> np.ndarray:
        wide = np.array([_float_of(t) for t in texts], dtype=np.float64)
        with np.errstate(all="ignore"):
            narrow = wide.astype(dtype)
        back = narrow.astype(np.float64)
        bad = (np.isinf(back) | np.isnan(back)) & ~np.isnan(wide) & ~np.isinf(wide)
        bad |= np.isinf(wide) & ~np.isinf(back)
        bad |= np.isnan(wide) & ~np.isnan(back)
        if bad.any():
            i = int(np.argmax(bad))
            raise self.error(f"value {texts[i]} is out of range for {etype.text}", positions[i])
        for i, t in enumerate(texts):
            if "(" in t:
                narrow[i] = self.nan_with_payload(t, dtype, etype, positions[i])
        return narrow

    def nan_with_payload(self, text: str, dtype, etype, pos: int):
        payload = int(text[text.index("(") + 3 : -1], 16)
        bits = np.dtype(dtype).itemsize * 8
        mantissa = ml_dtypes.finfo(dtype).nmant if etype is not PrimitiveType.F64 else 52
        if etype in (PrimitiveType.F32, PrimitiveType.F64, PrimitiveType.F16):
            mantissa = np.finfo(dtype).nmant
        if payload == 0 or payload >= 1 << mantissa:
            raise self.error(f"nan payload {text} does not fit {etype.text}", pos)
        uint = np.dtype(f"u{bits // 8}")
        canonical = np.array(np.nan, dtype=dtype).view(uint)
        exponent_mask = int(canonical) & ~((1 << mantissa) - 1) & ((1 << (bits - 1)) - 1)
        sign = (1 << (bits - 1)) if text.startswith("-") else 0
        return np.array(sign | exponent_mask | payload, dtype=uint).view(dtype)

    # -- module ----------------------------------------------------------------------------
    def module(self) -> HloModule:
        if self.at_end():
            raise self.error("empty input: expected 'HloModule'")
        word = self.peek_ident()
        if word != "HloModule":
            raise self.expected("'HloModule'")
        self.pos += len(word)
        module = HloModule(self.name("a module name"))
        self.header(module.config)
        module.stack_frames = self.stack_frame_tables()
        computations: dict[str, HloComputation] = {}
        entry: HloComputation | None = None
        if self.at_end():
            raise self.error("module has no computations")
        while not self.at_end():
            start = self.pos
            comp, is_entry = self.computation()
            if comp.name in computations:
                raise self.error(f"duplicate computation name '{comp.name}'", start)
            computations[comp.name] = comp
            if is_entry:
                if entry is not None:
                    raise self.error("more than one ENTRY computation", start)
                entry = comp
        entry = entry or list(computations.values())[-1]
        for comp in computations.values():
            module.add_computation(comp, entry=comp is entry)
        self.resolve_computations(computations)
        return module

    def header(self, config: ModuleConfig) -> None:
        extras: list[tuple[str, str]] = []
        while self.accept(","):
            key_pos = self.pos
            key = self.ident("a module attribute name")
            self.expect("=", f"'=' after '{key}'")
            if key == "is_scheduled":
                config.is_scheduled = self.boolean()
            elif key == "input_output_alias":
                config.input_output_alias = self.io_alias()
            elif key == "buffer_donor":
                config.buffer_donors = self.buffer_donors()
            elif key == "entry_computation_layout":
                self.expect("{")
                config.entry_computation_layout = self.program_shape()
                self.expect("}")
            elif key == "replica_count":
                config.replica_count = self.positive_int("replica_count")
            elif key == "num_partitions":
                config.num_partitions = self.positive_int("num_partitions")
            elif key == "frontend_attributes":
                config.frontend_attributes = self.frontend_attributes()
            elif any(k == key for k, _ in extras):
                raise self.error(f"duplicate module attribute '{key}'", key_pos)
            else:
                extras.append((key, self.balanced()))
        config.extra_attributes = tuple(extras)

    def positive_int(self, what: str) -> int:
        pos = self.pos
        value = self.integer()
        if value < 1:
            raise self.error(f"{what} must be at least 1", pos)
        return value

    def io_alias(self) -> tuple[AliasEntry, ...]:
        self.expect("{")
        entries: list[AliasEntry] = []
        while not self.accept("}"):
            if entries:
                self.expect(",", "',' or '}' in input_output_alias")
            output = self.shape_index()
            self.expect(":", "':' after output index")
            if self.accept("("):
                param = self.integer("a parameter number")
                self.expect(",")
                index = self.shape_index()
                kind: AliasKind = "may-alias"
                if self.accept(","):
                    kind = self.alias_kind()
                self.expect(")")
            else:
                param = self.integer("a parameter number or '('")
                index = ()
                kind = "may-alias"
            entries.append(AliasEntry(output, param, index, kind))
        return tuple(entries)

    def alias_kind(self) -> AliasKind:
        pos = self.pos
        text = self.ident("'may-alias' or 'must-alias'")
        if text == "may-alias":
            return "may-alias"
        if text == "must-alias":
            return "must-alias"
        raise self.error(f"unknown alias kind '{text}'", pos)

    def buffer_donors(self) -> tuple[BufferDonor, ...]:
        self.expect("{")
        donors: list[BufferDonor] = []
        while not self.accept("}"):
            if donors:
                self.expect(",", "',' or '}' in buffer_donor")
            self.expect("(")
            param = self.integer("a parameter number")
            self.expect(",")
            donors.append(BufferDonor(param, self.shape_index()))
            self.expect(")")
        return tuple(donors)

    def shape_index(self) -> tuple[int, ...]:
        return self.int_list("a shape index {...}")

    def program_shape(self) -> ProgramShape:
        self.expect("(", "'(' opening parameter shapes")
        params = []
        if not self.accept(")"):
            while True:
                params.append(self.shape())
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' in parameter shapes")
        self.expect("->")
        return ProgramShape(tuple(params), self.shape())

    def stack_frame_tables(self) -> StackFrameTables:
        tables: dict[str, tuple[tuple[int, str], ...]] = {}
        while True:
            word = self.peek_ident()
            if word not in _TABLE_NAMES:
                break
            save = self.pos
            self.pos += len(word)
            if self.peek("{") or self.peek("("):
                self.pos = save
                break
            if word in tables:
                raise self.error(f"duplicate {word} table", save)
            rows = []
            while True:
                self.skip()
                if not _INT.match(self.text, self.pos):
                    break
                row_id = self.integer()
                if word in ("FileNames", "FunctionNames"):
                    rows.append((row_id, self.string()))
                else:
                    self.expect("{", "'{' opening a table row")
                    start = self.pos
                    end = self.text.find("}", start)
                    newline = self.text.find("\n", start)
                    if end < 0 or 0 <= newline < end:
                        raise self.error("unterminated table row", start)
                    rows.append((row_id, self.text[start:end].strip()))
                    self.pos = end + 1
            tables[word] = tuple(rows)
        return StackFrameTables(
            tables.get("FileNames", ()),
            tables.get("FunctionNames", ()),
            tables.get("FileLocations", ()),
            tables.get("StackFrames", ()),
        )

    # -- computations ----------------------------------------------------------------------
    def computation(self) -> tuple[HloComputation, bool]:
        head = _COMPUTATION_START.match(self.text, self.pos)
        if head and (head.group(1) or head.group(2) != "ENTRY"):
            is_entry = head.group(1) is not None
            name = head.group(2)
            thread = None
            self.pos = head.end()
        else:
            is_entry, name, thread = self.computation_head()
        comp = HloComputation(name)
        if thread is not None:
            comp.execution_thread = thread
        pending: list[_PendingInstr] = []
        by_name: dict[str, HloInstruction] = {}
        root: HloInstruction | None = None
        while not self.accept("}"):
            if self.pos >= len(self.text):
                raise self.error(f"unexpected end of input in computation '{name}'")
            start = self.pos
            is_root, item = self.instruction()
            instr = item.instr
            if instr.name in by_name:
                raise self.error(f"duplicate instruction name '{instr.name}'", start)
            by_name[instr.name] = instr
            comp.add_instruction(instr)
            pending.append(item)
            if is_root:
                if root is not None:
                    raise self.error(f"computation '{name}' has more than one ROOT", start)
                root = instr
        if not comp.instructions:
            raise self.error(f"computation '{name}' has no instructions")
        self.resolve_operands(comp, pending, by_name)
        comp.root = root or comp.instructions[-1]
        self.check_parameters(comp)
        return comp, is_entry

    def computation_head(self) -> tuple[bool, str, str | None]:
        """`[ENTRY] name [(params) -> shape] [, execution_thread="..."] {`."""
        is_entry = False
        if self.peek_ident() == "ENTRY":
            self.pos += len("ENTRY")
            is_entry = True
        name = self.name("a computation name")
        if self.peek("("):
            self.signature()
        thread = None
        if self.accept(","):
            key = self.ident()
            if key != "execution_thread":
                raise self.error(f"unknown computation attribute '{key}'")
            self.expect("=")
            thread = self.string()
        self.expect("{", f"'{{' opening computation '{name}'")
        return is_entry, name, thread

    def signature(self) -> None:
        self.expect("(")
        if not self.accept(")"):
            while True:
                self.name("a parameter name")
                self.expect(":", "':' after parameter name")
                self.shape()
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' in computation signature")
        self.expect("->", "'->' in computation signature")
        self.shape()

    def resolve_operands(self, comp, pending: list[_PendingInstr], by_name) -> None:
        for item in pending:
            for names, target in (
                (item.operand_names, item.instr.operands),
                (item.predecessor_names, item.instr.control_predecessors),
            ):
                for op_name, pos in names:
                    operand = by_name.get(op_name)
                    if operand is None:
                        raise self.error(
                            f"instruction '{item.instr.name}' uses undefined operand "
                            f"'{op_name}' (not in computation '{comp.name}')",
                            pos,
                        )
                    target.append(operand)
            item.instr._attach()  # its use-list entries, now that its operands are known

    def check_parameters(self, comp: HloComputation) -> None:
        numbers = sorted(
            i.parameter_number
            for i in comp.instructions
            if i.opcode is Opcode.PARAMETER and i.parameter_number is not None
        )
        if numbers != list(range(len(numbers))):
            raise self.error(
                f"parameters of computation '{comp.name}' are numbered {numbers}, "
                f"expected 0..{len(numbers) - 1}",
                self.pos - 1,
            )

    # -- instructions ----------------------------------------------------------------------
    def instruction(self) -> tuple[bool, _PendingInstr]:
        line = _INSTRUCTION_START.match(self.text, self.pos)
        shape = _SHAPES.get(line.group(3)) if line else None
        if line is not None and shape is not None:
            is_root = line.group(1) is not None
            name = line.group(2)
            op_pos = line.start(4)
            op_text = line.group(4)
            opcode = self.opcode(op_text, op_pos)
            self.pos = line.end()
        else:
            is_root, name = self.instruction_head()
            shape = self.instruction_shape(name)
            self.skip()
            op_pos = self.pos
            op_text = self.ident("an opcode")
            opcode = self.opcode(op_text, op_pos)
            self.expect("(", f"'(' after opcode '{op_text}'")
        instr = HloInstruction(name, opcode, shape)
        item = _PendingInstr(instr, op_pos, [])
        if opcode is Opcode.CONSTANT:
            self.constant_operand(instr)
        elif opcode is Opcode.PARAMETER:
            instr.parameter_number = self.parameter_number()
        else:
            self.operands(item)
        arity = opcode.arity
        fixed = arity != VARIADIC and opcode not in (Opcode.CONSTANT, Opcode.PARAMETER)
        if fixed and len(item.operand_names) != arity:
            raise self.error(
                f"'{op_text}' takes {arity} operand{'s' if arity != 1 else ''}, "
                f"'{name}' has {len(item.operand_names)}",
                op_pos,
            )
        while True:
            key = _ATTRIBUTE_KEY.match(self.text, self.pos)
            if key is None and not self.accept(","):
                return is_root, item
            self.attribute(item, key)

    def opcode(self, text: str, pos: int) -> Opcode:
        try:
            return Opcode.from_text(text)
        except KeyError:
            raise self.error(f"unknown opcode '{text}'", pos) from None

    def instruction_shape(self, name: str) -> Shape:
        if not self.shape_starts_here():
            self.skip()
            word = self.peek_ident()
            if word is not None and self.text.startswith("[", self.pos + len(word)):
                raise self.error(f"unknown element type '{word}'")
            if word is not None and word not in _ELEMENT_TYPES:
                raise self.error(f"expected a shape for '{name}', found '{word}'")
        return self.shape()

    def parameter_number(self) -> int:
        """`N)` after `parameter(`."""
        m = _PARAMETER_NUMBER.match(self.text, self.pos)
        if m:
            self.pos = m.end()
            return int(m.group(1))
        num_pos = self.pos
        number = self.integer("a parameter number")
        if number < 0:
            raise self.error("parameter number must not be negative", num_pos)
        self.expect(")", "')' after parameter number")
        return number

    def instruction_head(self) -> tuple[bool, str]:
        """`[ROOT] name =`, where an instruction may itself be named ROOT."""
        is_root = False
        if self.peek_ident() == "ROOT":
            save = self.pos
            self.pos += len("ROOT")
            if self.peek("="):
                self.pos = save
            else:
                is_root = True
        name = self.name("an instruction name")
        self.expect("=", f"'=' after instruction name '{name}'")
        return is_root, name

    def constant_operand(self, instr: HloInstruction) -> None:
        self.skip()
        if self.text.startswith("{...}", self.pos):
            self.pos += 5
        else:
            instr.literal = self.literal_of(instr.shape)
        self.expect(")", f"')' closing constant '{instr.name}'")

    def literal_of(self, shape: Shape) -> Literal:
        """A constant's value: scalars read before (literals are immutable) come from a cache."""
        m = _SCALAR_TEXT.match(self.text, self.pos)
        if m is None:
            return self.literal(shape)
        key = (shape, m.group(0))
        literal = _SCALARS.get(key)
        if literal is None:
            literal = self.literal(shape)
            if self.pos != m.end():
                return literal
            if len(_SCALARS) >= _MAX_SCALARS:
                _SCALARS.clear()
            _SCALARS[key] = literal
        self.pos = m.end()
        return literal

    def operands(self, item: _PendingInstr) -> None:
        names = item.operand_names
        while True:
            m = _OPERAND.match(self.text, self.pos)
            if m:
                names.append((m.group(2), m.start(1)))
                self.pos = m.end()
                if m.group(3) == ")":
                    return
                continue
            if not names and self.accept(")"):
                return
            if self.shape_starts_here():
                self.shape()
            self.skip()
            pos = self.pos
            item.operand_names.append((self.name("an operand name"), pos))
            if self.accept(")"):
                return
            self.expect(",", "',' or ')' after operand")

    # -- attributes ------------------------------------------------------------------------
    def attribute(self, item: _PendingInstr, m: re.Match | None) -> None:
        """An attribute after its comma; `m` is the `, key =` fast-path match, if any."""
        instr = item.instr
        if m:
            key_pos = m.start(1)
            key = m.group(1)
        else:
            self.skip()
            key_pos = self.pos
            key = self.ident("an attribute name")
            self.expect("=", f"'=' after attribute '{key}'")
        kind = ATTRIBUTE_KINDS.get(key)
        if kind is None:
            raise self.error(f"unknown attribute '{key}' on '{instr.name}'", key_pos)
        if key in instr.attrs or (kind is AttrKind.INSTRUCTION_LIST and item.predecessor_names):
            raise self.error(f"attribute '{key}' given twice on '{instr.name}'", key_pos)
        if m:
            self.pos = m.end()
        else:
            self.skip()
        value_pos = self.pos
        if kind is AttrKind.INSTRUCTION_LIST:
            item.predecessor_names = self.name_list()
            return
        if kind is AttrKind.COMPUTATION:
            ref = _ComputationRef(self.name("a computation name"), value_pos)
            self.computation_refs.append((instr, key, ref))
            instr.attrs[key] = ref
            return
        if kind is AttrKind.COMPUTATION_LIST:
            refs = tuple(_ComputationRef(n, p) for n, p in self.name_list())
            self.computation_refs.append((instr, key, refs))
            instr.attrs[key] = refs
            return
        reader = _ATTRIBUTE_READERS[kind]
        try:
            instr.attrs[key] = reader(self)
        except HloParseError as e:
            raise HloParseError(
                f"in attribute '{key}' ({kind.value}): {e.message}",
                e.line,
                e.column,
                e.source_line,
                e.filename,
            ) from None

    def name_list(self) -> list[tuple[str, int]]:
        self.expect("{")
        names = []
        if not self.accept("}"):
            while True:
                self.skip()
                pos = self.pos
                names.append((self.name(), pos))
                if self.accept("}"):
                    break
                self.expect(",", "',' or '}' in name list")
        return names

    def int_list(self, what: str = "'{' opening an integer list") -> tuple[int, ...]:
        m = _INT_LIST.match(self.text, self.pos)
        if m:
            items = m.group(1).split(",")
            if all(_DECIMAL.fullmatch(item) for item in items):
                self.pos = m.end()
                return tuple(map(int, items))
            if not m.group(1).strip():
                self.pos = m.end()
                return ()
        self.expect("{", what)
        values = []
        if not self.accept("}"):
            while True:
                values.append(self.integer())
                if self.accept("}"):
                    break
                self.expect(",", "',' or '}' in integer list")
        return tuple(values)

    def nested_int_lists(self) -> tuple[tuple[int, ...], ...]:
        self.expect("{")
        groups = []
        if not self.accept("}"):
            while True:
                groups.append(self.int_list())
                if self.accept("}"):
                    break
                self.expect(",", "',' or '}' between groups")
        return tuple(groups)

    def float_attr(self) -> float:
        m = self.match(_FLOAT)
        if not m:
            raise self.expected("a number")
        return _float_of(m.group(0))

    def enum(self) -> A.Enum:
        return A.Enum(self.ident())

    def window(self) -> A.Window:
        self.expect("{")
        fields: dict[str, list] = {}
        while not self.accept("}"):
            self.skip()
            key_pos = self.pos
            key = self.ident("a window field (size, stride, pad, lhs_dilate, rhs_dilate, ...)")
            if key not in _WINDOW_FIELDS:
                raise self.error(f"unknown window field '{key}'", key_pos)
            if key in fields:
                raise self.error(f"window field '{key}' given twice", key_pos)
            self.expect("=")
            self.skip()
            if key == "pad":
                fields[key] = self.x_separated(_PAD_DIM, "low_high padding")
            else:
                fields[key] = self.x_separated(_DIGITS, f"{key} value")
        sizes = fields.get("size")
        if sizes is None:
            if fields:
                raise self.error("window has no 'size' field")
            return A.Window(())
        rank = len(sizes)
        for key, values in fields.items():
            if len(values) != rank:
                raise self.error(f"window field '{key}' has {len(values)} values, size {rank}")
        dims = []
        for i in range(rank):
            pad = fields.get("pad", [None] * rank)[i]
            low, high = (int(pad.group(1)), int(pad.group(2))) if pad else (0, 0)
            reversal = fields.get("rhs_reversal", [0] * rank)[i]
            dims.append(
                A.WindowDim(
                    size=sizes[i],
                    stride=fields.get("stride", [1] * rank)[i],
                    pad_low=low,
                    pad_high=high,
                    window_dilation=fields.get("rhs_dilate", [1] * rank)[i],
                    base_dilation=fields.get("lhs_dilate", [1] * rank)[i],
                    reversal=bool(reversal),
                )
            )
        return A.Window(tuple(dims))

    def x_separated(self, regex: re.Pattern, what: str) -> list:
        items = []
        while True:
            m = regex.match(self.text, self.pos)
            if not m:
                raise self.expected(what)
            self.pos = m.end()
            items.append(int(m.group(0)) if regex is _DIGITS else m)
            if not self.text.startswith("x", self.pos):
                return items
            self.pos += 1

    def padding(self) -> A.Padding:
        self.skip()
        dims = []
        for m in self.x_separated(_PAD_DIM, "low_high[_interior] padding"):
            interior = int(m.group(3)) if m.group(3) else 0
            if interior < 0:
                raise self.error("interior padding must not be negative", m.start())
            dims.append((int(m.group(1)), int(m.group(2)), interior))
        return A.Padding(tuple(dims))

    def dim_labels(self) -> A.ConvDimLabels:
        self.skip()
        start = self.pos
        m = self.match(_DIM_LABELS)
        if not m:
            raise self.expected("dimension labels like b01f_01io->b01f")
        lhs, rhs, out = m.groups()
        try:
            b, f, ls = _labels(lhs, "bf")
            i, o, ks = _labels(rhs, "io")
            ob, of, os_ = _labels(out, "bf")
        except ValueError as e:
            raise self.error(f"bad dim_labels '{m.group(0)}': {e}", start) from None
        if not len(ls) == len(ks) == len(os_):
            raise self.error(f"dim_labels '{m.group(0)}' disagree on spatial rank", start)
        return A.ConvDimLabels(b, f, ls, i, o, ks, ob, of, os_)

    def slice_spec(self) -> A.SliceSpec:
        self.expect("{")
        dims = []
        if not self.accept("}"):
            while True:
                self.expect("[", "'[' opening a slice range")
                start = self.integer("slice start")
                self.expect(":")
                limit = self.integer("slice limit")
                stride = 1
                if self.accept(":"):
                    spos = self.pos
                    stride = self.integer("slice stride")
                    if stride < 1:
                        raise self.error("slice stride must be positive", spos)
                self.expect("]", "']' closing a slice range")
                dims.append((start, limit, stride))
                if self.accept("}"):
                    break
                self.expect(",", "',' or '}' in slice")
        return A.SliceSpec(tuple(dims))

    def metadata(self) -> A.Metadata:
        self.expect("{")
        items: list[tuple[str, str | int]] = []
        while not self.accept("}"):
            key = self.ident("a metadata field")
            self.expect("=", f"'=' after metadata field '{key}'")
            if self.peek('"'):
                items.append((key, self.string()))
            else:
                items.append((key, self.integer("a string or integer")))
        return A.Metadata(tuple(items))

    def frontend_attributes(self) -> A.FrontendAttributes:
        self.expect("{")
        items: list[tuple[str, str | A.Raw]] = []
        if not self.accept("}"):
            while True:
                key = self.string() if self.peek('"') else self.ident("an attribute key")
                self.expect("=", f"'=' after '{key}'")
                if self.peek("{"):  # an unquoted structured value, e.g. xla.sdy.meshes={...}
                    items.append((key, A.Raw(self.balanced())))
                else:
                    items.append((key, self.string()))
                if self.accept("}"):
                    break
                self.expect(",", "',' or '}' in frontend_attributes")
        return A.FrontendAttributes(tuple(items))

    def sharding(self) -> A.Sharding:
        self.skip()
        if not self.peek("{"):
            raise self.expected("'{' opening a sharding")
        return A.Sharding(self.balanced()[1:-1])

    def backend_config(self) -> A.BackendConfig:
        if self.peek('"'):
            return A.BackendConfig(self.string())
        if self.peek("{"):
            return A.BackendConfig(self.balanced(), braced=True)
        raise self.expected("a quoted string or '{' for backend_config")

    def replica_groups(self) -> A.ReplicaGroups:
        if self.peek("["):
            self.skip()
            m = re.compile(r"\[[0-9,]*\]<=\[[0-9,]*\](?:T\([0-9,]*\))?").match(self.text, self.pos)
            if not m:
                raise self.expected("replica groups like [2,2]<=[4]")
            self.pos = m.end()
            return A.ReplicaGroups(iota_text=m.group(0))
        return A.ReplicaGroups(groups=self.nested_int_lists())

    def pairs(self) -> tuple[tuple[int, ...], ...]:
        groups = self.nested_int_lists()
        for g in groups:
            if len(g) != 2:
                raise self.error(f"expected pairs {{a,b}}, found a group of {len(g)}")
        return groups

    def precision_list(self) -> tuple[A.Enum, ...]:
        self.expect("{")
        values = []
        if not self.accept("}"):
            while True:
                values.append(A.Enum(self.ident("a precision")))
                if self.accept("}"):
                    break
                self.expect(",", "',' or '}' in precision list")
        return tuple(values)

    def shape_list(self) -> tuple[Shape, ...]:
        self.expect("{")
        shapes = []
        if not self.accept("}"):
            while True:
                shapes.append(self.shape())
                if self.accept("}"):
                    break
                self.expect(",", "',' or '}' in shape list")
        return tuple(shapes)

    def output_operand_aliasing(self) -> tuple[A.OutputOperandAlias, ...]:
        self.expect("{")
        entries = []
        if not self.accept("}"):
            while True:
                out = self.shape_index()
                self.expect(":")
                self.expect("(")
                operand = self.integer("an operand number")
                self.expect(",")
                index = self.shape_index()
                self.expect(")")
                entries.append(A.OutputOperandAlias(out, operand, index))
                if self.accept("}"):
                    break
                self.expect(",", "',' or '}' in output_to_operand_aliasing")
        return tuple(entries)

    def raw(self) -> A.Raw:
        return A.Raw(self.balanced())

    # -- called computations ---------------------------------------------------------------
    def resolve_computations(self, computations: dict[str, HloComputation]) -> None:
        def lookup(instr: HloInstruction, ref: _ComputationRef) -> HloComputation:
            comp = computations.get(ref.name)
            if comp is None:
                raise self.error(
                    f"instruction '{instr.name}' calls undefined computation '{ref.name}'",
                    ref.pos,
                )
            return comp

        for instr, key, value in self.computation_refs:
            if isinstance(value, tuple):
                instr.attrs[key] = tuple(lookup(instr, r) for r in value)
            else:
                instr.attrs[key] = lookup(instr, value)
        self.check_call_cycles(computations)

    def check_call_cycles(self, computations: dict[str, HloComputation]) -> None:
        state: dict[str, int] = {}
        for root in computations.values():
            if root.name in state:
                continue
            stack = [(root, iter(list(root.called_computations())))]
            state[root.name] = 1
            while stack:
                comp, callees = stack[-1]
                callee = next(callees, None)
                if callee is None:
                    state[comp.name] = 2
                    stack.pop()
                    continue
                s = state.get(callee.name)
                if s == 1:
                    raise self.error(
                        f"computation '{callee.name}' calls itself (a cycle)",
                        _reference_position(self, callee.name),
                    )
                if s is None:
                    state[callee.name] = 1
                    stack.append((callee, iter(list(callee.called_computations()))))


_WINDOW_FIELDS = ("size", "stride", "pad", "lhs_dilate", "rhs_dilate", "rhs_reversal")

_ATTRIBUTE_READERS = {
    AttrKind.INT: lambda p: p.integer(),
    AttrKind.FLOAT: _Parser.float_attr,
    AttrKind.BOOL: _Parser.boolean,
    AttrKind.STRING: _Parser.string,
    AttrKind.ENUM: _Parser.enum,
    AttrKind.INT_LIST: lambda p: p.int_list(),
    AttrKind.WINDOW: _Parser.window,
    AttrKind.DIM_LABELS: _Parser.dim_labels,
    AttrKind.PADDING: _Parser.padding,
    AttrKind.SLICE: _Parser.slice_spec,
    AttrKind.METADATA: _Parser.metadata,
    AttrKind.FRONTEND_ATTRIBUTES: _Parser.frontend_attributes,
    AttrKind.SHARDING: _Parser.sharding,
    AttrKind.BACKEND_CONFIG: _Parser.backend_config,
    AttrKind.REPLICA_GROUPS: _Parser.replica_groups,
    AttrKind.PAIRS: _Parser.pairs,
    AttrKind.PRECISION_LIST: _Parser.precision_list,
    AttrKind.SHAPE_LIST: _Parser.shape_list,
    AttrKind.SHAPE: lambda p: p.shape(),
    AttrKind.OUTPUT_OPERAND_ALIASING: _Parser.output_operand_aliasing,
    AttrKind.RAW: _Parser.raw,
}


def _reference_position(parser: _Parser, name: str) -> int:
    for _, _, value in parser.computation_refs:
        for ref in value if isinstance(value, tuple) else (value,):
            if ref.name == name:
                return ref.pos
    return 0


def _labels(text: str, pair: str) -> tuple[int, int, tuple[int, ...]]:
    """Positions of the two letters of `pair` and of the spatial digits 0, 1, ... in text."""
    first, second = (text.find(c) for c in pair)
    if first < 0 or second < 0:
        raise ValueError(f"'{text}' needs both '{pair[0]}' and '{pair[1]}'")
    digits = [c for c in text if c.isdigit()]
    if sorted(digits) != [str(i) for i in range(len(digits))] or len(digits) > 10:
        raise ValueError(f"spatial digits of '{text}' are not 0..n-1")
    if len(text) != len(digits) + 2 or text.count(pair[0]) != 1 or text.count(pair[1]) != 1:
        raise ValueError(f"'{text}' has unexpected letters")
    spatial = tuple(text.index(str(i)) for i in range(len(digits)))
    return first, second, spatial


def _float_of(text: str) -> float:
    body = text.lstrip("+-")
    sign = -1.0 if text.startswith("-") else 1.0
    if body.startswith("nan"):
        return float("-nan") if sign < 0 else float("nan")
    if body == "inf":
        return sign * float("inf")
    return float(text)


# -- public entry points -------------------------------------------------------------------
def parse_module(text: str, filename: str | None = None) -> HloModule:
    """Parse HLO module text (JAX's `as_text()`, XLA dumps, xlapy's printer) into a module.

    Raises HloParseError (with line, column and the offending source line) for malformed
    text; never another exception type.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_module expects a str, got {type(text).__name__}")
    parser = _Parser(text, filename)
    return _guarded(parser, parser.module)


def parse_shape(text: str) -> Shape:
    """Parse a shape such as `f32[2,<=3]{1,0}` or `(s32[], pred[4])`."""
    parser = _Parser(text, None)

    def run():
        shape = parser.shape()
        if not parser.at_end():
            raise parser.expected("end of shape")
        return shape

    return _guarded(parser, run)


def parse_literal(text: str, shape: Shape | str) -> Literal:
    """Parse a literal value (`{1, 2}`, `(1, 2)`, `nan`) of `shape` into a Literal."""
    if isinstance(shape, str):
        shape = parse_shape(shape)
    parser = _Parser(text, None)

    def run():
        literal = parser.literal(shape)
        if not parser.at_end():
            raise parser.expected("end of literal")
        return literal

    return _guarded(parser, run)


def _guarded(parser: _Parser, fn):
    try:
        return fn()
    except HloParseError:
        raise
    except RecursionError:
        raise parser.error("input nested too deeply") from None
    except (ValueError, IndexError, KeyError, TypeError, OverflowError) as e:
        raise parser.error(f"invalid input: {e}") from None
