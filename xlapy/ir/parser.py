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

import re
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from xlapy.errors import HloParseError, ShapeError
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
from xlapy.ir.opcodes import VARIADIC, Opcode, has_async_shorthand
from xlapy.ir.shape_inference import compatible, infer_shape
from xlapy.ir.shapes import UNBOUNDED, Layout, ProgramShape, Shape, Tile
from xlapy.ir.sharding import ShardingSyntaxError, parse_sharding
from xlapy.ir.text_cursor import MAX_DEPTH, TextCursor
from xlapy.ir.types import Kind, PrimitiveType

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
_DIM_LABELS = re.compile(r"([0-9a-z?]+)_([0-9a-z?]+)->([0-9a-z?]+)")
_DIGITS = re.compile(r"-?[0-9]{1,19}(?![0-9])")
_PAD_DIM = re.compile(r"(-?[0-9]{1,19})_(-?[0-9]{1,19})(?:_(-?[0-9]{1,19}))?(?![0-9])")
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
_PARAMETER_NUMBER = re.compile(r"[ \t]*([0-9]{1,9})[ \t]*\)")
_INT_LIST = re.compile(r"\s*\{([-+0-9, \t]*)\}")
_DECIMAL = re.compile(r"[ \t]*[-+]?[0-9]+[ \t]*")
_IOTA_LIST = re.compile(r"\[[0-9,]*\]<=\[[0-9,]*\](?:T\([0-9,]*\))?")
_IOTA_IDS = re.compile(r"\[[0-9,]*\](?:<=\[[0-9,]*\])?(?:T\([0-9,]*\))?")
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
    operand_shapes: dict[int, Shape] = field(default_factory=dict)  # as written, if written
    tuple_index: int | None = None  # a `p#2` get-tuple-element: shape known once p is
    wrapped: Opcode | None = None  # the op a shorthand async op wraps (its attributes)
    infer: bool = False  # written without a shape: inferred once operands resolve


@dataclass(slots=True)
class _AsyncSugar:
    """`custom-call-start(x), custom_call_target="f"` (or -update, -done): an async op whose
    wrapped computation (parameters and `wrapped` as root) is built once operands resolve."""

    instr: HloInstruction
    wrapped: Opcode
    pos: int
    root: HloInstruction | None = None  # the wrapped instruction, for a -start


@dataclass(slots=True)
class _Signature:
    """A computation's written `(params) -> result`, and where it starts."""

    pos: int
    parameters: list[Shape]
    result: Shape


@dataclass(slots=True)
class _ComputationRef:
    """A called computation named before the whole module is read."""

    name: str
    pos: int


