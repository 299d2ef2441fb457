"""Shape inference: a table of (opcode, operand shapes, attributes, declared, expected shape)
covering every opcode, and a table of bad cases with the message each must give."""

from __future__ import annotations

import pytest

from xlapy.errors import ShapeError
from xlapy.ir.attributes import (
    ConvDimLabels,
    Enum,
    OutputOperandAlias,
    Padding,
    ReplicaGroups,
    SliceSpec,
    Window,
    WindowDim,
)
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module, parse_shape
from xlapy.ir.shape_inference import SHAPE_RULES, infer_shape, missing_rules

LIBRARY = """
HloModule lib

add_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = f32[] add(a, b)
}

add_pair {
  a0 = f32[] parameter(0)
  a1 = s32[] parameter(1)
  b0 = f32[] parameter(2)
  b1 = s32[] parameter(3)
  s0 = f32[] add(a0, b0)
  s1 = s32[] add(a1, b1)
  ROOT r = (f32[], s32[]) tuple(s0, s1)
}

three_params {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = f32[] parameter(2)
  ROOT r = f32[] add(a, b)
}

lt_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = pred[] compare(a, b), direction=LT
}

ge_f32 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT r = pred[] compare(a, b), direction=GE
}

lt_pair {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = s32[] parameter(2)
  d = s32[] parameter(3)
  ROOT r = pred[] compare(a, b), direction=LT
}

id3 {
  ROOT p = f32[3] parameter(0)
}

neg3 {
  p = f32[3] parameter(0)
  ROOT n = f32[3] negate(p)
}

s32_3 {
  p = f32[3] parameter(0)
  ROOT n = s32[3] convert(p)
}

body {
  p = (s32[], f32[3]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[3] get-tuple-element(p), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT t = (s32[], f32[3]) tuple(j, x)
}

bad_body {
  p = (s32[], f32[3]) parameter(0)
  ROOT i = s32[] get-tuple-element(p), index=0
}

cond {
  p = (s32[], f32[3]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  ten = s32[] constant(10)
  ROOT lt = pred[] compare(i, ten), direction=LT
}

ENTRY e {
  ROOT c = f32[] constant(0)
}
"""

C = {c.name: c for c in parse_module(LIBRARY).computations}


def S(text: str):
    return parse_shape(text)


def win(*dims: tuple) -> Window:
    return Window(tuple(WindowDim(*d) for d in dims))


def groups(*gs) -> ReplicaGroups:
    return ReplicaGroups(tuple(tuple(g) for g in gs))


NHWC = ConvDimLabels(0, 3, (1, 2), 2, 3, (0, 1), 0, 3, (1, 2))  # b01f_01io->b01f
NCHW = ConvDimLabels(0, 1, (2, 3), 1, 0, (2, 3), 0, 1, (2, 3))  # bf01_oi01->bf01
GATHER_ROWS = dict(
    offset_dims=(1,),
    collapsed_slice_dims=(0,),
    start_index_map=(0,),
    index_vector_dim=1,
    slice_sizes=(1, 4),
)
SCATTER_ROWS = dict(
    update_window_dims=(1,),
    inserted_window_dims=(0,),
    scatter_dims_to_operand_dims=(0,),
    index_vector_dim=1,
    to_apply=C["add_f32"],
)
ASYNC = "((f32[3]), f32[3], s32[])"

