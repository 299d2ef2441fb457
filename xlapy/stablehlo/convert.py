"""StableHLO syntax tree -> HloModule.

Each function becomes an HLO computation and each op one or a few HLO instructions, written
as HLO text and read back by xlapy's own HLO parser, so that every attribute means exactly
what it means in HLO text and there is one reader of it. Constants are written elided
(`constant({...})`) and their values, like the op metadata from `loc(...)`, are set on the
parsed instructions afterwards, so large weights and long source paths never go through
text twice.

StableHLO regions may use values defined outside them (a branch of `case` reads the
enclosing function's values); HLO computations may not. A region is therefore converted in
a scope that records each outer value it uses, and the op that owns the region passes those
values in explicitly: as extra loop state for `while`, as a tuple operand per branch for
`case` and `if`. Regions of ops whose computation has a fixed signature (reduce, sort,
scatter, ...) must not capture; that is an error naming the value.

Every line written remembers the position of the op it came from, so an error found by the
HLO parser or the verifier is reported at the StableHLO line and column.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xlapy.errors import HloParseError, VerifierError, XlapyError
from xlapy.ir.attributes import Metadata
from xlapy.ir.literal import Literal
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.shapes import Layout, Shape
from xlapy.ir.text_cursor import error_at
from xlapy.ir.types import PrimitiveType
from xlapy.ir.verifier import verify
from xlapy.stablehlo import mlir
from xlapy.stablehlo.mlir import (
    ArrayAttr,
    AttrDict,
    DenseAttr,
    DialectAttr,
    Op,
    Symbol,
    Type,
    Typed,
)

# -- types -------------------------------------------------------------------------------

_ELEMENT_TYPES = {
    "i1": "pred",
    "bf16": "bf16",
    "f16": "f16",
    "f32": "f32",
    "f64": "f64",
    "f8E4M3FN": "f8e4m3fn",
    "f8E5M2": "f8e5m2",
    "f8E4M3FNUZ": "f8e4m3fnuz",
    "f8E5M2FNUZ": "f8e5m2fnuz",
    "f8E4M3B11FNUZ": "f8e4m3b11fnuz",
    "f8E3M4": "f8e3m4",
    "f8E4M3": "f8e4m3",
    "f8E8M0FNU": "f8e8m0fnu",
    "f4E2M1FN": "f4e2m1fn",
    "complex<f32>": "c64",
    "complex<f64>": "c128",
}
for _bits in (2, 4, 8, 16, 32, 64):
    _ELEMENT_TYPES[f"i{_bits}"] = f"s{_bits}"
    _ELEMENT_TYPES[f"si{_bits}"] = f"s{_bits}"
    _ELEMENT_TYPES[f"ui{_bits}"] = f"u{_bits}"
_SHAPES: dict[str, Shape] = {}


class TypeProblem(Exception):
    """A type xlapy cannot represent; the converter turns it into a positioned error."""


def shape_of(text: str) -> Shape:
    """The HLO shape of an MLIR type: `tensor<2x3xf32>` -> f32[2,3]."""
    shape = _SHAPES.get(text)
    if shape is None:
        shape = _shape_of(text.strip())
        _SHAPES[text] = shape
    return shape


def _shape_of(text: str) -> Shape:
    if text in ("!stablehlo.token", "!mhlo.token"):
        return Shape.token()
    if text.startswith("tuple<"):
        return Shape.tuple(shape_of(t) for t in _split_top(text[6:-1]))
    if "quant." in text:
        raise TypeProblem(f"quantized type '{text}' is not supported")
    if text.startswith("tensor<"):
        body = text[7:-1]
        if "," in body and not body.startswith("complex"):
            body, _, encoding = body.partition(",")
            if "bounds" in encoding:
                raise TypeProblem(f"bounded dynamic type '{text}' is not supported")
        parts = body.split("x")
        dims: list[int] = []
        while len(parts) > 1 and (parts[0].isdigit() or parts[0] == "?"):
            if parts[0] == "?":
                raise TypeProblem(f"dynamic shape '{text}' is not supported (need static shapes)")
            if len(parts[0]) > 19:
                raise TypeProblem(f"dimension {parts[0][:20]}... of '{text[:60]}' is too large")
            dims.append(int(parts.pop(0)))
        element = "x".join(parts)
    else:
        element, dims = text, []
    hlo = _ELEMENT_TYPES.get(element)
    if hlo is None:
        raise TypeProblem(f"unsupported element type '{element}' in '{text}'")
    return Shape.array(PrimitiveType.from_text(hlo), dims)


def _split_top(text: str) -> list[str]:
    out, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "<([{":
            depth += 1
        elif c in ">)]}":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        out.append(text[start:].strip())
    return out


# -- the value of a few attribute forms ---------------------------------------------------


def ival(x: Any) -> Any:
    return x.value if isinstance(x, Typed) else x


def ints(x: Any) -> tuple[int, ...]:
    x = ival(x)
    if x is None:
        return ()
    if isinstance(x, ArrayAttr):
        return tuple(int(v) for v in x.values)
    if isinstance(x, DenseAttr):
        return tuple(int(v) for v in dense_array(x, None).reshape(-1))
    if isinstance(x, list | tuple):
        return tuple(int(ival(v)) for v in x)
    return (int(x),)


def enum_word(x: Any) -> str:
    """`#stablehlo<comparison_direction LT>` -> LT; `LT` -> LT."""
    if isinstance(x, DialectAttr):
        return x.body.split()[-1] if x.body else x.name
    return str(ival(x))


def int_list(values) -> str:
    return "{" + ",".join(str(v) for v in values) + "}"


def dense_array(attr: DenseAttr, shape: Shape | None) -> np.ndarray:
    """The values of `dense<...>` as an array of `shape` (its own type when None)."""
    if shape is None:
        if attr.type is None:
            raise TypeProblem("dense attribute without a type")
        shape = shape_of(attr.type.text)
    dtype = shape.element_type.dtype
    dims = shape.dims
    body = attr.body.strip()
    count = int(np.prod(dims)) if dims else 1
    if body.startswith('"0x') or body.startswith('"0X'):
        raw = bytes.fromhex(body[3:-1])
        width = max(1, np.dtype(dtype).itemsize)
        if shape.element_type.bits < 8:
            arr = np.frombuffer(raw, np.uint8 if _unsigned(shape) else np.int8).astype(dtype)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
        if len(raw) == width and count != 1:
            return np.full(dims, arr[0], dtype=dtype)
        return arr.reshape(dims)
    kind = shape.element_type.kind.value
    tokens = _DENSE_TOKEN.findall(body)
    for t in tokens:
        if len(t) > 40 and kind != "float":  # no integer of any element type is this long
            raise TypeProblem(f"value {t[:20]}... ({len(t)} characters) is out of range")
    if kind == "complex":  # hex parts are bit patterns of the part type (f32 for c64)
        part = np.finfo(dtype).dtype.type
        reals = np.array([_float_token(t, part) for t in tokens])
        if len(reals) % 2:
            raise TypeProblem(f"complex constant with {len(reals)} parts: not (real, imag) pairs")
        values: Any = np.empty(len(reals) // 2, np.complex128)
        values.real, values.imag = reals[0::2], reals[1::2]  # not re + 1j*im: 1j*inf has a nan
    elif kind == "float":
        values = np.array([_float_token(t, dtype) for t in tokens], dtype=np.float64)
    elif kind == "pred":
        values = np.array([t == "true" or (t not in ("false",) and int(t, 0) != 0) for t in tokens])
    else:  # integers: wrap into the type's width, so 2^64 - 1 is a valid ui64
        width = 8 * np.dtype(dtype).itemsize
        unsigned = np.dtype(f"u{np.dtype(dtype).itemsize}")
        wrapped = [int(t, 0) % (1 << width) for t in tokens]
        if shape.element_type.bits < 8:
            values = np.array([int(t, 0) for t in tokens], dtype=np.int64)
        else:
            values = np.array(wrapped, dtype=unsigned).view(dtype)
    arr = np.asarray(values).astype(dtype)
    if arr.size == 1 and count != 1:
        return np.full(dims, arr.reshape(()), dtype=dtype)
    if arr.size != count:
        raise TypeProblem(f"dense constant has {arr.size} values, its type needs {count}")
    return arr.reshape(dims)


_DENSE_TOKEN = re.compile(
    r"0x[0-9A-Fa-f]+|[-+]?(?:inf|nan|[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)|true|false"
)


def _unsigned(shape: Shape) -> bool:
    return shape.element_type.kind.value == "unsigned"


def _float_token(token: str, dtype) -> float:
    if not token.startswith("0x"):
        return float(token)
    bits = int(token, 16)
    width = np.dtype(dtype).itemsize if dtype is not np.float64 else 8
    if len(token) - 2 > 2 * width:  # hex wider than the element type: a double
        width = 8
    utype = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    target = dtype if np.dtype(dtype).itemsize == width else np.float64
    return float(np.array(bits, dtype=utype).view(target))


# -- locations -----------------------------------------------------------------------------


class Locations:
    """Resolves `loc(...)` text (and `#locN` aliases) to op metadata text."""

    _NAME = re.compile(r'^"((?:[^"\\]|\\.)*)"\s*(?:\((.*)\))?$', re.DOTALL)
    _FILE = re.compile(r'^"((?:[^"\\]|\\.)*)":([0-9]+):([0-9]+)')

    def __init__(self, aliases: dict[str, str]):
        self.aliases = aliases
        self.cache: dict[str, Metadata | None] = {}

    def metadata(self, loc: str | None) -> Metadata | None:
        """The op metadata of a location (op_name, source_file, source_line), or None."""
        if not loc:
            return None
        if loc in self.cache:
            return self.cache[loc]
        name, file, line = self.resolve(loc, 0)
        items: list[tuple[str, str | int]] = []
        if name:
            items.append(("op_name", name))
        if file:
            items += [("source_file", file), ("source_line", line)]
        meta = Metadata(tuple(items)) if items else None
        self.cache[loc] = meta
        return meta

    def resolve(self, loc: str, depth: int) -> tuple[str | None, str | None, int]:
        """(op name, source file, source line) of a location; None where it has none."""
        loc = loc.strip()
        if depth > 32:
            return None, None, 0
        if loc.startswith("#"):
            alias = self.aliases.get(loc[1:], "")
            if alias.startswith("loc(") and alias.endswith(")"):
                return self.resolve(alias[4:-1], depth + 1)
            return None, None, 0
        if m := self._FILE.match(loc):
            return None, mlir.unescape(m.group(1)), int(m.group(2))
        if m := self._NAME.match(loc):
            name = mlir.unescape(m.group(1))
            if m.group(2):
                _, file, line = self.resolve(m.group(2), depth + 1)
                return name, file, line
            return name, None, 0
        if loc.startswith("callsite(") and loc.endswith(")"):
            inner = loc[9:-1]
            callee, _, caller = inner.partition(" at ")
            found = self.resolve(callee, depth + 1)
            if found[1] is None:  # the callee names no file: take the caller's
                _, where, line = self.resolve(caller, depth + 1)
                return found[0], where, line
            return found
        if loc.startswith("fused"):
            start = loc.find("[")
            parts = _split_top(loc[start + 1 : loc.rfind("]")]) if start >= 0 else []
            for part in parts:
                found = self.resolve(part, depth + 1)
                if found[0] or found[1]:
                    return found
        return None, None, 0


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


# -- shardings ----------------------------------------------------------------------------

_SDY_SHARDING = re.compile(r"\s*@([A-Za-z0-9_$.\-]+)\s*,\s*\[(.*)\]", re.DOTALL)
_SDY_AXIS = re.compile(r'"([^"]+)"(:\([0-9]+\)[0-9]+)?')
_SDY_MESH_AXIS = re.compile(r'"([^"]+)"\s*=\s*([0-9]+)')
_SDY_UNREDUCED = re.compile(r"\bunreduced\s*=\s*\{([^{}]*)\}")
SHARDING_GROUP_TARGET = "xla.sdy.ShardingGroup"


def hlo_sharding(value: Any, meshes: dict[str, str]) -> str | None:
    """HLO sharding text for `mhlo.sharding` (already HLO text) or a Shardy
    `#sdy.sharding<@mesh, [{"x"}, {}]>` / `#sdy.sharding_per_value<[<...>]>` attribute; None
    for anything else. TypeProblem for Shardy forms HLO text cannot express."""
    if isinstance(value, str):
        return value
    if not isinstance(value, DialectAttr) or not value.name.startswith("sdy.sharding"):
        return None
    body = value.body.strip()
    if value.name == "sdy.sharding_per_value":
        parts = _split_top(body.strip()[1:-1])
        texts = [sdy_sharding(p.strip()[1:-1], meshes) for p in parts]
        return texts[0] if len(texts) == 1 else "{" + ", ".join(texts) + "}"
    return sdy_sharding(body, meshes)


def sdy_sharding(body: str, meshes: dict[str, str], keep: set[str] | None = None) -> str:
    """`@mesh, [{"x"}, {"y", "z"}, {}]` on mesh `["x"=2, "y"=2, "z"=2]` as HLO's iota tile
    assignment: the devices of the mesh, transposed so that the axes each dimension is
    split over come in dimension order and the unused axes last (as replication). Axes
    outside `keep` (when given) are left out: the value is replicated over them."""
    m = _SDY_SHARDING.match(body)
    if m is None:
        raise TypeProblem(f"cannot read the Shardy sharding '{body}'")
    found = _SDY_UNREDUCED.search(body[m.end() :])
    unreduced = _SDY_AXIS.findall(found.group(1)) if found else []
    axes = sdy_mesh_axes(m.group(1), meshes)
    if isinstance(axes, str):
        return axes
    size = dict(axes)
    dims: list[list[str]] = []
    for dim in re.findall(r"\{([^{}]*)\}", m.group(2)):
        names = []
        for axis in _SDY_AXIS.finditer(dim):
            if axis.group(2):
                raise TypeProblem(f"Shardy sub-axis '{axis.group(0)}' is not supported")
            if axis.group(1) not in size:
                raise TypeProblem(f"sharding uses axis '{axis.group(1)}', not in the mesh")
            if keep is None or axis.group(1) in keep:
                names.append(axis.group(1))
        dims.append(names)
    tiles = [int(np.prod([size[a] for a in dim])) if dim else 1 for dim in dims]
    partial: list[str] = []
    for axis, sub in unreduced:
        if sub:
            raise TypeProblem(f"Shardy sub-axis '{axis}{sub}' is not supported")
        if axis not in size:
            raise TypeProblem(f"sharding has unreduced axis '{axis}', not in the mesh")
        if keep is None or axis in keep:
            partial.append(axis)
    if all(t == 1 for t in tiles) and not partial:
        return "{replicated}"
    used = [a for dim in dims for a in dim]
    if set(partial) & set(used):
        raise TypeProblem(f"the sharding '{body.strip()}' both splits and sums over an axis")
    unused = [a for a, _ in axes if a not in used and a not in partial]
    replicas = int(np.prod([size[a] for a in unused])) if unused else 1
    devices = _mesh_devices(axes, used + partial + unused)
    if partial:
        # Partial sums (JAX's P(unreduced={...})): the value is the sum of the pieces the
        # devices along these axes hold; XLA's `last_tile_dims={unreduced}` subgroup.
        tile_dims = [*tiles, int(np.prod([size[a] for a in partial]))]
        kinds = ["unreduced"]
        if replicas > 1:
            tile_dims.append(replicas)
            kinds.append("replicated")
        dims_text = ",".join(map(str, tile_dims))
        return f"{{devices=[{dims_text}]{devices} last_tile_dims={{{', '.join(kinds)}}}}}"
    tile_dims = tiles + ([replicas] if replicas > 1 else [])
    last = " last_tile_dim_replicate" if replicas > 1 else ""
    return f"{{devices=[{','.join(map(str, tile_dims))}]{devices}{last}}}"


def sdy_open_dims(body: str) -> list[int]:
    """The open dimensions (`{?}`, `{"x", ?}`) of a Shardy sharding `@mesh, [...]`."""
    m = _SDY_SHARDING.match(body)
    if m is None:
        return []
    dims = re.findall(r"\{([^{}]*)\}", m.group(2))
    return [i for i, dim in enumerate(dims) if "?" in dim]


def sdy_manual_sharding(mesh: str, meshes: dict[str, str], manual: list[str], rank: int) -> str:
    """The HLO sharding of a value inside a shard_map region over `manual` axes of `mesh`:
    `{manual}` when they are all its axes, else manual over them and replicated over the
    others (`last_tile_dims={manual, replicated}`)."""
    axes = sdy_mesh_axes(mesh, meshes)
    if isinstance(axes, str):
        return "{manual}"
    size = dict(axes)
    for a in manual:
        if a not in size:
            raise TypeProblem(f"manual axis '{a}' is not in the mesh '@{mesh}'")
    rest = [a for a, _ in axes if a not in manual]
    if not rest:
        return "{manual}"
    tile_dims = [1] * rank + [int(np.prod([size[a] for a in manual])) if manual else 1]
    tile_dims.append(int(np.prod([size[a] for a in rest])))
    devices = _mesh_devices(axes, manual + rest)
    dims = ",".join(map(str, tile_dims))
    return f"{{devices=[{dims}]{devices} last_tile_dims={{manual, replicated}}}}"


def sdy_mesh_axes(name: str, meshes: dict[str, str]) -> list[tuple[str, int]] | str:
    """The (axis, size) list of mesh `@name`, or the HLO text of a maximal sharding for a
    one-device mesh with `device_ids`. TypeProblem for an unknown mesh or device ids."""
    mesh_text = meshes.get(name)
    if mesh_text is None:
        raise TypeProblem(f"sharding names an unknown mesh '@{name}'")
    axes = [(a, int(size)) for a, size in _SDY_MESH_AXIS.findall(mesh_text)]
    if "device_ids" in mesh_text:
        ids = re.search(r"device_ids\s*=\s*\[([0-9, ]*)\]", mesh_text)
        if not axes and ids is not None and len(ids.group(1).split(",")) == 1:
            return f"{{maximal device={int(ids.group(1))}}}"
        raise TypeProblem("Shardy meshes with explicit device_ids are not supported")
    return axes


def _mesh_devices(axes: list[tuple[str, int]], order: list[str]) -> str:
    """The iota tile assignment of the mesh's devices with its axes transposed to `order`."""
    index = {a: i for i, (a, _) in enumerate(axes)}
    perm = [index[a] for a in order]
    if perm == sorted(perm):
        return f"<=[{int(np.prod([n for _, n in axes]))}]"
    sizes = ",".join(str(n) for _, n in axes)
    return f"<=[{sizes}]T({','.join(map(str, perm))})"


