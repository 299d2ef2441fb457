# ruff: noqa: E501
"""The SPMD partitioner on what JAX's multi-device tests exercise beyond tests/spmd/:
shard_map regions nested in partially manual ones (manual over some mesh axes, then over
others inside), sharding constraints with open dimensions, and the choice for a dot of
sharded operands. Each program is partitioned, run on its devices with each device's slice
of random global inputs, reassembled, and checked against NumPy or the one-device interpreter
(the manual collectives need the devices: the interpreter cannot run those globally)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import xlapy
from tests.test_spmd_partition import run_partitioned, run_sharded
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module
from xlapy.passes.spmd import partition
from xlapy.runtime import Client
from xlapy.runtime.options import CompileOptions

# shard_map(h, in P('i', None), out P('i', None), manual over {'i'}) where h enters a
# region over 'j' (in P(None, 'j'), out P(None, None)) computing psum(sin(x) * x, 'j'),
# and adds 1 in the outer region: JAX 0.10.2's HLO of the program on a 2x2 mesh ('i', 'j').
NESTED_PSUM = r"""
HloModule jit_f, entry_computation_layout={(f32[4,8]{1,0})->f32[4,4]{1,0}}, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["i"=2, "j"=2]>}}

region_0.1 {
  psum.2 = f32[] parameter(0)
  psum.3 = f32[] parameter(1)
  ROOT add.1 = f32[] add(psum.2, psum.3)
}

xla.sdy.manual_computation_body.2 {
  shard_map.4 = f32[2,4]{1,0} parameter(0)
  sin.1 = f32[2,4]{1,0} sine(shard_map.4)
  mul.1 = f32[2,4]{1,0} multiply(sin.1, shard_map.4)
  ROOT psum.5 = f32[2,4]{1,0} all-reduce(mul.1), channel_id=1, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=region_0.1
}

xla.sdy.manual_computation_body_0.3 {
  shard_map.7 = f32[2,8]{1,0} parameter(0)
  shard_map.8 = f32[2,4]{1,0} custom-call(shard_map.7), custom_call_target="xla.sdy.GlobalToLocalShape", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.in_shardings="#sdy.sharding_per_value<[<@mesh, [{}, {\"j\"}]>]>",xla.sdy.manual_axes="#sdy<manual_axes{\"j\"}>"}
  shard_map.9 = f32[2,4]{1,0} call(shard_map.8), to_apply=xla.sdy.manual_computation_body.2, frontend_attributes={inlineable="false"}
  shard_map.10 = f32[2,4]{1,0} custom-call(shard_map.9), custom_call_target="xla.sdy.LocalToGlobalShape", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.manual_axes="#sdy<manual_axes{\"j\"}>",xla.sdy.out_shardings="#sdy.sharding_per_value<[<@mesh, [{}, {}]>]>"}
  constant.1 = f32[] constant(1)
  broadcast.1 = f32[2,4]{1,0} broadcast(constant.1), dimensions={}
  add.5 = f32[2,4]{1,0} custom-call(broadcast.1), custom_call_target="Sharding", sharding={replicated}, frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{}, {}]>]>"}
  add.6 = f32[2,4]{1,0} add(shard_map.10, add.5)
  ROOT add.7 = f32[2,4]{1,0} custom-call(add.6), custom_call_target="Sharding", sharding={replicated}, frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{}, {}]>]>"}
}

