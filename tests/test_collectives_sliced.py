"""Collectives that move slices: ragged-all-to-all and the in-place (sliced) form of
collective-permute, on several in-process devices, on the CPU backend and the reference
interpreter.

XLA:CPU runs neither (ragged-all-to-all: "not supported by XLA:CPU ThunkEmitter"; the
in-place collective-permute cannot reach it through jaxlib, whose StableHLO has no such
form), so expected values come from NumPy references written here from the semantics:
ragged-all-to-all from the pseudocode of `jax.lax.ragged_all_to_all`'s documentation, the
in-place permute from XLA's (pair p moves `slice_sizes[p]` from the sender's input at its
input start indices to the receiver's output at its output start indices; start indices
clamp as dynamic-slice's do; the rest of the output keeps the output operand's values).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_collectives_runtime import run, way  # noqa: F401  (fixture: led / parallel)
from xlapy.errors import VerifierError, XlapyError
from xlapy.ir.parser import parse_module
from xlapy.ir.verifier import verify

PLATFORMS = ["cpu", "interpreter"]

# -- ragged-all-to-all ----------------------------------------------------------------------

RAGGED = """HloModule ragged, num_partitions={n}

ENTRY e {{
  x = {t}[{rows},3] parameter(0)
  o = {t}[{out_rows},3] parameter(1)
  io = s32[{count}] parameter(2)
  ss = s32[{count}] parameter(3)
  oo = s32[{count}] parameter(4)
  rs = s32[{count}] parameter(5)
  ROOT r = {t}[{out_rows},3] ragged-all-to-all(x, o, io, ss, oo, rs), channel_id=1,
    replica_groups={groups}
}}
"""


def ragged_reference(inputs, groups):
    """jax.lax.ragged_all_to_all's documented pseudocode, per group: member s sends
    operand[input_offsets[i] : +send_sizes[i]] to member i // k, which writes it at
    all_to_all(output_offsets)[i] for recv_sizes[i] rows of a copy of its output."""
    results = {}
    for group in groups:
        n = len(group)
        for r, d in enumerate(group):
            _, out, _, _, _, recv = inputs[d]
            k = len(recv) // n
            result = out.copy()
            for i in range(len(recv)):
                s = group[i // k]
                x, _, io, _, oo, _ = inputs[s]
                j = r * k + i % k  # the entry of s's arrays that describes this piece
                at, size = oo[j], recv[i]
                result[at : at + size] = x[io[j] : io[j] + size]
            results[d] = result
    return results


def ragged_inputs(rng, groups, rows, out_rows, k, dtype):
    """Random data and a random valid exchange: piece q from member s to member r has a
    random size and sits at random gaps in s's input and r's output."""
    devices = [d for g in groups for d in g]
    args = {}
    for group in groups:
        n = len(group)
        sizes = rng.integers(0, 3, size=(n, n, k))  # sizes[s, r, q]
        io = np.zeros((n, n * k), np.int32)
        oo = np.zeros((n, n * k), np.int32)
        rs = np.zeros((n, n * k), np.int32)
        for s in range(n):
            at = int(rng.integers(0, 2))
            for r in range(n):
                for q in range(k):
                    io[s, r * k + q] = at
                    at += int(sizes[s, r, q]) + int(rng.integers(0, 2))
            assert at <= rows
        for r in range(n):
            at = int(rng.integers(0, 2))
            for s in range(n):
                for q in range(k):
                    oo[s, r * k + q] = at
                    rs[r, s * k + q] = sizes[s, r, q]
                    at += int(sizes[s, r, q]) + int(rng.integers(0, 2))
            assert at <= out_rows
        for i, d in enumerate(group):
            x = _random(rng, (rows, 3), dtype)
            out = _random(rng, (out_rows, 3), dtype)
            send = np.array([sizes[i, r, q] for r in range(n) for q in range(k)], np.int32)
            args[d] = [x, out, io[i], send, oo[i], rs[i]]
    return [args[d] for d in sorted(devices)]


def _random(rng, shape, dtype):
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-1000, 1000, size=shape).astype(dtype)
    return rng.normal(size=shape).astype(dtype)


def _groups_text(groups) -> str:
    return "{" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(
    "n,groups,k,dtype",
    [
        (2, [[0, 1]], 1, np.float32),
        (4, [[0, 1, 2, 3]], 1, np.float32),
        (4, [[0, 1, 2, 3]], 2, np.int32),
        (4, [[0, 2], [1, 3]], 2, np.float32),
        (4, [[3, 1, 0, 2]], 1, np.int32),
    ],
)
def test_ragged_all_to_all(platform, n, groups, k, dtype):
    rng = np.random.default_rng(1000 * n + 10 * k + len(groups))
    size = len(groups[0])
    rows, out_rows = 4 * size * k + 2, 4 * size * k + 3
    args = ragged_inputs(rng, groups, rows, out_rows, k, dtype)
    t = "f32" if dtype == np.float32 else "s32"
    text = RAGGED.format(
        n=n, t=t, rows=rows, out_rows=out_rows, count=size * k, groups=_groups_text(groups)
    )
    got = run(platform, text, args, partitions=n)
    want = ragged_reference(args, groups)
    for d in range(n):
        assert got[d][0].tobytes() == want[d].tobytes(), (d, got[d][0], want[d])


@pytest.mark.parametrize("platform", PLATFORMS)
def test_ragged_all_to_all_alone(platform):
    """One participant: the exchange is with itself."""
    x = np.arange(12, dtype=np.float32).reshape(4, 3) + 0.5
    out = -np.ones((5, 3), np.float32)
    args = [[x, out, np.int32([1]), np.int32([2]), np.int32([3]), np.int32([2])]]
    text = RAGGED.format(n=1, t="f32", rows=4, out_rows=5, count=1, groups="{{0}}")
    (got,) = run(platform, text, args, partitions=1)[0]
    want = out.copy()
    want[3:5] = x[1:3]
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize(
    "change,message",
    [
        ("recv", "whose recv_sizes\\[1\\] says 3"),
        ("send", "sends rows \\[1, 9\\) of an input with 6 rows"),
        ("write", "writes rows \\[5, 6\\) of participant 1's output, which has 5 rows"),
    ],
)
def test_ragged_all_to_all_bad_sizes(platform, change, message):
    """Sizes that disagree or slices out of bounds fail every device with a clear error."""
    rng = np.random.default_rng(7)
    x = [rng.normal(size=(6, 3)).astype(np.float32) for _ in range(2)]
    out = [rng.normal(size=(5, 3)).astype(np.float32) for _ in range(2)]
    io, ss, oo, rs = ([0, 1], [1, 1]), ([1, 1], [1, 1]), ([0, 0], [1, 1]), ([1, 1], [1, 1])
    io, ss, oo, rs = ([list(a) for a in v] for v in (io, ss, oo, rs))
    if change == "recv":
        rs[1][1] = 3
    elif change == "send":
        ss[1][0] = rs[0][1] = 8
    else:
        oo[0][1] = 5
    args = [[x[d], out[d], *(np.array(v[d], np.int32) for v in (io, ss, oo, rs))] for d in range(2)]
    text = RAGGED.format(n=2, t="f32", rows=6, out_rows=5, count=2, groups="{{0,1}}")
    with pytest.raises(XlapyError, match=message):
        run(platform, text, args, partitions=2)


def test_ragged_all_to_all_verifier():
    text = RAGGED.format(n=2, t="f32", rows=6, out_rows=5, count=2, groups="{{0,1}}")
    with pytest.raises(VerifierError, match="one length"):
        verify(parse_module(text.replace("rs = s32[2]", "rs = s32[3]")))
    with pytest.raises(VerifierError, match="ragged along dimension 0 only"):
        verify(parse_module(text.replace("o = f32[5,3]", "o = f32[5,4]")))


# -- in-place collective-permute ---------------------------------------------------------

IN_PLACE = """HloModule in_place, num_partitions=4