# -- the converter ------------------------------------------------------------------------


@dataclass
class Line:
    text: str
    pos: int


@dataclass
class Comp:
    """An HLO computation being written."""

    name: str
    lines: list[Line] = field(default_factory=list)
    root: str | None = None


class Scope:
    """The values visible in a region: its own, then (captured on use) its parent's."""

    def __init__(self, conv: Converter, comp: Comp, parent: Scope | None, capture=None):
        self.conv = conv
        self.comp = comp
        self.parent = parent
        self.values: dict[str, tuple[str, Shape]] = {}
        # capture(name, hlo_value_in_parent) -> hlo value in this computation; None: no
        # captures allowed
        self.capture = capture
        self.captured: list[tuple[str, Shape]] = []  # parent-side values, in capture order

    def lookup(self, name: str, pos: int, user: str) -> tuple[str, Shape]:
        found = self.values.get(name)
        if found is not None:
            return found
        if self.parent is None:
            raise self.conv.error(f"use of undefined value '{name}'", pos)
        outer = self.parent.lookup(name, pos, user)
        literal = self.conv.literals.get(outer[0])
        if self.capture is None and literal is not None:
            # A constant (JAX's sort comparators read outer NaN/zero constants) is cheaper
            # and always allowed to rebuild inside the region.
            local = self.conv.constant(self, literal, outer[1])
            self.values[name] = local
            return local
        if self.capture is None:
            raise self.conv.error(
                f"the region of '{user}' uses '{name}', a value defined outside it; "
                "only while, case and if regions may do that",
                pos,
            )
        local = self.capture(outer, pos)
        self.captured.append(outer)
        self.values[name] = local
        return local


Rule = Callable[..., list[tuple[str, Shape]]]
RULES: dict[str, Rule] = {}


def rule(*names: str):
    def register(fn: Rule) -> Rule:
        for name in names:
            RULES[name] = fn
        return fn

    return register


