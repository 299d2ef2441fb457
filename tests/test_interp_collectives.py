"""Collectives on one device, replica-id and partition-id in the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends.interpreter import evaluate
from xlapy.backends.interpreter.rules.collectives import iota_groups
from xlapy.errors import EvaluationError
from xlapy.ir.parser import parse_module

ADD = """add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""


def module(body: str, header: str = "") -> str:
    return f"HloModule c{header}\n{ADD}ENTRY e {{\n  x = f32[4,6]{{1,0}} parameter(0)\n{body}\n}}"


@pytest.fixture
def x():
    return np.random.default_rng(5).normal(size=(4, 6)).astype(np.float32)


IDENTITY_CASES = [
    ("all-reduce", "ROOT r = f32[4,6]{1,0} all-reduce(x), replica_groups={}, to_apply=add"),
    (
        "all-reduce groups",
        "ROOT r = f32[4,6]{1,0} all-reduce(x), replica_groups={{0}}, "
        "channel_id=1, use_global_device_ids=true, to_apply=add",
    ),
    (
        "all-reduce iota",
        "ROOT r = f32[4,6]{1,0} all-reduce(x), replica_groups=[1,1]<=[1], to_apply=add",
    ),
    ("all-gather", "ROOT r = f32[4,6]{1,0} all-gather(x), replica_groups={{0}}, dimensions={0}"),
    (
        "reduce-scatter",
        "ROOT r = f32[4,6]{1,0} reduce-scatter(x), replica_groups={{0}}, "
        "dimensions={1}, to_apply=add",
    ),
    ("all-to-all", "ROOT r = f32[4,6]{1,0} all-to-all(x), replica_groups={{0}}, dimensions={0}"),
    (
        "collective-broadcast",
        "ROOT r = f32[4,6]{1,0} collective-broadcast(x), replica_groups={{0}}",
    ),
    (
        "collective-permute self",
        "ROOT r = f32[4,6]{1,0} collective-permute(x), source_target_pairs={{0,0}}",
    ),
    (
        "all-reduce-start/done",
        "s = f32[4,6]{1,0} all-reduce-start(x), replica_groups={}, "
        "to_apply=add\n  ROOT r = f32[4,6]{1,0} all-reduce-done(s)",
    ),
    (
        "all-gather-start/done",
        "s = (f32[4,6]{1,0}, f32[4,6]{1,0}) all-gather-start(x), "
        "replica_groups={{0}}, dimensions={0}\n  ROOT r = f32[4,6]{1,0} all-gather-done(s)",
    ),
    (
        "collective-permute-start/done",
        "s = (f32[4,6]{1,0}, f32[4,6]{1,0}) "
        "collective-permute-start(x), source_target_pairs={{0,0}}\n"
        "  ROOT r = f32[4,6]{1,0} collective-permute-done(s)",
    ),
]


@pytest.mark.parametrize("name,body", IDENTITY_CASES, ids=[c[0] for c in IDENTITY_CASES])
def test_single_participant_is_a_copy(x, name, body):
    got = evaluate(parse_module(module(body)), [x])
    np.testing.assert_array_equal(got, x)


def test_variadic_all_reduce_returns_a_tuple(x):
    body = (
        "y = f32[4,6]{1,0} negate(x)\n"
        "  ROOT r = (f32[4,6]{1,0}, f32[4,6]{1,0}) all-reduce(x, y), replica_groups={}, "
        "to_apply=add"
    )
    a, b = evaluate(parse_module(module(body)), [x])
    np.testing.assert_array_equal(a, x)
    np.testing.assert_array_equal(b, -x)


def test_collective_permute_without_sender_gives_zeros(x):
    body = (
        "ROOT r = f32[4,6]{1,0} collective-permute(x), channel_id=1, "
        "source_target_pairs={{0,1},{1,2}}"
    )
    got = evaluate(parse_module(module(body, ", num_partitions=3")), [x], partition_id=0)
    np.testing.assert_array_equal(got, np.zeros_like(x))


def test_collective_permute_from_another_device_needs_the_runtime(x):
    body = (
        "ROOT r = f32[4,6]{1,0} collective-permute(x), channel_id=1, "
        "source_target_pairs={{0,1},{1,2}}"
    )
    with pytest.raises(EvaluationError, match="multi-device runtime"):
        evaluate(parse_module(module(body, ", num_partitions=3")), [x], partition_id=1)


@pytest.mark.parametrize(
    "body,header",
    [
        (
            "ROOT r = f32[4,6]{1,0} all-reduce(x), replica_groups={{0,1}}, to_apply=add",
            ", replica_count=2",
        ),
        (
            "ROOT r = f32[4,6]{1,0} all-reduce(x), replica_groups={}, to_apply=add",
            ", replica_count=2",
        ),
        (
            "ROOT r = f32[4,6]{1,0} all-reduce(x), channel_id=3, replica_groups={{0}}, "
            "to_apply=add",
            ", num_partitions=2",
        ),
        (
            "ROOT r = f32[8,6]{1,0} all-gather(x), replica_groups=[1,2]<=[2], dimensions={0}",
            ", replica_count=2",
        ),
    ],
)
def test_bigger_groups_need_the_runtime(x, body, header):
    with pytest.raises(EvaluationError, match="multi-device runtime"):
        evaluate(parse_module(module(body, header)), [x])


def test_replica_and_partition_ids():
    text = """HloModule ids
ENTRY e {
  r = u32[] replica-id()
  p = u32[] partition-id()
  ROOT t = (u32[], u32[]) tuple(r, p)
}"""
    r, p = evaluate(parse_module(text), [], replica_id=3, partition_id=5)
    assert r.dtype == np.uint32 and r.shape == () and int(r) == 3
    assert p.dtype == np.uint32 and int(p) == 5
    r, p = evaluate(parse_module(text), [])
    assert (int(r), int(p)) == (0, 0)


@pytest.mark.parametrize(
    "text,groups",
    [
        ("[2,2]<=[4]", ((0, 1), (2, 3))),
        ("[2,2]<=[2,2]T(1,0)", ((0, 2), (1, 3))),
        ("[1,4]<=[4]", ((0, 1, 2, 3),)),
        ("[4,2]<=[2,2,2]T(2,1,0)", ((0, 4), (2, 6), (1, 5), (3, 7))),
    ],
)
def test_iota_replica_groups(text, groups):
    assert iota_groups(text) == groups
