# ruff: noqa: E501  (golden HLO lines are as long as XLA prints them)
"""The HLO parser on hand-written text: every syntax feature lands in the right IR field,
and hand-written golden texts print back exactly."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from xlapy.ir import attributes as A
from xlapy.ir.module import AliasEntry, BufferDonor
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_literal, parse_module, parse_shape
from xlapy.ir.printer import PrintOptions, print_computation, print_instruction, print_module
from xlapy.ir.shapes import UNBOUNDED, Layout, Shape, Tile
from xlapy.ir.types import PrimitiveType


def _entry(body: str, header: str = "HloModule m") -> str:
    return f"{header}\n\nENTRY main {{\n{body}\n}}\n"


def _root(body: str, header: str = "HloModule m"):
    return parse_module(_entry(body, header)).entry.root


# -- golden texts: parse then print gives the same text --------------------------------------
GOLDEN_SHORT = """\
HloModule golden, is_scheduled=true, input_output_alias={ {0}: (0, {}, may-alias), {1}: (1, {}, must-alias) }, buffer_donor={ (2, {}) }, entry_computation_layout={(f32[2,3]{1,0}, f32[3]{0}, s32[])->(f32[2,3]{1,0}, f32[3]{0})}, replica_count=2, num_partitions=2, frontend_attributes={fa="1"}, allow_spmd_sharding_propagation_to_output={true}

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[2,3]{1,0} parameter(0), sharding={devices=[2,1]0,1}
  y = f32[3]{0} parameter(1)
  i = s32[] parameter(2)
  zero = f32[] constant(0)
  r = f32[3]{0} reduce(x, zero), dimensions={0}, to_apply=add
  big = f32[2,3]{1,0} constant({ { 1, 2.5, -3 }, { nan, inf, -inf } })
  m = f32[2,3]{1,0} multiply(x, big), metadata={op_type="mul" op_name="jit(f)/mul" source_file="f.py" source_line=7}
  cc = f32[3]{0} custom-call(r, y), custom_call_target="my_target", api_version=API_VERSION_TYPED_FFI, backend_config={"opaque": [1, 2]}, output_to_operand_aliasing={{}: (0, {})}
  ar = f32[3]{0} all-reduce(cc), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add
  ROOT t = (f32[2,3]{1,0}, f32[3]{0}) tuple(m, ar)
}

"""

GOLDEN_LONG = """\
HloModule golden_long, entry_computation_layout={(f32[4,4]{1,0})->f32[2,2]{1,0}}

FileNames
1 "a.py"

FunctionNames
1 "f"

FileLocations
1 {file_name_id=1 function_name_id=1 line=3 end_line=3 column=1 end_column=9}

StackFrames
1 {file_location_id=1 parent_frame_id=1}


%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a, %b)
}

%fused (p: f32[4,4]) -> f32[2,2] {
  %p = f32[4,4]{1,0} parameter(0)
  %ninf = f32[] constant(-inf)
  ROOT %rw = f32[2,2]{1,0} reduce-window(%p, %ninf), window={size=2x2 stride=2x2}, to_apply=%max
}

ENTRY %main (x: f32[4,4]) -> f32[2,2] {
  %x = f32[4,4]{1,0} parameter(0), metadata={op_name="x" stack_frame_id=1}
  ROOT %f = f32[2,2]{1,0} fusion(%x), kind=kLoop, calls=%fused, backend_config="cfg"
}

"""


@pytest.mark.parametrize(
    ("text", "options"),
    [(GOLDEN_SHORT, PrintOptions.short()), (GOLDEN_LONG, PrintOptions.long())],
    ids=["short", "long"],
)
def test_golden_text_prints_back_exactly(text, options):
    assert print_module(parse_module(text), options) == text


def test_golden_header_fields():
    config = parse_module(GOLDEN_SHORT).config
    assert config.is_scheduled
    assert config.input_output_alias == (
        AliasEntry((0,), 0, ()),
        AliasEntry((1,), 1, (), "must-alias"),
    )
    assert config.buffer_donors == (BufferDonor(2, ()),)
    assert config.replica_count == 2 and config.num_partitions == 2
    assert config.frontend_attributes.get("fa") == "1"
    assert config.extra_attributes == (("allow_spmd_sharding_propagation_to_output", "{true}"),)
    assert str(config.entry_computation_layout.result) == "(f32[3]{0}, f32[3]{0})".replace(
        "f32[3]{0}, f32[3]", "f32[2,3]{1,0}, f32[3]"
    )


def test_short_alias_form():
    text = _entry("  ROOT p = f32[2] parameter(0)", "HloModule m, input_output_alias={ {}: 0 }")
    assert parse_module(text).config.input_output_alias == (AliasEntry((), 0, (), "may-alias"),)


def test_stack_frame_tables_are_kept():
    tables = parse_module(GOLDEN_LONG).stack_frames
    assert tables.file_names == ((1, "a.py"),)
    assert tables.function_names == ((1, "f"),)
    assert tables.stack_frames == ((1, "file_location_id=1 parent_frame_id=1"),)
    module = parse_module(GOLDEN_LONG)
    assert module.entry.parameter(0).metadata.get("stack_frame_id") == 1


# -- computations and instructions ---------------------------------------------------------
def test_entry_is_marked_or_last():
    text = (
        "HloModule m\n\na {\n  ROOT x = f32[] parameter(0)\n}\n\n"
        "b {\n  ROOT y = s32[] parameter(0)\n}\n"
    )
    module = parse_module(text)
    assert module.entry.name == "b" and module.entry.is_entry
    marked = text.replace("a {", "ENTRY a {")
    assert parse_module(marked).entry.name == "a"


def test_forward_references_and_text_order():
    text = """HloModule m

