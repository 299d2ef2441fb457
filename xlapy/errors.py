"""The exceptions xlapy raises for bad input. Every one derives from XlapyError, so a caller
(and the command line) can catch them all and print the message without a traceback."""

from __future__ import annotations


class XlapyError(Exception):
    """Base of every error xlapy raises for bad programs, inputs or API misuse."""


class HloParseError(XlapyError):
    """Malformed HLO text. Carries the position; str() is `line:col: error: msg`, the source
    line and a caret under the column."""

    def __init__(
        self,
        message: str,
        line: int,
        column: int,
        source_line: str = "",
        filename: str | None = None,
    ):
        self.message = message
        self.line = line
        self.column = column
        self.source_line = source_line
        self.filename = filename
        where = f"{filename}:" if filename else ""
        text = f"{where}{line}:{column}: error: {message}"
        if source_line:
            text += f"\n{source_line}\n{' ' * (column - 1)}^"
        super().__init__(text)


class ShapeError(XlapyError):
    """An operation's operands or attributes do not fit together (shape inference)."""


class VerifierError(XlapyError):
    """An invalid program. The message names the computation and instruction."""


class EvaluationError(XlapyError):
    """A program could not be evaluated (e.g. an elided constant, a missing input)."""


class CustomCallError(XlapyError):
    """A custom call target is unknown, registered twice, or failed. `status_code` is the
    absl status code a failed target returned (XLA FFI handlers: NOT_FOUND, INTERNAL...),
    which the PJRT plugin reports as the call's error code, as XLA does; None otherwise."""

    def __init__(self, message: str, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


class HloAttributeError(VerifierError):
    """An instruction's attribute is missing, or holds a value of the wrong kind, when read
    through one of HloInstruction's typed accessors. The message names the instruction."""
