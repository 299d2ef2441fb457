# What every part of the CPU code generator shares, so that the emitter, its elemental rules
# and the scatter emitter import one module below them instead of each other: the kernel ABI
# (KernelSpec, the symbol kernels are compiled under), element types as LLVM types, the type
# and shape checks, and the registry of elemental emission rules (`emits`) that elemental.py
# fills and the emitter reads.

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llvmlite import ir

from xlapy.errors import XlapyError
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape
from xlapy.ir.types import PrimitiveType

if TYPE_CHECKING:
    from xlapy.backends.cpu.codegen.emitter import KernelEmitter

P = PrimitiveType
I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
C64_TYPE = ir.LiteralStructType([F32, F32])  # (real, imaginary): codegen/complex.py
C128_TYPE = ir.LiteralStructType([F64, F64])

REDUCE_BLOCK = 256
"""Elements of the innermost reduced dimension summed into one partial result."""


class UnsupportedForCodegen(XlapyError):
    """The CPU emitter cannot compile this instruction or type; run it in the interpreter."""


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """An emitted kernel: its LLVM IR text and the signature the caller must honour."""

    name: str
    llvm_ir: str
    outputs: tuple[Shape, ...]
    params: tuple[Shape, ...]
    outer_extent: int
    in_place: tuple[tuple[int, int], ...] = ()


_SUPPORTED_TYPES = {
    P.PRED, P.S8, P.S16, P.S32, P.S64, P.U8, P.U16, P.U32, P.U64,
    P.F16, P.BF16, P.F32, P.F64, P.C64, P.C128,
    P.F8E4M3FN, P.F8E5M2, P.F8E4M3, P.F8E3M4, P.F8E4M3FNUZ, P.F8E5M2FNUZ, P.F8E4M3B11FNUZ,
}  # fmt: skip
F8_TYPES = frozenset(
    {P.F8E4M3FN, P.F8E5M2, P.F8E4M3, P.F8E3M4, P.F8E4M3FNUZ, P.F8E5M2FNUZ, P.F8E4M3B11FNUZ}
)
"""8-bit floats: f32 in registers, one byte in memory (codegen/f8.py)."""


def reg_type(t: PrimitiveType):
    """The LLVM type a value of element type `t` has in registers."""
    if t is P.PRED:
        return I1
    if t.is_integral:
        return ir.IntType(t.bits)
    if t.is_complex:
        return C64_TYPE if t is P.C64 else C128_TYPE
    return F64 if t is P.F64 else F32


def mem_type(t: PrimitiveType):
    """The LLVM type one element of `t` has in memory."""
    if t is P.PRED:
        return I8
    if t is P.F16:
        return F16
    if t is P.BF16:
        return I16
    if t in F8_TYPES:
        return I8
    return reg_type(t)


def physical_strides(shape: Shape) -> list[int]:
    """Element stride of each logical dimension in a dense buffer laid out by the layout."""
    strides = [0] * shape.rank
    step = 1
    for d in shape.layout_or_default.minor_to_major:
        strides[d] = step
        step *= shape.dims[d]
    return strides


def physical_dims(shape: Shape) -> tuple[int, ...]:
    """The dims of `shape` in its layout's major-to-minor order."""
    order = tuple(reversed(shape.layout_or_default.minor_to_major))
    return tuple(shape.dims[d] for d in order)


def check_type(instr: HloInstruction, shape: Shape) -> None:
    if shape.is_tuple:
        for s in shape.tuple_shapes:
            check_type(instr, s)
        return
    if shape.element_type not in _SUPPORTED_TYPES:
        raise UnsupportedForCodegen(
            f"{instr.name}: the CPU emitter does not handle element type {shape.element_type}"
        )
    if shape.is_dynamic:
        raise UnsupportedForCodegen(f"{instr.name}: dynamic shape {shape} is not supported")
    if shape.layout is not None and shape.layout.tiles:
        raise UnsupportedForCodegen(f"{instr.name}: tiled layout {shape.layout} not supported")


Index = tuple  # tuple of i64 ir.Values, one per logical dimension
Rule = Callable[["KernelEmitter", HloInstruction, Index], object]
EMIT_RULES: dict[Opcode, Rule] = {}


def emits(*opcodes: Opcode):
    """Register the decorated function as the elemental emission rule of `opcodes`."""

    def register(fn: Rule) -> Rule:
        for op in opcodes:
            EMIT_RULES[op] = fn
        return fn

    return register


SYMBOL = "xla_kernel"
"""The symbol every kernel is compiled under: kernels are emitted without the names of their
instructions, so structurally equal computations give the same IR text, share one disk cache
entry and, within a process, one loaded object. Dumps show the kernel's own name instead."""


def symbol_name(name: str) -> str:
    """`name` as an LLVM symbol: characters other than letters, digits and _ become _."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name) or "xla_kernel"


def reduce_hero(leaves: Sequence[HloInstruction]) -> HloInstruction | None:
    """The first output of a kernel that is a reduce over some dimensions, if any: the
    kernel's loops run over its output, and outputs over its input (XLA's multi-output
    reduction fusion: an `exp` returned beside the sum of it) are stored from inside its
    reduction loop, once per input element."""
    return next((x for x in leaves if x.opcode is Opcode.REDUCE and x.dimensions), None)