ENTRY main {
  ROOT r = f32[2] call(s), to_apply=later
  s = f32[2] negate(p)
  p = f32[2] parameter(0)
}

later {
  ROOT q = f32[2] parameter(0)
}
"""
    module = parse_module(text)
    entry = module.entry
    assert [i.name for i in entry.instructions] == ["r", "s", "p"]
    assert entry.root.name == "r"
    assert entry.root.attrs["to_apply"] is module.get_computation("later")
    assert entry.root.operands[0] is entry.get_instruction("s")


def test_missing_root_means_last_instruction():
    root = _root("  p = f32[2] parameter(0)\n  n = f32[2] negate(p)")
    assert root.name == "n"


def test_typed_operands_and_percent_names_are_optional():
    root = _root("  %a = f32[] parameter(0)\n  ROOT %s = f32[] add(f32[] %a, a)")
    assert [o.name for o in root.operands] == ["a", "a"]


def test_comments_are_ignored():
    root = _root("  /* c */ p = (f32[], f32[], /*index=2*/s32[]) parameter(0) // tail\n")
    assert len(root.shape.tuple_shapes) == 3


def test_elided_constant_has_no_literal():
    root = _root("  ROOT c = f32[1000] constant({...})")
    assert root.is_elided_constant and root.literal is None
    assert print_instruction(root) == "ROOT c = f32[1000] constant({...})"


def test_control_predecessors_and_sharding():
    root = _root(
        "  p = f32[] parameter(0)\n  a = f32[] negate(p)\n"
        "  ROOT b = f32[] abs(p), control-predecessors={a}, sharding={maximal device=0}"
    )
    assert [c.name for c in root.control_predecessors] == ["a"]
    assert root.attrs["sharding"] == A.Sharding("maximal", device=0)


def test_execution_thread_on_computation():
    text = 'HloModule m\n\nENTRY e, execution_thread="host" {\n  ROOT p = f32[] parameter(0)\n}\n'
    module = parse_module(text)
    assert module.entry.execution_thread == "host"
    assert print_module(parse_module(print_module(module))) == print_module(module)


# -- shapes --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("f32[]", Shape.scalar("f32")),
        ("f32[2,3]{0,1}", Shape.array("f32", (2, 3), (0, 1))),
        ("bf16[<=4,?]", Shape.array("bf16", (4, UNBOUNDED), dynamic=(True, True))),
        ("token[]", Shape.token()),
        (
            "(s32[], (pred[2]))",
            Shape.tuple([Shape.scalar("s32"), Shape.tuple([Shape.array("pred", (2,))])]),
        ),
        (
            "f32[8,128]{1,0:T(8,128)(2,1)E(4)S(1)}",
            Shape.array("f32", (8, 128), Layout((1, 0), (Tile((8, 128)), Tile((2, 1))), 4, 1)),
        ),
        ("u4[3]{0:T(*,2)}", Shape.array("u4", (3,), Layout((0,), (Tile((Tile.COMBINE_DIM, 2)),)))),
    ],
)
def test_parse_shape(text, expected):
    assert parse_shape(text) == expected


@pytest.mark.parametrize("etype", [t for t in PrimitiveType if t.is_array_type])
def test_every_element_type_parses(etype):
    root = _root(f"  ROOT p = {etype.text}[2]{{0}} parameter(0)")
    assert root.shape.element_type is etype


# -- literals ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shape", "text", "expected"),
    [
        ("pred[3]", "{true, false, 1}", np.array([True, False, True])),
        ("s8[2]", "{-128, 127}", np.array([-128, 127], np.int8)),
        ("u64[1]", "{18446744073709551615}", np.array([2**64 - 1], np.uint64)),
        ("s4[3]", "{-8, 0, 7}", np.array([-8, 0, 7], ml_dtypes.int4)),
        ("f32[2,2]", "{ {1, 2}, {3, 4.5} }", np.array([[1, 2], [3, 4.5]], np.float32)),
        ("f16[3]", "{inf, -inf, 65504}", np.array([np.inf, -np.inf, 65504], np.float16)),
        ("bf16[2]", "{0.1, -3e38}", np.array([0.1, -3e38], ml_dtypes.bfloat16)),
        (
            "c64[2]",
            "{(1, 2), (-0.5, inf)}",
            np.array([1 + 2j, complex(-0.5, np.inf)], np.complex64),
        ),
        ("f32[0]", "{}", np.zeros(0, np.float32)),
        ("f64[]", "1e-300", np.array(1e-300)),
    ],
)
def test_parse_literal_values(shape, text, expected):
    literal = parse_literal(text, shape)
    assert literal.array.dtype == expected.dtype
    np.testing.assert_array_equal(literal.array, expected)


def test_nan_constants_keep_their_bits():
    for etype in ("f32", "f64", "f16", "bf16"):
        lit = parse_literal("{nan, -nan, nan(0x3)}", f"{etype}[3]")
        dtype = lit.array.dtype
        uint = np.dtype(f"u{dtype.itemsize}")
        bits = lit.array.view(uint)
        assert bits[0] != bits[1] and (int(bits[2]) & 0xF) == 3
        text = print_instruction(_root(f"  ROOT c = {etype}[3] constant({{nan, -nan, nan(0x3)}})"))
        assert "{nan, -nan, nan(0x3)}" in text


def test_tuple_constant():
    root = _root("  ROOT t = (f32[], (s32[2], c64[])) constant((1.5, ({1, 2}, (3, -4))))")
    inner = root.literal.elements[1]
    np.testing.assert_array_equal(inner.elements[0].array, np.array([1, 2], np.int32))
    assert inner.elements[1].array[()] == np.complex64(3 - 4j)


@pytest.mark.parametrize(
    "etype", ["f32", "f64", "f16", "bf16", "f8e4m3fn", "f8e5m2", "f8e4m3b11fnuz", "f4e2m1fn"]
)
def test_every_float_value_prints_back_bit_exactly(etype):
    shape = parse_shape(f"{etype}[1]")
    dtype = shape.element_type.dtype
    rng = np.random.default_rng(7)
    width = dtype.itemsize * 8
    bits = rng.integers(0, 2**width, size=300, dtype=np.uint64).astype(f"u{dtype.itemsize}")
    if dtype.itemsize == 1:
        bits = np.arange(2**shape.element_type.bits, dtype=np.uint8)
    values = bits.view(dtype)
    from xlapy.ir.printer import float_text

    for value in values:
        text = float_text(value, shape.element_type)
        back = parse_literal("{" + text + "}", shape).array
        if np.isnan(value.astype(np.float64)):
            assert np.isnan(back.astype(np.float32)[0]), text
            continue
        assert back.tobytes() == np.array([value]).tobytes(), text


# -- attributes ----------------------------------------------------------------------------
def test_structured_attributes():
    body = """  x = f32[1,8,8,3] parameter(0)
  w = f32[3,3,3,4] parameter(1)
  c = f32[1,4,4,4] convolution(x, w), window={size=3x3 stride=2x2 pad=0_1x1_1 lhs_dilate=1x1 rhs_dilate=2x2 rhs_reversal=0x1}, dim_labels=b01f_01io->b01f, feature_group_count=1
  p = f32[1,5,9,4] pad(c, z), padding=0_0x1_0_0x-1_0_2x0_0
  z = f32[] constant(0)
  s = f32[1,2,4,4] slice(c), slice={[0:1], [0:4:2], [0:4], [0:4]}
  cmp = pred[1,4,4,4] compare(c, c), direction=LT, type=TOTALORDER
  d = f32[1,4] dot(x, w), lhs_contracting_dims={1,2}, rhs_contracting_dims={0,1}, operand_precision={highest,default}
  ROOT cp = f32[1,4,4,4] collective-permute(c), channel_id=2, source_target_pairs={{0,1},{1,0}}"""
    comp = parse_module(_entry(body)).entry
    conv = comp.get_instruction("c")
    dims = conv.attrs["window"].dims
    assert dims[0] == A.WindowDim(3, 2, 0, 1, 2, 1, False)
    assert dims[1] == A.WindowDim(3, 2, 1, 1, 2, 1, True)
    labels = conv.attrs["dim_labels"]
    assert (labels.input_batch, labels.input_feature, labels.input_spatial) == (0, 3, (1, 2))
    assert (labels.kernel_input_feature, labels.kernel_output_feature) == (2, 3)
    pad = comp.get_instruction("p").attrs["padding"]
    assert pad.dims == ((0, 0, 0), (1, 0, 0), (-1, 0, 2), (0, 0, 0))
    assert comp.get_instruction("s").attrs["slice"].dims[1] == (0, 4, 2)
    cmp = comp.get_instruction("cmp")
    assert cmp.attrs["direction"] == A.Enum("LT")
    dot = comp.get_instruction("d")
    assert dot.attrs["lhs_contracting_dims"] == (1, 2)
    assert dot.attrs["operand_precision"] == (A.Enum("highest"), A.Enum("default"))
    assert comp.root.attrs["source_target_pairs"] == ((0, 1), (1, 0))
    text = print_computation(comp)
    assert "window={size=3x3 stride=2x2 pad=0_1x1_1 rhs_dilate=2x2 rhs_reversal=0x1}" in text
    assert "padding=0_0_0x1_0_0x-1_0_2x0_0_0" in text


def test_window_fields_default():
    root = _root(
        "  p = f32[4] parameter(0)\n  z = f32[] constant(0)\n"
        "  ROOT r = f32[4] reduce-window(p, z), window={size=2 pad=1_0}, to_apply=add",
        "HloModule m\n\nadd {\n  a = f32[] parameter(0)\n  ROOT b = f32[] parameter(1)\n}",
    )
    assert root.attrs["window"].dims == (A.WindowDim(2, 1, 1, 0, 1, 1, False),)


def test_replica_groups_both_forms():
    body = (
        "  p = f32[4] parameter(0)\n"
        "  a = f32[4] all-gather(p), dimensions={0}, replica_groups=[2,2]<=[4]\n"
        "  ROOT b = f32[4] all-gather(p), dimensions={0}, replica_groups={{0,2},{1,3}}"
    )
    comp = parse_module(_entry(body)).entry
    assert comp.get_instruction("a").attrs["replica_groups"].iota_text == "[2,2]<=[4]"
    assert comp.root.attrs["replica_groups"].groups == ((0, 2), (1, 3))


def test_backend_config_forms():
    quoted = _root('  ROOT p = f32[] parameter(0), backend_config="a\\"b"')
    assert quoted.attrs["backend_config"] == A.BackendConfig('a"b')
    braced = _root('  ROOT p = f32[] parameter(0), backend_config={"x": {"y": "}"}}')
    assert braced.attrs["backend_config"] == A.BackendConfig('{"x": {"y": "}"}}', braced=True)


def test_custom_call_attributes():
    root = _root(
        '  p = f32[2] parameter(0)\n  ROOT c = (f32[2], s32[]) custom-call(p), custom_call_target="t", '
        "operand_layout_constraints={f32[2]{0}}, custom_call_has_side_effect=true, "
        'output_to_operand_aliasing={{0}: (0, {})}, frontend_attributes={a.b="1",c="x"}'
    )
    assert root.attrs["custom_call_target"] == "t"
    assert root.attrs["operand_layout_constraints"] == (Shape.array("f32", (2,), (0,)),)
    assert root.has_side_effect
    assert root.attrs["output_to_operand_aliasing"] == (A.OutputOperandAlias((0,), 0, ()),)
    assert root.attrs["frontend_attributes"].get("a.b") == "1"


def test_operand_count_table():
    module = parse_module(
        _entry("  p = f32[] parameter(0)\n  ROOT t = (f32[], f32[], f32[]) tuple(p, p, p)")
    )
    assert module.entry.root.opcode is Opcode.TUPLE and len(module.entry.root.operands) == 3


def test_print_options_toggle_metadata_and_elision():
    module = parse_module(GOLDEN_SHORT)
    assert "metadata=" not in print_module(module, metadata=False)
    elided = print_module(module, elide_constants_over=3)
    assert "constant({...})" in elided and "constant(0)" in elided
    assert "add(f32[] a, f32[] b)" in print_module(module, operand_shapes=True)


def test_frontend_attribute_with_unquoted_structured_value():
    # Shardy's mesh table, as jax's shard_map lowering writes it in the module header.
    text = (
        'HloModule m, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["i"=1]>},k="v"}\n\n'
        "ENTRY main {\n  ROOT a = f32[2] parameter(0)\n}\n"
    )
    module = parse_module(text)
    attrs = module.config.frontend_attributes
    assert attrs.get("xla.sdy.meshes").text == '{mesh = #sdy.mesh<["i"=1]>}'
    assert attrs.get("k") == "v"
    assert print_module(parse_module(print_module(module))) == print_module(module)
