"""Shapes and layouts: `f32[3,<=4]{1,0:T(8,128)}` and `(f32[2], s32[])`.

A Shape is an immutable value. Arrays carry an element type, dimension sizes, a per-dimension
dynamic flag (`<=N` is a bounded dynamic dimension of bound N; `?` an unbounded one, stored as
size UNBOUNDED), and an optional Layout. Tuples carry their element shapes. Tokens and opaque
values carry neither. A ShapeIndex is a tuple of ints naming a sub-shape inside tuples.

Shape.__str__ prints XLA's text form; the parser reads it back (xlapy.ir.parser).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from xlapy.ir.types import PrimitiveType

UNBOUNDED = -1
"""The size of a `?` (unbounded dynamic) dimension."""

ShapeIndex = tuple[int, ...]

IndexedShape = tuple[ShapeIndex, "Shape"]
"""An (index, sub-shape) pair; named here because `Shape.tuple` hides `tuple` in the class."""


@dataclass(frozen=True, slots=True)
class Tile:
    """One tile of a tiled layout, e.g. T(8,128). A dimension of COMBINE_DIM prints as `*`."""

    dims: tuple[int, ...]

    COMBINE_DIM = -2

    def __str__(self) -> str:
        return "(" + ",".join("*" if d == Tile.COMBINE_DIM else str(d) for d in self.dims) + ")"


@dataclass(frozen=True, slots=True)
class Layout:
    """The physical order of an array: minor_to_major dimension numbers plus tiling options."""

    minor_to_major: tuple[int, ...]
    tiles: tuple[Tile, ...] = ()
    element_size_bits: int = 0
    memory_space: int = 0

    def __str__(self) -> str:
        text = ",".join(str(d) for d in self.minor_to_major)
        extras = []
        if self.tiles:
            extras.append("T" + "".join(str(t) for t in self.tiles))
        if self.element_size_bits:
            extras.append(f"E({self.element_size_bits})")
        if self.memory_space:
            extras.append(f"S({self.memory_space})")
        if extras:
            text += ":" + "".join(extras)
        return "{" + text + "}"

    @staticmethod
    def default(rank: int) -> Layout:
        """Row-major: the last dimension is the most minor."""
        return Layout(tuple(range(rank - 1, -1, -1)))

    @property
    def is_default(self) -> bool:
        return (
            self.minor_to_major == tuple(range(len(self.minor_to_major) - 1, -1, -1))
            and not self.tiles
            and not self.element_size_bits
            and not self.memory_space
        )


@dataclass(frozen=True, slots=True)
class Shape:
    """An array, tuple, token or opaque shape. Build with `Shape.array(...)`/`Shape.tuple(...)`."""

    element_type: PrimitiveType
    dims: tuple[int, ...] = ()
    dynamic: tuple[bool, ...] = ()
    layout: Layout | None = None
    tuple_shapes: tuple[Shape, ...] = field(default=())

    # -- construction ----------------------------------------------------------------------
    @staticmethod
    def array(
        element_type: PrimitiveType | str,
        dims=(),
        layout: Layout | tuple[int, ...] | None = None,
        dynamic=None,
    ) -> Shape:
        """An array shape; `layout` may be a Layout or a minor_to_major tuple."""
        if isinstance(element_type, str):
            element_type = PrimitiveType.from_text(element_type)
        dims = tuple(int(d) for d in dims)
        if isinstance(layout, tuple | list):
            layout = Layout(tuple(layout))
        dyn = tuple(bool(d) for d in dynamic) if dynamic is not None else (False,) * len(dims)
        dyn = tuple(d or s == UNBOUNDED for d, s in zip(dyn, dims, strict=True))
        return Shape(element_type, dims, dyn, layout)

    @staticmethod
    def tuple(shapes) -> Shape:
        return Shape(PrimitiveType.TUPLE, tuple_shapes=tuple(shapes))

    @staticmethod
    def token() -> Shape:
        return Shape(PrimitiveType.TOKEN)

    @staticmethod
    def scalar(element_type: PrimitiveType | str) -> Shape:
        return Shape.array(element_type, ())

    # -- kind ------------------------------------------------------------------------------
    @property
    def is_tuple(self) -> bool:
        return self.element_type is PrimitiveType.TUPLE

    @property
    def is_token(self) -> bool:
        return self.element_type is PrimitiveType.TOKEN

    @property
    def is_opaque(self) -> bool:
        return self.element_type is PrimitiveType.OPAQUE

    @property
    def is_array(self) -> bool:
        return self.element_type.is_array_type

    @property
    def is_scalar(self) -> bool:
        return self.is_array and not self.dims

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def is_dynamic(self) -> bool:
        return any(self.dynamic) or any(s.is_dynamic for s in self.tuple_shapes)

    @property
    def is_unbounded_dynamic(self) -> bool:
        return UNBOUNDED in self.dims or any(s.is_unbounded_dynamic for s in self.tuple_shapes)

    @property
    def dtype(self):
        """The host NumPy dtype of the elements (arrays only)."""
        return self.element_type.dtype

    # -- sizes -----------------------------------------------------------------------------
    @property
    def num_elements(self) -> int:
        """Element count, taking each bounded dynamic dimension at its bound."""
        if not self.is_array:
            raise TypeError(f"{self} is not an array shape")
        if UNBOUNDED in self.dims:
            raise ValueError(f"{self} has an unbounded dimension and no static size")
        return math.prod(self.dims)

    @property
    def byte_size(self) -> int:
        """Bytes of a dense buffer holding this shape; a tuple is its table of leaf pointers."""
        if self.is_tuple:
            return 8 * len(self.tuple_shapes)
        if not self.is_array:
            return 0
        return self.num_elements * self.element_type.byte_size

    # -- tuple navigation ------------------------------------------------------------------
    def subshape(self, index: ShapeIndex) -> Shape:
        """The shape at `index`; IndexError naming the index when it does not exist."""
        shape = self
        for i in index:
            if not shape.is_tuple or not 0 <= i < len(shape.tuple_shapes):
                raise IndexError(f"shape index {{{','.join(map(str, index))}}} is not in {self}")
            shape = shape.tuple_shapes[i]
        return shape

    def has_index(self, index: ShapeIndex) -> bool:
        try:
            self.subshape(index)
        except IndexError:
            return False
        return True

    def subshapes(self) -> Iterator[IndexedShape]:
        """Every (index, sub-shape) in pre-order, the whole shape first."""
        yield (), self
        for i, child in enumerate(self.tuple_shapes):
            for index, sub in child.subshapes():
                yield (i, *index), sub

    def leaves(self) -> list[IndexedShape]:
        """The non-tuple sub-shapes in pre-order (the flattening custom calls and .npz use)."""
        if not self.tuple_shapes:  # (an array, a token, or an empty tuple: no generator)
            return [] if self.is_tuple else [((), self)]
        return [(i, s) for i, s in self.subshapes() if not s.is_tuple]

    # -- variants --------------------------------------------------------------------------
    def with_layout(self, layout: Layout | None) -> Shape:
        return replace(self, layout=layout)

    def with_element_type(self, element_type: PrimitiveType) -> Shape:
        return replace(self, element_type=element_type)

    def with_dims(self, dims, dynamic=None) -> Shape:
        return Shape.array(self.element_type, dims, None, dynamic)

    def without_layout(self) -> Shape:
        """The same shape with every layout dropped (tuples recursively)."""
        if self.is_tuple:
            return Shape.tuple(s.without_layout() for s in self.tuple_shapes)
        return replace(self, layout=None)

    @property
    def layout_or_default(self) -> Layout:
        return self.layout if self.layout is not None else Layout.default(self.rank)

    def compatible(self, other: Shape) -> bool:
        """Equal ignoring layouts (XLA's ShapeUtil::Compatible): without_layout() of both
        equal, compared field by field without building them (the simplifier asks per
        rewrite it tries)."""
        if self is other:
            return True
        if self.is_tuple or other.is_tuple:
            mine, theirs = self.tuple_shapes, other.tuple_shapes
            return (
                self.is_tuple
                and other.is_tuple
                and len(mine) == len(theirs)
                and all(a.compatible(b) for a, b in zip(mine, theirs))
            )
        return (
            self.element_type is other.element_type
            and self.dims == other.dims
            and self.dynamic == other.dynamic
            and self.tuple_shapes == other.tuple_shapes
        )

    def same_dims(self, other: Shape) -> bool:
        return self.dims == other.dims and self.dynamic == other.dynamic

    # -- text ------------------------------------------------------------------------------
    def to_text(self, with_layout: bool = True) -> str:
        """The shape as HLO text prints it (`f32[2,3]{1,0}`); memoized, since equal shapes
        print alike and a compile prints the same few shapes hundreds of times."""
        key = (self, with_layout)
        text = _TEXTS.get(key)
        if text is None:
            text = self._text(with_layout)
            if len(_TEXTS) >= _MAX_TEXTS:
                _TEXTS.clear()
            _TEXTS[key] = text
        return text

    def _text(self, with_layout: bool) -> str:
        if self.is_tuple:
            inner = ", ".join(s.to_text(with_layout) for s in self.tuple_shapes)
            return f"({inner})"
        if not self.is_array:
            return f"{self.element_type.text}[]"
        dims = []
        for size, dyn in zip(self.dims, self.dynamic, strict=True):
            if size == UNBOUNDED:
                dims.append("?")
            else:
                dims.append(f"<={size}" if dyn else str(size))
        text = f"{self.element_type.text}[{','.join(dims)}]"
        layout = self.layout
        if not with_layout or layout is None:
            return text
        if self.dims or layout.tiles or layout.memory_space:
            text += str(layout)  # a scalar shows only a memory space or tiles: u32[]{:S(2)}
        return text

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return f"Shape({self.to_text()!r})"


_TEXTS: dict[tuple[Shape, bool], str] = {}
_MAX_TEXTS = 4096


@dataclass(frozen=True, slots=True)
class ProgramShape:
    """A computation's signature: `(f32[2], s32[]) -> f32[2]`."""

    parameters: tuple[Shape, ...]
    result: Shape

    def to_text(self, with_layout: bool = True) -> str:
        params = ", ".join(p.to_text(with_layout) for p in self.parameters)
        return f"({params})->{self.result.to_text(with_layout)}"

    def __str__(self) -> str:
        return self.to_text()


def index_text(index: ShapeIndex) -> str:
    """A ShapeIndex as XLA prints it: `{1,0}`."""
    return "{" + ",".join(str(i) for i in index) + "}"


def merged_stride(shape: Shape, dims: Sequence[int]) -> int | None:
    """The one element stride of `shape`'s logical `dims` (in this order, the first most
    major) read as one flat dimension of their product in its layout, or None when they do
    not merge (1 when the product is 1). Dims of extent 1 are left out: they move nothing."""
    strides = [0] * shape.rank
    step = 1
    for d in shape.layout_or_default.minor_to_major:
        strides[d] = step
        step *= shape.dims[d]
    kept = [d for d in dims if shape.dims[d] != 1]
    for outer, inner in itertools.pairwise(kept):
        if strides[outer] != strides[inner] * shape.dims[inner]:
            return None
    return strides[kept[-1]] if kept else 1
