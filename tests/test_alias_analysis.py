"""Alias analysis: which values must share one buffer."""

from __future__ import annotations

from test_dataflow import CONTROL, WHILE

from xlapy.analysis.alias import AliasAnalysis, UnionFind
from xlapy.analysis.dataflow import DataflowAnalysis
from xlapy.ir.parser import parse_module


def _aliases(text):
    m = parse_module(text)
    df = DataflowAnalysis.run(m)
    return m, df, AliasAnalysis.run(m, df)


def test_while_state_is_one_buffer_per_index():
    m, _df, al = _aliases(WHILE)
    w = m.entry.get_instruction("w")
    body, cond = w.attrs["body"], w.attrs["condition"]
    buf = al.buffer_at(w, (1,))
    names = {v.name for v in buf.values}
    assert names == {"w{1}", "x0", "bp{1}", "cp{1}", "x1"}
    assert al.buffer_at(body.root, (1,)) is buf
    assert al.buffer_at(cond.parameter(0), (1,)) is buf
    assert al.buffer_at(w, (0,)) is not buf
    assert {v.name for v in al.buffer_at(w, (0,)).values} == {
        "w{0}",
        "zero",
        "bp{0}",
        "cp{0}",
        "i1",
    }
    assert buf.size == 16


def test_conditional_call_and_in_place_are_not_merged():
    m, _df, al = _aliases(CONTROL)
    e = m.entry
    k = e.root
    b0, b1 = k.attrs["branch_computations"]
    assert al.buffer_at(k) is al.buffer_at(b0.root) is al.buffer_at(b1.root)
    assert al.buffer_at(b0.parameter(0)) is al.buffer_at(e.get_instruction("c"))
    callee = e.get_instruction("c").attrs["to_apply"]
    assert al.buffer_at(callee.parameter(0)) is al.buffer_at(e.get_instruction("fus"))
    # In-place decisions belong to buffer assignment.
    assert al.buffer_at(e.get_instruction("dus")) is not al.buffer_at(e.get_instruction("x"))


def test_input_output_alias_merges_parameter_and_output():
    text = """
HloModule inc, input_output_alias={ {}: (0, {}, may-alias) }
ENTRY e {
  p = f32[] parameter(0)
  c = f32[] constant(1)
  ROOT out = f32[] add(p, c)
}
"""
    m, _df, al = _aliases(text)
    assert al.buffer_at(m.entry.root) is al.buffer_at(m.entry.parameter(0))
    assert al.buffer_at(m.entry.get_instruction("c")) is not al.buffer_at(m.entry.root)
    assert len(al.buffers) == 2


def test_union_find():
    class V:
        def __init__(self, i):
            self.id = i

    items = [V(i) for i in range(6)]
    uf = UnionFind()
    uf.union(items[4], items[2])
    uf.union(items[2], items[5])
    uf.union(items[0], items[1])
    assert uf.find(items[5]) is items[2]
    assert uf.find(items[1]) is items[0]
    assert uf.find(items[3]) is items[3]


def test_parameters_by_number_finds_what_parameter_finds():
    """The one-pass lookup the alias, copy-insertion and buffer-assignment code use for an
    entry's aliased parameters (hundreds in a training step, each found by a scan before):
    the same instruction as `parameter(n)`, parameters in any text order."""
    module = parse_module(
        """HloModule m, input_output_alias={ {0}: (2, {}, may-alias), {1}: (0, {}, may-alias) }
ENTRY e {
  c = f32[3] parameter(2)
  a = f32[3] parameter(0)
  s = f32[3] add(a, c)
  b = f32[3] parameter(1)
  t = f32[3] multiply(s, b)
  ROOT r = (f32[3], f32[3]) tuple(t, s)
}"""
    )
    entry = module.entry
    found = entry.parameters_by_number()
    assert sorted(found) == [0, 1, 2]
    assert all(found[n] is entry.parameter(n) for n in range(3))
    aliases = AliasAnalysis.run(module, DataflowAnalysis.run(module))
    dataflow = aliases.dataflow
    assert aliases.buffer_of(dataflow.value_at(found[2])) is aliases.buffer_at(entry.root, (0,))
