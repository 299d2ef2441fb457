# ruff: noqa: E501  (HLO lines are as long as XLA prints them)
"""HloInstruction's typed attribute accessors: what each returns for attributes read from HLO
text, the defaults of absent ones, and the error (naming the instruction) for a missing
required or a malformed attribute."""

import pytest

from xlapy.errors import HloAttributeError, VerifierError
from xlapy.ir import attributes as A
from xlapy.ir.parser import parse_module

TEXT = """HloModule m

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

ENTRY e {
  x = f32[4,8] parameter(0)
  y = f32[8,3] parameter(1)
  i = s32[5,1] parameter(2)
  img = f32[1,6,6,2] parameter(3)
  k = f32[3,3,2,4] parameter(4)
  z = f32[] constant(0)
  dot = f32[4,3] dot(x, y), lhs_contracting_dims={1}, rhs_contracting_dims={0}, operand_precision={highest,default}
  g = f32[5,8] gather(x, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}
  u = f32[5,8] parameter(5)
  s = f32[4,8] scatter(x, i, u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add, unique_indices=true
  rw = f32[2,8] reduce-window(x, z), window={size=2x1 stride=2x1}, to_apply=add
  conv = f32[1,4,4,4] convolution(img, k), window={size=3x3}, dim_labels=b01f_01io->b01f, feature_group_count=1
  pad = f32[6,8] pad(x, z), padding=1_1x0_0
  sl = f32[2,8] slice(x), slice={[0:4:2], [0:8]}
  f = c64[8] parameter(6)
  fft = c64[8] fft(f), fft_type=IFFT, fft_length={8}
  cmp = pred[4,8] compare(x, x), direction=LT
  ar = f32[4,8] all-reduce(x), replica_groups={{0,1}}, channel_id=3, use_global_device_ids=true, to_apply=add
  cp = f32[4,8] collective-permute(x), source_target_pairs={{0,1},{1,0}}
  cc = f32[4,8] custom-call(x), custom_call_target="my_target", backend_config="opaque text", api_version=API_VERSION_TYPED_FFI, frontend_attributes={key="value"}
  ROOT t = (f32[4,3], f32[5,8], f32[4,8], f32[2,8], f32[1,4,4,4], f32[6,8], f32[2,8], c64[8], pred[4,8], f32[4,8], f32[4,8], f32[4,8]) tuple(dot, g, s, rw, conv, pad, sl, fft, cmp, ar, cp, cc)
}
"""


@pytest.fixture(scope="module")
def instrs():
    module = parse_module(TEXT)
    return {i.name: i for i in module.entry.instructions}


def test_structured_attributes_come_back_typed(instrs):
    dot = instrs["dot"].dot_dimension_numbers
    assert dot == A.DotDimensionNumbers((), (), (1,), (0,))
    assert instrs["dot"].operand_precision == ("highest", "default")
    g = instrs["g"].gather_dimension_numbers
    assert (g.offset_dims, g.collapsed_slice_dims, g.start_index_map) == ((1,), (0,), (0,))
    assert (g.index_vector_dim, g.slice_sizes, g.operand_batching_dims) == (1, (1, 8), ())
    s = instrs["s"].scatter_dimension_numbers
    assert (s.update_window_dims, s.inserted_window_dims, s.index_vector_dim) == ((1,), (0,), 1)
    assert instrs["s"].unique_indices and not instrs["s"].indices_are_sorted
    assert instrs["s"].to_apply.name == "add"
    rw = instrs["rw"]
    assert isinstance(rw.window, A.Window) and [d.stride for d in rw.window.dims] == [2, 1]
    conv = instrs["conv"]
    assert isinstance(conv.dim_labels, A.ConvDimLabels) and conv.dim_labels.input_feature == 3
    assert (conv.feature_group_count, conv.batch_group_count) == (1, 1)
    assert instrs["pad"].padding_config.dims == ((1, 1, 0), (0, 0, 0))
    assert instrs["sl"].slice_spec.dims == ((0, 4, 2), (0, 8, 1))