ENTRY e {{
  x = f32[8,5] parameter(0)
  o = f32[7,5] parameter(1)
  a = s32[] parameter(2)
  b = s32[] parameter(3)
  c = s32[] parameter(4)
  z = s32[] constant(0)
  one = s32[] constant(1)
{body}
}}
"""
RING = "{0,1},{1,2},{2,3},{3,0}"


def in_place_reference(args, pairs, sizes, in_starts, out_starts):
    """XLA's in-place collective-permute; in_starts(d, p) / out_starts(d, p) are device d's
    start indices for pair p."""
    results = []
    for d, row in enumerate(args):
        result = row[1].copy()
        for p, (s, t) in enumerate(pairs):
            if t != d:
                continue
            x = args[s][0]
            size = sizes[p]
            src = [min(max(int(v), 0), x.shape[i] - size[i]) for i, v in enumerate(in_starts(s, p))]
            dst = [
                min(max(int(v), 0), result.shape[i] - size[i])
                for i, v in enumerate(out_starts(d, p))
            ]
            result[dst[0] : dst[0] + size[0], dst[1] : dst[1] + size[1]] = x[
                src[0] : src[0] + size[0], src[1] : src[1] + size[1]
            ]
        results.append(result)
    return results


def in_place_args(seed):
    """Per device: its input, its output buffer and three start scalars (one of them past
    the end, so it clamps)."""
    rng = np.random.default_rng(seed)
    return [
        [
            rng.normal(size=(8, 5)).astype(np.float32),
            rng.normal(size=(7, 5)).astype(np.float32),
            np.int32(rng.integers(0, 6)),
            np.int32(rng.integers(0, 4)),
            np.int32(rng.integers(5, 12)),
        ]
        for _ in range(4)
    ]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_in_place_permute_shared_starts(platform):
    """One start-index tuple for every pair: the sender's input starts, the receiver's
    output starts, every device's its own."""
    body = f"""  is = (s32[], s32[]) tuple(a, one)
  os = (s32[], s32[]) tuple(b, c)
  ROOT r = f32[7,5] collective-permute(x, o, is, os), channel_id=1,
    source_target_pairs={{{RING}}}, slice_sizes={{{{3,2}}}}"""
    args = in_place_args(1)
    got = run(platform, IN_PLACE.format(body=body), args, partitions=4)
    pairs = [(0, 1), (1, 2), (2, 3), (3, 0)]
    want = in_place_reference(
        args,
        pairs,
        [(3, 2)] * 4,
        lambda d, p: (args[d][2], 1),
        lambda d, p: (args[d][3], args[d][4]),
    )
    for d in range(4):
        assert got[d][0].tobytes() == want[d].tobytes(), d


