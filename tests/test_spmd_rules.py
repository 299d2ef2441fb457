"""SPMD partitioning op by op: small HLO in, collectives and numbers out; the replicate
fallback and its report; `xlapy opt --partition N`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hlo_snippets import ARGMAX_REDUCER
from test_spmd_partition import run_partitioned

from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module
from xlapy.passes.spmd import PartitionError, partition
from xlapy.passes.spmd.tiling import Tiling
from xlapy.runtime import Client
from xlapy.runtime.options import CompileOptions

ADD = """add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""


def module(params: str, body: str) -> str:
    return f"HloModule m\n\n{ADD}\nENTRY e {{\n{params}\n{body}\n}}\n"


DOT = module(
    "  x = f32[8,16]{1,0} parameter(0), sharding={devices=[2,4]<=[8]}\n"
    "  w = f32[16,4]{1,0} parameter(1), sharding={devices=[4,1,2]<=[2,4]T(1,0) "
    "last_tile_dim_replicate}",
    "  d = f32[8,4]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
    "  ROOT t = f32[8,4]{1,0} tanh(d)",
)
RESHARD = module(
    "  x = f32[8,12]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}",
    "  ROOT y = f32[8,12]{1,0} negate(x), sharding={devices=[1,4]<=[4]}",
)
GATHER_ALL = module(
    "  x = f32[8,12]{1,0} parameter(0), sharding={devices=[2,2]<=[4]}",
    "  ROOT y = f32[8,12]{1,0} exponential(x), sharding={replicated}",
)
REDUCE = module(
    "  x = f32[8,12]{1,0} parameter(0), sharding={devices=[2,2]<=[4]}\n  zero = f32[] constant(0)",
    "  ROOT r = f32[8]{0} reduce(x, zero), dimensions={1}, to_apply=add",
)
REDUCE_INIT = module(
    "  x = f32[8,12]{1,0} parameter(0), sharding={devices=[2,2]<=[4]}\n  one = f32[] constant(1)",
    "  ROOT r = f32[8]{0} reduce(x, one), dimensions={1}, to_apply=add",
)
WINDOW = module(
    "  x = f32[8,12]{1,0} parameter(0), sharding={devices=[2,2]<=[4]}\n  zero = f32[] constant(0)",
    "  ROOT r = f32[8,10]{1,0} reduce-window(x, zero), window={size=1x3}, to_apply=add",
)
SLICE_CONCAT = module(
    "  x = f32[8,12]{1,0} parameter(0), sharding={devices=[2,2]<=[4]}",
    "  a = f32[8,6]{1,0} slice(x), slice={[0:8], [0:6]}\n"
    "  b = f32[8,6]{1,0} slice(x), slice={[0:8], [6:12]}\n"
    "  ROOT c = f32[8,12]{1,0} concatenate(b, a), dimensions={1}",
)
WHILE = """HloModule w

cond {
  s = (s32[], f32[8]{0}) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  s2 = (s32[], f32[8]{0}) parameter(0)
  i2 = s32[] get-tuple-element(s2), index=0
  one = s32[] constant(1)
  j = s32[] add(i2, one)
  v = f32[8]{0} get-tuple-element(s2), index=1
  w = f32[8]{0} add(v, v)
  ROOT t = (s32[], f32[8]{0}) tuple(j, w)
}

ENTRY e {
  x = f32[8]{0} parameter(0), sharding={devices=[4]<=[4]}
  zero = s32[] constant(0)
  init = (s32[], f32[8]{0}) tuple(zero, x)
  loop = (s32[], f32[8]{0}) while(init), condition=cond, body=body
  v2 = f32[8]{0} get-tuple-element(loop), index=1
  ROOT y = f32[8]{0} sine(v2)
}
"""

FFT = module(
    "  x = f32[8,16]{1,0} parameter(0), sharding={devices=[1,4]<=[4]}",
    "  f = c64[8,9]{1,0} fft(x), fft_type=RFFT, fft_length={16}\n  ROOT r = f32[8,9]{1,0} real(f)",
)
CUSTOM = module(
    "  x = f32[8]{0} parameter(0), sharding={devices=[4]<=[4]}",
    '  ROOT y = f32[8]{0} custom-call(x), custom_call_target="my_kernel"',
)