def test_enums_and_scalars(instrs):
    fft = instrs["fft"]
    assert fft.fft_type is A.FftType.IFFT and fft.fft_length == (8,)
    cmp = instrs["cmp"]
    assert cmp.comparison_direction is A.ComparisonDirection.LT
    assert cmp.comparison_direction == "LT"  # a StrEnum: compares as its text
    assert cmp.comparison_type is None
    cmp.attrs["order"] = A.Enum("TOTAL")
    assert cmp.comparison_type is A.ComparisonType.TOTALORDER
    del cmp.attrs["order"]
    cc = instrs["cc"]
    assert cc.custom_call_target == "my_target"
    assert cc.custom_call_api_version is A.CustomCallApiVersion.TYPED_FFI
    assert cc.backend_config == A.BackendConfig("opaque text")
    assert cc.frontend_attributes.get("key") == "value"
    ar = instrs["ar"]
    assert ar.channel_id == 3 and ar.use_global_device_ids
    assert ar.replica_groups is not None and ar.replica_groups.expanded() == ((0, 1),)
    assert instrs["cp"].source_target_pairs == ((0, 1), (1, 0))


def test_absent_attributes_give_xlas_defaults(instrs):
    x = instrs["x"]
    assert x.channel_id is None and x.replica_groups is None and not x.use_global_device_ids
    assert x.sharding is None and x.backend_config is None and x.custom_call_target is None
    assert x.custom_call_api_version is None and x.fusion_kind is None
    assert x.frontend_attributes == A.FrontendAttributes(())
    assert x.source_target_pairs == () and x.output_to_operand_aliasing == ()
    assert x.to_apply_or_none is None and x.window_or_none is None and x.calls_or_none is None
    assert x.epsilon == 0.0 and x.rng_delta == 0 and x.fft_type is A.FftType.FFT
    assert x.rng_algorithm is A.RngAlgorithm.DEFAULT and x.topk_largest
    assert x.transpose_a is A.TriangularSolveTranspose.NO_TRANSPOSE


@pytest.mark.parametrize(
    "accessor",
    ["to_apply", "window", "dim_labels", "slice_spec", "padding_config", "calls", "while_body"],
)
def test_a_missing_required_attribute_names_the_instruction(instrs, accessor):
    with pytest.raises(HloAttributeError, match=r"^x: parameter needs the attribute \w+="):
        getattr(instrs["x"], accessor)


@pytest.mark.parametrize(
    ("name", "value", "accessor", "expected"),
    [
        ("window", (1, 2), "window", "a Window"),
        ("channel_id", "3", "channel_id", "an integer"),
        ("channel_id", True, "channel_id", "an integer"),
        ("use_global_device_ids", 1, "use_global_device_ids", "true or false"),
        ("fft_type", A.Enum("DCT"), "fft_type", "one of FFT, IFFT, RFFT, IRFFT"),
        ("algorithm", A.Enum("rng_mersenne"), "rng_algorithm", "one of rng_default"),
        ("to_apply", "add", "to_apply", "a computation"),
        ("lhs_contracting_dims", (1.5,), "dot_dimension_numbers", "a list of integers"),
        ("epsilon", "small", "epsilon", "a number"),
        ("source_target_pairs", ((0, 1, 2),), "source_target_pairs", "source,target"),
        ("replica_groups", ((0, 1),), "replica_groups", "a ReplicaGroups"),
    ],
)
def test_a_malformed_attribute_names_the_instruction(name, value, accessor, expected):
    module = parse_module(TEXT)
    (x,) = (i for i in module.entry.instructions if i.name == "x")
    x.attrs[name] = value
    with pytest.raises(HloAttributeError, match=f"^x: {name}=") as info:
        getattr(x, accessor)
    assert expected in str(info.value)
    assert isinstance(info.value, VerifierError)  # an invalid program


def test_index_vector_dim_defaults_to_the_indices_rank():
    module = parse_module(TEXT)
    (g,) = (i for i in module.entry.instructions if i.name == "g")
    del g.attrs["index_vector_dim"]
    assert g.gather_dimension_numbers.index_vector_dim == 2  # s32[5,1]: rank 2


@pytest.mark.parametrize(
    ("attribute", "enum"),
    [
        ("direction", A.ComparisonDirection),
        ("type", A.ComparisonType),
        ("comparison_direction", A.ComparisonDirection),
        ("fft_type", A.FftType),
        ("distribution", A.RngDistribution),
        ("transpose_a", A.TriangularSolveTranspose),
        ("kind", A.FusionKind),
        ("api_version", A.CustomCallApiVersion),
    ],
)
def test_the_enums_are_the_values_the_parser_accepts(attribute, enum):
    assert A.ENUM_VALUES[attribute] == {e.value for e in enum}
