"""The parser's fast paths (whole-line regexes, shape and scalar caches) agree with its general
rules: text with comments and odd spacing reads like plain text, and a cached form never
lets a wrong one through."""

import pytest

from xlapy.errors import HloParseError
from xlapy.ir.parser import parse_module

PLAIN = """HloModule m

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[2,3]{1,0} parameter(0)
  z = f32[] constant(0)
  r = f32[2]{0} reduce(x, z), dimensions={1}, to_apply=add
  ROOT n = f32[2]{0} negate(r)
}
"""

# The same module with comments and line breaks wherever the grammar allows them.
NOISY = """HloModule m

add /* c */ {
  a = f32[] /* c */ parameter( 0 )
  b =
    f32[] parameter(1) // c
  ROOT /* c */ s = f32[] add( a /* c */, b )
}

ENTRY main {
  x = f32[2,3]{1,0} parameter(0)
  z = f32[]constant(0)
  r = f32[2]{0} reduce(f32[2,3]{1,0} x, f32[] z), dimensions = { 1 }, /* c */ to_apply = add
  ROOT n = f32[2]{0} negate(%r)
}
"""


def test_comments_and_spacing_read_like_plain_text():
    assert parse_module(NOISY).to_text() == parse_module(PLAIN).to_text()


def test_names_that_look_like_keywords():
    text = """HloModule m
ENTRY {
  f32 = f32[] parameter(0)
  token = f32[] parameter(1)
  ROOT ROOT = f32[] add(f32, token)
}
"""
    with pytest.raises(HloParseError, match=r"expected a computation name, found '\{'"):
        parse_module(text)
    root = parse_module(text.replace("ENTRY {", "ENTRY ENTRY {")).entry.root
    assert root.name == "ROOT"
    assert [o.name for o in root.operands] == ["f32", "token"]


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [
        ("f32[2,3]{1,0}", "f32[2,3]{1,1}", "is not a permutation"),
        ("s32[]", "s8[]", "value 300 is out of range for s8"),
    ],
)
def test_a_cached_form_does_not_admit_a_wrong_one(good, bad, message):
    value = "300" if "[]" in good else "{ {1, 2, 3}, {4, 5, 6} }"

    def module(shape):
        return f"HloModule m\nENTRY e {{\n  ROOT c = {shape} constant({value})\n}}\n"

    parse_module(module(good))
    with pytest.raises(HloParseError, match=message):
        parse_module(module(bad))


def test_unterminated_comment_after_attribute_key():
    text = (
        "HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n"
        "  ROOT r = f32[2] reverse(p), dimensions= /* x\n}\n"
    )
    with pytest.raises(HloParseError, match="unterminated comment") as err:
        parse_module(text)
    assert (err.value.line, err.value.column) == (4, 43)