class Converter:
    """Writes the HLO text of a StableHLO module."""

    def __init__(self, module: mlir.Module, text: str, filename: str | None):
        self.module = module
        self.text = text
        self.filename = filename
        self.funcs = {f.name: f for f in module.funcs}
        self.comps: list[Comp] = []
        self.func_comps: dict[str, tuple[Comp, list[Shape]]] = {}
        self.counter = 0
        self.literals: dict[str, np.ndarray] = {}
        # set on the parsed instructions, not written as text: large and slow to read back
        self.metadata: dict[str, Metadata] = {}
        self.locs = Locations(module.aliases)
        self.positions: dict[str, int] = {}  # HLO instruction name -> StableHLO position
        self.op: Op | None = None
        self.global_program = False  # some value carries a sharding: see `header`

    def error(self, message: str, pos: int | None = None) -> HloParseError:
        if pos is None:
            pos = self.op.pos if self.op is not None else 0
        return error_at(self.text, self.filename, message, pos)

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}.{self.counter}"

    def shape(self, typ: Type) -> Shape:
        try:
            return shape_of(typ.text)
        except TypeProblem as e:
            raise self.error(str(e), typ.pos) from None

    # -- writing instructions ------------------------------------------------------------
    def add(
        self,
        scope: Scope,
        opcode: str,
        shape: Shape,
        operands: list[str],
        attrs: str = "",
        *,
        metadata: bool = True,
    ) -> tuple[str, Shape]:
        op = self.op
        name = self.fresh(opcode.replace("-", "_") if opcode != "parameter" else "param")
        if metadata and op is not None and op.loc:
            meta = self.locs.metadata(op.loc)
            if meta is not None:
                self.metadata[name] = meta
        args = ", ".join(operands)
        text = f"{name} = {shape.to_text(False)} {opcode}({args}){attrs}"
        pos = op.pos if op is not None else 0
        scope.comp.lines.append(Line(text, pos))
        self.positions[name] = pos
        return name, shape

    def constant(self, scope: Scope, array: np.ndarray, shape: Shape) -> tuple[str, Shape]:
        value = self.add(scope, "constant", shape, ["{...}"])
        self.literals[value[0]] = np.asarray(array, dtype=shape.element_type.dtype).reshape(
            shape.dims
        )
        return value

    def constant_of(self, value: tuple[str, Shape], what: str) -> np.ndarray:
        """The data of an operand that must be a constant (the static case of a dynamic op)."""
        array = self.literals.get(value[0])
        if array is None:
            raise self.error(f"{what} must be a constant (dynamic shapes are not supported)")
        return array

    def scalar(self, scope: Scope, value, like: Shape) -> tuple[str, Shape]:
        """A constant of `like`'s element type and dims holding `value` everywhere."""
        s = Shape.array(like.element_type, ())
        c = self.constant(scope, np.array(value), s)
        if not like.dims:
            return c
        return self.add(scope, "broadcast", like, [c[0]], ", dimensions={}")

    def tuple_parts(self, scope: Scope, value: tuple[str, Shape]) -> list[tuple[str, Shape]]:
        name, shape = value
        return [
            self.add(scope, "get-tuple-element", s, [name], f", index={i}")
            for i, s in enumerate(shape.tuple_shapes)
        ]

    def joint_result_shape(self, op: Op) -> Shape:
        """The shape of the one HLO value that holds all of `op`'s results: the result's
        own, or the tuple of them (split again by `results`)."""
        shapes = self.result_shapes(op)
        return shapes[0] if len(shapes) == 1 else Shape.tuple(shapes)

    def results(self, scope, value, op: Op) -> list[tuple[str, Shape]]:
        """An op's results from one HLO value: itself, or its tuple's parts when the op has
        several results."""
        if len(op.results) == 1 and len(op.result_types) <= 1:
            return [value]
        return self.tuple_parts(scope, value)

    # -- functions and regions -----------------------------------------------------------
    def func_comp(self, name: str, pos: int) -> tuple[Comp, list[Shape]]:
        """The computation of function `name` (converted on first use)."""
        done = self.func_comps.get(name)
        if done is not None:
            return done
        func = self.funcs.get(name)
        if func is None:
            raise self.error(f"call of unknown function '@{name}'", pos)
        if func.body is None:
            raise self.error(f"function '@{name}' has no body", func.pos)
        comp = Comp(self.fresh(_clean(name)))
        self.func_comps[name] = (comp, [])  # a recursive call finds this and fails later
        scope = Scope(self, comp, None)
        saved, self.op = self.op, None
        for i, (arg, typ, attrs) in enumerate(func.args):
            shape = self.shape(typ)
            sharding = self.sharding(attrs, typ.pos)
            extra = f", sharding={sharding}" if sharding else ""
            pname = self.fresh(_clean(arg[1:]))
            comp.lines.append(
                Line(f"{pname} = {shape.to_text(False)} parameter({i}){extra}", func.pos)
            )
            scope.values[arg] = (pname, shape)
        outs = self.block(scope, func.body, func.pos)
        self.op = saved
        declared = [self.shape(t) for t, _ in func.results]
        self.check_types([s for _, s in outs], declared, func.pos, f"function '@{name}' returns")
        shardings = [self.sharding(attrs, t.pos) for t, attrs in func.results]
        if any(shardings) and len(outs) == 1:  # an identity carrying the output's sharding
            outs = [
                self.add(
                    scope,
                    "custom-call",
                    outs[0][1],
                    [outs[0][0]],
                    f', custom_call_target="Sharding", sharding={shardings[0]}',
                )
            ]
            shardings = []
        tuple_sharding = ""
        if any(shardings):
            texts = ", ".join(s or "{replicated}" for s in shardings)
            tuple_sharding = f", sharding={{{texts}}}"
        self.finish(scope, outs, tuple_always=len(outs) != 1, attrs=tuple_sharding)
        self.comps.append(comp)
        self.func_comps[name] = (comp, declared)
        return comp, declared

    def block(self, scope: Scope, block: mlir.Block, pos: int) -> list[tuple[str, Shape]]:
        """Convert a block's ops; the values its terminator returns."""
        for op in block.ops:
            if op.name in ("return", "func.return", "stablehlo.return", "sdy.return"):
                self.op = op
                return [scope.lookup(n, p, op.name) for n, p in op.operands]
            self.convert_op(scope, op)
        raise self.error("a region does not end in a return", pos)

    def finish(self, scope: Scope, outs, tuple_always: bool, attrs: str = "") -> None:
        if len(outs) == 1 and not tuple_always:
            scope.comp.root = outs[0][0]
            return
        root = self.add(
            scope, "tuple", Shape.tuple(s for _, s in outs), [n for n, _ in outs], attrs
        )
        scope.comp.root = root[0]

    def sharding(self, attrs: dict, pos: int) -> str | None:
        """The HLO sharding text of an `mhlo.sharding` or `sdy.sharding` attribute."""
        value = attrs.get("mhlo.sharding", attrs.get("sdy.sharding"))
        if value is None:
            return None
        try:
            text = hlo_sharding(value, self.module.meshes)
        except TypeProblem as e:
            raise self.error(str(e), pos) from None
        self.global_program = self.global_program or text is not None
        return text

    def region_comp(
        self, parent: Scope, block: mlir.Block, op: Op, arg_shapes: list[Shape], stem: str
    ) -> tuple[Comp, list[tuple[str, Shape]]]:
        """A computation for a region with a fixed signature (one parameter per block
        argument, no captures)."""
        if len(block.args) != len(arg_shapes):
            raise self.error(
                f"the region of '{op.name}' takes {len(block.args)} arguments, "
                f"expected {len(arg_shapes)}",
                op.pos,
            )
        comp = Comp(self.fresh(stem))
        scope = Scope(self, comp, parent, capture=None)
        for i, ((arg, typ), shape) in enumerate(zip(block.args, arg_shapes, strict=True)):
            declared = self.shape(typ)
            if not _same(declared, shape):
                raise self.error(
                    f"argument {arg} of the region of '{op.name}' has type {typ.text}, "
                    f"expected {_mlir_type(shape)}",
                    typ.pos,
                )
            pname = self.fresh("param")
            comp.lines.append(Line(f"{pname} = {declared.to_text(False)} parameter({i})", op.pos))
            scope.values[arg] = (pname, declared)
        saved = self.op
        outs = self.block(scope, block, op.pos)
        self.op = saved
        self.comps.append(comp)
        return comp, outs

    def applied(
        self, parent: Scope, op: Op, scalars: list[Shape], stem: str, region: int = 0
    ) -> str:
        """The name of a reducer-like computation: (acc..., x...) -> acc..., from the op's
        region, or from `applies stablehlo.add` in the pretty form."""
        n = len(scalars)
        if "applies" in op.attrs and not op.regions:
            binop = _ELEMENTWISE.get(op.attrs["applies"].removeprefix("stablehlo."))
            if binop is None or n != 1:
                raise self.error(f"cannot apply '{op.attrs['applies']}' in a reduction")
            comp = Comp(self.fresh(stem))
            s = scalars[0].to_text(False)
            a, b = self.fresh("lhs"), self.fresh("rhs")
            r = self.fresh(binop.replace("-", "_"))
            comp.lines += [
                Line(f"{a} = {s} parameter(0)", op.pos),
                Line(f"{b} = {s} parameter(1)", op.pos),
                Line(f"{r} = {s} {binop}({a}, {b})", op.pos),
            ]
            comp.root = r
            self.comps.append(comp)
            return comp.name
        if len(op.regions) <= region:
            raise self.error(f"'{op.name}' needs a region", op.pos)
        comp, outs = self.region_comp(parent, op.regions[region], op, scalars + scalars, stem)
        self.check_types([s for _, s in outs], scalars, op.pos, f"the region of '{op.name}'")
        self.finish(Scope(self, comp, None), outs, tuple_always=n != 1)
        return comp.name

    def check_types(self, got: list[Shape], want: list[Shape], pos: int, what: str) -> None:
        if len(got) != len(want):
            raise self.error(f"{what} {len(got)} values, expected {len(want)}", pos)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            if not _same(g, w):
                raise self.error(
                    f"{what} {_mlir_type(g)} as value {i}, its type says {_mlir_type(w)}", pos
                )

    # -- ops -----------------------------------------------------------------------------
    def convert_op(self, scope: Scope, op: Op) -> None:
        self.op = op
        fn = RULES.get(op.name)
        if fn is None:
            dialect = op.name.split(".")[0]
            if dialect not in ("stablehlo", "chlo", "func", "check", "mhlo", "sdy"):
                raise self.error(f"unknown dialect '{dialect}' (op '{op.name}')", op.pos)
            raise self.error(f"unsupported op '{op.name}'", op.pos)
        operands = [scope.lookup(n, p, op.name) for n, p in op.operands]
        self.check_operand_types(op, operands)
        try:
            outs = fn(self, op, scope, operands)
        except TypeProblem as e:  # an attribute's values (dense_array...) that do not fit
            raise self.error(str(e), op.pos) from None
        if len(outs) != len(op.results):
            raise self.error(
                f"'{op.name}' gives {len(outs)} result{'s' if len(outs) != 1 else ''}, "
                f"the text names {len(op.results)}",
                op.pos,
            )
        declared = op.result_types
        if declared and len(declared) == len(outs):
            for (_, shape), typ in zip(outs, declared, strict=True):
                want = self.shape(typ)
                if not _same(shape, want):
                    raise self.error(
                        f"'{op.name}' has result type {typ.text}, but its operands give "
                        f"{_mlir_type(shape)}",
                        typ.pos,
                    )
        if len(outs) == 1 and ("mhlo.sharding" in op.attrs or "sdy.sharding" in op.attrs):
            self.attach_sharding(scope, outs[0][0], self.sharding(op.attrs, op.pos))
        for name, value in zip(op.results, outs, strict=True):
            scope.values[name] = value

    def attach_sharding(self, scope: Scope, name: str, sharding: str | None) -> None:
        """Add `sharding=` to the line defining `name` (if it has none yet)."""
        if not sharding:
            return
        for line in reversed(scope.comp.lines):
            if line.text.startswith(f"{name} ="):
                if ", sharding=" not in line.text:
                    line.text += f", sharding={sharding}"
                return

    def check_operand_types(self, op: Op, operands) -> None:
        types = op.operand_types
        if not types or not operands:
            return
        if op.name in _TYPE_IS_RESULT:
            return
        if len(types) == len(operands):
            pairs = list(zip(operands, types, op.operands, strict=True))
        elif len(types) == 1 and not op.result_types:
            pairs = [(v, types[0], o) for v, o in zip(operands, op.operands, strict=True)]
        elif len(types) == 2 and op.name == "stablehlo.select":
            pairs = [(operands[0], types[0], op.operands[0])] + [
                (v, types[1], o) for v, o in zip(operands[1:], op.operands[1:], strict=True)
            ]
        else:
            return
        for (_, shape), typ, (name, pos) in pairs:
            want = self.shape(typ)
            if not _same(shape, want):
                raise self.error(
                    f"type mismatch: '{name}' has type {_mlir_type(shape)}, "
                    f"'{op.name}' declares {typ.text}",
                    pos,
                )

    def result_shape(self, op: Op, operands) -> Shape:
        """The one result type an op declares (`: T`, `(..) -> T` or `: P, T`)."""
        if op.result_types:
            return self.shape(op.result_types[0])
        if op.operand_types:
            return self.shape(op.operand_types[-1])
        if operands:
            return operands[-1][1]
        raise self.error(f"'{op.name}' needs a result type", op.pos)

    def single(
        self,
        scope: Scope,
        op: Op,
        operands,
        opcode: str,
        attrs: str = "",
        *,
        take: int | None = None,
    ) -> list[tuple[str, Shape]]:
        """One HLO instruction for an op with one result, on its operands (the first `take`)."""
        shape = self.result_shape(op, operands)
        return [self.add(scope, opcode, shape, [n for n, _ in operands[:take]], attrs)]

    def result_shapes(self, op: Op) -> list[Shape]:
        return [self.shape(t) for t in op.result_types]

    # -- the module ----------------------------------------------------------------------
    def convert(self) -> HloModule:
        main = self.funcs.get("main")
        if main is None:
            publics = [f for f in self.module.funcs if f.visibility == "public"]
            if len(publics) != 1:
                raise self.error("no public function '@main' to use as the entry", 0)
            main = publics[0]
        entry, _ = self.func_comp(main.name, main.pos)
        header = self.header(main)
        parts = [header, ""]
        line_pos: list[int] = [0, 0]
        for comp in self.comps:
            is_entry = comp is entry
            parts.append(f"{'ENTRY ' if is_entry else ''}{comp.name} {{")
            line_pos.append(0)
            for line in comp.lines:
                root = "ROOT " if line.text.startswith(f"{comp.root} =") else ""
                parts.append(f"  {root}{line.text}")
                line_pos.append(line.pos)
            parts.append("}")
            parts.append("")
            line_pos += [0, 0]
        hlo = "\n".join(parts)
        try:
            module = parse_module(hlo)
        except HloParseError as e:
            pos = line_pos[e.line - 1] if e.line - 1 < len(line_pos) else 0
            raise self.error(f"{e.message}", pos) from None
        literals, metadata = self.literals, self.metadata
        for computation in module.computations:
            for instr in computation.instructions:
                meta = metadata.get(instr.name)
                if meta is not None:
                    instr.attrs["metadata"] = meta
                if instr.opcode is Opcode.CONSTANT and instr.name in literals:
                    instr.literal = Literal(instr.shape, literals[instr.name])
        try:
            verify(module)
        except VerifierError as e:
            raise self.error(f"invalid program: {e}", self.position_in(str(e))) from None
        return module

    def position_in(self, message: str) -> int:
        for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*\.[0-9]+", message):
            if name in self.positions:
                return self.positions[name]
        return 0

    def header(self, main: mlir.Func) -> str:
        attrs = self.module.attrs
        name = _clean(self.module.name or "stablehlo_module")
        items = [f"HloModule {name}"]
        aliases, donors = [], []
        tuple_out = len(main.results) != 1
        for i, (_, _, arg_attrs) in enumerate(main.args):
            out = arg_attrs.get("tf.aliasing_output")
            if out is not None:
                index = f"{{{ival(out)}}}" if tuple_out else "{}"
                aliases.append(f"{index}: ({i}, {{}}, may-alias)")
            if ival(arg_attrs.get("jax.buffer_donor")) is True:
                donors.append(f"({i}, {{}})")
        # XLA's own HLO -> StableHLO translation keeps the aliases as a module attribute
        for entry in ival(attrs.get("mhlo.input_output_alias")) or []:
            alias = entry.get("alias", {})
            kind = str(ival(alias.get("kind", "may_alias"))).replace("_", "-")
            number = ival(alias.get("parameter_number"))
            if kind not in ("may-alias", "must-alias") or not isinstance(number, int):
                raise self.error(f"bad mhlo.input_output_alias entry {entry}", 0)
            leaf = int_list(ints(alias.get("parameter_index")))
            out = int_list(ints(entry.get("output_index")))
            aliases.append(f"{out}: ({number}, {leaf}, {kind})")
        if aliases:
            items.append(f"input_output_alias={{ {', '.join(aliases)} }}")
        if donors:
            items.append(f"buffer_donor={{ {', '.join(donors)} }}")
        layout = self.entry_layout(main)
        if layout is not None:
            items.append(f"entry_computation_layout={{{layout}}}")
        replicas = ival(attrs.get("mhlo.num_replicas", 1))
        partitions = ival(attrs.get("mhlo.num_partitions", 1))
        if replicas != 1:
            items.append(f"replica_count={replicas}")
        frontend = []
        if partitions != 1 and self.global_program:
            # A program with shardings is a global program for `partitions` devices, not
            # one already partitioned (XLA's HLO text keeps `num_partitions=` for those):
            # the count rides along as a frontend attribute (ModuleConfig.spmd_partitions).
            frontend.append(f'mhlo.num_partitions="{partitions}"')
        elif partitions != 1:
            items.append(f"num_partitions={partitions}")
        # Outputs JAX wants in another memory (`out_shardings` with memory_kind=
        # "pinned_host"): ModuleConfig.output_memory_kinds, read by the PJRT plugin.
        kinds = [str(ival(attrs.get("mhlo.memory_kind")) or "device") for _, attrs in main.results]
        if any(kind != "device" for kind in kinds):
            frontend.append(f'xla.output_memory_kinds="{",".join(kinds)}"')
        if frontend:
            items.append(f"frontend_attributes={{{', '.join(frontend)}}}")
        return ", ".join(items)

    def entry_layout(self, main: mlir.Func) -> str | None:
        """`entry_computation_layout` text from the `mhlo.layout_mode` attributes of main's
        arguments and results, as XLA reads them: "default" and "auto" leave the choice to
        the compiler (xlapy picks the default, major-to-minor layout), a minor-to-major list
        such as "{0,1}" fixes that value's layout. None when nothing is fixed."""
        fixed = False

        def one(typ: Type, attrs: dict) -> str:
            nonlocal fixed
            shape = self.shape(typ)
            mode = ival(attrs.get("mhlo.layout_mode"))
            if not shape.is_array:
                return shape.to_text(True)
            if mode is None or mode in ("default", "auto"):
                default = range(len(shape.dims) - 1, -1, -1)
                return shape.to_text(False) + "{" + ",".join(map(str, default)) + "}"
            m = re.fullmatch(r"\{\s*(\d+(?:\s*,\s*\d+)*)?\s*\}", str(mode))
            dims = tuple(int(d) for d in re.findall(r"\d+", str(mode))) if m else None
            if dims is None or sorted(dims) != list(range(len(shape.dims))):
                raise self.error(
                    f"mhlo.layout_mode {mode!r} is not 'default', 'auto' or a minor-to-major "
                    f"permutation of the {len(shape.dims)} dimensions of {typ.text}",
                    typ.pos,
                )
            fixed = True
            return shape.to_text(False) + "{" + ",".join(map(str, dims)) + "}"

        params = [one(typ, attrs) for _, typ, attrs in main.args]
        results = [one(typ, attrs) for typ, attrs in main.results]
        if not fixed:
            return None
        result = results[0] if len(results) == 1 else "(" + ", ".join(results) + ")"
        return f"({', '.join(params)})->{result}"


