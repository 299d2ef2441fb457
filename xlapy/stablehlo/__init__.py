"""StableHLO in: MLIR text (and bytecode, through jaxlib's MLIR bindings) -> HloModule.

    import_text(text, filename="<stablehlo>") -> HloModule   the `stablehlo`, `func`, `chlo`
                                                              and `check` dialects as text
    import_bytes(data) -> HloModule                           MLIR bytecode, a portable
                                                              artifact or jax.export bytes
    load(source) -> HloModule                                 any input format, detected

Errors in the input are HloParseError (`file:line:col: error: ...` with a caret) or another
XlapyError; never a Python traceback.
"""

from xlapy.stablehlo.load import import_bytes, import_text, load

__all__ = ["import_bytes", "import_text", "load"]
