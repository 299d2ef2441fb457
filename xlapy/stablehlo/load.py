"""The front doors: StableHLO text, StableHLO bytes, and `load`, which takes any input."""

from __future__ import annotations

from xlapy.ir.module import HloModule
from xlapy.stablehlo.convert import convert_text


def import_text(text: str, filename: str = "<stablehlo>") -> HloModule:
    """The HloModule of StableHLO text (as `jax.jit(f).lower(x).as_text()` prints it, pretty
    or generic form). HloParseError at the line and column of anything malformed or
    unsupported."""
    return convert_text(text, filename)


def import_bytes(data: bytes) -> HloModule:
    """The HloModule of StableHLO bytes: MLIR bytecode, a versioned portable artifact, or
    `jax.export.Exported.serialize()` output."""
    from xlapy.stablehlo.bytecode import bytes_to_text

    return import_text(bytes_to_text(data), "<stablehlo bytecode>")


def load(source, filename: str | None = None) -> HloModule:
    """An HloModule from HLO text, StableHLO text, StableHLO bytecode / portable artifact,
    or a serialized jax.export artifact, given as the data (str or bytes) or a path; the
    format is found from the content. `filename` names the source in error messages."""
    from xlapy.stablehlo.bytecode import load_any

    return load_any(source, filename)
