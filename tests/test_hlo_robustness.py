"""Inputs that once escaped as Python exceptions (found by fuzzing) now end as xlapy errors:
zero-sized replica groups in collective shape inference, the nesting counter of speculative
tuple-shape reads, integers past Python's 4300-digit conversion limit."""

import pytest

from xlapy.errors import HloParseError, VerifierError
from xlapy.ir.attributes import Mesh, MeshAxis, ReplicaGroups
from xlapy.ir.parser import parse_module
from xlapy.ir.verifier import verify

REDUCE_SCATTER = """HloModule m, replica_count=4

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  p = f32[8] parameter(0)
  ROOT r = f32[RESULT] reduce-scatter(p), replica_groups=GROUPS, dimensions={0}, to_apply=add
}
"""


@pytest.mark.parametrize(
    "groups, result, error, message",
    [
        ("{{}}", "4", VerifierError, "replica groups must not be empty"),
        ("[1,0]<=[0]", "4", VerifierError, "replica groups must not be empty"),
        ("[0]<=[0]", "4", HloParseError, "need \\[groups,size\\]"),
        ("{{0,1},{2}}", "4", VerifierError, "same size"),
        ("{}", "0", VerifierError, "not a whole multiple"),
        ("[2,2]<=[3]", "4", HloParseError, "different numbers of devices"),
        ("[2,2]<=[2,2]T(0,0)", "4", HloParseError, "not a permutation"),
        ("mesh['a'=2] {'b'}", "4", HloParseError, "mesh has no axis 'b'"),
        ("mesh['a'=4] {'a':(1)8}", "4", HloParseError, "does not fit"),
        ("mesh['a'=2,'b'=2], device_ids=([2,3]) {'a'}", "4", HloParseError, "must be a perm"),
        ("mesh['a'=2,'b'=2], device_ids=([4]<=[3]) {'a'}", "4", HloParseError, "different"),
        ("mesh['a'=2,'b'=2], device_ids=([2,2]T(1,1)) {'a'}", "4", HloParseError, "not a perm"),
    ],
)
def test_bad_replica_groups_are_xlapy_errors(groups, result, error, message):
    text = REDUCE_SCATTER.replace("GROUPS", groups).replace("RESULT", result)
    with pytest.raises(error, match=message):
        verify(parse_module(text))


def test_ten_deep_tuple_constant():
    shape, value = "s32[]", "7"
    for _ in range(10):
        shape, value = f"({shape})", f"({value})"
    text = f"HloModule m\n\nENTRY e {{\n  ROOT c = {shape} constant({value})\n}}\n"
    printed = parse_module(text).to_text()
    assert "constant(( ( ( ( ( ( ( ( ( ( 7 ) ) ) ) ) ) ) ) ) ))" in printed
    assert parse_module(printed).to_text() == printed


@pytest.mark.parametrize(
    "line",
    [
        "ROOT c = s32[] constant(DIGITS)",
        "ROOT c = s32[1] parameter(DIGITS)",
        "ROOT c = s32[DIGITS] parameter(0)",
        "p = s32[1] parameter(0)\n  ROOT c = s32[1] reverse(p), dimensions={DIGITS}",
    ],
)
def test_huge_integers_are_out_of_range_not_python_errors(line):
    text = "HloModule m\n\nENTRY e {\n  " + line.replace("DIGITS", "9" * 5000) + "\n}\n"
    with pytest.raises(HloParseError, match="out of range") as info:
        parse_module(text)
    assert "4300" not in str(info.value)


# -- ReplicaGroups.expanded: every printed form to explicit groups ---------------------------
@pytest.mark.parametrize(
    "groups, expected",
    [
        (ReplicaGroups(((0, 1), (2, 3))), ((0, 1), (2, 3))),
        (ReplicaGroups(), ()),
        (ReplicaGroups(iota_text="[2,2]<=[4]"), ((0, 1), (2, 3))),
        (ReplicaGroups(iota_text="[1,4]<=[4]"), ((0, 1, 2, 3),)),
        (ReplicaGroups(iota_text="[2,2]<=[2,2]T(1,0)"), ((0, 2), (1, 3))),
        (ReplicaGroups(iota_text="[4,2]<=[2,2,2]T(2,1,0)"), ((0, 4), (2, 6), (1, 5), (3, 7))),
        (ReplicaGroups(iota_text="[2,0]<=[0]"), ((), ())),
    ],
)
def test_expanded_explicit_and_iota(groups, expected):
    assert groups.expanded() == expected