# (opcode, operand shapes, attrs, declared shape or None, expected shape)
GOOD = [
    # elementwise unary
    ("exponential", ["f32[2,3]"], {}, None, "f32[2,3]"),
    ("abs", ["c64[4]"], {}, None, "f32[4]"),
    ("abs", ["s32[4]"], {}, None, "s32[4]"),
    ("cbrt", ["f64[2]"], {}, None, "f64[2]"),
    ("ceil", ["bf16[2]"], {}, None, "bf16[2]"),
    ("floor", ["f16[2]"], {}, None, "f16[2]"),
    ("round-nearest-afz", ["f32[]"], {}, None, "f32[]"),
    ("round-nearest-even", ["f32[]"], {}, None, "f32[]"),
    ("count-leading-zeros", ["s64[1]"], {}, None, "s64[1]"),
    ("popcnt", ["u8[5]"], {}, None, "u8[5]"),
    ("not", ["pred[2]"], {}, None, "pred[2]"),
    ("copy", ["(f32[2], s32[])"], {}, None, "(f32[2], s32[])"),
    ("cosine", ["c64[2]"], {}, None, "c64[2]"),
    ("sine", ["f32[2]"], {}, None, "f32[2]"),
    ("tan", ["f32[2]"], {}, None, "f32[2]"),
    ("tanh", ["f32[2]"], {}, None, "f32[2]"),
    ("erf", ["f32[2]"], {}, None, "f32[2]"),
    ("exponential-minus-one", ["f32[2]"], {}, None, "f32[2]"),
    ("log", ["f32[2]"], {}, None, "f32[2]"),
    ("log-plus-one", ["f32[2]"], {}, None, "f32[2]"),
    ("logistic", ["f32[2]"], {}, None, "f32[2]"),
    ("negate", ["u32[2]"], {}, None, "u32[2]"),
    ("sign", ["s8[2]"], {}, None, "s8[2]"),
    ("sqrt", ["f32[<=5]"], {}, None, "f32[<=5]"),
    ("rsqrt", ["f32[2]"], {}, None, "f32[2]"),
    ("is-finite", ["bf16[3]"], {}, None, "pred[3]"),
    ("real", ["c128[2]"], {}, None, "f64[2]"),
    ("imag", ["c64[]"], {}, None, "f32[]"),
    ("real", ["f32[2]"], {}, None, "f32[2]"),
    ("convert", ["f32[2,3]"], {}, "s8[2,3]{0,1}", "s8[2,3]"),
    ("bitcast-convert", ["f32[4]"], {}, "u8[4,4]", "u8[4,4]"),
    ("bitcast-convert", ["f16[3,2]"], {}, "f32[3]", "f32[3]"),
    ("bitcast-convert", ["s32[3]"], {}, "f32[3]", "f32[3]"),
    ("reduce-precision", ["f32[3]"], {"exponent_bits": 5, "mantissa_bits": 2}, None, "f32[3]"),
    # elementwise binary and ternary
    ("add", ["f32[2,3]", "f32[2,3]{0,1}"], {}, None, "f32[2,3]"),
    ("add", ["f32[<=4]", "f32[4]"], {}, None, "f32[<=4]"),
    ("subtract", ["s32[2]", "s32[2]"], {}, None, "s32[2]"),
    ("multiply", ["bf16[2]", "bf16[2]"], {}, None, "bf16[2]"),
    ("divide", ["f32[2]", "f32[2]"], {}, None, "f32[2]"),
    ("maximum", ["pred[2]", "pred[2]"], {}, None, "pred[2]"),
    ("minimum", ["u8[2]", "u8[2]"], {}, None, "u8[2]"),
    ("power", ["f32[2]", "f32[2]"], {}, None, "f32[2]"),
    ("remainder", ["s32[2]", "s32[2]"], {}, None, "s32[2]"),
    ("atan2", ["f32[2]", "f32[2]"], {}, None, "f32[2]"),
    ("and", ["pred[2]", "pred[2]"], {}, None, "pred[2]"),
    ("or", ["u32[2]", "u32[2]"], {}, None, "u32[2]"),
    ("xor", ["s8[2]", "s8[2]"], {}, None, "s8[2]"),
    ("shift-left", ["u32[2]", "u32[2]"], {}, None, "u32[2]"),
    ("shift-right-arithmetic", ["s32[2]", "s32[2]"], {}, None, "s32[2]"),
    ("shift-right-logical", ["s32[2]", "s32[2]"], {}, None, "s32[2]"),
    ("compare", ["s32[4]", "s32[4]"], {"direction": Enum("LT")}, None, "pred[4]"),
    ("compare", ["f32[]", "f32[]"], {"comparison_direction": Enum("EQ")}, None, "pred[]"),
    ("complex", ["f32[3]", "f32[3]"], {}, None, "c64[3]"),
    ("complex", ["f64[3]", "f64[3]"], {}, None, "c128[3]"),
    ("stochastic-convert", ["f32[3]", "u32[3]"], {}, "bf16[3]", "bf16[3]"),
    ("clamp", ["f32[]", "f32[3,2]", "f32[]"], {}, None, "f32[3,2]"),
    ("clamp", ["f32[3,2]", "f32[3,2]", "f32[]"], {}, None, "f32[3,2]"),
    ("select", ["pred[]", "f32[2]", "f32[2]"], {}, None, "f32[2]"),
    ("select", ["pred[2]", "s32[2]", "s32[2]"], {}, None, "s32[2]"),
    # shape and data movement
    ("broadcast", ["f32[3]"], {"dimensions": (1,)}, "f32[2,3]", "f32[2,3]"),
    ("broadcast", ["f32[]"], {"dimensions": ()}, "f32[2,3]", "f32[2,3]"),
    ("reshape", ["f32[2,3]"], {}, "f32[6]", "f32[6]"),
    ("bitcast", ["f32[2,3]"], {}, "f32[6]{0}", "f32[6]"),
    ("dynamic-reshape", ["f32[6]", "s32[]", "s32[]"], {}, "f32[<=2,3]", "f32[<=2,3]"),
    ("transpose", ["f32[2,3,4]"], {"dimensions": (2, 0, 1)}, None, "f32[4,2,3]"),
    ("slice", ["f32[10,5]"], {"slice": SliceSpec(((2, 9, 3), (0, 5, 1)))}, None, "f32[3,5]"),
    (
        "pad",
        ["f32[3,4]", "f32[]"],
        {"padding": Padding(((1, 2, 1), (-1, 0, 0)))},
        None,
        "f32[8,3]",
    ),
    ("concatenate", ["f32[2,3]", "f32[4,3]"], {"dimensions": (0,)}, None, "f32[6,3]"),
    ("reverse", ["f32[2,3]"], {"dimensions": (0, 1)}, None, "f32[2,3]"),
    ("iota", [], {"iota_dimension": 1}, "s32[4,5]", "s32[4,5]"),
    ("get-dimension-size", ["f32[3,4]"], {"dimensions": (1,)}, None, "s32[]"),
    ("set-dimension-size", ["f32[3,4]", "s32[]"], {"dimensions": (1,)}, None, "f32[3,<=4]"),
    # reductions
    (
        "reduce",
        ["f32[2,3,4]", "f32[]"],
        {"dimensions": (0, 2), "to_apply": C["add_f32"]},
        None,
        "f32[3]",
    ),
    (
        "reduce",
        ["f32[5,6]", "s32[5,6]", "f32[]", "s32[]"],
        {"dimensions": (1,), "to_apply": C["add_pair"]},
        None,
        "(f32[5], s32[5])",
    ),
    (
        "reduce",
        ["bf16[4]", "f32[]"],
        {"dimensions": (0,), "to_apply": C["add_f32"]},
        None,
        "f32[]",
    ),
    (
        "reduce-window",
        ["f32[4,6]", "f32[]"],
        {"window": win((2, 2), (3, 1, 1, 1)), "to_apply": C["add_f32"]},
        None,
        "f32[2,6]",
    ),
    (
        "reduce-window",
        ["f32[5]", "f32[]"],
        {"window": win((2, 1, 0, 0, 1, 2)), "to_apply": C["add_f32"]},
        None,
        "f32[8]",
    ),
    (
        "select-and-scatter",
        ["f32[4,6]", "f32[2,3]", "f32[]"],
        {"window": win((2, 2), (2, 2)), "select": C["ge_f32"], "scatter": C["add_f32"]},
        None,
        "f32[4,6]",
    ),
    # dot and convolution
    (
        "dot",
        ["f32[2,3]", "f32[3,4]"],
        {"lhs_contracting_dims": (1,), "rhs_contracting_dims": (0,)},
        None,
        "f32[2,4]",
    ),
    (
        "dot",
        ["f32[7,2,3]", "f32[7,4,3]"],
        {
            "lhs_batch_dims": (0,),
            "rhs_batch_dims": (0,),
            "lhs_contracting_dims": (2,),
            "rhs_contracting_dims": (2,),
        },
        None,
        "f32[7,2,4]",
    ),
    (
        "dot",
        ["bf16[2,3]", "bf16[3,4]"],
        {"lhs_contracting_dims": (1,), "rhs_contracting_dims": (0,)},
        "f32[2,4]",
        "f32[2,4]",
    ),
    ("dot", ["f32[2]", "f32[3]"], {}, None, "f32[2,3]"),
    (
        "scaled-dot",
        ["f8e4m3fn[2,32]", "f8e4m3fn[32,4]", "f8e8m0fnu[2,1]", "f8e8m0fnu[1,4]"],
        {"lhs_contracting_dims": (1,), "rhs_contracting_dims": (0,)},
        "f32[2,4]",
        "f32[2,4]",
    ),
    ("ragged-dot", ["f32[11,5]", "f32[3,5,7]", "s32[3]"], {}, None, "f32[11,7]"),
    (
        "convolution",
        ["f32[1,8,8,3]", "f32[3,3,3,16]"],
        {"dim_labels": NHWC, "window": win((3, 2, 1, 1), (3, 2, 1, 1))},
        None,
        "f32[1,4,4,16]",
    ),
    (
        "convolution",
        ["f32[1,8,8,3]", "f32[3,3,3,16]"],
        {"dim_labels": NHWC, "window": win((3, 1, 0, 0, 2), (3,))},
        None,
        "f32[1,4,6,16]",
    ),
    (
        "convolution",
        ["f32[1,8,8,6]", "f32[3,3,2,6]"],
        {"dim_labels": NHWC, "window": win((3,), (3,)), "feature_group_count": 3},
        None,
        "f32[1,6,6,6]",
    ),
    (
        "convolution",
        ["f32[4,5,5,2]", "f32[1,1,2,4]"],
        {"dim_labels": NHWC, "window": win((1,), (1,)), "batch_group_count": 2},
        None,
        "f32[2,5,5,4]",
    ),
    (
        "convolution",
        ["f32[2,3,9,9]", "f32[4,3,3,3]"],
        {"dim_labels": NCHW, "window": win((3, 2, 1, 1), (3, 1, 2, 2, 2))},
        None,
        "f32[2,4,5,9]",
    ),
    ("fft", ["c64[4,8]"], {"fft_type": Enum("FFT"), "fft_length": (8,)}, None, "c64[4,8]"),
    ("fft", ["c64[4,8]"], {"fft_type": Enum("IFFT"), "fft_length": (8,)}, None, "c64[4,8]"),
    ("fft", ["f32[4,8]"], {"fft_type": Enum("RFFT"), "fft_length": (8,)}, None, "c64[4,5]"),
    ("fft", ["c64[4,5]"], {"fft_type": Enum("IRFFT"), "fft_length": (8,)}, None, "f32[4,8]"),
    ("fft", ["f32[3,4,6]"], {"fft_type": Enum("RFFT"), "fft_length": (4, 6)}, None, "c64[3,4,4]"),
    (
        "fft",
        ["c128[3,4,4]"],
        {"fft_type": Enum("IRFFT"), "fft_length": (4, 6)},
        None,
        "f64[3,4,6]",
    ),
    # indexing
    (
        "dynamic-slice",
        ["f32[5,6]", "s32[]", "s32[]"],
        {"dynamic_slice_sizes": (2, 3)},
        None,
        "f32[2,3]",
    ),
    ("dynamic-update-slice", ["f32[5,6]", "f32[2,3]", "s32[]", "s32[]"], {}, None, "f32[5,6]"),
    ("gather", ["f32[5,4]", "s32[3,1]"], GATHER_ROWS, None, "f32[3,4]"),
    ("gather", ["f32[5,4]", "s32[3]"], GATHER_ROWS, None, "f32[3,4]"),
    (
        "gather",
        ["f32[2,5,4]", "s32[2,3,1]"],
        dict(
            offset_dims=(2,),
            collapsed_slice_dims=(1,),
            start_index_map=(1,),
            operand_batching_dims=(0,),
            start_indices_batching_dims=(0,),
            index_vector_dim=2,
            slice_sizes=(1, 1, 4),
        ),
        None,
        "f32[2,3,4]",
    ),
    (
        "gather",
        ["f32[6,7]", "s32[2,2]"],
        dict(offset_dims=(1, 2), start_index_map=(0, 1), index_vector_dim=1, slice_sizes=(2, 3)),
        None,
        "f32[2,2,3]",
    ),
    ("scatter", ["f32[5,4]", "s32[3,1]", "f32[3,4]"], SCATTER_ROWS, None, "f32[5,4]"),
    (
        "scatter",
        ["f32[5,4]", "s32[5,4]", "s32[3,1]", "f32[3,4]", "s32[3,4]"],
        {**SCATTER_ROWS, "to_apply": C["add_pair"]},
        None,
        "(f32[5,4], s32[5,4])",
    ),
    # sorting
    ("sort", ["f32[3,4]"], {"dimensions": (1,), "to_apply": C["lt_f32"]}, None, "f32[3,4]"),
    (
        "sort",
        ["f32[3,4]", "s32[3,4]"],
        {"dimensions": (0,), "to_apply": C["lt_pair"]},
        None,
        "(f32[3,4], s32[3,4])",
    ),
    ("topk", ["f32[3,10]"], {"k": 4, "largest": True}, None, "(f32[3,4], s32[3,4])"),
    # control flow and calls
    ("call", ["f32[3]"], {"to_apply": C["neg3"]}, None, "f32[3]"),
    ("scan", ["f32[3]", "f32[]"], {"to_apply": C["neg3"]}, "(f32[3], f32[])", "(f32[3], f32[])"),
    ("fusion", ["f32[3]"], {"calls": C["s32_3"], "kind": Enum("kLoop")}, None, "s32[3]"),
    ("map", ["f32[3]", "f32[3]"], {"to_apply": C["add_f32"], "dimensions": (0,)}, None, "f32[3]"),
    (
        "while",
        ["(s32[], f32[3])"],
        {"condition": C["cond"], "body": C["body"]},
        None,
        "(s32[], f32[3])",
    ),
    (
        "conditional",
        ["pred[]", "f32[3]", "f32[3]"],
        {"true_computation": C["id3"], "false_computation": C["neg3"]},
        None,
        "f32[3]",
    ),
    (
        "conditional",
        ["s32[]", "f32[3]", "f32[3]", "f32[3]"],
        {"branch_computations": (C["id3"], C["neg3"], C["id3"])},
        None,
        "f32[3]",
    ),
    (
        "custom-call",
        ["f32[3]"],
        {
            "custom_call_target": "foo",
            "output_to_operand_aliasing": (OutputOperandAlias((0,), 0, ()),),
        },
        "(f32[3], s32[])",
        "(f32[3], s32[])",
    ),
    # random numbers
    ("rng", ["f32[]", "f32[]"], {"distribution": Enum("rng_uniform")}, "f32[2,3]", "f32[2,3]"),
    ("rng-bit-generator", ["u64[2]"], {}, "(u64[2], u32[3,4])", "(u64[2], u32[3,4])"),
    ("rng-get-and-update-state", [], {"delta": 4}, None, "u64[2]"),
    # collectives
    ("all-reduce", ["f32[3]"], {"to_apply": C["add_f32"]}, None, "f32[3]"),
    ("all-reduce", ["f32[3]", "f32[2]"], {"to_apply": C["add_f32"]}, None, "(f32[3], f32[2])"),
    ("all-reduce-start", ["f32[3]"], {"to_apply": C["add_f32"]}, None, "f32[3]"),
    ("all-reduce-done", ["f32[3]"], {}, None, "f32[3]"),
    (
        "all-gather",
        ["f32[2,3]"],
        {"dimensions": (0,), "replica_groups": groups((0, 1, 2, 3))},
        None,
        "f32[8,3]",
    ),
    ("all-gather", ["f32[2,3]"], {"dimensions": (1,)}, "f32[2,6]", "f32[2,6]"),
    (
        "all-gather",
        ["f32[2,3]"],
        {"dimensions": (0,), "replica_groups": ReplicaGroups((), "[2,2]<=[4]")},
        None,
        "f32[4,3]",
    ),
    (
        "all-gather-start",
        ["f32[2]"],
        {"dimensions": (0,), "replica_groups": groups((0, 1))},
        None,
        "(f32[2], f32[4])",
    ),
    ("all-gather-done", ["(f32[2], f32[4])"], {}, None, "f32[4]"),
    (
        "reduce-scatter",
        ["f32[8,3]"],
        {"dimensions": (0,), "replica_groups": groups((0, 1)), "to_apply": C["add_f32"]},
        None,
        "f32[4,3]",
    ),
    (
        "all-to-all",
        ["f32[4,6]"],
        {"split_dimension": 0, "dimensions": (0,), "replica_groups": groups((0, 1))},
        None,
        "f32[4,6]",
    ),
    ("all-to-all", ["f32[2]", "f32[2]"], {}, None, "(f32[2], f32[2])"),
    (
        "ragged-all-to-all",
        ["f32[8]", "f32[8]", "s32[2]", "s32[2]", "s32[2]", "s32[2]"],
        {},
        None,
        "f32[8]",
    ),
    ("collective-broadcast", ["f32[3]"], {}, None, "f32[3]"),
    ("collective-permute", ["f32[3]"], {}, None, "f32[3]"),
    ("collective-permute-start", ["f32[3]"], {}, None, "(f32[3], f32[3])"),
    ("collective-permute-done", ["(f32[3], f32[3])"], {}, None, "f32[3]"),
    ("replica-id", [], {}, None, "u32[]"),
    ("partition-id", [], {}, None, "u32[]"),
    # infeed, outfeed, send, recv
    ("infeed", ["token[]"], {}, "(f32[3], token[])", "(f32[3], token[])"),
    ("outfeed", ["f32[3]", "token[]"], {"outfeed_shape": S("f32[3]")}, None, "token[]"),
    ("send", ["f32[3]", "token[]"], {"channel_id": 1}, None, "(f32[3], u32[], token[])"),
    ("send-done", ["(f32[3], u32[], token[])"], {}, None, "token[]"),
    ("recv", ["token[]"], {}, "(f32[3], u32[], token[])", "(f32[3], u32[], token[])"),
    ("recv-done", ["(f32[3], u32[], token[])"], {}, None, "(f32[3], token[])"),
    # async wrappers
    ("async-start", ["f32[3]"], {"calls": C["neg3"]}, None, ASYNC),
    ("async-update", [ASYNC], {}, None, ASYNC),
    ("async-done", [ASYNC], {}, None, "f32[3]"),
    ("copy-start", ["f32[3]"], {}, None, "(f32[3], f32[3], u32[])"),
    ("copy-done", ["(f32[3], f32[3], u32[])"], {}, None, "f32[3]"),
    # linear algebra
    ("cholesky", ["f32[2,3,3]"], {"lower": True}, None, "f32[2,3,3]"),
    ("triangular-solve", ["f32[3,3]", "f32[3,5]"], {"left_side": True}, None, "f32[3,5]"),
    ("triangular-solve", ["f32[3,3]", "f32[5,3]"], {"left_side": False}, None, "f32[5,3]"),
    (
        "batch-norm-training",
        ["f32[2,3,4]", "f32[3]", "f32[3]"],
        {"feature_index": 1, "epsilon": 0.001},
        None,
        "(f32[2,3,4], f32[3], f32[3])",
    ),
    (
        "batch-norm-inference",
        ["f32[2,3,4]", "f32[4]", "f32[4]", "f32[4]", "f32[4]"],
        {"feature_index": 2, "epsilon": 0.001},
        None,
        "f32[2,3,4]",
    ),
    (
        "batch-norm-grad",
        ["f32[2,3,4]", "f32[3]", "f32[3]", "f32[3]", "f32[2,3,4]"],
        {"feature_index": 1, "epsilon": 0.001},
        None,
        "(f32[2,3,4], f32[3], f32[3])",
    ),
    # constants, parameters, tuples, other
    ("constant", [], {}, "f32[2]{0}", "f32[2]"),
    ("parameter", [], {}, "(f32[2], s32[])", "(f32[2], s32[])"),
    ("tuple", ["f32[2]", "s32[]"], {}, None, "(f32[2], s32[])"),
    ("tuple", [], {}, None, "()"),
    ("get-tuple-element", ["(f32[2], s32[])"], {"index": 1}, None, "s32[]"),
    ("after-all", ["token[]", "token[]"], {}, None, "token[]"),
    ("after-all", [], {}, None, "token[]"),
    ("add-dependency", ["f32[2]", "token[]"], {}, None, "f32[2]"),
    ("domain", ["f32[2]"], {}, None, "f32[2]"),
    ("opt-barrier", ["(f32[2], s32[])"], {}, None, "(f32[2], s32[])"),
]