SCATTERED = module(
    "  x = f32[8,16]{1,0} parameter(0), sharding={devices=[1,4]<=[4]}\n"
    "  w = f32[16,8]{1,0} parameter(1), sharding={devices=[4,1]<=[4]}",
    "  ROOT d = f32[8,8]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, "
    "sharding={devices=[4,1]<=[4]}",
)

PAIR_SUM = """pair_sum {
  a = f32[] parameter(0)
  i = f32[] parameter(1)
  b = f32[] parameter(2)
  j = f32[] parameter(3)
  s = f32[] add(a, b)
  t = f32[] add(i, j)
  ROOT r = (f32[], f32[]) tuple(s, t)
}
"""


def variadic(reducer: str, inits: str, second: str) -> str:
    return (
        f"HloModule v\n\n{reducer}\nENTRY e {{\n"
        "  x = f32[8,12]{1,0} parameter(0), sharding={devices=[2,2]<=[4]}\n"
        f"{second}{inits}"
        "  r = (f32[8]{0}, {t}[8]{0}) reduce(x, y, a, b), dimensions={1}, to_apply={name}\n"
        "  ROOT k = {t}[8]{0} get-tuple-element(r), index=1\n}\n"
    )


ARGMAX = (
    variadic(
        ARGMAX_REDUCER,
        "  a = f32[] constant(-inf)\n  b = s32[] constant(0)\n",
        "  y = s32[8,12]{1,0} iota(), iota_dimension=1\n",
    )
    .replace("{t}", "s32")
    .replace("{name}", "argmax")
)
VARIADIC_INIT = (
    variadic(
        PAIR_SUM,
        "  a = f32[] constant(0)\n  b = f32[] constant(1)\n",
        "  y = f32[8,12]{1,0} exponential(x)\n",
    )
    .replace("{t}", "f32")
    .replace("{name}", "pair_sum")
)

MAX = """max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
"""
CONV_SAME = module(
    "  x = f32[2,8,8,3]{3,2,1,0} parameter(0), sharding={devices=[1,4,1,1]<=[4]}\n"
    "  w = f32[3,3,3,4]{3,2,1,0} parameter(1)",
    "  ROOT y = f32[2,8,8,4]{3,2,1,0} convolution(x, w), window={size=3x3 pad=1_1x1_1}, "
    "dim_labels=b01f_01io->b01f",
)
CONV_STRIDED = module(
    "  x = f32[2,8,8,3]{3,2,1,0} parameter(0), sharding={devices=[1,2,2,1]<=[4]}\n"
    "  w = f32[3,3,3,4]{3,2,1,0} parameter(1)",
    "  ROOT y = f32[2,4,4,4]{3,2,1,0} convolution(x, w), window={size=3x3 stride=2x2 "
    "pad=0_1x0_1}, dim_labels=b01f_01io->b01f",
)
POOL = module(
    "  x = f32[2,8,8,3]{3,2,1,0} parameter(0), sharding={devices=[1,2,2,1]<=[4]}\n"
    "  low = f32[] constant(-inf)",
    "  ROOT y = f32[2,4,4,3]{3,2,1,0} reduce-window(x, low), window={size=1x3x3x1 "
    "stride=1x2x2x1 pad=0_0x0_1x0_1x0_0}, to_apply=max",
).replace("add {", MAX + "\nadd {")
BLUR = module(
    "  x = f32[16,6]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}\n  zero = f32[] constant(0)",
    "  ROOT y = f32[16,6]{1,0} reduce-window(x, zero), window={size=5x1 pad=2_2x0_0}, to_apply=add",
)
STRIDED_LOW = module(
    "  x = f32[16,4]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}\n  zero = f32[] constant(0)",
    "  ROOT y = f32[8,4]{1,0} reduce-window(x, zero), window={size=3x1 stride=2x1 pad=1_0x0_0}, "
    "to_apply=add",
)
CUMSUM = module(
    "  x = f32[16]{0} parameter(0), sharding={devices=[4]<=[4]}\n  zero = f32[] constant(0)",
    "  ROOT y = f32[16]{0} reduce-window(x, zero), window={size=16 pad=15_0}, to_apply=add",
)

