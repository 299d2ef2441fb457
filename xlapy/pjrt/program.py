"""The programs JAX hands the plugin, turned into xlapy modules.

`PJRT_Client_Compile` receives a program and its format: "mlir" (StableHLO as MLIR
bytecode, usually a versioned portable artifact, or MLIR text) or "hlo" (a serialized
HloModuleProto, which xlapy does not read). This file is the one place that knows how.
"""

from __future__ import annotations

from xlapy.errors import XlapyError
from xlapy.ir.module import HloModule


class ProgramFormatError(XlapyError):
    """A program in a format the plugin does not read."""


def module_from_program(code: bytes, fmt: str) -> HloModule:
    """The HloModule of a program of format `fmt` ("mlir")."""
    if fmt != "mlir":
        raise ProgramFormatError(
            f"xlapy's PJRT plugin reads programs of format 'mlir' (StableHLO); got '{fmt}'"
        )
    try:
        from xlapy.stablehlo import import_bytes  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return _module_through_jaxlib(code)
    module: HloModule = import_bytes(code)
    return module


def _module_through_jaxlib(code: bytes) -> HloModule:
    """Until xlapy's StableHLO importer lands: jaxlib converts StableHLO to an XLA
    computation, whose HLO text xlapy parses. This fallback goes once the importer
    (`xlapy.stablehlo.import_bytes`) is merged."""
    from jax._src.lib import _jax

    from xlapy.ir.parser import parse_module

    computation = _jax.mlir.mlir_module_to_xla_computation(
        code, use_tuple_args=False, return_tuple=False
    )
    return parse_module(computation.as_hlo_text())