def _ids(table):
    return [f"{row[0]}-{i}" for i, row in enumerate(table)]


@pytest.mark.parametrize(
    ("opcode", "operands", "attrs", "declared", "expected"), GOOD, ids=_ids(GOOD)
)
def test_infers(opcode, operands, attrs, declared, expected):
    shape = infer_shape(
        Opcode.from_text(opcode),
        [S(o) for o in operands],
        attrs,
        S(declared) if declared else None,
    )
    assert shape == S(expected), f"{opcode}: got {shape}, expected {expected}"


def test_every_opcode_has_a_rule_and_a_test():
    assert missing_rules() == []
    assert set(SHAPE_RULES) == set(Opcode)
    tested = {Opcode.from_text(row[0]) for row in GOOD}
    assert set(Opcode) - tested == set()


# (opcode, operand shapes, attrs, declared, expected message substring)
BAD = [
    ("add", ["f32[2]", "f32[3]"], {}, None, "operand 1 has shape f32[3] but must have the dims"),
    ("add", ["f32[]", "f32[2]"], {}, None, "does not broadcast implicitly"),
    ("add", ["f32[2]", "s32[2]"], {}, None, "operand 1 has element type s32"),
    ("add", ["f32[2]"], {}, None, "expects 2 operands, got 1"),
    ("exponential", ["s32[2]"], {}, None, "float or complex"),
    ("cbrt", ["c64[2]"], {}, None, "a float type"),  # XLA rejects complex cbrt too
    ("and", ["f32[2]", "f32[2]"], {}, None, "pred or an integer type"),
    ("shift-left", ["f32[2]", "f32[2]"], {}, None, "an integer type"),
    ("compare", ["f32[2]", "f32[2]"], {}, None, "missing attribute 'direction'"),
    ("compare", ["f32[2]", "f32[2]"], {"direction": Enum("XX")}, None, "comparison_direction"),
    ("complex", ["f16[2]", "f16[2]"], {}, None, "f32 or f64"),
    ("convert", ["f32[2]"], {}, None, "needs a result shape"),
    ("convert", ["f32[2]"], {}, "s32[3]", "must keep the dims"),
    ("bitcast-convert", ["f32[3]"], {}, "f64[3]", "last dimension of size 64/32=2"),
    # corner fuzz seed 701229: f64 -> c64 ran here; XLA and StableHLO refuse it
    ("bitcast-convert", ["f64[]"], {}, "c64[]", "between real and complex"),
    ("bitcast-convert", ["c128[2]"], {}, "s64[2,2]", "between real and complex"),
    ("clamp", ["f32[2]", "f32[3]", "f32[]"], {}, None, "must be a scalar or match"),
    ("select", ["s32[]", "f32[2]", "f32[2]"], {}, None, "element type pred"),
    ("select", ["pred[3]", "f32[2]", "f32[2]"], {}, None, "must be pred[] or match"),
    ("reshape", ["f32[2,3]"], {}, "f32[5]", "cannot reshape f32[2,3] (6 elements)"),
    ("reshape", ["f32[2,3]"], {}, None, "needs a result shape"),
    ("broadcast", ["f32[3]"], {"dimensions": (0,)}, "f32[2,3]", "has size 2"),
    ("broadcast", ["f32[3]"], {"dimensions": ()}, "f32[2,3]", "one result dimension per"),
    ("transpose", ["f32[2,3]"], {"dimensions": (0, 0)}, None, "not a permutation"),
    ("slice", ["f32[4]"], {"slice": SliceSpec(((0, 5, 1),))}, None, "does not fit size 4"),
    ("slice", ["f32[4]"], {"slice": SliceSpec(((0, 4, 0),))}, None, "stride"),
    ("pad", ["f32[2]", "f32[]"], {"padding": Padding(((-3, 0, 0),))}, None, "negative"),
    ("pad", ["f32[2]", "s32[]"], {"padding": Padding(((0, 0, 0),))}, None, "padding value"),
    ("concatenate", ["f32[2,3]", "f32[2,4]"], {"dimensions": (0,)}, None, "every dimension but"),
    ("iota", [], {"iota_dimension": 2}, "s32[4,5]", "out of range"),
    (
        "reduce",
        ["f32[2,3]", "f32[]"],
        {"dimensions": (2,), "to_apply": C["add_f32"]},
        None,
        "reduce dimension 2 is out of range",
    ),
    (
        "reduce",
        ["f32[2,3]", "f32[]"],
        {"dimensions": (0,), "to_apply": C["three_params"]},
        None,
        "must take 2 parameters, takes 3",
    ),
    (
        "reduce",
        ["f32[2,3]", "f32[2]"],
        {"dimensions": (0,), "to_apply": C["add_f32"]},
        None,
        "init value 0 (operand 1) must be a scalar",
    ),
    (
        "reduce",
        ["f32[2,3]", "s32[2,3]", "f32[]", "s32[]"],
        {"dimensions": (0,), "to_apply": C["add_f32"]},
        None,
        "must take 4 parameters",
    ),
    (
        "reduce-window",
        ["f32[4,6]", "f32[]"],
        {"window": win((2,)), "to_apply": C["add_f32"]},
        None,
        "window has 1 dimensions but input 0 has rank 2",
    ),
    (
        "select-and-scatter",
        ["f32[4,6]", "f32[3,3]", "f32[]"],
        {"window": win((2, 2), (2, 2)), "select": C["ge_f32"], "scatter": C["add_f32"]},
        None,
        "source has shape f32[3,3]",
    ),
    (
        "select-and-scatter",
        ["f32[4,6]", "f32[2,3]", "f32[]"],
        {"window": win((2, 2), (2, 2)), "select": C["add_f32"], "scatter": C["add_f32"]},
        None,
        "must return pred[]",
    ),
    (
        "dot",
        ["f32[2,3]", "f32[4,5]"],
        {"lhs_contracting_dims": (1,), "rhs_contracting_dims": (0,)},
        None,
        "contracting dimension lhs 1 (size 3) does not match rhs 0 (size 4)",
    ),
    (
        "dot",
        ["f32[2,3]", "s32[3,5]"],
        {"lhs_contracting_dims": (1,), "rhs_contracting_dims": (0,)},
        None,
        "a result shape must say",
    ),
    (
        "convolution",
        ["f32[1,8,8,4]", "f32[3,3,3,16]"],
        {"dim_labels": NHWC, "window": win((3,), (3,))},
        None,
        "input feature size 4 must equal kernel input feature size 3",
    ),
    (
        "convolution",
        ["f32[1,8,8,3]", "f32[3,3,3,16]"],
        {"dim_labels": NHWC, "window": win((2,), (3,))},
        None,
        "does not match the kernel's size 3",
    ),
    ("fft", ["c64[8]"], {"fft_type": Enum("RFFT"), "fft_length": (8,)}, None, "f32 or f64"),
    ("fft", ["c64[8]"], {"fft_type": Enum("IRFFT"), "fft_length": (8,)}, None, "must be [5]"),
    ("fft", ["f32[8]"], {"fft_type": Enum("FFT"), "fft_length": (8,)}, None, "complex operand"),
    (
        "dynamic-slice",
        ["f32[5,6]", "s32[]"],
        {"dynamic_slice_sizes": (2, 3)},
        None,
        "needs 2 start indices",
    ),
    (
        "dynamic-slice",
        ["f32[5,6]", "s32[]", "s32[]"],
        {"dynamic_slice_sizes": (6, 3)},
        None,
        "slice size 6 of dimension 0",
    ),
    (
        "dynamic-update-slice",
        ["f32[5,6]", "f32[6,3]", "s32[]", "s32[]"],
        {},
        None,
        "larger than operand 0",
    ),
    (
        "gather",
        ["f32[5,4]", "s32[3,1]"],
        {**GATHER_ROWS, "slice_sizes": (1, 5)},
        None,
        "slice size 5 of dimension 1",
    ),
    (
        "gather",
        ["f32[5,4]", "s32[3,1]"],
        {**GATHER_ROWS, "offset_dims": ()},
        None,
        "offset_dims [] must have 1 entries",
    ),
    ("gather", ["f32[5,4]", "f32[3,1]"], GATHER_ROWS, None, "start indices must be integers"),
    (
        "scatter",
        ["f32[5,4]", "s32[3,1]", "f32[2,4]"],
        SCATTER_ROWS,
        None,
        "scatter dimension 0 (size 2) does not match",
    ),
    (
        "scatter",
        ["f32[5,4]", "s32[3,1]", "f32[3,5]"],
        SCATTER_ROWS,
        None,
        "exceeds operand dimension 1",
    ),
    (
        "sort",
        ["f32[3,4]"],
        {"dimensions": (1,), "to_apply": C["add_f32"]},
        None,
        "must return pred[]",
    ),
    (
        "sort",
        ["f32[3,4]", "s32[3,5]"],
        {"dimensions": (1,), "to_apply": C["lt_pair"]},
        None,
        "sort needs equal dims",
    ),
    ("topk", ["f32[3,10]"], {"k": 11}, None, "k=11"),
    ("call", ["f32[4]"], {"to_apply": C["neg3"]}, None, "parameter 0 of computation neg3"),
    ("map", ["f32[3]"], {"to_apply": C["add_f32"]}, None, "takes 2 parameters"),
    (
        "while",
        ["(s32[], f32[3])"],
        {"condition": C["cond"], "body": C["bad_body"]},
        None,
        "body bad_body returns s32[]",
    ),
    (
        "while",
        ["(s32[], f32[3])"],
        {"condition": C["body"], "body": C["body"]},
        None,
        "must return pred[]",
    ),
    (
        "conditional",
        ["pred[]", "f32[3]", "f32[3]"],
        {"true_computation": C["id3"], "false_computation": C["s32_3"]},
        None,
        "branch 1 (s32_3) returns s32[3]",
    ),
    (
        "conditional",
        ["f32[]", "f32[3]", "f32[3]"],
        {"branch_computations": (C["id3"], C["neg3"])},
        None,
        "must be s32[]",
    ),
    (
        "conditional",
        ["s32[]", "f32[3]"],
        {"branch_computations": (C["id3"], C["neg3"])},
        None,
        "2 branches but 1 branch operands",
    ),
    ("custom-call", ["f32[3]"], {"custom_call_target": "x"}, None, "needs a result shape"),
    (
        "rng",
        ["f32[]", "f32[]"],
        {"distribution": Enum("rng_uniform")},
        "s32[2]",
        "must have the element type",
    ),
    ("rng-bit-generator", ["u64[2]"], {}, "(u64[3], u32[4])", "result state u64[3]"),
    ("reduce-scatter", ["f32[8]"], {"dimensions": (0,)}, None, "explicit replica_groups"),
    (
        "reduce-scatter",
        ["f32[7]"],
        {"dimensions": (0,), "replica_groups": groups((0, 1))},
        None,
        "not divisible by the group size 2",
    ),
    ("all-gather", ["f32[2,3]"], {"dimensions": (0,)}, "f32[4,4]", "except in dimension 0"),
    ("get-tuple-element", ["(f32[2])"], {"index": 1}, None, "index 1 is out of range"),
    ("get-tuple-element", ["f32[2]"], {"index": 0}, None, "must be a tuple"),
    ("after-all", ["f32[2]"], {}, None, "must be a token"),
    ("cholesky", ["f32[2,3]"], {}, None, "square"),
    ("triangular-solve", ["f32[3,3]", "f32[4,5]"], {"left_side": True}, None, "3 rows"),
    (
        "batch-norm-training",
        ["f32[2,3,4]", "f32[4]", "f32[3]"],
        {"feature_index": 1},
        None,
        "scale (operand 1) must be f32[3]",
    ),
    ("infeed", ["token[]"], {}, "f32[3]", "(data, token) tuple"),
    ("async-done", ["f32[3]"], {}, None, "tuple its start op produces"),
]


@pytest.mark.parametrize(("opcode", "operands", "attrs", "declared", "message"), BAD, ids=_ids(BAD))
def test_rejects(opcode, operands, attrs, declared, message):
    with pytest.raises(ShapeError) as info:
        infer_shape(
            Opcode.from_text(opcode),
            [S(o) for o in operands],
            attrs,
            S(declared) if declared else None,
        )
    text = str(info.value)
    assert text.startswith(f"{opcode}: ")
    assert message in text


def test_result_does_not_depend_on_declared_when_inferable():
    add = infer_shape(Opcode.ADD, [S("f32[2]{0}"), S("f32[2]")], {}, S("f32[9]"))
    assert add == S("f32[2]")
    dot = infer_shape(
        Opcode.DOT,
        [S("f32[2,3]"), S("f32[3]")],
        {"lhs_contracting_dims": (1,), "rhs_contracting_dims": (0,)},
    )
    assert dot == S("f32[2]")