ENTRY main.4 {
  x.1 = f32[4,8]{1,0} parameter(0), sharding={devices=[2,2]<=[4]}, frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{\"i\"}, {\"j\"}]>"}
  shard_map.14 = f32[2,8]{1,0} custom-call(x.1), custom_call_target="xla.sdy.GlobalToLocalShape", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.in_shardings="#sdy.sharding_per_value<[<@mesh, [{\"i\"}, {}]>]>",xla.sdy.manual_axes="#sdy<manual_axes{\"i\"}>"}
  shard_map.15 = f32[2,4]{1,0} call(shard_map.14), to_apply=xla.sdy.manual_computation_body_0.3, frontend_attributes={inlineable="false"}
  shard_map.16 = f32[4,4]{1,0} custom-call(shard_map.15), custom_call_target="xla.sdy.LocalToGlobalShape", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.manual_axes="#sdy<manual_axes{\"i\"}>",xla.sdy.out_shardings="#sdy.sharding_per_value<[<@mesh, [{\"i\"}, {}]>]>"}
  shard_map.17 = f32[4,4]{1,0} custom-call(shard_map.16), custom_call_target="xla.sdy.FuncResultSharding", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{\"i\"}, {}]>]>"}
  tuple.1 = (f32[4,4]{1,0}) tuple(shard_map.17)
  ROOT get-tuple-element.1 = f32[4,4]{1,0} get-tuple-element(tuple.1), index=0, sharding={devices=[2,1,2]<=[4] last_tile_dim_replicate}
}
"""

# The same nesting with the inner region's result tiled along 'j' (out P(None, 'j')):
# leaving it gathers the 'j' pieces back inside the outer region, which holds its data
# whole along 'j'.
NESTED_TILED = (
    NESTED_PSUM.replace(
        r'xla.sdy.out_shardings="#sdy.sharding_per_value<[<@mesh, [{}, {}]>]>"',
        r'xla.sdy.out_shardings="#sdy.sharding_per_value<[<@mesh, [{}, {\"j\"}]>]>"',
    )
    .replace(
        "  ROOT psum.5 = f32[2,4]{1,0} all-reduce(mul.1), channel_id=1, "
        "replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=region_0.1\n",
        "  ROOT psum.5 = f32[2,4]{1,0} add(mul.1, mul.1)\n",
    )
    .replace("f32[2,4]{1,0} custom-call(shard_map.9)", "f32[2,8]{1,0} custom-call(shard_map.9)")
    .replace("f32[2,4]{1,0} broadcast", "f32[2,8]{1,0} broadcast")
    .replace("add.5 = f32[2,4]", "add.5 = f32[2,8]")
    .replace("add.6 = f32[2,4]", "add.6 = f32[2,8]")
    .replace("add.7 = f32[2,4]", "add.7 = f32[2,8]")
    .replace("f32[2,4]{1,0} call(shard_map.14)", "f32[2,8]{1,0} call(shard_map.14)")
    .replace("->f32[4,4]", "->f32[4,8]")
    .replace("f32[4,4]{1,0} custom-call", "f32[4,8]{1,0} custom-call")
    .replace("tuple.1 = (f32[4,4]{1,0})", "tuple.1 = (f32[4,8]{1,0})")
    .replace("get-tuple-element.1 = f32[4,4]", "get-tuple-element.1 = f32[4,8]")
)


def _x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)


def test_nested_region_with_inner_psum():
    """The inner region takes each device's 'j' piece of the outer region's rows, sums
    over 'j' inside; the outer region adds 1 and returns its rows."""
    x = _x(0)
    (got,), report, module = run_partitioned(NESTED_PSUM, [x], 4)
    want = (np.sin(x) * x)[:, :4] + (np.sin(x) * x)[:, 4:] + 1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert report.native["shard_map region"] == 2
    text = module.to_text()
    # entering the inner region is a local slice, not a collective
    assert "all-to-all" not in text and "collective-permute" not in text
    assert "dynamic-slice" in text


def test_nested_region_with_tiled_result():
    """The inner region's result tiled along 'j' is gathered back to the outer region's
    whole rows among the devices of the same 'i' piece (groups {0,1} and {2,3})."""
    x = _x(1)
    (got,), _, module = run_partitioned(NESTED_TILED, [x], 4)
    np.testing.assert_allclose(got, 2 * np.sin(x) * x + 1, rtol=1e-5, atol=1e-6)
    gathers = re.findall(r"all-gather\(.*replica_groups=(\{[^ ]*\})", module.to_text())
    assert "{{0,1},{2,3}}" in gathers, module.to_text()


# -- sharding constraints with open dimensions --------------------------------------------

# x P('x', 'y') on a 2x2x2 mesh, transposed, then constrained with every dimension open
# but the last (JAX's out-sharding left to propagation: `[{?}, {?}, {}]` on an empty mesh)
OPEN_CONSTRAINT = """
module @jit_f attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  sdy.mesh @mesh = <["x"=2, "y"=2, "z"=2]>
  sdy.mesh @empty_mesh = <[]>
  func.func public @main(%arg0: tensor<8x4x2xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {"y"}, {}]>}) -> (tensor<2x4x8xf32>) {
    %0 = stablehlo.sine %arg0 : tensor<8x4x2xf32>
    %1 = stablehlo.transpose %0, dims = [2, 1, 0] : (tensor<8x4x2xf32>) -> tensor<2x4x8xf32>
    %2 = sdy.sharding_constraint %1 <@empty_mesh, [{?}, {?}, {}]> : tensor<2x4x8xf32>
    return %2 : tensor<2x4x8xf32>
  }
}
"""


def _partition_mlir(text: str, n: int):

    module = xlapy.load(text)
    report = partition(module, n)
    return module, report


def test_open_dimensions_read_as_unspecified_dims():
    """Shardy's `{?}` becomes GSPMD's unspecified_dims on the Sharding custom call."""

    module = xlapy.load(OPEN_CONSTRAINT)
    (call,) = [i for i in module.entry_computation().instructions if i.opcode.text == "custom-call"]
    assert call.custom_call_target == "Sharding"
    assert call.backend_config is not None
    assert call.backend_config.text == "unspecified_dims=[0,1]"


def test_open_dimensions_keep_the_value_tiling():
    """Open dimensions keep the tiling the value has (dimension 1 cut by 'y'), the closed
    one is held whole (dimension 2 was cut by 'x': gathered); the result's sharding says
    so, and the pieces reassemble to the global result."""
    module, _ = _partition_mlir(OPEN_CONSTRAINT, 8)
    root = module.entry_computation().root_instruction()
    assert root.shape.dims == (2, 2, 8)
    s = root.attrs["sharding"]
    assert s.tile_dims[:3] == (1, 2, 1)
    x = np.random.default_rng(2).standard_normal((8, 4, 2)).astype(np.float32)

    client = Client("interpreter", device_count=8)
    exe = client.compile(module.to_text(), CompileOptions.make(num_partitions=8))
    (got,) = run_sharded(client, exe, module, [x], 8)
    np.testing.assert_allclose(got, np.sin(x).transpose(2, 1, 0), rtol=1e-6)


def test_closed_replicated_constraint_still_gathers():
    """The same constraint with every dimension closed (`[{}, {}, {}]`) replicates."""
    module, _ = _partition_mlir(OPEN_CONSTRAINT.replace("[{?}, {?}, {}]", "[{}, {}, {}]"), 8)
    root = module.entry_computation().root_instruction()
    assert root.shape.dims == (2, 4, 8)


# -- a dot of sharded operands stays sharded ------------------------------------------------

# sin(2x) @ x2 with x P('x', 'y') and x2 P('y', 'x') on a 2x2 mesh, the result's sharding
# left to propagation (JAX's ShardingInTypesTest.test_auto_user)
SHARDED_DOT = """
HloModule f, entry_computation_layout={(f32[8,2]{1,0}, f32[2,8]{1,0})->f32[8,8]{1,0}}