CASES = {
    "dot": (DOT, 8, {"all-reduce": 1}),
    "same convolution over cut rows: halo exchange": (CONV_SAME, 4, {"collective-permute": 2}),
    "strided convolution: right halos only": (CONV_STRIDED, 4, {"collective-permute": 2}),
    "max pool 3x3 stride 2: halos padded with -inf": (POOL, 4, {"collective-permute": 2}),
    "reduce-window of 5 rows over 4-row blocks": (BLUR, 4, {"collective-permute": 2}),
    "stride 2, low padding: left halos only": (STRIDED_LOW, 4, {"collective-permute": 1}),
    "cumulative sum: windows wider than a block are gathered": (CUMSUM, 4, {"all-gather": 1}),
    "argmax over a cut dimension: partial results gathered": (ARGMAX, 4, {"all-gather": 2}),
    "variadic reduce with a non-identity init": (VARIADIC_INIT, 4, {"all-gather": 2}),
    "reshard all-to-all": (RESHARD, 4, {"all-to-all": 1}),
    "gather to replicated": (GATHER_ALL, 4, {"all-gather": 2}),
    "reduce over a cut dimension": (REDUCE, 4, {"all-reduce": 1}),
    "reduce with a non-identity init": (REDUCE_INIT, 4, {"all-gather": 1}),
    "reduce-window gathers its window dimension": (WINDOW, 4, {"all-gather": 1}),
    "slice and concatenate": (SLICE_CONCAT, 4, {"all-gather": 1}),
    "while keeps its state's tiling": (WHILE, 4, {}),
    "fft falls back": (FFT, 4, {"all-gather": 1}),
    "dot into a sharded result: reduce-scatter": (SCATTERED, 4, {"reduce-scatter": 1}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_rule(name):
    text, n, collectives = CASES[name]
    args = [
        np.random.default_rng(0).normal(size=p.shape.dims).astype(np.float32)
        for p in parse_module(text).entry_computation().parameters
    ]
    (got,), report, _ = run_partitioned(text, args, n)
    np.testing.assert_allclose(got, evaluate(parse_module(text), args), rtol=1e-5, atol=1e-5)
    assert report.collectives == collectives, report.text()


def test_fallback_is_reported():
    report = partition(parse_module(CUSTOM), 4)
    assert [(f.name, f.opcode) for f in report.fallbacks] == [("y", "custom-call")]
    assert "replicated: y (custom-call): custom call 'my_kernel' has no" in report.text()
    assert report.collectives == {"all-gather": 1}


def test_uneven_parameter_is_a_clear_error():
    text = module(
        "  x = f32[6]{0} parameter(0), sharding={devices=[4]<=[4]}",
        "  ROOT y = f32[6]{0} negate(x)",
    )
    with pytest.raises(PartitionError, match=r"does not split evenly into \[4\] tiles"):
        partition(parse_module(text), 4)


def test_cli_opt_partition(run_cli, write):
    code, out, err = run_cli("opt", write("m.hlo", DOT), "--partition", "8")
    assert code == 0, err
    module = parse_module(out)
    assert module.config.num_partitions == 8
    assert [i.opcode.text for i in module.entry_computation().instructions].count("all-reduce") == 1
    assert "spmd-partitioner: 8 partitions" in err and "no op fell back" in err


def test_client_partitions_a_global_program():
    """Compiled for 8 partitions, an annotated global module is partitioned (as by XLA);
    an already partitioned one (num_partitions in its header) is left alone."""
    client = Client("interpreter", device_count=8)
    exe = client.compile(DOT, CompileOptions.make(num_partitions=8))
    assert "all-reduce" in exe.hlo_text() and "num_partitions=8" in exe.hlo_text()
    again = client.compile(exe.hlo_text(), CompileOptions.make(num_partitions=8))
    assert again.hlo_text() == exe.hlo_text()
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(8, 16)).astype(np.float32), rng.normal(size=(16, 4)).astype(np.float32)
    module = parse_module(exe.hlo_text())
    xs, ws = (Tiling.from_sharding(p.attrs["sharding"], 2, 8) for p in module.entry.parameters)
    devices = client.devices()
    rows = [
        [
            client.buffer_from_pyval(np.array(x[xs.slices(x.shape)[d]]), devices[d]),
            client.buffer_from_pyval(np.array(w[ws.slices(w.shape)[d]]), devices[d]),
        ]
        for d in range(8)
    ]
    outs = exe.execute(rows)
    out = Tiling.from_sharding(module.entry.root.attrs["sharding"], 2, 8)
    got = np.zeros((8, 4), np.float32)
    for d in range(8):
        got[out.slices(got.shape)[d]] = np.asarray(outs[d][0])
    np.testing.assert_allclose(got, np.tanh(x @ w), rtol=1e-5, atol=1e-5)


def test_cli_memory_per_device(run_cli, write):
    path = write("m.hlo", DOT)
    code, whole, err = run_cli("memory", path, "--no-opt", "--json")
    assert code == 0, err
    code, part, err = run_cli("memory", path, "--no-opt", "--json", "--partition", "8")
    assert code == 0, err
    assert "spmd-partitioner: 8 partitions" in err
    # x f32[8,16] is cut 8 ways, w f32[16,4] 4 ways: 512 + 256 bytes whole, 64 + 64 a device
    assert json.loads(whole)["argument_bytes"] == 768
    assert json.loads(part)["argument_bytes"] == 128


UNEVEN = module(
    "  x = f32[8,6]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}",
    "  ROOT y = f32[8,6]{1,0} negate(x), sharding={devices=[1,4]<=[4]}",
)


def test_uneven_annotation_is_followed_where_it_can_be():
    """6 rows do not split 4 ways: that dimension stays whole (the result still right)."""
    x = np.random.default_rng(2).normal(size=(8, 6)).astype(np.float32)
    (got,), report, module = run_partitioned(UNEVEN, [x], 4)
    np.testing.assert_array_equal(got, -x)
    assert report.uneven == ["y: f32[8,6]{1,0} kept whole along dimensions [1]"]
    assert module.entry_computation().root_instruction().attrs["sharding"].is_replicated


VOCAB_GATHER = module(
    "  table = f32[16,8]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}\n"
    "  ids = s32[6]{0} parameter(1)",
    "  ROOT rows = f32[6,8]{1,0} gather(table, ids), offset_dims={1}, collapsed_slice_dims={0}, "
    "start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}",
)
POINT_GATHER = module(
    "  x = f32[8,12]{1,0} parameter(0), sharding={devices=[2,2]<=[4]}\n"
    "  at = s32[5,2]{1,0} parameter(1)",
    "  ROOT v = f32[5]{0} gather(x, at), offset_dims={}, collapsed_slice_dims={0,1}, "
    "start_index_map={1,0}, index_vector_dim=1, slice_sizes={1,1}",
)


@pytest.mark.parametrize(
    ("text", "indices"),
    [
        (VOCAB_GATHER, np.array([3, 15, 0, -3, 20, 9], np.int32)),  # out of range: clamped
        (POINT_GATHER, np.array([[0, 0], [11, 7], [5, 2], [13, -1], [6, 4]], np.int32)),
    ],
)
def test_gather_from_rows_cut_by_index_is_masked_and_summed(text, indices):
    """A gather taking single rows along a cut dimension (an embedding table cut by
    vocabulary): each device gathers what it holds, zeroes the rest, one all-reduce; the
    operand is never gathered. Out-of-range indices clamp as in the global gather."""
    shape = parse_module(text).entry_computation().parameters[0].shape.dims
    table = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    (got,), report, _ = run_partitioned(text, [table, indices], 4)
    np.testing.assert_array_equal(got, evaluate(parse_module(text), [table, indices]))
    assert report.collectives == {"all-reduce": 1}, report.text()
