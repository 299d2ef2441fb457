"""Malformed HLO text: every case must raise HloParseError at the right place.

Each row is (id, text, line, column, a substring of the message). Nothing else may escape
from the parser (no IndexError, KeyError, ValueError or RecursionError).
"""

import pytest

from xlapy.errors import HloParseError
from xlapy.ir.parser import parse_module

H = "HloModule m\n\n"


def E(body):
    """A module whose entry computation has the given body lines."""
    return H + "ENTRY main {\n" + body + "\n}\n"


P = "  p = f32[2] parameter(0)\n"

CASES = [
    ("empty", "", 1, 1, "empty input: expected 'HloModule'"),
    ("blank", "   \n  \n", 3, 1, "empty input: expected 'HloModule'"),
    (
        "no_header",
        "HloModul m\nENTRY main {\n  p = f32[] parameter(0)\n}\n",
        1,
        1,
        "expected 'HloModule', a computation or an instruction, found 'HloModul'",
    ),
    ("no_computations", "HloModule m\n", 2, 1, "module has no computations"),
    (
        "unknown_opcode",
        E(P + "  ROOT r = f32[2] frobnicate(p)"),
        5,
        19,
        "unknown opcode 'frobnicate'",
    ),
    ("arity_add", E(P + "  ROOT r = f32[2] add(p)"), 5, 19, "'add' takes 2 operands, 'r' has 1"),
    (
        "arity_neg",
        E(P + "  ROOT r = f32[2] negate(p, p)"),
        5,
        19,
        "'negate' takes 1 operand, 'r' has 2",
    ),
    (
        "arity_select",
        E(P + "  ROOT r = f32[2] select(p, p)"),
        5,
        19,
        "'select' takes 3 operands, 'r' has 2",
    ),
    (
        "undefined_operand",
        E(P + "  ROOT r = f32[2] add(p, q)"),
        5,
        26,
        "instruction 'r' uses undefined operand 'q' (n",
    ),
    (
        "undefined_computation",
        E(P + "  ROOT r = f32[2] call(p), to_apply=nowhere"),
        5,
        37,
        "instruction 'r' calls undefined computation '",
    ),
    ("dup_instr", E(P + "  p = f32[2] parameter(1)"), 5, 3, "duplicate instruction name 'p'"),
    (
        "dup_comp",
        H + "c {\n  a = f32[] parameter(0)\n}\nc {\n  b = f32[] parameter(0)\n}\n",
        6,
        1,
        "duplicate computation name 'c'",
    ),
    (
        "const_count",
        E("  ROOT c = f32[3] constant({1, 2})"),
        4,
        28,
        "constant has 2 elements in dimension 0, shape",
    ),
    (
        "const_rank",
        E("  ROOT c = f32[2,2] constant({1, 2})"),
        4,
        31,
        "expected '{' opening dimension 1 of constant ",
    ),
    (
        "const_type",
        E("  ROOT c = s32[] constant(1.5)"),
        4,
        27,
        "expected an integer of type s32, found '1.5'",
    ),
    (
        "const_pred",
        E("  ROOT c = pred[] constant(2)"),
        4,
        28,
        "expected 'true' or 'false', found '2'",
    ),
    (
        "const_range_s8",
        E("  ROOT c = s8[] constant(128)"),
        4,
        26,
        "value 128 is out of range for s8",
    ),
    (
        "const_range_u8",
        E("  ROOT c = u8[2] constant({1, -1})"),
        4,
        31,
        "value -1 is out of range for u8",
    ),
    (
        "const_range_f16",
        E("  ROOT c = f16[] constant(1e10)"),
        4,
        27,
        "value 1e10 is out of range for f16",
    ),
    (
        "const_range_f32",
        E("  ROOT c = f32[] constant(1e39)"),
        4,
        27,
        "value 1e39 is out of range for f32",
    ),
    (
        "const_huge_int",
        E("  ROOT c = s64[] constant(99999999999999999999999)"),
        4,
        27,
        "value 99999999999999999999999 is out of range",
    ),
    (
        "const_inf_fn",
        E("  ROOT c = f8e4m3fn[] constant(inf)"),
        4,
        32,
        "value inf is out of range for f8e4m3fn",
    ),
    (
        "const_complex",
        E("  ROOT c = c64[] constant(1)"),
        4,
        27,
        "expected '(' opening a c64 value (real, imag)",
    ),
    (
        "const_tuple_arity",
        E("  ROOT c = (f32[], s32[]) constant((1))"),
        4,
        38,
        "expected ',' before tuple constant element 1,",
    ),
    (
        "bad_layout_perm",
        E("  ROOT p = f32[2,3]{0,0} parameter(0)"),
        4,
        20,
        "layout {0,0} is not a permutation of the 2 di",
    ),
    (
        "bad_layout_len",
        E("  ROOT p = f32[2,3]{0} parameter(0)"),
        4,
        20,
        "layout {0} is not a permutation of the 2 dime",
    ),
    (
        "bad_layout_range",
        E("  ROOT p = f32[2,3]{2,0} parameter(0)"),
        4,
        20,
        "layout {2,0} is not a permutation of the 2 di",
    ),
    ("unknown_type", E("  ROOT p = f31[2] parameter(0)"), 4, 12, "unknown element type 'f31'"),
    (
        "unknown_attr",
        E(P + "  ROOT r = f32[2] negate(p), frob=3"),
        5,
        30,
        "unknown attribute 'frob' on 'r'",
    ),
    (
        "attr_wrong_kind_int",
        E(P + "  ROOT r = f32[2] broadcast(p), dimensions=3"),
        5,
        44,
        "expected '{' opening an integer list, found '",
    ),
    (
        "attr_wrong_kind_bool",
        E(P + "  ROOT r = f32[2] sort(p), dimensions={0}, is_stable=maybe"),
        5,
        54,
        "expected 'true' or 'false', found 'maybe'",
    ),
    (
        "attr_twice",
        E(P + "  ROOT r = f32[2] negate(p), metadata={}, metadata={}"),
        5,
        43,
        "attribute 'metadata' given twice on 'r'",
    ),
    (
        "unterminated_string",
        E(P + '  ROOT r = f32[2] negate(p), metadata={op_name="abc}'),
        5,
        48,
        "unterminated string",
    ),
    (
        "unterminated_comment",
        E(P + "  ROOT r = f32[2] negate(/* p)"),
        5,
        26,
        "unterminated comment",
    ),
    (
        "truncated",
        E(P + "  ROOT r = f32[2] negate(p)")[:-5],
        5,
        26,
        "expected an operand name, found end of input",
    ),
    (
        "truncated_mid",
        (H + "ENTRY main {\n" + P + "  ROOT r = f32[2] add(p,"),
        5,
        25,
        "expected an operand name, found end of input",
    ),
    (
        "missing_eq",
        E(P + "  ROOT r f32[2] negate(p)"),
        5,
        10,
        "expected '=' after instruction name 'r', foun",
    ),
    (
        "missing_shape",
        E(P + "  ROOT r = reshape(p)"),
        5,
        12,
        "cannot infer the shape of 'r': reshape: needs a result shape",
    ),
    (
        "missing_paren",
        E(P + "  ROOT r = f32[2] negate p"),
        5,
        26,
        "expected '(' after opcode 'negate', found 'p'",
    ),
    (
        "two_roots",
        E(P + "  ROOT a = f32[2] negate(p)\n  ROOT b = f32[2] negate(p)"),
        6,
        3,
        "computation 'main' has more than one ROOT",
    ),
    (
        "two_entries",
        H + "ENTRY a {\n  p = f32[] parameter(0)\n}\nENTRY b {\n  p = f32[] parameter(0)\n}\n",
        6,
        1,
        "more than one ENTRY computation",
    ),
    (
        "param_gap",
        E("  a = f32[] parameter(0)\n  ROOT b = f32[] parameter(2)"),
        6,
        1,
        "parameters of computation 'main' are numbered",
    ),
    (
        "deep_tuple",
        E("  ROOT p = " + "(" * 200 + "f32[]" + ")" * 200 + " parameter(0)"),
        4,
        77,
        "nesting deeper than 64 levels",
    ),
    (
        "deep_raw",
        E(P + "  ROOT r = f32[2] negate(p), statistics=" + "{" * 500 + "}" * 500),
        5,
        105,
        "nesting deeper than 64 levels",
    ),
    (
        "bad_window",
        E(P + "  ROOT r = f32[2] reduce-window(p, p), window={size=2 strid=1}, to_apply=main"),
        5,
        55,
        "unknown window field 'strid'",
    ),
    (
        "window_rank",
        E(P + "  ROOT r = f32[2] reduce-window(p, p), window={size=2x2 stride=1}, to_apply=main"),
        5,
        66,
        "window field 'stride' has 1 values, size 2",
    ),
    (
        "bad_dim_labels",
        E(P + "  ROOT r = f32[2] convolution(p, p), dim_labels=b01f_01xo->b01f"),
        5,
        49,
        "bad dim_labels 'b01f_01xo->b01f': '01xo' need",
    ),
    (
        "bad_slice",
        E(P + "  ROOT r = f32[1] slice(p), slice={[0:1:0]}"),
        5,
        41,
        "slice stride must be positive",
    ),
    (
        "bad_padding",
        E(P + "  ROOT r = f32[1] pad(p, p), padding=0_0_-1"),
        5,
        38,
        "interior padding must not be negative",
    ),
    (
        "bad_alias",
        "HloModule m, input_output_alias={ {0}: (0, {}, maybe-alias) }\n\n"
        "ENTRY e {\n  ROOT p = f32[] parameter(0)\n}\n",
        1,
        47,
        "unknown alias kind 'maybe-alias'",
    ),
    (
        "bad_header_attr",
        "HloModule m, is_scheduled=yes\n\nENTRY e {\n  ROOT p = f32[] parameter(0)\n}\n",
        1,
        27,
        "expected 'true' or 'false', found 'yes'",
    ),
    (
        "replica_count_zero",
        "HloModule m, replica_count=0\n\nENTRY e {\n  ROOT p = f32[] parameter(0)\n}\n",
        1,
        28,
        "replica_count must be at least 1",
    ),
    ("dyn_dim_neg", E("  ROOT p = f32[-1] parameter(0)"), 4, 16, "dimension size -1 out of range"),
    ("empty_computation", H + "ENTRY main {\n}\n", 4, 2, "computation 'main' has no instructions"),
    (
        "garbage_after",
        E(P + "  ROOT r = f32[2] negate(p)") + "@@@",
        7,
        1,
        "expected a computation name, found '@'",
    ),
    (
        "bad_escape",
        E(P + '  ROOT r = f32[2] custom-call(p), custom_call_target="a\\q"'),
        5,
        56,
        "bad escape sequence in string",
    ),
    (
        "call_cycle",
        H + "a {\n  p = f32[] parameter(0)\n  ROOT r = f32[] call(p), to_apply=a\n}\n",
        5,
        36,
        "computation 'a' calls itself (a cycle)",
    ),
    (
        "unbalanced_raw",
        E(P + "  ROOT r = f32[2] negate(p), statistics={(]}"),
        5,
        43,
        "unbalanced ']'",
    ),
    (
        "nan_payload_too_big",
        E("  ROOT c = f16[] constant(nan(0xfffff))"),
        4,
        27,
        "nan payload nan(0xfffff) does not fit f16",
    ),
]


@pytest.mark.parametrize(
    ("text", "line", "column", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_malformed_input_raises_parse_error(text, line, column, message):
    with pytest.raises(HloParseError) as info:
        parse_module(text, filename="bad.hlo")
    err = info.value
    assert message in err.message
    assert (err.line, err.column) == (line, column)
    assert err.filename == "bad.hlo"
    rendered = str(err)
    assert rendered.startswith(f"bad.hlo:{line}:{column}: error: ")
    if err.source_line:
        assert rendered.endswith("\n" + " " * (column - 1) + "^")


def test_there_are_at_least_forty_distinct_cases():
    assert len({c[0] for c in CASES}) == len(CASES) >= 40
    assert len({c[1] for c in CASES}) == len(CASES)