ENTRY main {
  x = f32[8,2]{1,0} parameter(0), sharding={devices=[2,2]<=[4]}
  x2 = f32[2,8]{1,0} parameter(1), sharding={devices=[2,2]<=[2,2]T(1,0)}
  two = f32[] constant(2)
  b = f32[8,2]{1,0} broadcast(two), dimensions={}
  y = f32[8,2]{1,0} multiply(x, b)
  z = f32[8,2]{1,0} sine(y)
  ROOT a = f32[8,8]{1,0} dot(z, x2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_dot_of_sharded_operands_is_not_replicated():
    """XLA keeps the lhs's row cut on the result (P('x', None)) and all-reduces the
    contraction cut by 'y'; replicating the dot (gathering both operands, every device
    computing all of it) moved fewer bytes here but left three devices' work redundant."""

    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 2)).astype(np.float32)
    x2 = rng.standard_normal((2, 8)).astype(np.float32)
    (got,), _, module = run_partitioned(SHARDED_DOT, [x, x2], 4)
    root = module.entry_computation().root_instruction()
    assert root.shape.dims == (4, 8)
    assert "all-reduce" in module.to_text()
    want = evaluate(parse_module(SHARDED_DOT), [x, x2])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# -- values made from replicated ones are made per piece (a pure map) -----------------------

