"""The programs JAX hands the plugin, turned into xlapy modules.

`PJRT_Client_Compile` receives a program and its format: "mlir" (StableHLO as MLIR
bytecode, usually a versioned portable artifact, or MLIR text) or "hlo" (a serialized
HloModuleProto, which xlapy does not read). This file is the one place that knows how.
"""

from __future__ import annotations

from xlapy.errors import XlapyError
from xlapy.ir.module import HloModule
from xlapy.stablehlo import import_bytes


class ProgramFormatError(XlapyError):
    """A program in a format the plugin does not read."""


def module_from_program(code: bytes, fmt: str) -> HloModule:
    """The HloModule of a program of format `fmt` ("mlir")."""
    if fmt != "mlir":
        raise ProgramFormatError(
            f"xlapy's PJRT plugin reads programs of format 'mlir' (StableHLO); got '{fmt}'"
        )
    return import_bytes(code)
