"""Partial sums in the SPMD partitioner: JAX's `P(..., unreduced={...})` shardings.

An unreduced value is held as pieces that add up to it across the devices of the unreduced
mesh axes. Each program below is StableHLO as JAX hands it to the plugin (Shardy
annotations); it is compiled for N devices of the interpreter and run with each device's
slice of fresh random inputs. Checked: each device's piece (a partial sum where the output
is unreduced, the same numbers XLA:CPU gives: checked against JAX in the session that wrote
them), that the pieces add up to the NumPy result, and which collectives the partitioner
placed (none while a value stays unreduced; an all-reduce or reduce-scatter where it is
resharded to whole pieces).
"""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.ir.sharding import parse_sharding
from xlapy.runtime import Client
from xlapy.stablehlo import import_text

HEAD = (
    "module @jit_f attributes {{mhlo.num_partitions = {n} : i32}} {{\n"
    "  sdy.mesh @mesh = <[{mesh}]>\n"
)


def program(mesh: str, n: int, signature: str, body: str) -> str:
    return (
        HEAD.format(n=n, mesh=mesh) + f"  func.func public @main({signature} {{\n{body}\n  }}\n}}\n"
    )


def sh(dims: str, unreduced: str = "") -> str:
    extra = f", unreduced={{{unreduced}}}" if unreduced else ""
    return f"#sdy.sharding<@mesh, [{dims}]{extra}>"


def run(text: str, n: int, per_device_args):
    """Compile `text` for n interpreter devices and run it: per device, its outputs."""
    client = Client("interpreter", device_count=n)
    exe = client.compile(text)
    devices = client.devices()
    rows = [
        [client.buffer_from_pyval(np.ascontiguousarray(a), devices[d]) for a in args]
        for d, args in enumerate(per_device_args)
    ]
    outs = [[np.asarray(b) for b in row] for row in exe.execute(rows)]
    return outs, exe.module.to_text()


def collectives(text: str) -> dict[str, int]:
    names = ("all-reduce(", "reduce-scatter(", "all-gather(", "all-to-all(")
    return {k.rstrip("("): text.count(k) for k in names if text.count(k)}


S2 = sh('{"x"}, {}')
S3 = sh('{"x"}, {}', '"x"')
S4 = sh('{"z"}, {}', '"x"')
S6 = sh("{}", '"x"')
S7 = sh('{}, {"x"}')
S8 = sh("{}, {}", '"x"')

