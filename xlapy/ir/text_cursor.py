"""The cursor both text readers share: HLO text (xlapy.ir.parser) and MLIR text
(xlapy.stablehlo.mlir).

A cursor is the text, a position in it, a nesting depth with a limit, and the token-level
moves every grammar rule is written with (skip whitespace and comments, peek, accept,
expect, match a pattern, identifiers, integers). Errors are HloParseErrors that name the
line and column and carry the source line for the caret. Each reader sets the patterns of
its language (what counts as whitespace, an identifier, an integer) as class attributes
and words "expected X, found Y" its own way.
"""

from __future__ import annotations

import bisect
import re

from xlapy.errors import HloParseError

MAX_DEPTH = 64
_SPACE_OR_COMMENT = frozenset(" \t\n\r\f\v/")


def error_at(
    text: str,
    filename: str | None,
    message: str,
    pos: int,
    line_starts: list[int] | None = None,
) -> HloParseError:
    """An HloParseError at offset `pos` of `text`: line, column, the line and a caret.
    `line_starts` (offsets where lines begin) saves rescanning long text."""
    pos = max(0, min(pos, len(text)))
    if line_starts is None:
        line = text.count("\n", 0, pos) + 1
        start = text.rfind("\n", 0, pos) + 1
    else:
        line = bisect.bisect_right(line_starts, pos)
        start = line_starts[line - 1]
    end = text.find("\n", start)
    source = text[start : end if end >= 0 else len(text)]
    return HloParseError(message, line, pos - start + 1, source, filename)


class TextCursor:
    """A position in `text` and the token-level moves over it."""

    WHITESPACE: re.Pattern = re.compile(r"\s*")  # must match the empty string
    IDENT: re.Pattern = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
    INT: re.Pattern = re.compile(r"[-+]?[0-9]+(?![0-9A-Za-z_.])")
    INT_BASE = 10  # 0: also 0x... (MLIR)
    # Longer integer literals are refused before int() sees them (Python refuses 4,300
    # digits); the default fits a sign and the 20 digits of 2**64 - 1.
    MAX_INT_CHARS = 21

    def __init__(self, text: str, filename: str | None):
        self.text = text
        self.filename = filename
        self.pos = 0
        self.depth = 0
        self._line_starts: list[int] | None = None

    # -- errors ----------------------------------------------------------------------------
    def error(self, message: str, pos: int | None = None) -> HloParseError:
        if self._line_starts is None:
            self._line_starts = [0] + [m.end() for m in re.finditer(r"\n", self.text)]
        at = self.pos if pos is None else pos
        return error_at(self.text, self.filename, message, at, self._line_starts)

    def found(self) -> str:
        """How the text at the cursor is named in "expected X, found Y"."""
        self.skip()
        if self.pos >= len(self.text):
            return "end of input"
        m = self.IDENT.match(self.text, self.pos)
        return f"'{m.group(0) if m else self.text[self.pos]}'"

    def expected(self, what: str) -> HloParseError:
        return self.error(f"expected {what}, found {self.found()}")

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"nesting deeper than {MAX_DEPTH} levels")

    def leave(self) -> None:
        self.depth -= 1

    # -- tokens ----------------------------------------------------------------------------
    def skip(self) -> None:
        pos = self.pos
        if pos < len(self.text) and self.text[pos] not in _SPACE_OR_COMMENT:
            return
        m = self.WHITESPACE.match(self.text, pos)
        assert m is not None, "the whitespace pattern matches the empty string"
        self.pos = m.end()

    def at_end(self) -> bool:
        self.skip()
        return self.pos >= len(self.text)

    def peek(self, s: str) -> bool:
        self.skip()
        return self.text.startswith(s, self.pos)

    def accept(self, s: str) -> bool:
        if self.peek(s):
            self.pos += len(s)
            return True
        return False

    def expect(self, s: str, what: str | None = None) -> None:
        if not self.accept(s):
            raise self.expected(what or f"'{s}'")

    def match(self, regex: re.Pattern) -> re.Match | None:
        self.skip()
        m = regex.match(self.text, self.pos)
        if m:
            self.pos = m.end()
        return m

    def peek_ident(self) -> str | None:
        self.skip()
        m = self.IDENT.match(self.text, self.pos)
        return m.group(0) if m else None

    def ident(self, what: str = "an identifier") -> str:
        m = self.match(self.IDENT)
        if m is None:
            raise self.expected(what)
        return m.group(0)

    def keyword(self, word: str) -> bool:
        """Accept `word` when it stands alone (not the start of a longer identifier)."""
        if self.peek_ident() == word:
            self.pos += len(word)
            return True
        return False

    def integer(self, what: str = "an integer") -> int:
        m = self.match(self.INT)
        if m is None:
            raise self.expected(what)
        return self.int_value(m.group(0), m.start())

    def int_value(self, text: str, pos: int) -> int:
        """The value of an integer literal read at `pos`; too many digits is an error."""
        if len(text) > self.MAX_INT_CHARS:
            shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} digits)"
            raise self.error(f"value {shown} is out of range", pos)
        return int(text, self.INT_BASE)
