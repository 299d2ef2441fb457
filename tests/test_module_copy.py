"""HloModule.copy: the memory-plan trials copy the module instead of printing and parsing it,
so a copy must be what a parse of the module's text gives, and independent of the original."""

from pathlib import Path

import pytest

from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module

HERE = Path(__file__).parent
FILES = sorted(p for d in ("memory", "collectives") for p in (HERE / d).glob("*.hlo"))

WHILE = """HloModule loop, input_output_alias={ {}: 0 }

cond {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(5)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  v = f32[4] get-tuple-element(s), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  w = f32[4] add(v, v)
  ROOT t = (s32[], f32[4]) tuple(j, w)
}

ENTRY e {
  p = f32[4] parameter(0)
  z = s32[] constant(0)
  t = (s32[], f32[4]) tuple(z, p)
  r = (s32[], f32[4]) while(t), condition=cond, body=body
  ROOT o = f32[4] get-tuple-element(r), index=1
}
"""


def _shape_of_graph(module):
    """Every computation's instructions with their operands', users' and callees' names."""
    return [
        (
            c.name,
            c.is_entry,
            c.root_instruction().name,
            [
                (
                    i.name,
                    [o.name for o in i.operands],
                    [u.name for u in i.users],
                    [x.name for x in i.called_computations()],
                    [x.parent.name for x in i.called_computations()],
                )
                for i in c.instructions
            ],
        )
        for c in module.computations
    ]


@pytest.mark.parametrize(
    "text", [WHILE, *(p.read_text() for p in FILES)], ids=["while", *(p.name for p in FILES)]
)
def test_a_copy_is_what_a_parse_of_the_text_gives(text):
    module = parse_module(text)
    copy = module.copy()
    parsed = parse_module(module.to_text())
    assert copy.to_text() == module.to_text()
    assert _shape_of_graph(copy) == _shape_of_graph(parsed)
    assert copy.config == module.config and copy.config is not module.config
    mine = {id(i) for i in copy.instructions()}
    assert not mine & {id(i) for i in module.instructions()}
    assert all(
        x.parent is copy
        for c in copy.computations
        for i in c.instructions
        for x in i.called_computations()
    )


def test_editing_a_copy_leaves_the_original_alone():
    module = parse_module(WHILE)
    before = module.to_text()
    copy = module.copy()
    body = copy.get_computation("body")
    w = next(i for i in body.instructions if i.name == "w")
    assert w.opcode is Opcode.ADD
    w.opcode = Opcode.MULTIPLY
    assert module.to_text() == before
    assert copy.to_text() != before


def test_a_copy_shares_the_computations_it_is_told_to_share():
    module = parse_module(WHILE)
    cond = module.get_computation("cond")
    copy = module.copy(share={cond})
    assert copy.to_text() == module.to_text()
    assert copy.get_computation("cond") is cond
    assert cond.parent is module  # shared, not adopted
    body, entry = copy.get_computation("body"), copy.entry
    assert body is not module.get_computation("body") and entry is not module.entry
    loop = next(i for i in entry.instructions if i.opcode is Opcode.WHILE)
    assert loop.while_condition is cond and loop.while_body is body


def test_release_frees_a_copy_without_the_collector_and_keeps_shared_computations():
    import gc
    import weakref

    module = parse_module(WHILE)
    shared = {c for c in module.computations if c.name in ("cond", "body")}
    before = module.to_text()
    trial = module.copy(share=shared)
    entry = trial.entry_computation()
    probe = weakref.ref(entry.instructions[0])
    del entry
    gc.disable()
    try:
        trial.release(keep=shared)
        del trial
        assert probe() is None  # freed by reference counting, no collection ran
    finally:
        gc.enable()
    assert module.to_text() == before  # the shared computations are intact
    assert all(c.parent is module for c in shared)


def test_a_released_module_fails_loudly_when_used_again():
    module = parse_module(WHILE)
    instr = module.entry_computation().root
    comp = module.entry_computation()
    module.release()
    with pytest.raises(AttributeError):
        module.to_text()
    with pytest.raises(AttributeError):
        _ = comp.instructions
    with pytest.raises(AttributeError):
        _ = instr.operands
