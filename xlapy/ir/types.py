"""Element types of HLO arrays: the `f32` in `f32[3,4]`.

Each PrimitiveType knows its text name, its bit width, and the NumPy dtype that holds its
values on the host (ml_dtypes supplies bf16, the f8 family and the sub-byte integers).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import ml_dtypes
import numpy as np


class Kind(enum.Enum):
    PRED = "pred"
    SIGNED = "signed"
    UNSIGNED = "unsigned"
    FLOAT = "float"
    COMPLEX = "complex"
    TOKEN = "token"
    TUPLE = "tuple"
    OPAQUE = "opaque"


@dataclass(frozen=True, slots=True)
class _TypeInfo:
    text: str
    kind: Kind
    bits: int
    dtype: np.dtype | None


def _info(text: str, kind: Kind, bits: int, dtype) -> _TypeInfo:
    return _TypeInfo(text, kind, bits, None if dtype is None else np.dtype(dtype))


class PrimitiveType(enum.Enum):
    """An HLO element type. `PrimitiveType.from_text("bf16")`; `t.dtype` is the host dtype."""

    PRED = _info("pred", Kind.PRED, 8, np.bool_)
    S1 = _info("s1", Kind.SIGNED, 1, ml_dtypes.int1)
    S2 = _info("s2", Kind.SIGNED, 2, ml_dtypes.int2)
    S4 = _info("s4", Kind.SIGNED, 4, ml_dtypes.int4)
    S8 = _info("s8", Kind.SIGNED, 8, np.int8)
    S16 = _info("s16", Kind.SIGNED, 16, np.int16)
    S32 = _info("s32", Kind.SIGNED, 32, np.int32)
    S64 = _info("s64", Kind.SIGNED, 64, np.int64)
    U1 = _info("u1", Kind.UNSIGNED, 1, ml_dtypes.uint1)
    U2 = _info("u2", Kind.UNSIGNED, 2, ml_dtypes.uint2)
    U4 = _info("u4", Kind.UNSIGNED, 4, ml_dtypes.uint4)
    U8 = _info("u8", Kind.UNSIGNED, 8, np.uint8)
    U16 = _info("u16", Kind.UNSIGNED, 16, np.uint16)
    U32 = _info("u32", Kind.UNSIGNED, 32, np.uint32)
    U64 = _info("u64", Kind.UNSIGNED, 64, np.uint64)
    F4E2M1FN = _info("f4e2m1fn", Kind.FLOAT, 4, ml_dtypes.float4_e2m1fn)
    F8E3M4 = _info("f8e3m4", Kind.FLOAT, 8, ml_dtypes.float8_e3m4)
    F8E4M3 = _info("f8e4m3", Kind.FLOAT, 8, ml_dtypes.float8_e4m3)
    F8E4M3FN = _info("f8e4m3fn", Kind.FLOAT, 8, ml_dtypes.float8_e4m3fn)
    F8E4M3B11FNUZ = _info("f8e4m3b11fnuz", Kind.FLOAT, 8, ml_dtypes.float8_e4m3b11fnuz)
    F8E4M3FNUZ = _info("f8e4m3fnuz", Kind.FLOAT, 8, ml_dtypes.float8_e4m3fnuz)
    F8E5M2 = _info("f8e5m2", Kind.FLOAT, 8, ml_dtypes.float8_e5m2)
    F8E5M2FNUZ = _info("f8e5m2fnuz", Kind.FLOAT, 8, ml_dtypes.float8_e5m2fnuz)
    F8E8M0FNU = _info("f8e8m0fnu", Kind.FLOAT, 8, ml_dtypes.float8_e8m0fnu)
    BF16 = _info("bf16", Kind.FLOAT, 16, ml_dtypes.bfloat16)
    F16 = _info("f16", Kind.FLOAT, 16, np.float16)
    F32 = _info("f32", Kind.FLOAT, 32, np.float32)
    F64 = _info("f64", Kind.FLOAT, 64, np.float64)
    C64 = _info("c64", Kind.COMPLEX, 64, np.complex64)
    C128 = _info("c128", Kind.COMPLEX, 128, np.complex128)
    TOKEN = _info("token", Kind.TOKEN, 0, None)
    TUPLE = _info("tuple", Kind.TUPLE, 0, None)
    OPAQUE = _info("opaque", Kind.OPAQUE, 0, None)

    # -- lookups ---------------------------------------------------------------------------
    @staticmethod
    def from_text(text: str) -> PrimitiveType:
        """The type named `text` (e.g. "f32"); KeyError if there is none."""
        return _BY_TEXT[text]

    @staticmethod
    def from_dtype(dtype) -> PrimitiveType:
        """The type whose host dtype is `dtype`; KeyError if there is none."""
        return _BY_DTYPE[np.dtype(dtype)]

    # -- properties ------------------------------------------------------------------------
    @property
    def text(self) -> str:
        return self._value_.text

    @property
    def kind(self) -> Kind:
        return self._value_.kind

    @property
    def bits(self) -> int:
        """Bit width of one element (pred counts as 8, as XLA stores it)."""
        return self._value_.bits

    @property
    def byte_size(self) -> int:
        """Bytes one element takes in an unpacked buffer (sub-byte types take one byte)."""
        return max(1, (self._value_.bits + 7) // 8) if self.is_array_type else 0

    @property
    def dtype(self) -> np.dtype:
        if self._value_.dtype is None:
            raise TypeError(f"element type {self.text} has no host array representation")
        return self._value_.dtype

    @property
    def is_array_type(self) -> bool:
        return self._value_.dtype is not None

    @property
    def is_pred(self) -> bool:
        return self.kind is Kind.PRED

    @property
    def is_float(self) -> bool:
        return self.kind is Kind.FLOAT

    @property
    def is_complex(self) -> bool:
        return self.kind is Kind.COMPLEX

    @property
    def is_integral(self) -> bool:
        return self.kind in (Kind.SIGNED, Kind.UNSIGNED)

    @property
    def is_signed_integral(self) -> bool:
        return self.kind is Kind.SIGNED

    @property
    def is_unsigned_integral(self) -> bool:
        return self.kind is Kind.UNSIGNED

    @property
    def is_floating_or_complex(self) -> bool:
        return self.kind in (Kind.FLOAT, Kind.COMPLEX)

    @property
    def complex_component_type(self) -> PrimitiveType:
        """f32 for c64, f64 for c128."""
        if self is PrimitiveType.C64:
            return PrimitiveType.F32
        if self is PrimitiveType.C128:
            return PrimitiveType.F64
        raise TypeError(f"{self.text} is not a complex type")

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"PrimitiveType.{self.name}"


_BY_TEXT = {t.text: t for t in PrimitiveType}
_BY_DTYPE = {t.value.dtype: t for t in PrimitiveType if t.value.dtype is not None}

PRED = PrimitiveType.PRED
S8, S16, S32, S64 = PrimitiveType.S8, PrimitiveType.S16, PrimitiveType.S32, PrimitiveType.S64
U8, U16, U32, U64 = PrimitiveType.U8, PrimitiveType.U16, PrimitiveType.U32, PrimitiveType.U64
F16, BF16, F32, F64 = PrimitiveType.F16, PrimitiveType.BF16, PrimitiveType.F32, PrimitiveType.F64
C64, C128 = PrimitiveType.C64, PrimitiveType.C128
TOKEN, TUPLE, OPAQUE = PrimitiveType.TOKEN, PrimitiveType.TUPLE, PrimitiveType.OPAQUE
