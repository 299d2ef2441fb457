"""Typed accessors for the attributes passes read, instead of string lookups."""

from pathlib import Path

from xlapy.ir import parse_module

TEXT = """
HloModule typed

cond {
  t = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  n = s32[] constant(8)
  ROOT lt = pred[] compare(i, n), direction=LT, type=SIGNED
}

body {
  t = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(t), index=0
  one = s32[] constant(1)
  j = s32[] add(i, one)
  x = f32[4] get-tuple-element(t), index=1
  ROOT r = (s32[], f32[4]) tuple(j, x)
}

ENTRY main {
  p = f32[4] parameter(0)
  zero = s32[] constant(0)
  t = (s32[], f32[4]) tuple(zero, p)
  w = (s32[], f32[4]) while(t), condition=cond, body=body,
    backend_config={"known_trip_count":{"n":"8"}}
  v = (s32[], f32[4]) while(t), condition=cond, body=body,
    backend_config={"known_trip_count":{"n":"x"}}
  x = f32[4] get-tuple-element(w), index=1
  ROOT y = f32[4] transpose(x), dimensions={0}
}
"""


def test_typed_accessors():
    module = parse_module(TEXT)
    entry = module.entry_computation()
    get = entry.get_instruction
    assert get("w").known_trip_count == 8
    assert get("w").while_body is module.get_computation("body")
    assert get("w").while_condition is module.get_computation("cond")
    assert get("w").to_apply_or_none is None  # `to_apply` itself raises: it is required
    assert get("v").known_trip_count is None  # not a number: unknown, not an error
    assert get("t").known_trip_count is None
    assert get("x").tuple_index == 1
    assert get("y").dimensions == (0,)
    assert get("p").dimensions == ()
    lt = module.get_computation("cond").get_instruction("lt")
    assert lt.comparison_direction == "LT"
    assert lt.comparison_type == "SIGNED"


def test_comparison_direction_reads_either_spelling():
    module = parse_module(TEXT)
    lt = module.get_computation("cond").get_instruction("lt")
    direction = lt.attrs.pop("direction")
    lt.attrs["comparison_direction"] = direction
    assert lt.comparison_direction == "LT"


# Attributes with a typed accessor on HloInstruction: outside `ir`, code reads the accessor
# (every attribute has one now: tests/test_architecture.py checks all reads by name).
ACCESSOR_LOOKUPS = (
    'attrs.get("to_apply"',
    'attr("to_apply"',
    'attrs.get("dimensions"',
    'attrs["dimensions"]',
    'attr("dimensions"',
    'attrs["body"]',
    'attrs["condition"]',
    'attrs.get("direction"',
    'attrs["direction"]',
    'attrs.get("comparison_direction"',
    'attrs.get("known_trip_count"',
)


def test_passes_read_attributes_through_their_accessors():
    """Issue 15 counted 194 string lookups; the ones with an accessor are gone outside
    `ir` (the StableHLO reader's MLIR attributes are another dictionary)."""
    root = Path(__file__).resolve().parent.parent / "xlapy"
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("ir/") or rel == "stablehlo/mlir.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found.extend(f"xlapy/{rel}:{number}: {k}" for k in ACCESSOR_LOOKUPS if k in line)
    assert not found, "\n".join(found)