# ops whose short form `: T` names the result type, not the operands'
_TYPE_IS_RESULT = ("stablehlo.complex", "stablehlo.tuple")


def _same(a: Shape, b: Shape) -> bool:
    if a.is_tuple or b.is_tuple:
        return (
            a.is_tuple
            and b.is_tuple
            and len(a.tuple_shapes) == len(b.tuple_shapes)
            and all(_same(x, y) for x, y in zip(a.tuple_shapes, b.tuple_shapes, strict=True))
        )
    return a.element_type is b.element_type and a.dims == b.dims


_MLIR_ELEMENT = {v: k for k, v in _ELEMENT_TYPES.items() if not k.startswith("si")}


def _mlir_type(shape: Shape) -> str:
    if shape.is_tuple:
        return "tuple<" + ", ".join(_mlir_type(s) for s in shape.tuple_shapes) + ">"
    if not shape.is_array:
        return "!stablehlo.token"
    et = _MLIR_ELEMENT.get(shape.element_type.text, shape.element_type.text)
    return "tensor<" + "".join(f"{d}x" for d in shape.dims) + et + ">"


def _clean(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.\-]", "_", name)
    return cleaned if re.match(r"[A-Za-z_]", cleaned) else f"f_{cleaned}"


# -- the rules -----------------------------------------------------------------------------

_ELEMENTWISE = {
    "abs": "abs",
    "add": "add",
    "and": "and",
    "atan2": "atan2",
    "cbrt": "cbrt",
    "ceil": "ceil",
    "complex": "complex",
    "convert": "convert",
    "cosine": "cosine",
    "count_leading_zeros": "count-leading-zeros",
    "divide": "divide",
    "exponential": "exponential",
    "exponential_minus_one": "exponential-minus-one",
    "floor": "floor",
    "imag": "imag",
    "is_finite": "is-finite",
    "log": "log",
    "log_plus_one": "log-plus-one",
    "logistic": "logistic",
    "maximum": "maximum",
    "minimum": "minimum",
    "multiply": "multiply",
    "negate": "negate",
    "not": "not",
    "or": "or",
    "popcnt": "popcnt",
    "power": "power",
    "real": "real",
    "remainder": "remainder",
    "round_nearest_afz": "round-nearest-afz",
    "round_nearest_even": "round-nearest-even",
    "rsqrt": "rsqrt",
    "select": "select",
    "clamp": "clamp",
    "shift_left": "shift-left",
    "shift_right_arithmetic": "shift-right-arithmetic",
    "shift_right_logical": "shift-right-logical",
    "sign": "sign",
    "sine": "sine",
    "sqrt": "sqrt",
    "subtract": "subtract",
    "tan": "tan",
    "tanh": "tanh",
    "xor": "xor",
    "bitcast_convert": "bitcast-convert",
    "reshape": "reshape",
}


def _simple(opcode: str) -> Rule:
    def convert(conv: Converter, op: Op, scope: Scope, operands):
        return conv.single(scope, op, operands, opcode)

    return convert


for _name, _opcode in _ELEMENTWISE.items():
    RULES[f"stablehlo.{_name}"] = _simple(_opcode)
RULES["chlo.erf"] = _simple("erf")
RULES["chlo.tan"] = _simple("tan")
RULES["stablehlo.dynamic_reshape"] = lambda c, op, s, ops: [
    c.add(s, "reshape", c.result_shape(op, ops), [ops[0][0]])
]


def attr(op: Op, *names: str, default=None):
    for name in names:
        if name in op.attrs:
            return op.attrs[name]
    return default


@rule("stablehlo.constant")
def _constant(conv: Converter, op: Op, scope: Scope, operands):
    value = op.attrs.get("value")
    shape = conv.result_shape(op, operands)
    if not isinstance(value, DenseAttr):
        raise conv.error("a constant needs a dense<...> value", op.pos)
    try:
        array = dense_array(value, shape)
    except (TypeProblem, ValueError, OverflowError) as e:
        raise conv.error(f"bad constant: {e}", value.pos) from None
    if _is_splat(array):
        # one value everywhere (what CHLO decompositions emit: lgamma's ~30 constants of the
        # operand's shape): a broadcast scalar, as XLA's own builders write it, so that the
        # module's text, its fingerprint and the kernels it fuses into do not grow with the
        # shape (a 20,000-element lgamma printed 600,000 numbers on every compile)
        splat = conv.scalar(scope, array.reshape(-1)[0], shape)
        conv.literals[splat[0]] = array
        return [splat]
    return [conv.constant(scope, array, shape)]


def _is_splat(array: np.ndarray) -> bool:
    """Whether `array` has more than one element and all are the same bits."""
    if array.size < 2:
        return False
    rows = np.ascontiguousarray(array).reshape(array.size, 1).view(np.uint8)
    return bool((rows == rows[0]).all())


@rule("stablehlo.compare")
def _compare(conv: Converter, op: Op, scope: Scope, operands):
    words = list(op.keywords)
    direction = attr(op, "comparison_direction")
    ctype = attr(op, "compare_type")
    direction = enum_word(direction) if direction is not None else (words[0] if words else None)
    if ctype is not None:
        ctype = enum_word(ctype)
    elif len(words) > 1:
        ctype = words[1]
    if direction not in ("EQ", "NE", "LT", "LE", "GT", "GE"):
        raise conv.error(f"compare needs a direction (EQ, NE, LT, LE, GT, GE), got {direction}")
    extra = f", direction={direction}"
    if ctype in ("TOTALORDER",):
        extra += f", type={ctype}"
    return conv.single(scope, op, operands, "compare", extra)


@rule("stablehlo.broadcast_in_dim", "stablehlo.dynamic_broadcast_in_dim")
def _broadcast(conv: Converter, op: Op, scope: Scope, operands):
    dims = ints(attr(op, "dims", "broadcast_dimensions"))
    shape = conv.result_shape(op, operands)
    x, xs = operands[0]
    if len(dims) != len(xs.dims) or any(d >= len(shape.dims) for d in dims):
        raise conv.error(f"broadcast_in_dim dims {list(dims)} do not fit {_mlir_type(xs)}")
    keep = [i for i, d in enumerate(dims) if xs.dims[i] == shape.dims[d]]
    if len(keep) != len(dims):  # size-1 dimensions that expand: drop them first (HLO can't)
        if any(xs.dims[i] != 1 for i in range(len(dims)) if i not in keep):
            raise conv.error(
                f"broadcast_in_dim cannot expand {_mlir_type(xs)} to {_mlir_type(shape)}"
            )
        reshaped = Shape.array(xs.element_type, [xs.dims[i] for i in keep])
        x = conv.add(scope, "reshape", reshaped, [x])[0]
        dims = tuple(dims[i] for i in keep)
    return [conv.add(scope, "broadcast", shape, [x], f", dimensions={int_list(dims)}")]


