"""Literals: constant values of a Shape, held as NumPy arrays (ml_dtypes for bf16/f8).

Array data is kept in logical row-major order whatever the shape's layout; layouts are a
physical concern of the backends. A tuple literal holds one Literal per element. Literals are
immutable: the array is made read-only when the Literal is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xlapy.ir.shapes import Shape
from xlapy.ir.types import PrimitiveType


@dataclass(frozen=True, slots=True, eq=False)
class Literal:
    shape: Shape
    array: np.ndarray | None = None
    elements: tuple[Literal, ...] = ()

    def __post_init__(self):
        if self.shape.is_tuple:
            if len(self.elements) != len(self.shape.tuple_shapes):
                raise ValueError(f"tuple literal of {self.shape} needs one element per entry")
            return
        if not self.shape.is_array:
            return
        if self.array is None:
            raise ValueError(f"array literal of {self.shape} has no data")
        if self.array.shape != self.shape.dims or self.array.dtype != self.shape.dtype:
            raise ValueError(
                f"literal data {self.array.dtype}{list(self.array.shape)} does not match "
                f"{self.shape}"
            )
        self.array.flags.writeable = False

    @staticmethod
    def from_array(array, element_type: PrimitiveType | str | None = None) -> Literal:
        """A literal holding a copy of `array` (converted to `element_type` when given)."""
        if isinstance(element_type, str):
            element_type = PrimitiveType.from_text(element_type)
        arr = np.asarray(array)
        if element_type is None:
            element_type = PrimitiveType.from_dtype(arr.dtype)
        arr = np.array(arr, dtype=element_type.dtype, copy=True)
        return Literal(Shape.array(element_type, arr.shape), arr)

    @staticmethod
    def scalar(value, element_type: PrimitiveType | str) -> Literal:
        return Literal.from_array(np.asarray(value), element_type)

    @staticmethod
    def tuple(elements) -> Literal:
        elements = tuple(elements)
        return Literal(Shape.tuple(e.shape for e in elements), elements=elements)

    @staticmethod
    def token() -> Literal:
        return Literal(Shape.token())

    def to_value(self):
        """The interpreter's view: an ndarray, a tuple of values, or None for a token."""
        if self.shape.is_tuple:
            return tuple(e.to_value() for e in self.elements)
        return self.array

    def __eq__(self, other) -> bool:
        if not isinstance(other, Literal) or self.shape != other.shape:
            return False
        if self.shape.is_tuple:
            return self.elements == other.elements
        if self.array is None or other.array is None:
            return self.array is None and other.array is None
        return self.array.tobytes() == other.array.tobytes()

    def __hash__(self) -> int:
        data = self.array.tobytes() if self.array is not None else b""
        return hash((self.shape, data, self.elements))
