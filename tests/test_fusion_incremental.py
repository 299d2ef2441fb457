"""The fusion editor's shortcuts (a producer spliced into a tidy body without re-sorting it,
body fusibility from a kept index of unfusible members) give exactly what the full walks
give: the same fused module text, program by program, in lowered and optimized forms."""

from __future__ import annotations

import pytest
from jax_programs import PROGRAMS, hlo_texts

from xlapy.ir.parser import parse_module
from xlapy.passes import fusion_edit
from xlapy.passes.fusion import LoopFusion
from xlapy.passes.fusion_multi_output import MultiOutputFusion
from xlapy.passes.fusion_rules import fusion_body_is_fusible, unfusible_members

NAMES = sorted(PROGRAMS)[::8]


def _fused_text(text: str) -> str:
    module = parse_module(text)
    LoopFusion().run(module)
    MultiOutputFusion().run(module)
    return module.to_text()


@pytest.fixture
def full_walks(monkeypatch):
    """Make the editor re-sort every body and re-derive every unfusible list."""

    def splice(self, body, added, value, readers, producer_tidy):
        self._tidy(body)

    monkeypatch.setattr(fusion_edit.FusionEditor, "_tidy_splice", splice)
    monkeypatch.setattr(fusion_edit.FusionEditor, "unfusible", lambda self, b: unfusible_members(b))


@pytest.mark.parametrize("name", NAMES)
def test_incremental_fusion_matches_full_walks(name, request):
    texts = hlo_texts(PROGRAMS[name])
    fast = [_fused_text(t) for t in (texts.lowered, texts.optimized)]
    request.getfixturevalue("full_walks")
    slow = [_fused_text(t) for t in (texts.lowered, texts.optimized)]
    assert fast == slow


def test_kept_unfusible_index_matches_the_bodies(monkeypatch):
    module = parse_module(hlo_texts(PROGRAMS["mlp_train_step"]).lowered)
    checked = []
    original = fusion_edit.FusionEditor.finish

    def finish(self):
        for body, members in self._unfusible.values():
            assert {id(i) for i in members.values()} == set(map(id, unfusible_members(body)))
            fast = fusion_body_is_fusible(body, unfusible=self.unfusible)
            assert fast == fusion_body_is_fusible(body), body.name
            checked.append(body)
        original(self)

    monkeypatch.setattr(fusion_edit.FusionEditor, "finish", finish)
    fusion = LoopFusion()
    fusion.run(module)
    assert fusion.producers_fused > 0 and checked