@rule("stablehlo.transpose")
def _transpose(conv: Converter, op: Op, scope: Scope, operands):
    dims = ints(attr(op, "dims", "permutation"))
    return conv.single(
        scope, op, operands, "transpose", take=1, attrs=f", dimensions={int_list(dims)}"
    )


@rule("stablehlo.reverse")
def _reverse(conv: Converter, op: Op, scope: Scope, operands):
    dims = ints(attr(op, "dims", "dimensions"))
    return conv.single(
        scope, op, operands, "reverse", take=1, attrs=f", dimensions={int_list(dims)}"
    )


@rule("stablehlo.concatenate")
def _concatenate(conv: Converter, op: Op, scope: Scope, operands):
    dim = ints(attr(op, "dim", "dimension"))
    return conv.single(scope, op, operands, "concatenate", f", dimensions={int_list(dim)}")


@rule("stablehlo.iota", "stablehlo.dynamic_iota")
def _iota(conv: Converter, op: Op, scope: Scope, operands):
    dim = ints(attr(op, "dim", "iota_dimension"))[0]
    shape = conv.result_shape(op, [])
    return [conv.add(scope, "iota", shape, [], f", iota_dimension={dim}")]


@rule("stablehlo.slice")
def _slice(conv: Converter, op: Op, scope: Scope, operands):
    spec = op.attrs.get("slice")
    if spec is None:
        starts = ints(attr(op, "start_indices"))
        limits = ints(attr(op, "limit_indices"))
        strides = ints(attr(op, "strides")) or (1,) * len(starts)
        spec = list(zip(starts, limits, strides, strict=False))
    text = ", ".join(f"[{a}:{b}:{c}]" for a, b, c in spec)
    return conv.single(scope, op, operands, "slice", take=1, attrs=f", slice={{{text}}}")


@rule("stablehlo.dynamic_slice")
def _dynamic_slice(conv: Converter, op: Op, scope: Scope, operands):
    sizes = ints(attr(op, "sizes", "slice_sizes"))
    shape = conv.result_shape(op, operands)
    names = [n for n, _ in operands]
    return [
        conv.add(scope, "dynamic-slice", shape, names, f", dynamic_slice_sizes={int_list(sizes)}")
    ]


@rule("stablehlo.dynamic_update_slice")
def _dynamic_update_slice(conv: Converter, op: Op, scope: Scope, operands):
    return conv.single(scope, op, operands, "dynamic-update-slice")


@rule("stablehlo.pad", "stablehlo.dynamic_pad")
def _pad(conv: Converter, op: Op, scope: Scope, operands):
    if op.name == "stablehlo.dynamic_pad":
        low, high, interior = (
            tuple(int(v) for v in conv.constant_of(x, name).reshape(-1))
            for x, name in zip(operands[2:5], ("low", "high", "interior"), strict=True)
        )
        operands = operands[:2]
    else:
        low = ints(attr(op, "low", "edge_padding_low"))
        high = ints(attr(op, "high", "edge_padding_high"))
        interior = ints(attr(op, "interior", "interior_padding")) or (0,) * len(low)
    text = "x".join(f"{a}_{b}_{c}" for a, b, c in zip(low, high, interior, strict=False))
    return conv.single(scope, op, operands, "pad", f", padding={text or '{}'}")


_PRECISION = {"DEFAULT": "default", "HIGH": "high", "HIGHEST": "highest"}


def _precision(op: Op) -> str:
    values = attr(op, "precision", "precision_config")
    if not values:
        return ""
    words = [_PRECISION.get(enum_word(v), "default") for v in values]
    if all(w == "default" for w in words):
        return ""
    return f", operand_precision={{{','.join(words)}}}"


@rule("stablehlo.dot_general")
def _dot_general(conv: Converter, op: Op, scope: Scope, operands):
    numbers = attr(op, "dot_dimension_numbers")
    if isinstance(numbers, DialectAttr):
        f = numbers.fields
        lb, rb = ints(f.get("lhs_batching_dimensions")), ints(f.get("rhs_batching_dimensions"))
        lc, rc = (
            ints(f.get("lhs_contracting_dimensions")),
            ints(f.get("rhs_contracting_dimensions")),
        )
    else:
        lb, rb = (ints(x) for x in attr(op, "batching_dims", default=([], [])))
        lc, rc = (ints(x) for x in attr(op, "contracting_dims", default=([], [])))
    text = ""
    if lb or rb:
        text += f", lhs_batch_dims={int_list(lb)}, rhs_batch_dims={int_list(rb)}"
    text += f", lhs_contracting_dims={int_list(lc)}, rhs_contracting_dims={int_list(rc)}"
    return conv.single(scope, op, operands, "dot", text + _precision(op))


@rule("stablehlo.dot")
def _dot(conv: Converter, op: Op, scope: Scope, operands):
    lhs_rank = len(operands[0][1].dims)
    text = f", lhs_contracting_dims={{{lhs_rank - 1}}}, rhs_contracting_dims={{0}}"
    return conv.single(scope, op, operands, "dot", text + _precision(op))


@rule("stablehlo.get_tuple_element")
def _gte(conv: Converter, op: Op, scope: Scope, operands):
    index = ival(attr(op, "index"))
    parts = operands[0][1].tuple_shapes
    if not isinstance(index, int) or not 0 <= index < len(parts):
        raise conv.error(f"get_tuple_element index {index} is out of range", op.pos)
    return [
        conv.add(scope, "get-tuple-element", parts[index], [operands[0][0]], f", index={index}")
    ]


@rule("stablehlo.tuple")
def _tuple(conv: Converter, op: Op, scope: Scope, operands):
    shape = Shape.tuple(s for _, s in operands)
    return [conv.add(scope, "tuple", shape, [n for n, _ in operands])]


@rule("mhlo.copy")
def _copy(conv: Converter, op: Op, scope: Scope, operands):
    """mhlo.copy, what XLA's own HLO -> StableHLO translation writes for an HLO copy (its
    result_layout means nothing here: the imported module's layouts are the defaults)."""
    name, shape = operands[0]
    return [conv.add(scope, "copy", shape, [name])]


@rule("stablehlo.optimization_barrier")
def _barrier(conv: Converter, op: Op, scope: Scope, operands):
    shape = Shape.tuple(s for _, s in operands)
    packed = conv.add(scope, "tuple", shape, [n for n, _ in operands])
    value = conv.add(scope, "opt-barrier", shape, [packed[0]])
    return conv.tuple_parts(scope, value)


@rule("stablehlo.reduce_precision")
def _reduce_precision(conv: Converter, op: Op, scope: Scope, operands):
    fmt = attr(op, "format")
    if fmt is not None:
        m = re.fullmatch(r"e([0-9]+)m([0-9]+)", str(fmt))
        if m is None:
            raise conv.error(f"bad reduce_precision format '{fmt}'", op.pos)
        e, m_ = int(m.group(1)), int(m.group(2))
    else:
        e, m_ = ival(attr(op, "exponent_bits")), ival(attr(op, "mantissa_bits"))
    return conv.single(
        scope,
        op,
        operands,
        "reduce-precision",
        take=1,
        attrs=f", exponent_bits={e}, mantissa_bits={m_}",
    )


_RNG_ALGORITHMS = {"DEFAULT": "rng_default", "THREE_FRY": "rng_three_fry", "PHILOX": "rng_philox"}


@rule("stablehlo.rng_bit_generator")
def _rng_bit_generator(conv: Converter, op: Op, scope: Scope, operands):
    algorithm = enum_word(attr(op, "algorithm", "rng_algorithm", default="DEFAULT"))
    shapes = conv.result_shapes(op)
    value = conv.add(
        scope,
        "rng-bit-generator",
        Shape.tuple(shapes),
        [operands[0][0]],
        f", algorithm={_RNG_ALGORITHMS.get(algorithm, 'rng_default')}",
    )
    return conv.tuple_parts(scope, value)


@rule("stablehlo.rng")
def _rng(conv: Converter, op: Op, scope: Scope, operands):
    dist = enum_word(attr(op, "distribution", "rng_distribution", default="UNIFORM"))
    return conv.single(
        scope, op, operands, "rng", take=2, attrs=f", distribution=rng_{dist.lower()}"
    )


@rule("stablehlo.cholesky")
def _cholesky(conv: Converter, op: Op, scope: Scope, operands):
    lower = bool(ival(attr(op, "lower", default=False)))
    return conv.single(
        scope, op, operands, "cholesky", take=1, attrs=f", lower={str(lower).lower()}"
    )


@rule("stablehlo.triangular_solve")
def _triangular_solve(conv: Converter, op: Op, scope: Scope, operands):
    flags = ", ".join(
        f"{key}={str(bool(ival(attr(op, key, default=False)))).lower()}"
        for key in ("left_side", "lower", "unit_diagonal")
    )
    transpose = enum_word(attr(op, "transpose_a", default="NO_TRANSPOSE"))
    return conv.single(
        scope, op, operands, "triangular-solve", f", {flags}, transpose_a={transpose}"
    )


@rule("stablehlo.fft")
def _fft(conv: Converter, op: Op, scope: Scope, operands):
    kind = enum_word(attr(op, "type", "fft_type"))
    length = ints(attr(op, "length", "fft_length"))
    return conv.single(
        scope,
        op,
        operands,
        "fft",
        take=1,
        attrs=f", fft_type={kind}, fft_length={int_list(length)}",
    )


@rule("stablehlo.replica_id", "stablehlo.partition_id")
def _ids(conv: Converter, op: Op, scope: Scope, operands):
    opcode = "replica-id" if op.name.endswith("replica_id") else "partition-id"
    return [conv.add(scope, opcode, conv.result_shape(op, []), [])]


@rule("stablehlo.after_all")
def _after_all(conv: Converter, op: Op, scope: Scope, operands):
    return [conv.add(scope, "after-all", Shape.token(), [n for n, _ in operands])]


@rule("stablehlo.get_dimension_size")
def _get_dimension_size(conv: Converter, op: Op, scope: Scope, operands):
    dim = ints(attr(op, "dimension", "dim"))
    return conv.single(
        scope, op, operands, "get-dimension-size", take=1, attrs=f", dimensions={int_list(dim)}"
    )


@rule(
    "stablehlo.batch_norm_inference", "stablehlo.batch_norm_training", "stablehlo.batch_norm_grad"
)
def _batch_norm(conv: Converter, op: Op, scope: Scope, operands):
    opcode = op.name.removeprefix("stablehlo.").replace("_", "-")
    eps = float(ival(attr(op, "epsilon")))
    index = ival(attr(op, "feature_index"))
    shapes = conv.result_shapes(op) or [operands[0][1]]
    shape = shapes[0] if len(shapes) == 1 else Shape.tuple(shapes)
    value = conv.add(
        scope,
        opcode,
        shape,
        [n for n, _ in operands],
        f", epsilon={eps!r}, feature_index={index}",
    )
    return conv.results(scope, value, op)


