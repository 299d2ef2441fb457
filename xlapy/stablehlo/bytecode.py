"""StableHLO bytes -> text, and format detection for `xlapy.load`.

MLIR bytecode (`ML\\xefR` magic) and StableHLO's versioned portable artifacts are read
through jaxlib's MLIR bindings (`deserialize_portable_artifact` takes both) and printed as
text with their locations, which the text importer then reads. A `jax.export` serialization
is a flatbuffer holding the module's bytecode; jax's own deserializer takes it apart. xlapy
does not need jax otherwise, so each of these says plainly what to install when it is missing.
"""

from __future__ import annotations

import importlib
import os
import re

from xlapy.errors import XlapyError
from xlapy.ir.module import HloModule

MLIR_MAGIC = b"ML\xefR"
_HLO_TEXT = re.compile(r"\A(?:\s+|//[^\n]*\n|/\*.*?\*/)*HloModule\b", re.DOTALL)


class StableHloBytesError(XlapyError):
    """StableHLO bytes that cannot be read (or jax/jaxlib, which reads them, is missing)."""


def bytes_to_text(data: bytes) -> str:
    """The MLIR text of StableHLO bytecode, a portable artifact or a jax.export artifact."""
    data = bytes(data)
    if not data.startswith(MLIR_MAGIC):
        if MLIR_MAGIC in data:
            data = _exported_bytecode(data)
        else:
            raise StableHloBytesError(
                "not StableHLO bytecode: the data does not start with MLIR's magic 'ML\\xefR'"
            )
    try:
        jax_mlir = importlib.import_module("jax._src.interpreters.mlir")
        _jax = importlib.import_module("jax._src.lib")._jax
    except ImportError as e:
        raise StableHloBytesError(
            f"reading StableHLO bytecode needs jax and jaxlib (pip install jax): {e}"
        ) from None
    try:
        with jax_mlir.make_ir_context():
            module = _jax.mlir.deserialize_portable_artifact(data)
            return module.operation.get_asm(enable_debug_info=True)
    except Exception as e:  # jaxlib reports bad bytecode with assorted exception types
        raise StableHloBytesError(f"cannot read StableHLO bytecode: {e}") from None


def _exported_bytecode(data: bytes) -> bytes:
    """The module bytecode inside a `jax.export.Exported.serialize()` artifact."""
    try:
        from jax import export
    except ImportError as e:
        raise StableHloBytesError(f"reading a jax.export artifact needs jax: {e}") from None
    try:
        exported = export.deserialize(bytearray(data))
    except ImportError as e:
        raise StableHloBytesError(f"reading a jax.export artifact needs {e}") from None
    except Exception as e:  # a corrupt flatbuffer raises whatever the reader hits first
        raise StableHloBytesError(f"cannot read the jax.export artifact: {e}") from None
    return bytes(exported.mlir_module_serialized)


def load_any(source, filename: str | None = None) -> HloModule:
    """See xlapy.stablehlo.load: the data (str or bytes) or a path, any input format."""
    from xlapy.ir.parser import parse_module
    from xlapy.stablehlo.load import import_text

    if isinstance(source, os.PathLike) or (
        isinstance(source, str)
        and "\n" not in source
        and len(source) < 4096
        and os.path.isfile(source)
    ):
        filename = os.fspath(source)
        try:
            with open(filename, "rb") as f:
                source = f.read()
        except OSError as e:
            raise XlapyError(f"{filename}: {e.strerror}") from None
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        if MLIR_MAGIC in data[:4] or (MLIR_MAGIC in data and b"\0" in data[:64]):
            return import_text(bytes_to_text(data), filename or "<stablehlo bytecode>")
        try:
            source = data.decode("utf-8")
        except UnicodeDecodeError:
            where = f"{filename}: " if filename else ""
            raise XlapyError(
                f"{where}neither text nor StableHLO bytecode (no 'ML\\xefR' magic)"
            ) from None
    if not isinstance(source, str):
        raise XlapyError(f"cannot load a {type(source).__name__}: give text, bytes or a path")
    if _HLO_TEXT.match(source):
        return parse_module(source, filename=filename)
    return import_text(source, filename or "<stablehlo>")
