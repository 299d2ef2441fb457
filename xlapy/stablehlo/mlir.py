"""A reader for the MLIR text of the `func`, `stablehlo`, `chlo` and `check` dialects.

The reader is a hand-written recursive descent over the text with a cursor, in the style of
xlapy.ir.parser: whitespace and comments are skipped between tokens, and each token is
matched by a small regular expression at the cursor. It turns the text into a light syntax
tree (Module -> Func -> Op with operands, attributes, regions and types) and knows nothing
of what an op means; xlapy.stablehlo.convert gives the ops their meaning.

Ops come in two forms. The generic form is the same for every op:

    %r = "stablehlo.add"(%a, %b) <{props}> ({regions}) {attrs} : (types) -> types loc(...)

The pretty forms differ per op, but all that JAX prints follow one pattern: after the op
name comes a comma-separated list of items (operands `%a`, keywords `LT`, `key = value`
pairs, a slice `[0:4:2]`, a callee `@f(%x)`, a parenthesized operand list), an optional
attribute dictionary, then `:` and the types, and for a few ops (while, reduce) regions
after the types. Ops whose pretty form does not fit (reduce, while, convolution, constant)
have a rule of their own.

Every failure is an HloParseError with the line, column and a caret, like HLO's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from xlapy.errors import HloParseError
from xlapy.ir.text_cursor import MAX_DEPTH, TextCursor

_WS = re.compile(r"(?:\s+|//[^\n]*)*")
_TOKEN = re.compile(r"\S+")
_VALUE = re.compile(r"%[A-Za-z0-9_$.\-]+(?:#[0-9]+)?")
_SYMBOL = re.compile(r'@(?:[A-Za-z0-9_$.\-]+|"(?:[^"\\]|\\.)*")')
_HASH = re.compile(r"#[A-Za-z_][A-Za-z0-9_$.]*")
_BANG = re.compile(r"![A-Za-z_][A-Za-z0-9_$.]*")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*")
_INT = re.compile(r"[-+]?(?:0x[0-9A-Fa-f]+|[0-9]+)(?![0-9A-Za-z_.])")
_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+|inf|nan)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BLOCK = re.compile(r"\^[A-Za-z0-9_$.\-]+")
_TENSOR_TEXT = r"tensor<[0-9x]*(?:[a-z][a-z0-9]*|f8E[0-9A-Z]+|complex<f(?:32|64)>)>"
_TENSOR = re.compile(_TENSOR_TEXT)
# `%r = stablehlo.op %a, %b[, dims = [..]] : T` or `: (T, T) -> T`, then `loc(..)` and the
# end of the line: most ops JAX prints. Anything else goes through the general rules.
_FAST_OP = re.compile(
    r"(%[A-Za-z0-9_$.\-]+) = ((?:stablehlo|chlo)\.[a-z_]+) "
    r"(%[A-Za-z0-9_$.\-]+(?:#[0-9]+)?(?:, %[A-Za-z0-9_$.\-]+(?:#[0-9]+)?)*)"
    r"(?:, (dims) = \[([0-9, ]*)\])?"
    rf" : (?:\(({_TENSOR_TEXT}(?:, {_TENSOR_TEXT})*)\) -> )?({_TENSOR_TEXT})"
    r"(?: loc\(([^()\n]*)\))?[ \t]*(?=\n)"
)
_FAST_HEAD = re.compile(r"%[A-Za-z0-9_$.\-]+ = ((?:stablehlo|chlo)\.[a-z_]+)[ (]")
_LOC_END = r"(?: loc\((?P<loc>[^()\n]*)\))?[ \t]*(?=\n)"
_V = r"%[A-Za-z0-9_$.\-]+(?:#[0-9]+)?"
_INTS = r"[0-9, ]*"
_FAST_RULES = {
    "stablehlo.constant": re.compile(
        r"(%[A-Za-z0-9_$.\-]+) = (stablehlo\.constant) "
        rf"dense<(?P<body>[^<>\"\n]*)> : (?P<type>{_TENSOR_TEXT}){_LOC_END}"
    ),
    "stablehlo.dot_general": re.compile(
        rf"(%[A-Za-z0-9_$.\-]+) = (stablehlo\.dot_general) (?P<a>{_V}), (?P<b>{_V}), "
        rf"(?:batching_dims = \[(?P<lb>{_INTS})\] x \[(?P<rb>{_INTS})\], )?"
        rf"contracting_dims = \[(?P<lc>{_INTS})\] x \[(?P<rc>{_INTS})\]"
        r"(?:, precision = \[(?P<precision>[A-Z, ]*)\])? : "
        rf"\((?P<ta>{_TENSOR_TEXT}), (?P<tb>{_TENSOR_TEXT})\) -> (?P<tr>{_TENSOR_TEXT}){_LOC_END}"
    ),
    "stablehlo.reduce": re.compile(
        rf"(%[A-Za-z0-9_$.\-]+) = (stablehlo\.reduce)\((?P<a>{_V}) init: (?P<b>{_V})\) "
        rf"applies (?P<applies>stablehlo\.[a-z_]+) across dimensions = \[(?P<dims>{_INTS})\] : "
        rf"\((?P<ta>{_TENSOR_TEXT}), (?P<tb>{_TENSOR_TEXT})\) -> (?P<tr>{_TENSOR_TEXT}){_LOC_END}"
    ),
}


def _int_items(text: str) -> list[int]:
    return [int(d) for d in text.split(",") if d.strip()]


_TYPE_START = re.compile(
    r"(?:tensor|tuple|complex|vector|memref|index|none|[iuf][0-9]|ui[0-9]|si[0-9]|bf16|tf32"
    r"|f8E|f4E|f6E)|!"
)


@dataclass
class Type:
    """An MLIR type as written (`tensor<2x3xf32>`), with the position it was read at."""

    text: str
    pos: int


@dataclass
class DenseAttr:
    """`dense<...>`: the text between the angle brackets, and the tensor type after it."""

    body: str
    type: Type | None
    pos: int


@dataclass
class DialectAttr:
    """`#dialect.name<body>` (or `#dialect<body>`): the name, the body text and, where the
    body is a list of `key = value`, those pairs."""

    name: str
    body: str
    fields: dict[str, Any]


class AttrDict(dict):
    """An attribute dictionary, with the text it was read from (`text`)."""

    text = "{}"


@dataclass
class ArrayAttr:
    """`array<i64: 1, 2>`."""

    values: tuple


@dataclass
class Symbol:
    name: str


@dataclass
class Typed:
    """A number or other value with a `: type` suffix, such as `1 : i64`."""

    value: Any
    type: str


@dataclass
class Block:
    args: list[tuple[str, Type]]
    ops: list[Op]


@dataclass
class Op:
    """One operation. `results` names each result value (`%3#1` for the second result of
    `%3:2`); `operands` the values used, with their positions."""

    name: str
    pos: int
    results: list[str] = field(default_factory=list)
    operands: list[tuple[str, int]] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)
    regions: list[Block] = field(default_factory=list)
    operand_types: list[Type] = field(default_factory=list)
    result_types: list[Type] = field(default_factory=list)
    loc: str | None = None
    keywords: list[str] = field(default_factory=list)


@dataclass
class Func:
    name: str
    pos: int
    visibility: str
    args: list[tuple[str, Type, dict]]
    results: list[tuple[Type, dict]]
    body: Block | None
    loc: str | None = None


@dataclass
class Module:
    name: str | None
    attrs: dict[str, Any]
    funcs: list[Func]
    aliases: dict[str, str]  # `#loc3 = loc(...)` and other attribute aliases, as text
    meshes: dict[str, str] = field(default_factory=dict)  # sdy.mesh name -> `["x"=2, ...]`


class Reader(TextCursor):
    """The cursor over the text, and the grammar rules."""

    WHITESPACE = _WS
    IDENT = _IDENT
    INT = _INT
    INT_BASE = 0  # 0x... too
    MAX_INT_CHARS = 40

    def __init__(self, text: str, filename: str | None):
        super().__init__(text, filename)
        self.aliases: dict[str, str] = {}

    def found(self) -> str:
        self.skip()
        if self.pos >= len(self.text):
            return "end of input"
        m = _TOKEN.match(self.text, self.pos)
        return f"'{m.group(0)[:20] if m else self.text[self.pos]}'"

    def value(self, what: str = "a value such as %0") -> tuple[str, int]:
        self.skip()
        pos = self.pos
        m = self.match(_VALUE)
        if m is None:
            raise self.expected(what)
        return m.group(0), pos

    def string(self) -> str:
        m = self.match(_STRING)
        if m is None:
            raise self.expected("a string")
        return unescape(m.group(0)[1:-1])

    def symbol(self) -> str:
        m = self.match(_SYMBOL)
        if m is None:
            raise self.expected("a symbol such as @main")
        name = m.group(0)[1:]
        return unescape(name[1:-1]) if name.startswith('"') else name

    def balanced(self, open_: str, close: str) -> str:
        """The text from the cursor (at `open_`) to its matching `close`, both excluded;
        strings are skipped whole."""
        self.skip()
        start = self.pos
        if not self.text.startswith(open_, start):
            raise self.expected(f"'{open_}'")
        depth = 0
        i = start
        text = self.text
        pairs = {"<": ">", "(": ")", "[": "]", "{": "}"}
        closers = set(pairs.values())
        while i < len(text):
            c = text[i]
            if c == '"':
                m = _STRING.match(text, i)
                if m is None:
                    break
                i = m.end()
                continue
            if c == "-" and text.startswith("->", i):
                i += 2
                continue
            if c in pairs:
                depth += 1
            elif c in closers:
                depth -= 1
                if depth == 0:
                    if c != close:
                        raise self.error(f"expected '{close}', found '{c}'", i)
                    self.pos = i + 1
                    return text[start + len(open_) : i]
            i += 1
        raise self.error(f"'{open_}' is never closed", start)

    # -- types -----------------------------------------------------------------------------
    def at_type(self) -> bool:
        self.skip()
        return _TYPE_START.match(self.text, self.pos) is not None

    def type(self) -> Type:
        self.skip()
        pos = self.pos
        if not self.at_type():
            raise self.expected("a type")
        if self.text.startswith("!", pos):
            m = self.match(_BANG)
            if m is None:
                raise self.expected("a type such as !stablehlo.token")
            if self.peek("<"):
                self.balanced("<", ">")
            return Type(self.text[pos : self.pos], pos)
        self.ident("a type")
        if self.text.startswith("<", self.pos):
            self.balanced("<", ">")
        return Type(self.text[pos : self.pos], pos)

    def type_list_in_parens(self) -> list[Type]:
        self.expect("(")
        types: list[Type] = []
        if self.accept(")"):
            return types
        while True:
            types.append(self.type())
            self.skip_type_attrs()
            if self.accept(")"):
                return types
            self.expect(",", "',' or ')' in a type list")

    def skip_type_attrs(self) -> None:
        if self.peek("{"):
            self.attr_dict()

    def function_type(self) -> tuple[list[Type], list[Type]]:
        """`(T, T) -> T`, `(T) -> (T, T)`, `T -> T`, `T` or `T, T` (operand types only)."""
        if self.peek("("):
            inputs = self.type_list_in_parens()
        else:
            inputs = [self.type()]
            while self.peek(","):
                save = self.pos
                self.pos += 1
                if not self.at_type():
                    self.pos = save
                    break
                inputs.append(self.type())
        if not self.accept("->"):
            return inputs, []
        if self.peek("("):
            return inputs, self.type_list_in_parens()
        return inputs, [self.type()]

    # -- attributes ------------------------------------------------------------------------
    def attr_dict(self) -> AttrDict:
        self.expect("{")
        start = self.pos - 1
        self.enter()
        attrs = AttrDict()
        if self.accept("}"):
            self.leave()
            attrs.text = "{}"
            return attrs
        while True:
            self.skip()
            if self.peek('"'):
                key = self.string()
            else:
                key = self.ident("an attribute name")
            attrs[key] = self.attribute() if self.accept("=") else True
            if self.accept("}"):
                self.leave()
                attrs.text = self.text[start : self.pos]
                return attrs
            self.expect(",", "',' or '}' in an attribute dictionary")

    def attribute(self) -> Any:
        self.skip()
        pos = self.pos
        text = self.text
        if text.startswith('"', pos):
            value: Any = self.string()
        elif text.startswith("[", pos):
            value = self.attr_list()
        elif text.startswith("{", pos):
            value = self.attr_dict()
        elif text.startswith("@", pos):
            value = Symbol(self.symbol())
        elif text.startswith("#", pos):
            value = self.hash_attr()
        elif text.startswith("<", pos):
            value = DialectAttr("", self.balanced("<", ">"), {})
        elif text.startswith("(", pos):
            return self.function_type()
        elif m := _FLOAT.match(text, pos):
            self.pos = m.end()
            value = float(m.group(0))
        elif m := _INT.match(text, pos):
            self.pos = m.end()
            value = int(m.group(0), 0)
        else:
            word = self.peek_ident()
            if word is None:
                raise self.expected("an attribute value")
            if word in ("true", "false"):
                self.pos += len(word)
                return word == "true"
            if word == "dense":
                self.pos += len(word)
                body = self.balanced("<", ">")
                typ = self.type() if self.accept(":") else None
                return DenseAttr(body, typ, pos)
            if word == "array":
                self.pos += len(word)
                return ArrayAttr(array_values(self.balanced("<", ">")))
            if word == "unit":
                self.pos += len(word)
                return True
            if word == "dense_resource":
                raise self.error(
                    "dense_resource constants (data kept outside the text) are not supported; "
                    "print the module with its constants inline"
                )
            if self.at_type():
                return self.type()
            self.pos += len(word)
            value = word
        if isinstance(value, int | float | bool) and self.peek(":") and not self.peek("::"):
            save = self.pos
            self.pos += 1
            if self.at_type():
                return Typed(value, self.type().text)
            self.pos = save
        return value

    def attr_list(self) -> list:
        self.expect("[")
        self.enter()
        items: list = []
        if self.accept("]"):
            self.leave()
            return items
        while True:
            items.append(self.attribute())
            if self.accept("]"):
                self.leave()
                return items
            self.expect(",", "',' or ']' in a list")

    def hash_attr(self) -> Any:
        m = self.match(_HASH)
        if m is None:
            raise self.expected("an attribute such as #stablehlo<...>")
        name = m.group(0)[1:]
        if not self.text.startswith("<", self.pos):
            if name in self.aliases:
                return DialectAttr(name, self.aliases[name], {})
            return DialectAttr(name, "", {})
        body = self.balanced("<", ">")
        return DialectAttr(name, body, dialect_fields(body))

    # -- locations -------------------------------------------------------------------------
    def location(self) -> str | None:
        """`loc(...)` after an op, as the text between the parentheses."""
        if self.peek_ident() != "loc":
            return None
        self.pos += 3
        return self.balanced("(", ")")

    # -- structure -------------------------------------------------------------------------
    def module(self) -> Module:
        self.skip()
        name: str | None = None
        attrs: dict[str, Any] = {}
        funcs: list[Func] = []
        meshes: dict[str, str] = {}
        self.top_level_aliases()
        if self.peek('"builtin.module"'):
            op = self.generic_op(self.string(), self.pos)
            name = op.attrs.pop("sym_name", None)
            attrs = op.attrs
            if len(op.regions) != 1:
                raise self.error("builtin.module takes one region", op.pos)
            for mesh in (f for f in op.regions[0].ops if f.name == "sdy.mesh"):
                body = mesh.attrs.get("mesh")
                if isinstance(body, DialectAttr) and isinstance(mesh.attrs.get("sym_name"), str):
                    meshes[mesh.attrs["sym_name"]] = body.body
            funcs = [generic_func(self, f) for f in op.regions[0].ops if f.name != "sdy.mesh"]
        elif self.keyword("module"):
            if self.peek("@"):
                name = self.symbol()
            if self.keyword("attributes"):
                attrs = self.attr_dict()
            self.expect("{", "'{' opening the module body")
            while not self.accept("}"):
                self.skip()
                if self.pos >= len(self.text):
                    raise self.error("the module body is never closed ('}' missing)")
                if self.keyword("sdy.mesh"):  # `sdy.mesh @name = <["x"=2, ...]> {...}`
                    mesh_name = self.symbol()
                    self.expect("=", "'=' after the mesh name")
                    meshes[mesh_name] = self.balanced("<", ">")
                    if self.peek("{"):
                        self.attr_dict()
                    self.location()
                    continue
                funcs.append(self.func())
            self.location()
        else:
            while True:
                self.skip()
                if self.pos >= len(self.text):
                    break
                funcs.append(self.func())
        self.top_level_aliases()
        self.skip()
        if self.pos < len(self.text):
            raise self.expected("the end of the module")
        if not funcs:
            raise self.error("no func.func in the module", 0)
        return Module(name, attrs, funcs, self.aliases, meshes)

    def top_level_aliases(self) -> None:
        """`#name = ...` and `!name = ...` lines before or after the module."""
        while True:
            self.skip()
            m = re.compile(r"([#!][A-Za-z0-9_$.]+)\s*=\s*").match(self.text, self.pos)
            if m is None:
                return
            self.pos = m.end()
            start = self.pos
            end = self.text.find("\n", start)
            end = len(self.text) if end < 0 else end
            self.pos = end
            self.aliases[m.group(1)[1:]] = self.text[start:end].strip()

    def func(self) -> Func:
        self.skip()
        pos = self.pos
        word = self.peek_ident()
        if word not in ("func.func", "func"):
            raise self.expected("'func.func'")
        self.pos += len(word)
        visibility = "public"
        if self.peek_ident() in ("public", "private", "nested"):
            visibility = self.ident()
        name = self.symbol()
        self.expect("(", "'(' opening the argument list")
        args: list[tuple[str, Type, dict]] = []
        if not self.accept(")"):
            while True:
                arg, _ = self.value("an argument such as %arg0")
                self.expect(":", "':' after the argument name")
                typ = self.type()
                arg_attrs = self.attr_dict() if self.peek("{") else {}
                self.location()
                args.append((arg, typ, arg_attrs))
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' in the argument list")
        results: list[tuple[Type, dict]] = []
        if self.accept("->"):
            if self.peek("("):
                self.expect("(")
                if not self.accept(")"):
                    while True:
                        typ = self.type()
                        results.append((typ, self.attr_dict() if self.peek("{") else {}))
                        if self.accept(")"):
                            break
                        self.expect(",", "',' or ')' in the result list")
            else:
                results.append((self.type(), {}))
        if self.keyword("attributes"):
            self.attr_dict()
        body = self.block_in_braces([]) if self.peek("{") else None
        loc = self.location()
        return Func(name, pos, visibility, args, results, body, loc)

    def block_in_braces(self, args: list[tuple[str, Type]]) -> Block:
        """`{ [^bb0(args):] ops }`."""
        self.expect("{", "'{' opening a region")
        self.enter()
        if self.match(_BLOCK):
            if self.accept("("):
                args = []
                if not self.accept(")"):
                    while True:
                        name, _ = self.value("a block argument")
                        self.expect(":", "':' after the block argument")
                        typ = self.type()
                        self.location()
                        args.append((name, typ))
                        if self.accept(")"):
                            break
                        self.expect(",", "',' or ')' in the block arguments")
            self.expect(":", "':' after the block label")
        ops: list[Op] = []
        while not self.accept("}"):
            self.skip()
            if self.pos >= len(self.text):
                raise self.error("a region is never closed ('}' missing)")
            if self.text.startswith("^", self.pos):
                raise self.error("regions with more than one block are not supported")
            ops.append(self.op())
        self.leave()
        return Block(args, ops)

    def op(self) -> Op:
        self.skip()
        start = self.pos
        head = _FAST_HEAD.match(self.text, start)
        if head is not None:
            special = _FAST_RULES.get(head.group(1))
            fast = (special or _FAST_OP).match(self.text, start)
            if fast is not None:
                return self.fast_special(head.group(1), fast) if special else self.fast_op(fast)
        results: list[str] = []
        if self.text.startswith("%", self.pos):
            while True:
                name, _ = self.value("a result name")
                if self.accept(":"):
                    at = self.pos
                    count = self.integer("a result count")
                    if count > len(self.text):  # each result's type is written out later
                        raise self.error(f"result count {count} is more than the op can have", at)
                    results += [f"{name}#{i}" for i in range(count)]
                else:
                    results.append(name)
                if not self.accept(","):
                    break
            self.expect("=", "'=' after the result names")
        self.skip()
        pos = self.pos
        if self.text.startswith('"', pos):
            op = self.generic_op(self.string(), pos)
        else:
            m = self.match(_IDENT)
            if m is None:
                raise self.expected("an operation name")
            name = m.group(0)
            if "." not in name and name not in ("return", "call"):
                raise self.error(f"expected an operation name, found '{name}'", pos)
            op = Op(name, pos)
            rule = PRETTY_RULES.get(name, Reader.pretty_op)
            rule(self, op)
        op.results = results
        if start != pos and not results:
            raise self.error("expected result names", start)
        return op

    def fast_op(self, m: re.Match) -> Op:
        """An op of the most common pretty form (see _FAST_OP), read by one match."""
        op = Op(m.group(2), m.start(2), results=[m.group(1)], loc=m.group(8))
        base = m.start(3)
        op.operands = [(v.group(0), base + v.start()) for v in _VALUE.finditer(m.group(3))]
        if m.group(4) is not None:
            op.attrs[m.group(4)] = [int(d) for d in m.group(5).split(",") if d.strip()]
        if m.group(6) is not None:
            base = m.start(6)
            op.operand_types = [
                Type(t.group(0), base + t.start()) for t in _TENSOR.finditer(m.group(6))
            ]
            op.result_types = [Type(m.group(7), m.start(7))]
        else:
            op.operand_types = [Type(m.group(7), m.start(7))]
        self.pos = m.end()
        return op

    def fast_special(self, name: str, m: re.Match) -> Op:
        """constant, dot_general and reduce-with-applies in their common pretty forms."""
        op = Op(name, m.start(2), results=[m.group(1)], loc=m.group("loc"))
        groups = m.groupdict()
        if name == "stablehlo.constant":
            typ = Type(groups["type"], m.start("type"))
            op.attrs["value"] = DenseAttr(groups["body"], typ, m.start("body") - 6)
            op.result_types = [typ]
        else:
            op.operands = [(groups["a"], m.start("a")), (groups["b"], m.start("b"))]
            op.operand_types = [
                Type(groups["ta"], m.start("ta")),
                Type(groups["tb"], m.start("tb")),
            ]
            op.result_types = [Type(groups["tr"], m.start("tr"))]
            if name == "stablehlo.reduce":
                op.attrs["applies"] = groups["applies"]
                op.attrs["dimensions"] = _int_items(groups["dims"])
            else:
                if groups["lb"] is not None:
                    op.attrs["batching_dims"] = (
                        _int_items(groups["lb"]),
                        _int_items(groups["rb"]),
                    )
                op.attrs["contracting_dims"] = (_int_items(groups["lc"]), _int_items(groups["rc"]))
                if groups["precision"] is not None:
                    op.attrs["precision"] = [w.strip() for w in groups["precision"].split(",")]
        self.pos = m.end()
        return op

    def generic_op(self, name: str, pos: int) -> Op:
        op = Op(name, pos)
        self.expect("(", "'(' opening the operand list")
        if not self.accept(")"):
            while True:
                op.operands.append(self.value("an operand"))
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' in the operand list")
        if self.peek("<{"):
            self.pos += 1
            op.attrs.update(self.attr_dict())
            self.expect(">", "'>' closing the properties")
        if self.peek("({"):
            self.expect("(")
            while True:
                op.regions.append(self.block_in_braces([]))
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' between regions")
        if self.peek("{"):
            op.attrs.update(self.attr_dict())
        self.expect(":", "':' and the op's type")
        op.operand_types, op.result_types = self.function_type()
        op.loc = self.location()
        return op

    # -- pretty forms ----------------------------------------------------------------------
    def pretty_op(self, op: Op) -> None:
        """The common pretty form: items, an optional attribute dictionary, `:` and types."""
        self.pretty_items(op)
        if self.peek("{"):
            op.attrs.update(self.attr_dict())
        typed_value = isinstance(op.attrs.get("value"), DenseAttr)
        no_types = not op.operands and op.name in ("return", "func.return", "stablehlo.return")
        if (typed_value or no_types) and not self.peek(":"):
            op.loc = self.location()
            return
        self.expect(":", f"':' and the type of '{op.name}'")
        op.operand_types, op.result_types = self.function_type()
        self.trailing_regions(op)
        op.loc = self.location()

    def pretty_items(self, op: Op) -> None:
        first = True
        while True:
            self.skip()
            text, p = self.text, self.pos
            if p >= len(text):
                raise self.expected(f"the rest of '{op.name}'")
            c = text[p]
            if c in ":{}" or (c == "l" and self.peek_ident() == "loc"):
                return
            if c == "," and not first:  # an empty operand list: `dynamic_slice %x, , sizes = []`
                self.pos += 1
                continue
            if c == "%":
                op.operands.append(self.value())
                if self.text.startswith("[", self.pos):  # get_tuple_element %t[0]
                    self.pos += 1
                    op.attrs["index"] = self.integer("a tuple index")
                    self.expect("]")
            elif c == "[":
                op.attrs["slice"] = self.slice_spec()
            elif c == "(":
                self.pos += 1
                if not self.accept(")"):
                    self.pretty_items(op)
                    self.expect(")", "')' closing the operand list")
            elif c == "@":
                op.attrs["callee"] = Symbol(self.symbol())
            elif c == '"' and first:
                op.attrs["name"] = self.string()
            elif c == "<":  # sdy.sharding_constraint %x <@mesh, [{"x"}, {}]>
                op.attrs["sharding"] = DialectAttr("sdy.sharding", self.balanced("<", ">"), {})
            elif self.peek_ident() in ("dense", "array"):
                op.attrs["value"] = self.attribute()
            else:
                word = self.ident("an operand, keyword or attribute")
                if self.accept("="):
                    op.attrs[word] = self.pretty_value()
                else:
                    op.keywords.append(word)
            first = False
            end = self.pos
            if not self.accept(","):
                if "\n" in self.text[end : self.pos]:  # the next line is the next op
                    return
                if self.pos < len(self.text) and self.text[self.pos] in "%[(@<":
                    continue
                if self.peek_ident() not in (None, "loc") and not self.peek(":"):
                    continue
                return

    def pretty_value(self) -> Any:
        """A value after `key =` in a pretty form: `[1] x [0]`, `[..]`, an int, a keyword,
        an attribute."""
        self.skip()
        if self.peek("["):
            save = self.pos
            try:
                first = self.attr_list()
            except HloParseError:
                self.pos = save
                return self.slice_or_raw()
            if self.keyword("x"):
                return (first, self.attr_list())
            return first
        if m := self.match(_FLOAT):
            return float(m.group(0))
        if m := self.match(_INT):
            return int(m.group(0), 0)
        return self.attribute()

    def slice_or_raw(self) -> str:
        return self.balanced("[", "]")

    def slice_spec(self) -> list[tuple[int, int, int]]:
        """`[0:4:2, 1:3]` (start:limit[:stride])."""
        self.expect("[")
        out: list[tuple[int, int, int]] = []
        if self.accept("]"):
            return out
        while True:
            start = self.integer("a slice start")
            self.expect(":", "':' in a slice")
            limit = self.integer("a slice limit")
            stride = self.integer("a slice stride") if self.accept(":") else 1
            out.append((start, limit, stride))
            if self.accept("]"):
                return out
            self.expect(",", "',' or ']' in a slice")

    def trailing_regions(self, op: Op) -> None:
        """Regions printed after the types: `cond {..} do {..}` (while), `reducer(..) {..}`."""
        while True:
            word = self.peek_ident()
            if word in ("cond", "do"):
                self.pos += len(word)
                op.regions.append(self.block_in_braces(op.attrs.get("_block_args", [])))
            elif word == "reducer":
                self.pos += len(word)
                pairs: list[list[tuple[str, Type]]] = []
                while self.peek("("):
                    self.expect("(")
                    pair = []
                    while not self.accept(")"):
                        name, _ = self.value("a block argument")
                        self.expect(":")
                        pair.append((name, self.type()))
                        self.location()
                        self.accept(",")
                    pairs.append(pair)
                args = [p[0] for p in pairs] + [p[1] for p in pairs if len(p) > 1]
                op.regions.append(self.block_in_braces(args))
            else:
                return

    def pretty_constant(self, op: Op) -> None:
        if self.peek("{"):
            op.attrs.update(self.attr_dict())
        op.attrs["value"] = self.attribute()
        if isinstance(op.attrs["value"], DenseAttr) and op.attrs["value"].type is not None:
            op.result_types = [op.attrs["value"].type]
        else:
            self.expect(":", "':' and the constant's type")
            op.result_types = [self.type()]
        op.loc = self.location()

    def pretty_reduce(self, op: Op) -> None:
        """`(%x init: %c), ... applies stablehlo.add across dimensions = [0] : types` or
        `... across dimensions = [0] : types reducer(%a: T, %b: T) {...}`."""
        inputs, inits = [], []
        while self.peek("("):
            self.expect("(")
            inputs.append(self.value())
            self.expect("init", "'init:'")
            self.expect(":")
            inits.append(self.value())
            self.expect(")")
            self.accept(",")
        op.operands = inputs + inits
        if self.keyword("applies"):
            op.attrs["applies"] = self.ident("the name of the reduction op")
        if not self.keyword("across"):
            raise self.expected("'across dimensions = [...]'")
        if not self.keyword("dimensions"):
            raise self.expected("'dimensions'")
        self.expect("=")
        op.attrs["dimensions"] = self.attr_list()
        if self.peek("{"):
            op.attrs.update(self.attr_dict())
        self.expect(":", "':' and the types of the reduce")
        op.operand_types, op.result_types = self.function_type()
        self.trailing_regions(op)
        op.loc = self.location()

    def pretty_while(self, op: Op) -> None:
        """`(%iterArg = %c, ...) : T, T cond {...} do {...}`."""
        self.expect("(")
        names: list[str] = []
        if not self.accept(")"):
            while True:
                name, _ = self.value("a loop variable")
                self.expect("=")
                op.operands.append(self.value())
                names.append(name)
                if self.accept(")"):
                    break
                self.expect(",")
        if self.keyword("attributes"):
            op.attrs.update(self.attr_dict())
        self.expect(":", "':' and the loop variable types")
        types, _ = self.function_type() if names else ([], [])
        op.operand_types = types
        op.result_types = list(types)
        op.attrs["_block_args"] = list(zip(names, types, strict=False))
        self.trailing_regions(op)
        del op.attrs["_block_args"]
        op.loc = self.location()

    def pretty_convolution(self, op: Op) -> None:
        """`(%a, %b) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {...}
        {attrs} : types`."""
        self.expect("(")
        op.operands.append(self.value())
        self.expect(",")
        op.operands.append(self.value())
        self.expect(")")
        while True:
            word = self.peek_ident()
            if word == "dim_numbers":
                self.pos += len(word)
                self.expect("=")
                self.skip()
                m = re.compile(r"\[[^\]]*\]x\[[^\]]*\]->\[[^\]]*\]").match(self.text, self.pos)
                if m is None:
                    raise self.expected("dimension numbers such as [b, 0, 1, f]x[0, 1, i, o]->[..]")
                self.pos = m.end()
                op.attrs["dimension_numbers"] = DialectAttr("stablehlo.conv", m.group(0), {})
            elif word == "window":
                self.pos += len(word)
                self.expect("=")
                self.expect("{")
                window: dict[str, Any] = {}
                while not self.accept("}"):
                    key = self.ident("a window field")
                    self.expect("=")
                    window[key] = self.pretty_value()
                    self.accept(",")
                op.attrs["window"] = window
            else:
                break
            self.accept(",")
        if self.peek("{"):
            op.attrs.update(self.attr_dict())
        self.expect(":", "':' and the types of the convolution")
        op.operand_types, op.result_types = self.function_type()
        op.loc = self.location()

    def pretty_manual_computation(self, op: Op) -> None:
        """`(%a, %b) in_shardings=[<@mesh, [..]>, ..] out_shardings=[..] manual_axes={"x"}
        (%arg2: T, %arg3: T) {body} : (T, T) -> T` (shard_map). The shardings are kept as
        `sdy.sharding_per_value` attributes, the manual axes as their names."""
        self.expect("(", "'(' opening the operand list")
        if not self.accept(")"):
            while True:
                op.operands.append(self.value("an operand"))
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' in the operand list")
        for key in ("in_shardings", "out_shardings"):
            if not self.keyword(key):
                raise self.expected(f"'{key}=[...]'")
            self.expect("=")
            body = "[" + self.balanced("[", "]") + "]"
            op.attrs[key] = DialectAttr("sdy.sharding_per_value", body, {})
        if not self.keyword("manual_axes"):
            raise self.expected("'manual_axes={...}'")
        self.expect("=")
        op.attrs["manual_axes"] = re.findall(r'"([^"]+)"', self.balanced("{", "}"))
        self.expect("(", "'(' opening the region's arguments")
        args: list[tuple[str, Type]] = []
        if not self.accept(")"):
            while True:
                name, _ = self.value("a region argument")
                self.expect(":", "':' after the region argument")
                args.append((name, self.type()))
                self.location()
                if self.accept(")"):
                    break
                self.expect(",", "',' or ')' in the region's arguments")
        op.regions.append(self.block_in_braces(args))
        self.expect(":", "':' and the types of sdy.manual_computation")
        op.operand_types, op.result_types = self.function_type()
        op.loc = self.location()


def generic_func(reader: Reader, op: Op) -> Func:
    """A `"func.func"() <{function_type = ..., sym_name = ...}> ({...})` op as a Func."""
    if op.name != "func.func":
        raise reader.error(f"expected 'func.func' in the module, found '{op.name}'", op.pos)
    ftype = op.attrs.get("function_type")
    if not isinstance(ftype, tuple) or not isinstance(op.attrs.get("sym_name"), str):
        raise reader.error("func.func needs function_type and sym_name properties", op.pos)
    inputs, outputs = ftype
    arg_attrs = op.attrs.get("arg_attrs") or [{} for _ in inputs]
    res_attrs = op.attrs.get("res_attrs") or [{} for _ in outputs]
    body = op.regions[0] if op.regions else None
    names = [name for name, _ in body.args] if body else [f"%arg{i}" for i in range(len(inputs))]
    if len(names) != len(inputs):
        raise reader.error("func.func's block arguments do not match its function_type", op.pos)
    args = [(n, t, a) for n, t, a in zip(names, inputs, arg_attrs, strict=False)]
    results = [(t, a) for t, a in zip(outputs, res_attrs, strict=False)]
    visibility = op.attrs.get("sym_visibility", "public")
    return Func(op.attrs["sym_name"], op.pos, visibility, args, results, body, op.loc)


PRETTY_RULES = {
    "stablehlo.constant": Reader.pretty_constant,
    "stablehlo.reduce": Reader.pretty_reduce,
    "stablehlo.while": Reader.pretty_while,
    "stablehlo.convolution": Reader.pretty_convolution,
    "sdy.manual_computation": Reader.pretty_manual_computation,
}


def array_values(body: str) -> tuple:
    """The values of `array<i64: 1, 2>` (the body after the element type)."""
    _, _, rest = body.partition(":")
    items = [s.strip() for s in rest.split(",") if s.strip()]
    out: list = []
    for s in items:
        if s in ("true", "false"):
            out.append(s == "true")
        else:
            try:
                out.append(int(s, 0))
            except ValueError:
                out.append(float(s))
    return tuple(out)


_FIELD = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*")


def dialect_fields(body: str) -> dict[str, Any]:
    """`key = value, ...` inside `#dialect.name<...>`, as a dict (values read as attributes;
    an empty dict when the body is of another form)."""
    if _FIELD.match(body) is None:
        return {}
    reader = Reader(body, None)
    fields: dict[str, Any] = {}
    try:
        while True:
            key = reader.ident()
            reader.expect("=")
            fields[key] = reader.pretty_value()
            if not reader.accept(","):
                break
        reader.skip()
        if reader.pos != len(body):
            return {}
    except HloParseError:
        return {}
    return fields


_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}


def unescape(s: str) -> str:
    if "\\" not in s:
        return s
    out: list[str] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            nxt = s[i + 1]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            if re.fullmatch(r"[0-9A-Fa-f]{2}", s[i + 1 : i + 3]):
                out.append(chr(int(s[i + 1 : i + 3], 16)))
                i += 3
                continue
        out.append(c)
        i += 1
    return "".join(out)


def read_module(text: str, filename: str | None = None) -> Module:
    """The syntax tree of MLIR module text; HloParseError on malformed text."""
    reader = Reader(text, filename)
    try:
        return reader.module()
    except RecursionError:
        raise reader.error(f"nesting deeper than {MAX_DEPTH} levels") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as e:
        raise reader.error(f"cannot read this: {type(e).__name__}: {e}") from None