# JAX's partitionable threefry, in small: a counter made of iotas, mixed in a loop, added
# to a sharded input. Each device counts and mixes its own piece only.
PURE_MAP = """
HloModule bits

body {
  s = (s32[], u32[DIMS]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  v = u32[DIMS] get-tuple-element(s), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  k = u32[] convert(i1)
  kb = u32[DIMS] broadcast(k), dimensions={}
  m = u32[DIMS] multiply(v, kb)
  c = u32[] constant(2654435761)
  cb = u32[DIMS] broadcast(c), dimensions={}
  x = u32[DIMS] xor(m, cb)
  thirteen = u32[] constant(13)
  tb = u32[DIMS] broadcast(thirteen), dimensions={}
  sh = u32[DIMS] shift-right-logical(x, tb)
  y = u32[DIMS] add(x, sh)
  ROOT t = (s32[], u32[DIMS]) tuple(i1, y)
}

cond {
  s = (s32[], u32[DIMS]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(5)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY main {
  p = u32[DIMS] parameter(0), sharding=SHARDING
  r = u64[DIMS] iota(), iota_dimension=0
  c = u64[DIMS] iota(), iota_dimension=1
  cols = u64[] constant(COLS)
  e = u64[DIMS] broadcast(cols), dimensions={}
  rm = u64[DIMS] multiply(r, e)
  idx64 = u64[DIMS] add(rm, c)
  idx = u32[DIMS] convert(idx64)
  zero = s32[] constant(0)
  init = (s32[], u32[DIMS]) tuple(zero, idx)
  w = (s32[], u32[DIMS]) while(init), condition=cond, body=body
  bits = u32[DIMS] get-tuple-element(w), index=1
  ROOT out = u32[DIMS] add(bits, p)
}
"""

PURE_MAP_CASES = [
    # (rows, cols, sharding of the input, devices)
    (4, 8, "{devices=[2,2]<=[4]}", 4),
    (4, 9, "{devices=[1,3,2]<=[2,3]T(1,0) last_tile_dim_replicate}", 6),
    (16, 4, "{devices=[4,2]<=[8]}", 8),
    (8, 6, "{devices=[2,1,2]<=[4] last_tile_dim_replicate}", 4),
]


@pytest.mark.parametrize("rows,cols,sharding,n", PURE_MAP_CASES)
def test_values_from_replicated_ones_are_made_per_piece(rows, cols, sharding, n):
    """The iotas, the loop state and every op on them take the input's tiling: the
    partitioned program holds no array of the global shape and moves no data; its
    reassembled result is the one-device interpreter's."""
    text = (
        PURE_MAP.replace("DIMS", f"{rows},{cols}")
        .replace("SHARDING", sharding)
        .replace("COLS", str(cols))
    )
    rng = np.random.default_rng(rows * cols)
    p = rng.integers(0, 2**32, (rows, cols), dtype=np.uint32)
    (got,), report, module = run_partitioned(text, [p], n)
    out = module.to_text()
    assert f"[{rows},{cols}]" not in out, out
    for collective in ("all-gather", "all-reduce", "collective-permute", "all-to-all"):
        assert collective not in out, out
    assert not report.fallbacks
    want = evaluate(parse_module(text), [p])
    np.testing.assert_array_equal(got, want)