RNG = np.random.default_rng(20261127)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_dot_left_unreduced_keeps_partial_sums():
    """einsum(x, y, out_sharding=P(None, None, unreduced={'x'})) with the contracted
    dimension split over x: each device returns its local product, no all-reduce."""
    sig = (
        f"%a: tensor<3x4xf32> {{sdy.sharding = {S7}}}, "
        f"%b: tensor<4x5xf32> {{sdy.sharding = {S2}}}) -> "
        f"(tensor<3x5xf32> {{sdy.sharding = {S8}}})"
    )
    body = (
        "    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : "
        "(tensor<3x4xf32>, tensor<4x5xf32>) -> tensor<3x5xf32>\n"
        '    %1 = sdy.sharding_constraint %0 <@mesh, [{}, {}], unreduced={"x"}> '
        ": tensor<3x5xf32>\n    return %1 : tensor<3x5xf32>"
    )
    a, b = rand(3, 4), rand(4, 5)
    args = [[a[:, :2], b[:2]], [a[:, 2:], b[2:]]]
    outs, text = run(program('"x"=2', 2, sig, body), 2, args)
    for d in range(2):
        np.testing.assert_allclose(outs[d][0], args[d][0] @ args[d][1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[0][0] + outs[1][0], a @ b, rtol=1e-5, atol=1e-5)
    assert collectives(text) == {}, text
    assert "last_tile_dims={unreduced}" in text


def test_tiled_and_replicated_to_unreduced():
    """reshard(P('x', None) -> P(None, None, unreduced={'x'})): each device keeps its rows
    in place and zeros elsewhere (XLA:CPU's result); from replicated: the first device of
    each group keeps the value, the others zeros. No communication either way."""
    for src, expect in [
        ('{"x"}, {}', "rows"),
        ("{}, {}", "first"),
    ]:
        sig = (
            f"%a: tensor<4x2xf32> {{sdy.sharding = {sh(src)}}}) -> "
            f"(tensor<4x2xf32> {{sdy.sharding = {S8}}})"
        )
        body = (
            '    %0 = sdy.sharding_constraint %a <@mesh, [{}, {}], unreduced={"x"}> '
            ": tensor<4x2xf32>\n    return %0 : tensor<4x2xf32>"
        )
        a = rand(4, 2)
        args = [[a[:2]], [a[2:]]] if expect == "rows" else [[a], [a]]
        outs, text = run(program('"x"=2', 2, sig, body), 2, args)
        zero = np.zeros_like(a)
        if expect == "rows":
            want0, want1 = zero.copy(), zero.copy()
            want0[:2], want1[2:] = a[:2], a[2:]
        else:
            want0, want1 = a, zero
        np.testing.assert_array_equal(outs[0][0], want0)
        np.testing.assert_array_equal(outs[1][0], want1)
        assert collectives(text) == {}, text


@pytest.mark.parametrize(
    "out, reduction",
    [
        (sh('{"x"}, {}', '"y"'), {}),  # stays unreduced
        (sh("{}, {}"), {"all-reduce": 1, "all-gather": 1}),  # reduced, gathered over x
        (sh('{"x"}, {"y"}'), {"reduce-scatter": 1}),  # reduced, columns split over y
    ],
)
def test_unreduced_parameters_add_then_reshard(out, reduction):
    """Two unreduced arguments (partial sums over y of a 2x2 mesh, split over x) added:
    the sum stays a partial sum (an add per device); a reduced out-sharding adds the
    pieces up with one collective."""
    arg = sh('{"x"}, {}', '"y"')
    sig = (
        f"%a: tensor<4x6xf32> {{sdy.sharding = {arg}}}, "
        f"%b: tensor<4x6xf32> {{sdy.sharding = {arg}}}) -> "
        f"(tensor<4x6xf32> {{sdy.sharding = {out}}})"
    )
    body = (
        "    %0 = stablehlo.add %a, %b : tensor<4x6xf32>\n"
        f"    %1 = sdy.sharding_constraint %0 {out.removeprefix('#sdy.sharding')} "
        ": tensor<4x6xf32>\n    return %1 : tensor<4x6xf32>"
    )
    # device d = 2 * x + y holds rows x*2:(x+1)*2 as a partial sum over y
    pieces = {d: (rand(2, 6), rand(2, 6)) for d in range(4)}
    outs, text = run(program('"x"=2, "y"=2', 4, sig, body), 4, [pieces[d] for d in range(4)])
    whole = [sum(pieces[2 * x + y][0] + pieces[2 * x + y][1] for y in range(2)) for x in range(2)]
    assert collectives(text) == reduction, text
    for d in range(4):
        x, y = divmod(d, 2)
        got = outs[d][0]
        if not reduction:
            np.testing.assert_allclose(got, pieces[d][0] + pieces[d][1], rtol=1e-6)
        elif "all-reduce" in reduction:
            np.testing.assert_allclose(got, np.concatenate(whole), rtol=1e-5, atol=1e-6)
        else:  # P('x', 'y'): device (x, y) holds columns 3y:3y+3 of its rows
            np.testing.assert_allclose(got, whole[x][:, 3 * y : 3 * y + 3], rtol=1e-5, atol=1e-6)


def test_unreduced_value_used_by_a_nonlinear_op_is_reduced_first():
    """sin of a partial sum is not the sum of the sines: the partitioner adds the pieces
    up before the sin (a silent wrong answer otherwise)."""
    sig = (
        f"%a: tensor<8xf32> {{sdy.sharding = {S6}}}) -> "
        f"(tensor<8xf32> {{sdy.sharding = {sh('{}')}}})"
    )
    body = "    %0 = stablehlo.sine %a : tensor<8xf32>\n    return %0 : tensor<8xf32>"
    parts = [rand(8), rand(8)]
    outs, text = run(program('"x"=2', 2, sig, body), 2, [[p] for p in parts])
    for d in range(2):
        np.testing.assert_allclose(outs[d][0], np.sin(parts[0] + parts[1]), rtol=1e-5, atol=1e-6)
    assert collectives(text) == {"all-reduce": 1}, text


def test_shard_map_unreduced_out_spec():
    """shard_map(out_specs=P(unreduced={'x'})): each device's local result is its partial
    sum; resharding it to replicated afterwards sums the pieces."""
    sig = (
        f"%a: tensor<4x3xf32> {{sdy.sharding = {S2}}}) -> "
        f"(tensor<3xf32> {{sdy.sharding = {sh('{}')}}})"
    )
    body = (
        '    %0 = sdy.manual_computation(%a) in_shardings=[<@mesh, [{"x"}, {}]>] '
        'out_shardings=[<@mesh, [{}], unreduced={"x"}>] manual_axes={"x"} '
        "(%arg1: tensor<2x3xf32>) {\n"
        "      %c = stablehlo.constant dense<0.0> : tensor<f32>\n"
        "      %r = stablehlo.reduce(%arg1 init: %c) applies stablehlo.add across dimensions = [0] "
        ": (tensor<2x3xf32>, tensor<f32>) -> tensor<3xf32>\n"
        "      sdy.return %r : tensor<3xf32>\n"
        "    } : (tensor<4x3xf32>) -> tensor<3xf32>\n"
        "    return %0 : tensor<3xf32>"
    )
    a = rand(4, 3)
    outs, text = run(program('"x"=2', 2, sig, body), 2, [[a[:2]], [a[2:]]])
    for d in range(2):
        np.testing.assert_allclose(outs[d][0], a.sum(0), rtol=1e-5, atol=1e-6)
    assert collectives(text) == {"all-reduce": 1}, text


def test_importer_reads_unreduced_axes():
    """The importer's HLO sharding: the tile dimensions, then the unreduced subgroup, then
    replication over the axes left (the mesh's devices transposed to that order)."""
    module = import_text(
        program(
            '"x"=2, "y"=2, "z"=2',
            8,
            f"%a: tensor<4x2xf32> {{sdy.sharding = {S4}}}) -> (tensor<4x2xf32>)",
            "    return %a : tensor<4x2xf32>",
        )
    )
    s = module.entry_computation().parameters[0].attrs["sharding"]
    assert s.text() == "{devices=[2,1,2,2]<=[2,2,2]T(2,0,1) last_tile_dims={unreduced, replicated}}"
    assert s.is_unreduced and not s.is_replicated
    # devices (x, y, z) = 4x + 2y + z: z splits the rows, x sums, y replicates
    assert s.unreduced_groups() == [[0, 4], [2, 6], [1, 5], [3, 7]]
    assert parse_sharding(s.text()) == s


def test_importer_rejects_an_axis_both_split_and_summed():
    sig = f"%a: tensor<4x2xf32> {{sdy.sharding = {S3}}}) -> (tensor<4x2xf32>)"
    with pytest.raises(Exception, match="both splits and sums over an axis"):
        import_text(program('"x"=2', 2, sig, "    return %a : tensor<4x2xf32>"))


def test_loop_accumulates_unreduced_then_reduces_once():
    """A scan accumulating a gradient unreduced (JAX's microbatching pattern): the loop
    state stays a partial sum, the body's dot + transpose + add run without collectives,
    and the one all-reduce comes after the loop."""
    acc = sh("{}, {}", '"x"')
    sig = (
        f"%xs: tensor<3x4x2xf32> {{sdy.sharding = {sh('{}, {}, {}')}}}) -> "
        f"(tensor<2x2xf32> {{sdy.sharding = {sh('{}, {}')}}})"
    )
    body = f"""    %z = stablehlo.constant dense<0.0> : tensor<2x2xf32>
    %a0 = sdy.sharding_constraint %z <@mesh, [{{}}, {{}}], unreduced={{"x"}}> : tensor<2x2xf32>
    %i0 = stablehlo.constant dense<0> : tensor<i32>
    %w:3 = stablehlo.while(%i = %i0, %a = %a0, %x = %xs) : tensor<i32>, tensor<2x2xf32>, tensor<3x4x2xf32>
    cond {{
      %n = stablehlo.constant dense<3> : tensor<i32>
      %c = stablehlo.compare LT, %i, %n, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %c : tensor<i1>
    }} do {{
      %zero = stablehlo.constant dense<0> : tensor<i32>
      %s = stablehlo.dynamic_slice %x, %i, %zero, %zero, sizes = [1, 4, 2] : (tensor<3x4x2xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x2xf32>
      %m = stablehlo.reshape %s : (tensor<1x4x2xf32>) -> tensor<4x2xf32>
      %ms = sdy.sharding_constraint %m <@mesh, [{{"x"}}, {{}}]> : tensor<4x2xf32>
      %g = stablehlo.dot_general %ms, %ms, contracting_dims = [0] x [0] : (tensor<4x2xf32>, tensor<4x2xf32>) -> tensor<2x2xf32>
      %gu = sdy.sharding_constraint %g <@mesh, [{{}}, {{}}], unreduced={{"x"}}> : tensor<2x2xf32>
      %gt = stablehlo.transpose %gu, dims = [1, 0] : (tensor<2x2xf32>) -> tensor<2x2xf32>
      %gtu = sdy.sharding_constraint %gt <@mesh, [{{}}, {{}}], unreduced={{"x"}}> : tensor<2x2xf32>
      %new = stablehlo.add %a, %gtu : tensor<2x2xf32>
      %nu = sdy.sharding_constraint %new {acc.removeprefix("#sdy.sharding")} : tensor<2x2xf32>
      %one = stablehlo.constant dense<1> : tensor<i32>
      %j = stablehlo.add %i, %one : tensor<i32>
      stablehlo.return %j, %nu, %x : tensor<i32>, tensor<2x2xf32>, tensor<3x4x2xf32>
    }}
    %r = sdy.sharding_constraint %w#1 <@mesh, [{{}}, {{}}]> : tensor<2x2xf32>
    return %r : tensor<2x2xf32>"""  # noqa: E501
    xs = rand(3, 4, 2)
    outs, text = run(program('"x"=2', 2, sig, body), 2, [[xs], [xs]])
    want = sum(xs[k].T @ xs[k] for k in range(3)).T
    for d in range(2):
        np.testing.assert_allclose(outs[d][0], want, rtol=1e-5, atol=1e-5)
    assert collectives(text) == {"all-reduce": 1}, text
    loop_body = text[: text.index("ENTRY")]
    assert "all-reduce(" not in loop_body


def test_parameter_returned_as_partial_sum_keeps_its_sharding():
    """shard_map(lambda x: x, in_specs=P(), out_specs=P(unreduced={'x'})): the result is
    the parameter itself, read as a partial sum; the parameter's own sharding (what JAX
    checks against its in_shardings) stays replicated."""
    sig = (
        f"%a: tensor<8xf32> {{sdy.sharding = {sh('{}')}}}) -> "
        f"(tensor<8xf32> {{sdy.sharding = {S6}}})"
    )
    body = (
        "    %0 = sdy.manual_computation(%a) in_shardings=[<@mesh, [{}]>] "
        'out_shardings=[<@mesh, [{}], unreduced={"x"}>] manual_axes={"x"} '
        "(%arg1: tensor<8xf32>) {\n      sdy.return %arg1 : tensor<8xf32>\n"
        "    } : (tensor<8xf32>) -> tensor<8xf32>\n    return %0 : tensor<8xf32>"
    )
    a = rand(8)
    client = Client("interpreter", device_count=2)
    exe = client.compile(program('"x"=2', 2, sig, body))
    entry = exe.module.entry_computation()
    assert entry.parameters[0].attrs["sharding"].is_replicated
    assert entry.root_instruction().attrs["sharding"].is_unreduced
    outs, _ = run(program('"x"=2', 2, sig, body), 2, [[a], [a]])
    for d in range(2):
        np.testing.assert_array_equal(outs[d][0], a)


COMBINE = """HloModule m, num_partitions=2

add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

ENTRY e {
  a = f32[4] parameter(0)
  b = f32[2,2] parameter(1)
  ra = f32[4] all-reduce(a), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add
  rb = f32[2,2] all-reduce(b), channel_id=2, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add
  n = f32[4] negate(ra)
  rn = f32[4] all-reduce(n), channel_id=3, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=add
  ROOT t = (f32[4], f32[2,2], f32[4]) tuple(ra, rb, rn)
}
"""  # noqa: E501


def test_all_reduce_combiner_joins_independent_all_reduces():
    """The gradients reduced after a loop become one all-reduce of a tuple (XLA's
    combiner); an all-reduce that reads another's result stays apart (a cycle otherwise).
    Same numbers on 2 interpreter devices before and after."""
    from xlapy.ir.names import NameUniquer
    from xlapy.ir.parser import parse_module
    from xlapy.passes.spmd.combine import combine_all_reduces
    from xlapy.runtime.options import CompileOptions

    module = parse_module(COMBINE)
    assert combine_all_reduces(module.entry_computation(), NameUniquer(module)) == 1
    text = module.to_text()
    assert text.count("all-reduce(") == 2, text
    client = Client("interpreter", device_count=2)
    devices = client.devices()
    args = [[rand(4), rand(2, 2)] for _ in range(2)]
    rows = [[client.buffer_from_pyval(a, devices[d]) for a in args[d]] for d in range(2)]
    results = []
    for source in (COMBINE, text):
        exe = client.compile(source, CompileOptions.make(num_partitions=2))
        results.append([[np.asarray(b) for b in row] for row in exe.execute(rows)])
    a, b = args[0][0] + args[1][0], args[0][1] + args[1][1]
    for before, after in zip(*results, strict=True):
        for x, y, want in zip(before, after, (a, b, -2 * a), strict=True):
            np.testing.assert_array_equal(x, y)
            np.testing.assert_allclose(y, want, rtol=1e-6)