@pytest.mark.parametrize("platform", PLATFORMS)
def test_in_place_permute_per_pair_starts_and_sizes(platform):
    """One start-index tuple and one slice size per pair; device 3 receives from nobody
    (its output operand comes back unchanged); device 0 sends to itself."""
    body = """  i0 = (s32[], s32[]) tuple(a, z)
  i1 = (s32[], s32[]) tuple(one, b)
  i2 = (s32[], s32[]) tuple(c, one)
  o0 = (s32[], s32[]) tuple(b, one)
  o1 = (s32[], s32[]) tuple(z, c)
  o2 = (s32[], s32[]) tuple(a, z)
  is = ((s32[], s32[]), (s32[], s32[]), (s32[], s32[])) tuple(i0, i1, i2)
  os = ((s32[], s32[]), (s32[], s32[]), (s32[], s32[])) tuple(o0, o1, o2)
  ROOT r = f32[7,5] collective-permute(x, o, is, os), channel_id=1,
    source_target_pairs={{0,1},{2,0},{0,2}}, slice_sizes={{2,3},{4,1},{1,5}}"""
    args = in_place_args(2)
    got = run(platform, IN_PLACE.format(body=body), args, partitions=4)
    pairs = [(0, 1), (2, 0), (0, 2)]

    def in_starts(d, p):
        a, b, c = args[d][2:]
        return [(a, 0), (1, b), (c, 1)][p]

    def out_starts(d, p):
        a, b, c = args[d][2:]
        return [(b, 1), (0, c), (a, 0)][p]

    want = in_place_reference(args, pairs, [(2, 3), (4, 1), (1, 5)], in_starts, out_starts)
    for d in range(4):
        assert got[d][0].tobytes() == want[d].tobytes(), d
    assert got[3][0].tobytes() == args[3][1].tobytes()