def _mesh(sizes, axes, ids=None):
    names = tuple("xyz"[: len(sizes)])
    return ReplicaGroups(mesh=Mesh(names, tuple(sizes), ids), mesh_axes=tuple(axes))


@pytest.mark.parametrize(
    "groups, expected",
    [
        # groups vary along the named axes; the others pick the group
        (_mesh((2, 2), [MeshAxis(1)]), ((0, 1), (2, 3))),
        (_mesh((2, 2), [MeshAxis(0)]), ((0, 2), (1, 3))),
        (_mesh((2, 2), [MeshAxis(0), MeshAxis(1)]), ((0, 1, 2, 3),)),
        (_mesh((2, 4), [MeshAxis(1)]), ((0, 1, 2, 3), (4, 5, 6, 7))),
        # 'x':(1)2 is the major half of a 4-wide axis (stride 2), 'x':(2)2 the minor half
        (_mesh((4,), [MeshAxis(0, 1, 2)]), ((0, 2), (1, 3))),
        (_mesh((4,), [MeshAxis(0, 2, 2)]), ((0, 1), (2, 3))),
        (_mesh((8,), [MeshAxis(0, 1, 2), MeshAxis(0, 4, 2)]), ((0, 1, 4, 5), (2, 3, 6, 7))),
        # explicit device order
        (_mesh((2, 2), [MeshAxis(1)], (3, 1, 2, 0)), ((3, 1), (2, 0))),
    ],
)
def test_expanded_mesh(groups, expected):
    assert groups.expanded() == expected
    assert groups.group_size == len(expected[0])


@pytest.mark.parametrize(
    "ids, axis, expected",
    [
        ("[2,2]T(1,0)", "'a'", ((0, 1), (2, 3))),
        ("[2,2]T(1,0)", "'b'", ((0, 2), (1, 3))),
        ("[4]<=[2,2]T(1,0)", "'b'", ((0, 2), (1, 3))),
        ("[2,2]", "'b'", ((0, 1), (2, 3))),
    ],
)
def test_mesh_groups_with_iota_device_ids(ids, axis, expected):
    groups = f"mesh['a'=2,'b'=2], device_ids=({ids}) {{{axis}}}"
    text = REDUCE_SCATTER.replace("RESULT", "4").replace("GROUPS", groups)
    module = parse_module(text)
    verify(module)
    assert module.to_text().strip() == text.strip()
    assert module.entry.root.attrs["replica_groups"].expanded() == expected


def test_mesh_groups_parse_and_print_as_xla_does():
    text = REDUCE_SCATTER.replace("RESULT", "4").replace(
        "GROUPS", "mesh['axis_0'=2,'axis_1'=2] {'axis_1'}"
    )
    module = parse_module(text)
    verify(module)
    assert module.to_text().strip() == text.strip()
    assert module.entry.root.attrs["replica_groups"].expanded() == ((0, 1), (2, 3))
    sub = text.replace("{'axis_1'}", "{'axis_0':(1)2}").replace("'axis_0'=2", "'axis_0'=4")
    assert parse_module(sub).to_text().strip() == sub.strip()


# -- mutants the fuzzer found: invalid modules whose printed text must still read back --------
ASYNC_CHAIN = """HloModule m

w {
  a = f32[3] parameter(0)
  ROOT n = f32[3] ROOT_OP
}

ENTRY e {
  x = f32[3] parameter(0)
  s = ((f32[3]), f32[3], s32[]) async-start(x), calls=w
  u = ((f32[3]), f32[3], s32[]) MIDDLE(s)
  ROOT d = f32[3] async-done(u)
}
"""


@pytest.mark.parametrize(
    "root_op, middle",
    [
        ("negate(a)", "log"),  # a done whose operand is no async op: printed in long form
        ("async-start(a)", "async-update"),  # an async op wrapping an async op: long form
    ],
)
def test_broken_async_chains_print_long_and_read_back(root_op, middle):
    from hlo_fuzz import check_one

    text = ASYNC_CHAIN.replace("ROOT_OP", root_op).replace("MIDDLE", middle)
    assert check_one(text) is None