@rule("stablehlo.gather", "stablehlo.dynamic_gather")
def _gather(conv: Converter, op: Op, scope: Scope, operands):
    numbers = attr(op, "dimension_numbers")
    f = numbers.fields if isinstance(numbers, DialectAttr) else {}
    text = ""
    for key, hlo in (
        ("offset_dims", "offset_dims"),
        ("collapsed_slice_dims", "collapsed_slice_dims"),
        ("operand_batching_dims", "operand_batching_dims"),
        ("start_indices_batching_dims", "start_indices_batching_dims"),
        ("start_index_map", "start_index_map"),
    ):
        if key in f or key in ("offset_dims", "collapsed_slice_dims", "start_index_map"):
            text += f", {hlo}={int_list(ints(f.get(key)))}"
    text += f", index_vector_dim={ival(f.get('index_vector_dim', 0))}"
    if op.name == "stablehlo.dynamic_gather":
        sizes = tuple(int(v) for v in conv.constant_of(operands[2], "slice_sizes").reshape(-1))
    else:
        sizes = ints(attr(op, "slice_sizes"))
    text += f", slice_sizes={int_list(sizes)}"
    if ival(attr(op, "indices_are_sorted", default=False)) is True:
        text += ", indices_are_sorted=true"
    return conv.single(scope, op, operands, "gather", take=2, attrs=text)


@rule("stablehlo.scatter")
def _scatter(conv: Converter, op: Op, scope: Scope, operands):
    numbers = attr(op, "scatter_dimension_numbers")
    f = numbers.fields if isinstance(numbers, DialectAttr) else {}
    n = (len(operands) - 1) // 2
    text = ""
    for key in (
        "update_window_dims",
        "inserted_window_dims",
        "input_batching_dims",
        "scatter_indices_batching_dims",
        "scatter_dims_to_operand_dims",
    ):
        if key in f or key in (
            "update_window_dims",
            "inserted_window_dims",
            "scatter_dims_to_operand_dims",
        ):
            text += f", {key}={int_list(ints(f.get(key)))}"
    text += f", index_vector_dim={ival(f.get('index_vector_dim', 0))}"
    for key in ("indices_are_sorted", "unique_indices"):
        if ival(attr(op, key, default=False)) is True:
            text += f", {key}=true"
    scalars = [Shape.array(s.element_type, ()) for _, s in operands[:n]]
    to_apply = conv.applied(scope, op, scalars, "scatter_region")
    shapes = conv.result_shapes(op) or [s for _, s in operands[:n]]
    shape = shapes[0] if len(shapes) == 1 else Shape.tuple(shapes)
    value = conv.add(
        scope, "scatter", shape, [x for x, _ in operands], f"{text}, to_apply={to_apply}"
    )
    return conv.results(scope, value, op)