@pytest.mark.parametrize("platform", PLATFORMS)
def test_in_place_permute_start_done_tuple_buffers(platform):
    """The async pair on two buffers at once (a tuple input and output)."""
    body = f"""  x2 = f32[8,5] negate(x)
  o2 = f32[7,5] exponential(o)
  xs = (f32[8,5], f32[8,5]) tuple(x, x2)
  ys = (f32[7,5], f32[7,5]) tuple(o, o2)
  s1 = (s32[], s32[]) tuple(a, one)
  s2 = (s32[], s32[]) tuple(one, z)
  t1 = (s32[], s32[]) tuple(b, z)
  t2 = (s32[], s32[]) tuple(c, b)
  is = ((s32[], s32[]), (s32[], s32[])) tuple(s1, s2)
  os = ((s32[], s32[]), (s32[], s32[])) tuple(t1, t2)
  st = ((f32[8,5], f32[8,5]), (f32[7,5], f32[7,5]), u32[], u32[])
    collective-permute-start(xs, ys, is, os), channel_id=1,
    source_target_pairs={{{RING}}}, slice_sizes={{{{2,4}}}}
  d = (f32[7,5], f32[7,5]) collective-permute-done(st)
  d0 = f32[7,5] get-tuple-element(d), index=0
  d1 = f32[7,5] get-tuple-element(d), index=1
  ROOT r = (f32[7,5], f32[7,5]) tuple(d0, d1)"""
    args = in_place_args(3)
    got = run(platform, IN_PLACE.format(body=body), args, partitions=4)
    pairs = [(0, 1), (1, 2), (2, 3), (3, 0)]
    first = in_place_reference(
        args, pairs, [(2, 4)] * 4, lambda d, p: (args[d][2], 1), lambda d, p: (args[d][3], 0)
    )
    second_args = [[-row[0], np.exp(row[1]), *row[2:]] for row in args]
    second = in_place_reference(
        second_args, pairs, [(2, 4)] * 4, lambda d, p: (1, 0), lambda d, p: args[d][4:2:-1]
    )
    for d in range(4):
        assert got[d][0].tobytes() == first[d].tobytes(), d
        np.testing.assert_allclose(got[d][1], second[d], rtol=1e-5, err_msg=f"device {d}")


@pytest.mark.parametrize("platform", PLATFORMS)
def test_in_place_permute_bad_slice_sizes(platform):
    body = f"""  is = (s32[], s32[]) tuple(a, one)
  os = (s32[], s32[]) tuple(b, c)
  ROOT r = f32[7,5] collective-permute(x, o, is, os), channel_id=1,
    source_target_pairs={{{RING}}}, slice_sizes={{{{8,2}}}}"""
    with pytest.raises(XlapyError, match="does not fit the output buffer"):
        run(platform, IN_PLACE.format(body=body), in_place_args(4), partitions=4)
    wrong = body.replace("slice_sizes={{8,2}}", "slice_sizes={{1,2},{1,2}}")
    with pytest.raises(XlapyError, match="one per source-target pair"):
        run(platform, IN_PLACE.format(body=wrong), in_place_args(4), partitions=4)
