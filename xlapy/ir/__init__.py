"""The HLO IR: element types, shapes, literals, instructions, computations, modules."""

from xlapy.ir.attributes import AttrKind
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.literal import Literal
from xlapy.ir.module import AliasEntry, BufferDonor, HloModule, ModuleConfig
from xlapy.ir.opcodes import Category, Opcode
from xlapy.ir.parser import parse_literal, parse_module, parse_shape
from xlapy.ir.printer import PrintOptions, print_computation, print_instruction, print_module
from xlapy.ir.shapes import Layout, ProgramShape, Shape, Tile
from xlapy.ir.types import PrimitiveType

__all__ = [
    "AliasEntry",
    "AttrKind",
    "BufferDonor",
    "Category",
    "HloComputation",
    "HloInstruction",
    "HloModule",
    "Layout",
    "Literal",
    "ModuleConfig",
    "Opcode",
    "PrimitiveType",
    "PrintOptions",
    "ProgramShape",
    "Shape",
    "Tile",
    "parse_literal",
    "parse_module",
    "parse_shape",
    "print_computation",
    "print_instruction",
    "print_module",
]