def _variadic_reduction(conv: Converter, op: Op, scope: Scope, operands, opcode: str, attrs):
    """reduce / reduce-window: inputs then as many init values, a region over their scalars;
    `attrs` is the HLO attribute text before `to_apply`."""
    scalars = [s for _, s in operands[len(operands) // 2 :]]
    to_apply = conv.applied(scope, op, scalars, "region")
    shape = conv.joint_result_shape(op)
    args = [x for x, _ in operands]
    value = conv.add(scope, opcode, shape, args, f"{attrs}, to_apply={to_apply}")
    return conv.results(scope, value, op)


@rule("stablehlo.reduce")
def _reduce(conv: Converter, op: Op, scope: Scope, operands):
    dims = int_list(ints(attr(op, "dimensions")))
    return _variadic_reduction(conv, op, scope, operands, "reduce", f", dimensions={dims}")


def _window(op: Op, rank: int, size: tuple[int, ...]) -> str:
    """HLO `window={...}` from reduce_window / select_and_scatter / convolution attributes."""
    window = op.attrs.get("window")
    w: dict = window if isinstance(window, dict) else {}
    strides = ints(w.get("stride", attr(op, "window_strides"))) or (1,) * rank
    pad_attr = w.get("pad", attr(op, "padding"))
    if isinstance(pad_attr, DenseAttr):
        pads = [tuple(int(v) for v in row) for row in dense_array(pad_attr, None).reshape(-1, 2)]
    elif pad_attr:
        pads = [tuple(ints(row)) for row in pad_attr]
    else:
        pads = [(0, 0)] * rank
    lhs = ints(w.get("lhs_dilate", attr(op, "base_dilations", "lhs_dilation"))) or (1,) * rank
    rhs = ints(w.get("rhs_dilate", attr(op, "window_dilations", "rhs_dilation"))) or (1,) * rank
    reversal = w.get("reverse", attr(op, "window_reversal"))
    if rank == 0:
        return ""
    text = "size=" + "x".join(map(str, size))
    text += " stride=" + "x".join(map(str, strides))
    text += " pad=" + "x".join(f"{a}_{b}" for a, b in pads)
    if any(d != 1 for d in lhs):
        text += " lhs_dilate=" + "x".join(map(str, lhs))
    if any(d != 1 for d in rhs):
        text += " rhs_dilate=" + "x".join(map(str, rhs))
    if reversal is not None:
        flags = [
            bool(ival(v))
            for v in (reversal.values if isinstance(reversal, ArrayAttr) else reversal)
        ]
        if any(flags):
            text += " rhs_reversal=" + "x".join("1" if v else "0" for v in flags)
    return f", window={{{text}}}"


@rule("stablehlo.reduce_window")
def _reduce_window(conv: Converter, op: Op, scope: Scope, operands):
    size = ints(attr(op, "window_dimensions"))
    window = _window(op, len(size), size)
    return _variadic_reduction(conv, op, scope, operands, "reduce-window", window)


@rule("stablehlo.select_and_scatter")
def _select_and_scatter(conv: Converter, op: Op, scope: Scope, operands):
    size = ints(attr(op, "window_dimensions"))
    scalar = Shape.array(operands[0][1].element_type, ())
    if len(op.regions) != 2:
        raise conv.error(f"select_and_scatter takes 2 regions, found {len(op.regions)}", op.pos)
    select, outs = conv.region_comp(scope, op.regions[0], op, [scalar, scalar], "select")
    conv.check_types(
        [s for _, s in outs],
        [Shape.array(PrimitiveType.PRED, ())],
        op.pos,
        "the select region returns",
    )
    conv.finish(Scope(conv, select, None), outs, tuple_always=False)
    src = Shape.array(operands[1][1].element_type, ())
    scatter = conv.applied(scope, op, [src], "scatter", region=1)
    return conv.single(
        scope,
        op,
        operands,
        "select-and-scatter",
        f"{_window(op, len(size), size)}, select={select.name}, scatter={scatter}",
    )


@rule("stablehlo.sort")
def _sort(conv: Converter, op: Op, scope: Scope, operands):
    dim = ival(attr(op, "dimension", default=-1))
    if dim < 0:
        dim += len(operands[0][1].dims)
    stable = ival(attr(op, "is_stable", default=False)) is True
    scalars = [Shape.array(s.element_type, ()) for _, s in operands]
    args = [s for s in scalars for _ in (0, 1)]
    if not op.regions:
        raise conv.error("sort needs a comparator region", op.pos)
    comp, outs = conv.region_comp(scope, op.regions[0], op, args, "compare")
    conv.check_types(
        [s for _, s in outs],
        [Shape.array(PrimitiveType.PRED, ())],
        op.pos,
        "the comparator returns",
    )
    conv.finish(Scope(conv, comp, None), outs, tuple_always=False)
    shapes = [s for _, s in operands]
    shape = shapes[0] if len(shapes) == 1 else Shape.tuple(shapes)
    text = f", dimensions={{{dim}}}" + (", is_stable=true" if stable else "")
    value = conv.add(
        scope, "sort", shape, [x for x, _ in operands], f"{text}, to_apply={comp.name}"
    )
    return conv.results(scope, value, op)


@rule("stablehlo.map")
def _map(conv: Converter, op: Op, scope: Scope, operands):
    dims = ints(attr(op, "dimensions"))
    scalars = [Shape.array(s.element_type, ()) for _, s in operands]
    comp, outs = conv.region_comp(scope, op.regions[0], op, scalars, "map")
    conv.finish(Scope(conv, comp, None), outs, tuple_always=False)
    return conv.single(
        scope, op, operands, "map", f", dimensions={int_list(dims)}, to_apply={comp.name}"
    )


@rule("stablehlo.while")
def _while(conv: Converter, op: Op, scope: Scope, operands):
    if len(op.regions) != 2:
        raise conv.error(f"while takes 2 regions (cond, body), found {len(op.regions)}", op.pos)
    n = len(operands)
    state = [s for _, s in operands]
    comps: list[Comp] = []
    scopes: list[Scope] = []
    captured: list[tuple[str, Shape]] = []  # parent values, shared by cond and body
    params: list[str] = []

    for k, stem in enumerate(("cond", "body")):
        block = op.regions[k]
        if len(block.args) != n:
            raise conv.error(
                f"the {stem} region of while takes {len(block.args)} arguments, expected {n}",
                op.pos,
            )
        comp = Comp(conv.fresh(f"while_{stem}"))
        param = conv.fresh("state")
        params.append(param)
        region_scope = Scope(conv, comp, scope)
        for i, ((arg, _), shape) in enumerate(zip(block.args, state, strict=True)):
            region_scope.values[arg] = conv.add(
                region_scope, "get-tuple-element", shape, [param], f", index={i}"
            )

        def capture(outer, pos, region_scope=region_scope, param=param):
            for j, (name, _) in enumerate(captured):
                if name == outer[0]:
                    return conv.add(
                        region_scope, "get-tuple-element", outer[1], [param], f", index={n + j}"
                    )
            captured.append(outer)
            return conv.add(
                region_scope,
                "get-tuple-element",
                outer[1],
                [param],
                f", index={n + len(captured) - 1}",
            )

        region_scope.capture = capture
        comps.append(comp)
        scopes.append(region_scope)
    cond_out = conv.block(scopes[0], op.regions[0], op.pos)
    conv.check_types(
        [s for _, s in cond_out],
        [Shape.array(PrimitiveType.PRED, ())],
        op.pos,
        "the cond region of while returns",
    )
    conv.finish(scopes[0], cond_out, tuple_always=False)
    body_out = conv.block(scopes[1], op.regions[1], op.pos)
    conv.check_types([s for _, s in body_out], state, op.pos, "the body region of while returns")
    conv.op = op
    # pass every captured value through the body unchanged
    body_scope = scopes[1]
    passthrough = []
    for j, (_, shape) in enumerate(captured):
        passthrough.append(
            conv.add(body_scope, "get-tuple-element", shape, [params[1]], f", index={n + j}")
        )
    full = Shape.tuple(state + [s for _, s in captured])
    conv.finish(body_scope, body_out + passthrough, tuple_always=True)
    for comp, param in zip(comps, params, strict=True):
        comp.lines.insert(0, Line(f"{param} = {full.to_text(False)} parameter(0)", op.pos))
        conv.comps.append(comp)
    init = conv.add(scope, "tuple", full, [x for x, _ in operands] + [x for x, _ in captured])
    loop = conv.add(
        scope, "while", full, [init[0]], f", condition={comps[0].name}, body={comps[1].name}"
    )
    return [
        conv.add(scope, "get-tuple-element", s, [loop[0]], f", index={i}")
        for i, s in enumerate(state)
    ]


def _branches(conv: Converter, op: Op, scope: Scope, stem: str):
    """One computation per region, each taking a tuple of the values it captures; returns
    (computation names, the tuple operand of each)."""
    results = conv.result_shapes(op)
    names, args = [], []
    for k, block in enumerate(op.regions):
        if block.args:
            raise conv.error(f"the branches of '{op.name}' take no arguments", op.pos)
        comp = Comp(conv.fresh(f"{stem}_{k}"))
        param = conv.fresh("captures")
        region_scope = Scope(conv, comp, scope)
        captured: list[tuple[str, Shape]] = []

        def capture(outer, pos, region_scope=region_scope, param=param, captured=captured):
            captured.append(outer)
            return conv.add(
                region_scope,
                "get-tuple-element",
                outer[1],
                [param],
                f", index={len(captured) - 1}",
            )

        region_scope.capture = capture
        outs = conv.block(region_scope, block, op.pos)
        conv.check_types(
            [s for _, s in outs], results, op.pos, f"branch {k} of '{op.name}' returns"
        )
        conv.finish(region_scope, outs, tuple_always=len(results) != 1)
        conv.op = op
        packed = Shape.tuple(s for _, s in captured)
        comp.lines.insert(0, Line(f"{param} = {packed.to_text(False)} parameter(0)", op.pos))
        conv.comps.append(comp)
        names.append(comp.name)
        args.append(conv.add(scope, "tuple", packed, [x for x, _ in captured])[0])
    shape = results[0] if len(results) == 1 else Shape.tuple(results)
    return names, args, shape


@rule("stablehlo.case")
def _case(conv: Converter, op: Op, scope: Scope, operands):
    names, args, shape = _branches(conv, op, scope, "branch")
    value = conv.add(
        scope,
        "conditional",
        shape,
        [operands[0][0], *args],
        f", branch_computations={{{', '.join(names)}}}",
    )
    return conv.results(scope, value, op)


@rule("stablehlo.if")
def _if(conv: Converter, op: Op, scope: Scope, operands):
    if len(op.regions) != 2:
        raise conv.error(f"if takes 2 regions, found {len(op.regions)}", op.pos)
    names, args, shape = _branches(conv, op, scope, "if")
    value = conv.add(
        scope,
        "conditional",
        shape,
        [operands[0][0], *args],
        f", true_computation={names[0]}, false_computation={names[1]}",
    )
    return conv.results(scope, value, op)


@rule("func.call", "call")
def _call(conv: Converter, op: Op, scope: Scope, operands):
    callee = attr(op, "callee")
    if not isinstance(callee, Symbol):
        raise conv.error("call needs a callee such as @f", op.pos)
    return _call_function(conv, op, scope, operands, callee.name)


def _call_function(conv, op, scope, operands, name):
    comp, declared = conv.func_comp(name, op.pos)
    conv.op = op
    func = conv.funcs[name]
    params = [conv.shape(t) for _, t, _ in func.args]
    conv.check_types([s for _, s in operands], params, op.pos, f"the call of '@{name}' passes")
    shape = declared[0] if len(declared) == 1 else Shape.tuple(declared)
    value = conv.add(scope, "call", shape, [x for x, _ in operands], f", to_apply={comp.name}")
    if len(declared) == 1:
        return [value]
    return conv.tuple_parts(scope, value)


@rule("stablehlo.composite")
def _composite(conv: Converter, op: Op, scope: Scope, operands):
    callee = attr(op, "decomposition")
    if not isinstance(callee, Symbol):
        raise conv.error("composite needs a decomposition = @f", op.pos)
    return _call_function(conv, op, scope, operands, callee.name)


_API_VERSIONS = {
    0: "API_VERSION_UNSPECIFIED",
    1: "API_VERSION_ORIGINAL",
    2: "API_VERSION_STATUS_RETURNING",
    3: "API_VERSION_STATUS_RETURNING_UNIFIED",
    4: "API_VERSION_TYPED_FFI",
}


@rule("stablehlo.custom_call")
def _custom_call(conv: Converter, op: Op, scope: Scope, operands):
    target = attr(op, "call_target_name", "callee")
    target = target.name if isinstance(target, Symbol) else target
    if not isinstance(target, str):
        raise conv.error("custom_call needs a call_target_name", op.pos)
    if target == "mhlo.topk":
        return _mhlo_topk(conv, op, scope, operands)
    text = f", custom_call_target={_quote(target)}"
    has_side_effect = ival(attr(op, "has_side_effect", default=False)) is True
    if target.startswith("check."):
        has_side_effect = True
    if has_side_effect:
        text += ", custom_call_has_side_effect=true"
    config = attr(op, "mhlo.backend_config", "backend_config")
    if isinstance(config, AttrDict):
        text += f", backend_config={config.text}"
    elif isinstance(config, str) and config:
        text += f", backend_config={_quote(config)}"
    version = ival(attr(op, "api_version", default=None))
    if version is not None:
        text += f", api_version={_API_VERSIONS.get(int(version), 'API_VERSION_ORIGINAL')}"
    aliases = attr(op, "output_operand_aliases", default=[])
    if aliases:
        items = []
        for a in aliases:
            f = a.fields if isinstance(a, DialectAttr) else {}
            out = ",".join(map(str, ints(f.get("output_tuple_indices"))))
            opnd = ",".join(map(str, ints(f.get("operand_tuple_indices"))))
            items.append(f"{{{out}}}: ({ival(f.get('operand_index', 0))}, {{{opnd}}})")
        text += f", output_to_operand_aliasing={{{', '.join(items)}}}"
    called = attr(op, "called_computations", default=[])
    if called:
        names = [conv.func_comp(c.name, op.pos)[0].name for c in called if isinstance(c, Symbol)]
        conv.op = op
        text += f", called_computations={{{', '.join(names)}}}"
    sharding = conv.sharding(op.attrs, op.pos)
    if sharding:
        text += f", sharding={sharding}"
    # Declared operand layouts (JAX's LAPACK calls: column-major matrices) become XLA's
    # operand_layout_constraints, as in the HLO text JAX prints: a handler in C receives
    # its operands in them. JAX's batch count for its LAPACK calls is kept too.
    declared = _declared_layouts(attr(op, "operand_layouts"), [s for _, s in operands])
    if declared is not None:
        text += f", operand_layout_constraints={{{', '.join(map(str, declared))}}}"
    frontend = attr(op, "mhlo.frontend_attributes")
    items = []
    if isinstance(frontend, AttrDict):
        items = [f"{k}={_quote(str(ival(v)))}" for k, v in frontend.items()]
    rule = op.attrs.get("sdy.sharding_rule")
    if isinstance(rule, DialectAttr) and rule.name == "sdy.op_sharding_rule":
        # JAX's LAPACK calls say which dimensions are batch dimensions (the partitioner
        # cuts those, xlapy.passes.spmd.labels); XLA's HLO spelling of the same rule
        items.append(f"xla.sdy.sharding_rule={_quote(f'#sdy.op_sharding_rule<{rule.body}>')}")
    if items:
        text += f", frontend_attributes={{{','.join(items)}}}"
    shapes = conv.result_shapes(op)
    shape = shapes[0] if len(shapes) == 1 else Shape.tuple(shapes)
    value = conv.add(scope, "custom-call", shape, [x for x, _ in operands], text)
    if len(shapes) == 1:
        return [value]
    if not op.results:
        return []
    return conv.tuple_parts(scope, value)


def _mhlo_topk(conv: Converter, op: Op, scope: Scope, operands):
    """MHLO's topk as StableHLO carries it (XLA's HLO -> StableHLO converter writes HLO's
    topk so): `custom_call @mhlo.topk(x) {mhlo.attributes = {k = 3 : i64, largest = true}}`."""
    fields = attr(op, "mhlo.attributes")
    fields = fields if isinstance(fields, AttrDict) else {}
    k = ival(fields.get("k"))
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise conv.error("custom_call @mhlo.topk needs mhlo.attributes {k = N}", op.pos)
    largest = ival(fields.get("largest", True)) is not False
    shapes = conv.result_shapes(op)
    text = f", k={k}, largest={'true' if largest else 'false'}"
    value = conv.add(scope, "topk", Shape.tuple(shapes), [operands[0][0]], text)
    return conv.tuple_parts(scope, value)


def _declared_layouts(layouts, shapes: list[Shape]) -> list[Shape] | None:
    """`shapes` with the custom call's declared layouts, or None when it declares none
    but the default (row-major) ones."""
    if not isinstance(layouts, list | tuple) or len(layouts) != len(shapes):
        return None
    out = []
    for layout, shape in zip(layouts, shapes, strict=True):
        layout = ival(layout)
        if isinstance(layout, DenseAttr):  # dense<[0, 1]> : tensor<2xindex>
            order = tuple(int(t) for t in re.findall(r"\d+", layout.body))
        else:
            order = ints(layout)
        if shape.is_tuple or sorted(order) != list(range(shape.rank)):
            return None
        out.append(shape.with_layout(Layout(order)))
    if all(s.layout is None or s.layout.is_default for s in out):
        return None
    return out


@rule("sdy.sharding_constraint")
def _sharding_constraint(conv: Converter, op: Op, scope: Scope, operands):
    sharding = conv.sharding({"sdy.sharding": op.attrs.get("sharding")}, op.pos)
    if sharding is None:
        raise conv.error("sdy.sharding_constraint needs a sharding", op.pos)
    (x, shape) = operands[0]
    text = f', custom_call_target="Sharding", sharding={sharding}'
    attr = op.attrs.get("sharding")
    open_dims = sdy_open_dims(attr.body) if isinstance(attr, DialectAttr) else []
    if open_dims:
        # Shardy's open dimensions (`{?}`, `{"x", ?}`): propagation may cut them further;
        # GSPMD's spelling of the same constraint
        listed = ",".join(map(str, open_dims))
        text += f', backend_config="unspecified_dims=[{listed}]"'
    return [conv.add(scope, "custom-call", shape, [x], text)]


@rule("sdy.sharding_group")
def _sharding_group(conv: Converter, op: Op, scope: Scope, operands):
    """`sdy.sharding_group %v group_id=N` (jax.experimental.shard_alike): the values of a
    group get one sharding. It has no result: %v is rebound to a pass-through custom call
    that names the group (the partitioner gives every member the same tiling; on one
    device it is the identity), so the uses after it read the grouped value."""
    group = ival(op.attrs.get("group_id"))
    if not isinstance(group, int):
        raise conv.error("sdy.sharding_group needs an integer group_id", op.pos)
    (x, shape) = operands[0]
    text = (
        f', custom_call_target="{SHARDING_GROUP_TARGET}", '
        f'frontend_attributes={{xla.sdy.sharding_group_id="{group}"}}'
    )
    scope.values[op.operands[0][0]] = conv.add(scope, "custom-call", shape, [x], text)
    return []


@rule("sdy.manual_computation")
def _manual_computation(conv: Converter, op: Op, scope: Scope, operands):
    """shard_map: GSPMD's spelling of a manual region. Each operand is annotated with its
    in-sharding over the manual axes and cut to its local piece (SPMDFullToShardShape);
    the body becomes a computation called on the pieces as written; each result is put
    back together under its out-sharding (SPMDShardToFullShape). The collectives in the
    body are already explicit."""
    manual = _manual_axes(conv, op)
    keep = set(manual)
    ins = _per_value_shardings(conv, op, "in_shardings", len(operands), keep)
    local_shapes = [conv.shape(t) for _, t in op.regions[0].args] if op.regions else []
    if not op.regions or len(local_shapes) != len(operands):
        raise conv.error(
            f"sdy.manual_computation takes {len(operands)} operands, its region "
            f"{len(local_shapes)} arguments",
            op.pos,
        )
    mesh = _manual_mesh(conv, op)
    pieces = []
    for (x, shape), local, s in zip(operands, local_shapes, ins, strict=True):
        full = conv.add(
            scope, "custom-call", shape, [x], f', custom_call_target="Sharding", sharding={s}'
        )
        m = _manual_text(conv, op, mesh, manual, local.rank)
        pieces.append(
            conv.add(
                scope,
                "custom-call",
                local,
                [full[0]],
                f', custom_call_target="SPMDFullToShardShape", sharding={m}',
            )
        )
    comp, outs = conv.region_comp(scope, op.regions[0], op, local_shapes, "shmap_body")
    results = conv.result_shapes(op)
    conv.finish(Scope(conv, comp, None), outs, tuple_always=len(outs) != 1)
    conv.op = op
    shapes = [s for _, s in outs]
    joint = shapes[0] if len(shapes) == 1 else Shape.tuple(shapes)
    value = conv.add(scope, "call", joint, [x for x, _ in pieces], f", to_apply={comp.name}")
    locals_ = [value] if len(shapes) == 1 else conv.tuple_parts(scope, value)
    out_shardings = _per_value_shardings(conv, op, "out_shardings", len(results), keep)
    if len(locals_) != len(results):
        raise conv.error(
            f"the region of sdy.manual_computation returns {len(locals_)} values, the op "
            f"has {len(results)} results",
            op.pos,
        )
    converted = []
    for (x, local), shape, s in zip(locals_, results, out_shardings, strict=True):
        m = _manual_text(conv, op, mesh, manual, local.rank)
        inner = conv.add(
            scope, "custom-call", local, [x], f', custom_call_target="Sharding", sharding={m}'
        )
        text = f', custom_call_target="SPMDShardToFullShape", sharding={s}'
        converted.append(conv.add(scope, "custom-call", shape, [inner[0]], text))
    conv.global_program = True
    return converted


def _manual_axes(conv: Converter, op: Op) -> list[str]:
    value = op.attrs.get("manual_axes")
    if isinstance(value, list):
        return [str(a) for a in value]
    if isinstance(value, DialectAttr):  # generic form: #sdy<manual_axes{"x", "y"}>
        return re.findall(r'"([^"]+)"', value.body)
    raise conv.error("sdy.manual_computation needs manual_axes", op.pos)


def _per_value_shardings(conv: Converter, op: Op, key: str, count: int, keep: set[str]):
    """The HLO shardings (restricted to the manual axes `keep`) of `op`'s `key`."""
    value = op.attrs.get(key)
    if not isinstance(value, DialectAttr) or value.name != "sdy.sharding_per_value":
        raise conv.error(f"sdy.manual_computation needs {key}", op.pos)
    parts = _split_top(value.body.strip()[1:-1]) if value.body.strip() != "[]" else []
    if len(parts) != count:
        raise conv.error(
            f"sdy.manual_computation has {len(parts)} {key} for {count} values", op.pos
        )
    try:
        return [sdy_sharding(p.strip()[1:-1], conv.module.meshes, keep) for p in parts]
    except TypeProblem as e:
        raise conv.error(str(e), op.pos) from None


def _manual_mesh(conv: Converter, op: Op) -> str:
    """The mesh a manual computation's shardings name (the module's only mesh when it has
    neither operands nor results)."""
    for key in ("in_shardings", "out_shardings"):
        value = op.attrs.get(key)
        m = re.search(r"<\s*@([A-Za-z0-9_$.\-]+)", value.body) if value is not None else None
        if m is not None:
            return m.group(1)
    if len(conv.module.meshes) == 1:
        return next(iter(conv.module.meshes))
    raise conv.error("sdy.manual_computation names no mesh", op.pos)


def _manual_text(conv: Converter, op: Op, mesh: str, manual: list[str], rank: int) -> str:
    try:
        return sdy_manual_sharding(mesh, conv.module.meshes, manual, rank)
    except TypeProblem as e:
        raise conv.error(str(e), op.pos) from None


@rule(
    "check.expect_eq",
    "check.expect_almost_eq",
    "check.expect_close",
    "check.expect_eq_const",
    "check.expect_almost_eq_const",
)
def _check(conv: Converter, op: Op, scope: Scope, operands):
    names = [x for x, _ in operands]
    kind = op.name.removeprefix("check.").removesuffix("_const")
    if op.name.endswith("_const"):
        value = op.attrs.get("value")
        if not isinstance(value, DenseAttr):
            raise conv.error(f"'{op.name}' needs a dense<...> value", op.pos)
        shape = operands[0][1]
        try:
            names.append(conv.constant(scope, dense_array(value, shape), shape)[0])
        except (TypeProblem, ValueError) as e:
            raise conv.error(f"bad constant: {e}", value.pos) from None
    config = ""
    for key in ("max_ulp_difference", "tolerance"):
        if key in op.attrs:
            config = f", backend_config={_quote(f'{key}={ival(op.attrs[key])}')}"
    conv.add(
        scope,
        "custom-call",
        Shape.tuple(()),
        names,
        f", custom_call_target={_quote('check.' + kind)}, custom_call_has_side_effect=true"
        + config,
    )
    return []


@rule("stablehlo.all_reduce", "stablehlo.reduce_scatter")
def _all_reduce(conv: Converter, op: Op, scope: Scope, operands):
    scalars = [Shape.array(s.element_type, ()) for _, s in operands]
    to_apply = conv.applied(scope, op, scalars[:1], "reducer")
    text = _collective_attrs(conv, op)
    shapes = conv.result_shapes(op) or [s for _, s in operands]
    shape = shapes[0] if len(shapes) == 1 else Shape.tuple(shapes)
    opcode = "all-reduce"
    if op.name.endswith("reduce_scatter"):
        opcode = "reduce-scatter"
        text += f", dimensions={{{ival(attr(op, 'scatter_dimension'))}}}"
    value = conv.add(scope, opcode, shape, [x for x, _ in operands], f"{text}, to_apply={to_apply}")
    return conv.results(scope, value, op)


def _collective_attrs(conv: Converter, op: Op) -> str:
    text = ""
    groups = attr(op, "replica_groups")
    if isinstance(groups, DenseAttr):
        rows = dense_array(groups, None)
        rows = rows.reshape(rows.shape[0] if rows.ndim else 1, -1)
        inner = ",".join("{" + ",".join(str(int(v)) for v in r if v >= 0) + "}" for r in rows)
        text += f", replica_groups={{{inner}}}"
    handle = attr(op, "channel_handle")
    if isinstance(handle, DialectAttr) and ival(handle.fields.get("handle", 0)):
        text += f", channel_id={ival(handle.fields['handle'])}"
    if attr(op, "use_global_device_ids") is True:
        text += ", use_global_device_ids=true"
    return text


def _along_dimension(conv: Converter, op: Op, scope: Scope, operands, opcode: str, dim):
    """A collective whose results travel as one HLO value, with `dimensions={dim}`."""
    shape = conv.joint_result_shape(op)
    text = f"{_collective_attrs(conv, op)}, dimensions={{{dim}}}"
    value = conv.add(scope, opcode, shape, [x for x, _ in operands], text)
    return conv.results(scope, value, op)


@rule("stablehlo.all_gather")
def _all_gather(conv: Converter, op: Op, scope: Scope, operands):
    dim = ival(attr(op, "all_gather_dim"))
    return _along_dimension(conv, op, scope, operands, "all-gather", dim)


@rule("stablehlo.all_to_all")
def _all_to_all(conv: Converter, op: Op, scope: Scope, operands):
    split = ival(attr(op, "split_dimension"))
    concat = ival(attr(op, "concat_dimension"))
    if split == concat:
        return _along_dimension(conv, op, scope, operands, "all-to-all", split)
    if len(operands) != 1:
        raise conv.error(
            "all_to_all of several operands with split_dimension != concat_dimension is "
            "not supported"
        )
    return [_all_to_all_moving(conv, op, scope, operands[0], split, concat)]


def _all_to_all_moving(conv: Converter, op: Op, scope: Scope, operand, split: int, concat: int):
    """all_to_all that splits one dimension and concatenates along another, in HLO's
    all-to-all (which exchanges the pieces of one dimension) as XLA writes it: split
    dimension S of size n*c reshaped to [n, c], n moved to the front and exchanged, then
    moved in front of concat dimension C and merged into it."""
    x, shape = operand
    (result,) = conv.result_shapes(op)
    dims, et = list(shape.dims), shape.element_type
    if result.dims[split] == 0 or dims[split] % result.dims[split]:
        raise conv.error(f"all_to_all: split dimension {split} of {shape} does not divide")
    n = dims[split] // result.dims[split]
    pieces = [*dims[:split], n, dims[split] // n, *dims[split + 1 :]]
    rest = [pieces[i] for i in range(len(pieces)) if i != split]  # dims, S divided by n
    front = [split, *(i for i in range(len(pieces)) if i != split)]

    def add(opcode, dims_out, arg, text=""):
        return conv.add(scope, opcode, Shape.array(et, dims_out), [arg], text)[0]

    value = add("reshape", pieces, x)
    value = add("transpose", [n, *rest], value, f", dimensions={{{','.join(map(str, front))}}}")
    text = f"{_collective_attrs(conv, op)}, dimensions={{0}}"
    value = add("all-to-all", [n, *rest], value, text)
    back = [i + 1 for i in range(concat)] + [0] + [i + 1 for i in range(concat, len(rest))]
    moved = [([n, *rest])[i] for i in back]
    value = add("transpose", moved, value, f", dimensions={{{','.join(map(str, back))}}}")
    return conv.add(scope, "reshape", result, [value])


@rule("stablehlo.collective_permute")
def _collective_permute(conv: Converter, op: Op, scope: Scope, operands):
    pairs = attr(op, "source_target_pairs")
    rows: Any = dense_array(pairs, None).reshape(-1, 2) if isinstance(pairs, DenseAttr) else []
    inner = ",".join(f"{{{int(a)},{int(b)}}}" for a, b in rows)
    text = f", source_target_pairs={{{inner}}}" + _collective_attrs(conv, op)
    return conv.single(scope, op, operands, "collective-permute", take=1, attrs=text)


@rule("stablehlo.collective_broadcast")
def _collective_broadcast(conv: Converter, op: Op, scope: Scope, operands):
    return conv.single(
        scope, op, operands, "collective-broadcast", take=1, attrs=_collective_attrs(conv, op)
    )


@rule("stablehlo.convolution", "stablehlo.dynamic_conv")
def _convolution(conv: Converter, op: Op, scope: Scope, operands):
    if op.name == "stablehlo.dynamic_conv":
        padding = conv.constant_of(operands[2], "padding").reshape(-1, 2)
        op.attrs["padding"] = [[int(a), int(b)] for a, b in padding]
        operands = operands[:2]
    numbers = attr(op, "dimension_numbers")
    body = numbers.body if isinstance(numbers, DialectAttr) else ""
    m = re.fullmatch(r"\s*\[([^\]]*)\]x\[([^\]]*)\]->\[([^\]]*)\]\s*", body)
    if m is None:
        raise conv.error(f"cannot read convolution dimension numbers '{body}'", op.pos)
    lhs, rhs, out = ("".join(p.strip() for p in g.split(",")) for g in m.groups())
    rhs_dims = operands[1][1].dims
    spatial = sorted((c, i) for i, c in enumerate(rhs) if c.isdigit())
    size = tuple(rhs_dims[i] for _, i in spatial)
    text = _window(op, len(size), size) + f", dim_labels={lhs}_{rhs}->{out}"
    for key in ("feature_group_count", "batch_group_count"):
        value = ival(attr(op, key, default=1))
        if value != 1:
            text += f", {key}={value}"
    return conv.single(scope, op, operands, "convolution", text + _precision(op))


def _unsupported_quant(conv: Converter, op: Op, scope: Scope, operands):
    raise conv.error(f"'{op.name}': quantized types are not supported", op.pos)


RULES["stablehlo.uniform_quantize"] = _unsupported_quant
RULES["stablehlo.uniform_dequantize"] = _unsupported_quant


def convert_text(text: str, filename: str | None = None) -> HloModule:
    """Convert StableHLO text to an HloModule (see xlapy.stablehlo.import_text)."""
    from xlapy.stablehlo import chlo  # noqa: F401  (registers the chlo rules)

    tree = mlir.read_module(text, filename)
    converter = Converter(tree, text, filename)
    try:
        return converter.convert()
    except (HloParseError, XlapyError):
        raise
    except RecursionError:
        raise converter.error("the program nests too deeply") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as e:
        # an attribute of a form no rule expects: still one positioned error, no traceback
        what = f"'{converter.op.name}'" if converter.op is not None else "the module"
        raise converter.error(f"cannot convert {what}: {type(e).__name__}: {e}") from None


__all__ = ["convert_text"]