class _Parser(TextCursor):
    WHITESPACE = _WS
    IDENT = _IDENT
    INT = _INT

    def __init__(self, text: str, filename: str | None):
        super().__init__(text, filename)
        self.computation_refs: list[tuple[HloInstruction, str, Any]] = []
        self.multiline_strings = False  # header strings may span lines
        self.sugar: tuple[Opcode, Opcode] | None = None  # set by opcode(): (async op, wrapped)
        self.async_wrappers: list[_AsyncSugar] = []
        self.nested: list[_PendingInstr] = []  # instructions written inside operand lists
        self.inline_computations: list[HloComputation] = []  # to_apply={...}
        self.wrapper_computations: list[HloComputation] = []

    # -- errors ----------------------------------------------------------------------------
    def found(self) -> str:
        if self.pos >= len(self.text):
            return "end of input"
        m = _IDENT.match(self.text, self.pos) or _FLOAT.match(self.text, self.pos)
        token = m.group(0) if m else self.text[self.pos]
        return f"'{token}'"

    def expected(self, what: str) -> HloParseError:
        """An error for a missing `what`. When the unexpected token starts a later line and
        the previous line stopped inside a construct (not after a closing '}'), the missing
        piece belongs at the end of that line, so point there."""
        message = f"expected {what}, found {self.found()}"
        end_of_previous = len(self.text[: self.pos].rstrip())
        if (
            end_of_previous
            and self.text[end_of_previous - 1] != "}"
            and "\n" in self.text[end_of_previous : self.pos]
        ):
            return self.error(message, end_of_previous)
        return self.error(message)

    # -- low-level scanning ----------------------------------------------------------------
    def skip(self) -> None:
        super().skip()
        if self.text.startswith("/*", self.pos):
            raise self.error("unterminated comment")

    def name(self, what: str = "a name") -> str:
        m = self.match(_NAME)
        if not m:
            raise self.expected(what)
        return m.group(1)

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
            if j < len(text) and text[j] == "\n" and self.multiline_strings:
                out.append("\n")
                i = j + 1
                continue
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
            try:
                elements = []
                if not self.accept(")"):
                    while True:
                        elements.append(self.shape())
                        if self.accept(")"):
                            break
                        self.expect(",", "',' or ')' in tuple shape")
            finally:
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
                if self.accept("*"):
                    dims.append(Tile.COMBINE_DIM)
                else:
                    pos = self.pos
                    size = self.integer("tile size")
                    if size < 1:
                        raise self.error(f"tile size {size} must be positive", pos)
                    dims.append(size)
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' in tile")
        return Tile(tuple(dims))

    def paren_int(self) -> int:
        """`(n)` of a layout's E(n) or S(n): a count or a memory space, never negative."""
        self.expect("(")
        self.skip()
        pos = self.pos
        value = self.integer()
        if value < 0:
            raise self.error(f"{value} must not be negative", pos)
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
            low = -(2**63) if etype is PrimitiveType.U64 else info.min  # XLA reads an int64
            for k, (v, p) in enumerate(zip(values, positions)):
                if not low <= v <= info.max:
                    raise self.error(f"value {v} is out of range for {etype.text}", p)
                if v < 0 and etype is PrimitiveType.U64:
                    values[k] = v + 2**64
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
        for i, value in enumerate(wide):  # 1.8e308 reads as inf in Python; XLA refuses it
            if np.isinf(value) and "inf" not in texts[i]:
                raise self.error(f"value {texts[i]} is out of range for {etype.text}", positions[i])
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
        computations: dict[str, HloComputation] = {}
        entry: HloComputation | None = None
        if self.peek_ident() != "HloModule":  # computations, or one instruction, alone
            module = HloModule(_UNNAMED)
            if _SINGLE_INSTRUCTION.match(self.text, self.pos):
                entry = self.computation_body(_UNNAMED, single=True)
                if not self.at_end():
                    raise self.expected("end of input after a single instruction")
                computations[entry.name] = entry
            elif not _COMPUTATION_HEAD.match(self.text, self.pos):
                raise self.expected("'HloModule', a computation or an instruction")
        else:
            self.pos += len("HloModule")
            module = HloModule(self.name("a module name"))
            self.accept(":")  # the old `HloModule name:` form
            self.multiline_strings = True
            self.header(module.config)
            self.multiline_strings = False
            module.stack_frames = self.stack_frame_tables()
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
        taken = set(computations)
        for extra in [*self.inline_computations, *self.wrapper_computations]:
            name, n = extra.name, 0  # made by the parser: named apart from the written ones
            while name in taken:
                n += 1
                name = f"{extra.name}.{n}"
            extra.name = name
            taken.add(name)
            module.add_computation(extra)
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
            is_entry, name, thread, signature = self.computation_head()
            comp = self.computation_body(name)
            if signature is not None:
                self.check_signature(comp, signature)
            if thread is not None:
                comp.execution_thread = thread
            return comp, is_entry
        return self.computation_body(name), is_entry

    def computation_body(self, name: str, single: bool = False) -> HloComputation:
        """The instructions of computation `name` after its '{', through its '}' (or, with
        `single`, one instruction whose undefined operands become parameters)."""
        comp = HloComputation(name)
        pending: list[_PendingInstr] = []
        by_name: dict[str, HloInstruction] = {}
        root: HloInstruction | None = None
        first_sugar = len(self.async_wrappers)
        outer_nested, self.nested = self.nested, []
        while not (single and pending) and not self.accept("}"):
            if self.pos >= len(self.text):
                raise self.error(f"unexpected end of input in computation '{name}'")
            start = self.pos
            is_root, item = self.instruction()
            for nested in [*self.nested, item]:
                instr = nested.instr
                if instr.name in by_name:
                    raise self.error(f"duplicate instruction name '{instr.name}'", start)
                by_name[instr.name] = instr
                comp.add_instruction(instr)
                pending.append(nested)
            self.nested = []
            if is_root:
                if root is not None:
                    raise self.error(f"computation '{name}' has more than one ROOT", start)
                root = item.instr
        self.nested = outer_nested
        if not comp.instructions:
            raise self.error(f"computation '{name}' has no instructions")
        if single:
            self.add_missing_parameters(comp, pending, by_name)
        self.resolve_operands(comp, pending, by_name)
        if any(item.infer for item in pending):
            self.infer_shapes(comp, pending)
        self.name_nested(comp)
        if len(self.async_wrappers) > first_sugar:
            self.build_async_wrappers(comp, first_sugar)
        comp.root = root or comp.instructions[-1]
        self.check_parameters(comp)
        return comp

    def add_missing_parameters(self, comp: HloComputation, pending, by_name) -> None:
        """A lone instruction's operands that nothing defines, `add(f32[] x, f32[] y)`,
        become parameters 0, 1, ... of the shapes written with them."""
        params: list[HloInstruction] = []
        for item in pending:
            for k, (op_name, pos) in enumerate(item.operand_names):
                if op_name in by_name:
                    continue
                shape = item.operand_shapes.get(k)
                if shape is None:
                    raise self.error(
                        f"operand '{op_name}' is not defined (give its shape to make it a "
                        "parameter)",
                        pos,
                    )
                param = HloInstruction(
                    op_name, Opcode.PARAMETER, shape, parameter_number=len(params)
                )
                params.append(param)
                by_name[op_name] = param
        comp.instructions[:0] = params
        for param in params:
            param.parent = comp

    def name_nested(self, comp: HloComputation) -> None:
        """Name the instructions written inside another's operands after their opcodes, as
        XLA's name uniquer does: `parameter`, `parameter.1`, ..."""
        taken = {i.name for i in comp.instructions if not i.name.startswith(_NESTED)}
        for instr in comp.instructions:
            if not instr.name.startswith(_NESTED):
                continue
            base = instr.opcode.text
            name, n = base, 0
            while name in taken:
                n += 1
                name = f"{base}.{n}"
            taken.add(name)
            instr.name = name

    def computation_head(self) -> tuple[bool, str, str | None, _Signature | None]:
        """`[ENTRY] name [(params) -> shape] [, execution_thread="..."] {`."""
        is_entry = False
        if self.peek_ident() == "ENTRY":
            self.pos += len("ENTRY")
            is_entry = True
        name = self.name("a computation name")
        signature = self.signature() if self.peek("(") else None
        thread = None
        if self.accept(","):
            key = self.ident()
            if key != "execution_thread":
                raise self.error(f"unknown computation attribute '{key}'")
            self.expect("=")
            thread = self.string()
        self.expect("{", f"'{{' opening computation '{name}'")
        return is_entry, name, thread, signature

    def signature(self) -> _Signature:
        """`(p: f32[2], q: s32[]) -> f32[2]`, checked against the body once it is read."""
        self.skip()
        signature = _Signature(self.pos, [], Shape.tuple([]))
        self.expect("(")
        if not self.accept(")"):
            while True:
                self.name("a parameter name")
                self.expect(":", "':' after parameter name")
                signature.parameters.append(self.shape())
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' in computation signature")
        self.expect("->", "'->' in computation signature")
        signature.result = self.shape()
        return signature

    def check_signature(self, comp: HloComputation, signature: _Signature) -> None:
        params = comp.parameters
        declared = signature.parameters
        problem = None
        if len(declared) != len(params):
            problem = f"{len(declared)} parameters, the body has {len(params)}"
        else:
            for i, (shape, param) in enumerate(zip(declared, params)):
                if not compatible(shape, param.shape):
                    problem = f"parameter {i} is {shape.to_text(False)}, {param.name} is " + (
                        param.shape.to_text(False)
                    )
                    break
        root = comp.root
        if problem is None and root is not None and not compatible(signature.result, root.shape):
            problem = (
                f"result is {signature.result.to_text(False)}, the root {root.name} is "
                f"{root.shape.to_text(False)}"
            )
        if problem:
            raise self.error(
                f"signature of '{comp.name}' disagrees with its body: {problem}", signature.pos
            )

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
            for k, written in item.operand_shapes.items():
                actual = item.instr.operands[k].shape
                if not compatible(written, actual):
                    name, pos = item.operand_names[k]
                    raise self.error(
                        f"operand '{name}' is written as {written.to_text(False)} but is "
                        f"{actual.to_text(False)}",
                        pos,
                    )
            if item.tuple_index is not None:
                self.type_tuple_access(item)

    def infer_shapes(self, comp: HloComputation, pending: list[_PendingInstr]) -> None:
        """Shapes of instructions written without one, in operand order, as XLA infers
        them for the ops whose result follows from operands and attributes."""
        items = {id(item.instr): item for item in pending if item.infer}
        try:
            order = comp.post_order()
        except ValueError as e:
            raise self.error(f"computation '{comp.name}': {e}") from None
        for instr in order:
            item = items.get(id(instr))
            if item is None:
                continue
            if any(_calls(v) for v in instr.attrs.values()):
                raise self.error(
                    f"write the shape of '{instr.name}': it calls a computation", item.pos
                )
            try:
                instr.shape = infer_shape(
                    instr.opcode, [o.shape for o in instr.operands], instr.attrs
                )
            except (ShapeError, KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
                raise self.error(
                    f"cannot infer the shape of '{instr.name}': {e}", item.pos
                ) from None

    def type_tuple_access(self, item: _PendingInstr) -> None:
        source = item.instr.operands[0]
        index = item.tuple_index
        assert index is not None
        if not source.shape.is_tuple or index >= len(source.shape.tuple_shapes):
            raise self.error(
                f"'{source.name}#{index}': {source.name} has shape {source.shape}, which has "
                f"no tuple element {index}",
                item.pos,
            )
        item.instr.shape = source.shape.tuple_shapes[index]

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
            written = self.instruction_shape(name)
            self.skip()
            op_pos = self.pos
            op_text = self.ident("an opcode")
            opcode = self.opcode(op_text, op_pos)
            self.expect("(", f"'(' after opcode '{op_text}'")
            if written is None:  # `r = add(x, y)`: the shape follows from the operands
                item = self.instruction_rhs(name, Shape.tuple([]), opcode, op_text, op_pos)
                item.infer = True
                return is_root, item
            shape = written
        return is_root, self.instruction_rhs(name, shape, opcode, op_text, op_pos)

    def instruction_rhs(
        self,
        name: str,
        shape: Shape,
        opcode: Opcode,
        op_text: str,
        op_pos: int,
        attributes: bool = True,
    ) -> _PendingInstr:
        """An instruction after its `opcode(`: operands, then (unless nested in another's
        operand list) attributes."""
        sugar = self.sugar
        instr = HloInstruction(name, opcode, shape)
        item = _PendingInstr(instr, op_pos, [], wrapped=sugar[1] if sugar else None)
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
        while attributes:
            key = _ATTRIBUTE_KEY.match(self.text, self.pos)
            if key is None and not self.accept(","):
                break
            self.attribute(item, key)
        if sugar is not None:
            self.async_sugar(instr, sugar[1], op_pos)
        return item

    def async_sugar(self, instr: HloInstruction, wrapped: Opcode, pos: int) -> None:
        """Move the wrapped op's attributes off a shorthand async op (a -start keeps only
        the async op's own ones, an -update or -done none but those) and note it."""
        own = {k: v for k, v in instr.attrs.items() if k in _ASYNC_OWN_ATTRIBUTES}
        moved = {k: v for k, v in instr.attrs.items() if k not in _ASYNC_OWN_ATTRIBUTES}
        instr.attrs = own
        root = None
        if instr.opcode is Opcode.ASYNC_START:
            shape = instr.shape
            if not shape.is_tuple or len(shape.tuple_shapes) < 2:
                raise self.error(
                    f"'{instr.name}' must have an (operands, result, ...) tuple shape", pos
                )
            root = HloInstruction(instr.name + ".wrapped", wrapped, shape.tuple_shapes[1])
            root.attrs = moved
        for i, (target, key, value) in enumerate(self.computation_refs):
            if target is instr and key in moved:  # a -start's wrapped op calls it
                self.computation_refs[i] = (root, key, value) if root else (target, "", value)
        self.computation_refs = [r for r in self.computation_refs if r[1]]
        self.async_wrappers.append(_AsyncSugar(instr, wrapped, pos, root))

    def build_async_wrappers(self, comp: HloComputation, first: int) -> None:
        """The wrapped computations of the shorthand async ops read in `comp` (from index
        `first` of self.async_wrappers), now that their operands are resolved."""
        for sugar in self.async_wrappers[first:]:
            instr = sugar.instr
            if sugar.root is None:
                start = instr.operands[0] if instr.operands else None
                while start is not None and start.opcode is Opcode.ASYNC_UPDATE:
                    start = start.operands[0] if start.operands else None
                wrapped = _wrapped_opcode(start)
                if start is None or start.opcode is not Opcode.ASYNC_START:
                    raise self.error(f"'{instr.name}' must follow an async start", sugar.pos)
                if wrapped is not sugar.wrapped:
                    raise self.error(
                        f"'{instr.name}' is {sugar.wrapped.text}-{instr.opcode.text[6:]} but "
                        f"'{start.name}' starts {wrapped.text if wrapped else 'no'} op",
                        sugar.pos,
                    )
                continue
            wrapper = HloComputation(f"{instr.name}.async_computation")
            for i, operand in enumerate(instr.operands):
                param = HloInstruction(
                    f"{instr.name}.param_{i}", Opcode.PARAMETER, operand.shape, parameter_number=i
                )
                wrapper.add_instruction(param)
                sugar.root.operands.append(param)
            wrapper.add_instruction(sugar.root)
            wrapper.root = sugar.root
            thread = instr.attrs.get("async_execution_thread")
            if isinstance(thread, str):
                wrapper.execution_thread = thread
            instr.attrs["calls"] = wrapper
            self.wrapper_computations.append(wrapper)
        del self.async_wrappers[first:]

    def opcode(self, text: str, pos: int) -> Opcode:
        """The opcode spelled `text`; `<op>-start`, `-update` and `-done` of an op without
        async opcodes of its own are async-start/update/done wrapping op (self.sugar)."""
        self.sugar = None
        opcode = _OPCODES.get(text)
        if opcode is not None:
            return opcode
        base, _, suffix = text.rpartition("-")
        wrapped = _OPCODES.get(base)
        async_op = _ASYNC_SUFFIXES.get(suffix)
        if wrapped is None or async_op is None or not has_async_shorthand(wrapped):
            raise self.error(f"unknown opcode '{text}'", pos)
        self.sugar = (async_op, wrapped)
        return async_op

    def instruction_shape(self, name: str) -> Shape | None:
        """The shape after `name =`; None when an opcode follows at once (`add(x, y)`)."""
        if not self.shape_starts_here():
            self.skip()
            word = self.peek_ident()
            if word is not None and self.text.startswith("(", self.pos + len(word)):
                return None
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
            shape = self.shape() if self.shape_starts_here() else None
            self.skip()
            pos = self.pos
            name = self.name("an operand name")
            if shape is not None and self.text.startswith("(", self.pos):
                name = self.nested_instruction(shape, name, pos)  # add(f32[] parameter(0), ..)
            elif self.text.startswith("#", self.pos):
                name = self.tuple_access(name, pos)  # p#0: get-tuple-element(p), index=0
            if shape is not None:
                item.operand_shapes[len(names)] = shape
            names.append((name, pos))
            if self.accept(")"):
                return
            self.expect(",", "',' or ')' after operand")

    def nested_instruction(self, shape: Shape, op_text: str, op_pos: int) -> str:
        """An instruction written in place of an operand (its shape and opcode read); it
        joins the computation before the one using it, under a name given later."""
        opcode = self.opcode(op_text, op_pos)
        self.pos += 1  # '('
        name = f"{_NESTED}{len(self.nested)}.{op_pos}"
        item = self.instruction_rhs(name, shape, opcode, op_text, op_pos, attributes=False)
        self.nested.append(item)
        return name

    def tuple_access(self, tuple_name: str, pos: int) -> str:
        self.pos += 1  # '#'
        index = self.integer("a tuple index after '#'")
        if index < 0:
            raise self.error("tuple index must not be negative", pos)
        name = f"{_NESTED}{len(self.nested)}.{pos}"
        gte = HloInstruction(
            name, Opcode.GET_TUPLE_ELEMENT, Shape.tuple([]), attrs={"index": index}
        )
        self.nested.append(_PendingInstr(gte, pos, [(tuple_name, pos)], tuple_index=index))
        return name

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
        if key not in A.COMMON_ATTRIBUTES and key not in _ALLOWED[instr.opcode]:
            wrapped = item.wrapped
            if wrapped is None or key not in _ALLOWED[wrapped]:
                op = f"{wrapped.text}-{instr.opcode.text[6:]}" if wrapped else instr.opcode.text
                raise self.error(f"'{op}' does not take attribute '{key}'", key_pos)
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
        if kind is AttrKind.COMPUTATION and self.text.startswith("{", self.pos):
            self.pos += 1  # to_apply={ a = f32[] parameter(0) ... }: a computation in place
            inline = self.computation_body("_")
            self.inline_computations.append(inline)
            instr.attrs[key] = inline
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
        if key == "slice_sizes" and instr.opcode in _PERMUTES:
            reader = _Parser.nested_int_lists  # one size list per permuted slice
        try:
            value = instr.attrs[key] = reader(self)
            if kind is AttrKind.ENUM or kind is AttrKind.PRECISION_LIST or key in _CHECKED_RAW:
                self.check_value(instr, key, value, value_pos)
        except HloParseError as e:
            raise HloParseError(
                f"in attribute '{key}' ({kind.value}): {e.message}",
                e.line,
                e.column,
                e.source_line,
                e.filename,
            ) from None

    def check_value(self, instr: HloInstruction, key: str, value, pos: int) -> None:
        """Enum values XLA knows, precisions, and result_accuracy's two forms."""
        if isinstance(value, A.Enum):
            allowed = A.ENUM_VALUES.get(key)
            if key == "algorithm" and instr.opcode is Opcode.RNG_BIT_GENERATOR:
                allowed = _RNG_ALGORITHMS
            if allowed is not None and value.text not in allowed:
                raise self.error(
                    f"'{value.text}' is not a {key}; expected one of {', '.join(sorted(allowed))}",
                    pos,
                )
        elif isinstance(value, tuple):
            for p in value:
                if p.text not in A.PRECISIONS:
                    raise self.error(f"'{p.text}' is not a precision (default, high, highest)", pos)
        elif key == "result_accuracy" and not _RESULT_ACCURACY.fullmatch(value.text):
            raise self.error(
                "expected {mode=default|highest} or {tolerance={atol=..,rtol=..,ulps=..}}", pos
            )

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
            if all(_DECIMAL.fullmatch(item) for item in items) and len(m.group(1)) < 4000:
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
        if self.accept("{"):  # a scalar's: no dimensions
            self.expect("}", "'}' (a scalar's padding is {})")
            return A.Padding(())
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
        ranks = (len(lhs), len(rhs), len(out)) if "?" in m.group(0) else ()
        return A.ConvDimLabels(b, f, ls, i, o, ks, ob, of, os_, ranks)

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
        items: list[tuple[str, str | int | tuple[int, ...]]] = []
        while not self.accept("}"):
            if items:
                self.accept(",")  # XLA separates fields by spaces; it also reads commas
            key = self.ident("a metadata field")
            self.expect("=", f"'=' after metadata field '{key}'")
            if self.peek('"'):
                items.append((key, self.string()))
            elif self.peek("{"):
                items.append((key, self.int_list()))  # profile_type={1,2}
            else:
                items.append((key, self.integer("a string, integer or {integers}")))
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
        """The one entry for `sharding={...}` (xlapy.ir.sharding reads the value)."""
        self.skip()
        if not self.peek("{"):
            raise self.expected("'{' opening a sharding")
        start = self.pos
        text = self.balanced()
        try:
            return parse_sharding(text)
        except ShardingSyntaxError as e:
            raise self.error(f"bad sharding: {e}", start + e.offset) from None

    def backend_config(self) -> A.BackendConfig:
        if self.peek('"'):
            return A.BackendConfig(self.string())
        if self.peek("{"):
            return A.BackendConfig(self.balanced(), braced=True)
        raise self.expected("a quoted string or '{' for backend_config")

    def replica_groups(self) -> A.ReplicaGroups:
        self.skip()
        start = self.pos
        if self.peek("["):
            m = _IOTA_LIST.match(self.text, self.pos)
            if not m:
                raise self.expected("replica groups like [2,2]<=[4]")
            self.pos = m.end()
            groups = A.ReplicaGroups(iota_text=m.group(0))
        elif self.peek_ident() == "mesh":
            self.pos += len("mesh")
            groups = self.mesh_replica_groups()
        else:
            groups = A.ReplicaGroups(groups=self.nested_int_lists())
        try:
            groups.expanded()
        except ValueError as e:
            raise self.error(f"bad replica groups: {e}", start) from None
        return groups

    def mesh_replica_groups(self) -> A.ReplicaGroups:
        """`mesh['x'=2,'y'=4][, device_ids=(...)] {'y', 'x':(1)2}` after `mesh`."""
        self.expect("[", "'[' after mesh")
        names: list[str] = []
        sizes: list[int] = []
        while True:
            names.append(self.axis_name())
            self.expect("=", "'=' after a mesh axis name")
            sizes.append(self.integer("a mesh axis size"))
            if self.accept("]"):
                break
            self.expect(",", "',' or ']' in mesh axes")
        device_ids = None
        device_ids_iota = None
        if self.accept(","):
            if self.peek_ident() != "device_ids":
                raise self.expected("device_ids=(...)")
            self.pos += len("device_ids")
            self.expect("=")
            self.expect("(")
            self.skip()
            if self.peek("["):  # XLA's iota form, device_ids=([2,2]T(1,0))
                start = self.pos
                m = _IOTA_IDS.match(self.text, self.pos)
                if not m:
                    raise self.expected("device ids like [2,2]T(1,0)")
                self.pos = m.end()
                device_ids_iota = m.group(0)
                try:
                    device_ids = A.iota_device_ids(device_ids_iota)
                except ValueError as e:
                    raise self.error(f"bad device_ids: {e}", start) from None
            else:
                ids = [self.integer("a device id")]
                while self.accept(","):
                    ids.append(self.integer("a device id"))
                device_ids = tuple(ids)
            self.expect(")", "')' closing device_ids")
        self.expect("{", "'{' opening the mesh axes of the groups")
        axes: list[A.MeshAxis] = []
        while True:
            pos = self.pos
            name = self.axis_name()
            if name not in names:
                raise self.error(f"mesh has no axis '{name}'", pos)
            pre = size = 0
            if self.accept(":"):
                self.expect("(", "'(' opening a sub-axis like :(1)2")
                pre = self.integer("a sub-axis stride")
                self.expect(")")
                size = self.integer("a sub-axis size")
                if pre < 1 or size < 2:
                    raise self.error("a sub-axis needs stride >= 1 and size >= 2", pos)
            axes.append(A.MeshAxis(names.index(name), pre, size))
            if self.accept("}"):
                break
            self.expect(",", "',' or '}' in mesh axes")
        mesh = A.Mesh(tuple(names), tuple(sizes), device_ids, device_ids_iota)
        return A.ReplicaGroups(mesh=mesh, mesh_axes=tuple(axes))

    def axis_name(self) -> str:
        """A mesh axis name: `'x'` (as XLA prints it) or a bare identifier."""
        self.skip()
        if self.text.startswith("'", self.pos):
            end = self.text.find("'", self.pos + 1)
            if end < 0 or "\n" in self.text[self.pos : end]:
                raise self.error("unterminated axis name")
            name = self.text[self.pos + 1 : end]
            self.pos = end + 1
            return name
        return self.ident("a mesh axis name")

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

    def shaped_literal(self) -> Literal:
        """A literal with its shape, `s32[2]{0} {1, 2}`, or a tuple of them in parentheses."""
        self.enter()
        try:
            if not self.accept("("):
                shape = self.shape()
                return self.literal(shape)
            elements = []
            if not self.accept(")"):
                while True:
                    elements.append(self.shaped_literal())
                    if self.accept(")"):
                        break
                    self.expect(",", "',' or ')' in a tuple literal")
            return Literal(Shape.tuple([e.shape for e in elements]), elements=tuple(elements))
        finally:
            self.leave()

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


_NESTED = "\x00nested"  # the provisional name prefix of nested instructions
_UNNAMED = "_"  # XLA's name for a module without a header and for an inline computation
_COMPUTATION_HEAD = re.compile(rf"\s*(?:ENTRY\s+)?%?{_IDENT_TEXT}\s*[{{(,]")
_SINGLE_INSTRUCTION = re.compile(rf"\s*(?:ROOT\s+)?%?{_IDENT_TEXT}\s*=")
_OPCODES = {op.text: op for op in Opcode}
_ALLOWED = {op: A.OPCODE_ATTRIBUTES.get(op.text, frozenset(ATTRIBUTE_KINDS)) for op in Opcode}
_RNG_ALGORITHMS = frozenset(("rng_default", "rng_three_fry", "rng_philox"))
_CHECKED_RAW = frozenset(("result_accuracy",))
_NUMBER_TEXT = r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_RESULT_ACCURACY = re.compile(
    r"\{\s*(?:mode\s*=\s*(?:default|highest|DEFAULT|HIGHEST)"
    rf"|tolerance\s*=\s*\{{\s*(?:(?:atol|rtol|ulps)\s*=\s*{_NUMBER_TEXT}\s*,?\s*)*\}})\s*\}}"
)
_PERMUTES = (Opcode.COLLECTIVE_PERMUTE, Opcode.COLLECTIVE_PERMUTE_START)
_ASYNC_SUFFIXES = {
    "start": Opcode.ASYNC_START,
    "update": Opcode.ASYNC_UPDATE,
    "done": Opcode.ASYNC_DONE,
}
_ASYNC_OWN_ATTRIBUTES = frozenset(
    ("async_execution_thread", "metadata", "control-predecessors", "frontend_attributes")
)
"""Attributes of a shorthand async op that belong to the async op, not to the op it wraps."""


def _calls(value) -> bool:
    if isinstance(value, tuple):
        return any(_calls(v) for v in value)
    return isinstance(value, _ComputationRef | HloComputation)


def _wrapped_opcode(start: HloInstruction | None) -> Opcode | None:
    calls = start.attrs.get("calls") if start is not None else None
    return calls.root.opcode if isinstance(calls, HloComputation) and calls.root else None


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
    AttrKind.LITERAL: _Parser.shaped_literal,
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
    known = len(text) - text.count("?")
    if known != len(digits) + 2 or text.count(pair[0]) != 1 or text.count(pair[1]) != 1:
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
