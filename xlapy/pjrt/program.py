"""The programs JAX hands the plugin, turned into xlapy modules.

`PJRT_Client_Compile` receives a program and its format: "mlir" (StableHLO as MLIR
bytecode, usually a versioned portable artifact, or MLIR text) or "hlo" (a serialized
HloModuleProto, which xlapy does not read). This file is the one place that knows how.
"""

from __future__ import annotations

import numpy as np

from xlapy.errors import XlapyError
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.literal import Literal
from xlapy.ir.module import HloModule
from xlapy.ir.names import NameUniquer
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import ProgramShape, Shape
from xlapy.stablehlo import import_bytes

RUNTIME_TOKEN = Shape.array("pred", (0,))
"""What JAX passes and expects for a token of the entry computation (its RuntimeTokenSet
hands `np.zeros(0, bool)` buffers around): a program's tokens in its signature are these."""


class ProgramFormatError(XlapyError):
    """A program in a format the plugin does not read."""


def check_format(fmt: str) -> None:
    """ProgramFormatError unless `fmt` is a format the plugin reads ("mlir")."""
    if fmt != "mlir":
        raise ProgramFormatError(
            f"xlapy's PJRT plugin reads programs of format 'mlir' (StableHLO); got '{fmt}'"
        )


def module_from_mlir(code: bytes) -> HloModule:
    """The HloModule of StableHLO `code` (MLIR bytecode or text) as JAX hands it over, its
    entry's tokens made runtime tokens (`runtime_tokens`). Client.compile's `importer` for
    the plugin's programs (its name keys their program images)."""
    module = import_bytes(code)
    runtime_tokens(module)
    return module


def runtime_tokens(module: HloModule) -> bool:
    """Make the entry computation's token parameters and results (JAX threads its ordered
    effects through them: `jax.token = true`) pred[0] arrays, the buffers JAX passes for
    them: a token parameter's uses read an `after-all()` instead, a token result is an
    empty constant (the side-effecting instructions the token ordered stay, being side
    effects; the device runs executions in the order they were started). Returns whether
    anything changed."""
    entry = module.entry_computation()
    tokens = [p for p in entry.parameters if p.shape.is_token]
    root = entry.root_instruction()
    results = root.operands if root.opcode is Opcode.TUPLE else [root]
    if not tokens and not any(r.shape.is_token for r in results):
        return False
    names = NameUniquer(module)
    first = entry.instructions[0]
    for param in tokens:
        token = HloInstruction(names.fresh("runtime_token"), Opcode.AFTER_ALL, Shape.token())
        entry.add_instruction(token, before=first)
        entry.replace_all_uses(param, token)
        param.shape = RUNTIME_TOKEN

    def empty() -> HloInstruction:
        literal = Literal(RUNTIME_TOKEN, np.zeros(0, np.bool_))
        const = HloInstruction(
            names.fresh("runtime_token"), Opcode.CONSTANT, RUNTIME_TOKEN, literal=literal
        )
        return entry.add_instruction(const, before=root)

    if root.opcode is Opcode.TUPLE:
        for i, operand in enumerate(list(root.operands)):
            if operand.shape.is_token:
                root.replace_operand_at(i, empty())
        root.shape = Shape.tuple(o.shape for o in root.operands)
    elif root.shape.is_token:
        entry.set_root(empty())
    config = module.config
    if config.entry_computation_layout is not None:
        config.entry_computation_layout = ProgramShape(
            tuple(p.shape for p in entry.parameters), entry.root_instruction().shape
        )
    return True
