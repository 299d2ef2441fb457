"""HloSharding: every form XLA prints is parsed, printed back exactly, and verified."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xlapy.errors import HloParseError, VerifierError
from xlapy.ir.parser import parse_module
from xlapy.ir.sharding import HloSharding, ShardingSyntaxError, parse_sharding
from xlapy.ir.verifier import verify

ROUND_TRIP = [
    "{replicated}",
    "{manual}",
    "{unknown}",
    "{maximal device=3}",
    "{devices=[2,4]<=[8]}",
    "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}",
    "{devices=[2,2]0,2,1,3}",
    "{devices=[2,1,2]<=[4] last_tile_dim_replicate}",
    "{devices=[1,2,2]<=[4] last_tile_dims={manual}}",
    "{devices=[2,1,2,2]<=[2,2,2]T(2,1,0) last_tile_dims={manual, replicated}}",
    "{{replicated}, {devices=[2]<=[2]}}",
    "{{replicated}}",
    '{replicated metadata={op_name="a"}}',
    '{devices=[2,1]<=[2] metadata={op_name="b" source_line=3}}',
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(text):
    assert parse_sharding(text).text() == text


def test_iota_transposed_devices_and_coords():
    s = parse_sharding("{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}")
    assert s.devices() == (0, 4, 1, 5, 2, 6, 3, 7)
    assert s.data_rank == 2
    coords = s.device_coords()
    assert coords[0] == coords[4] == (0, 0) and coords[1] == (1, 0) and coords[7] == (3, 0)
    assert parse_sharding("{devices=[1,1,4]<=[4] last_tile_dim_replicate}").is_replicated


def test_tile_constructor_prefers_iota():
    assert HloSharding.tile((2, 2), (0, 1, 2, 3)).text() == "{devices=[2,2]<=[4]}"
    assert HloSharding.tile((2, 2), (0, 2, 1, 3)).text() == "{devices=[2,2]0,2,1,3}"


@pytest.mark.parametrize(
    "text,message",
    [
        ("{devices=[2,2]<=[8]}", "holds 8 devices"),
        ("{devices=[2,2]0,1,2}", "3 device ids"),
        ("{devices=[2,2]0,1,1,3}", "each once"),
        ("{devices=[2]<=[2]T(1)}", "permutation"),
        ("{sharded}", "unknown sharding 'sharded'"),
        ("{devices=[2]<=[2] last_tile_dims={weird}}", "subgroup kind"),
    ],
)
def test_syntax_errors(text, message):
    with pytest.raises(ShardingSyntaxError, match=message):
        parse_sharding(text)


def _module(sharding: str, header: str = "") -> str:
    return (
        f"HloModule m{header}\n\nENTRY e {{\n"
        f"  ROOT p = f32[4,6]{{1,0}} parameter(0), sharding={sharding}\n}}\n\n"
    )


def test_module_round_trip_and_parse_error_position():
    text = _module("{devices=[2,1,2]<=[4] last_tile_dim_replicate}")
    assert parse_module(text).to_text() == text
    with pytest.raises(HloParseError, match=r"bad sharding.*holds 8"):
        parse_module(_module("{devices=[2,2]<=[8]}"))


def test_verifier_checks_rank_and_devices():
    with pytest.raises(VerifierError, match="an array of rank 2 needs 2"):
        verify(parse_module(_module("{devices=[2,2,2]<=[8]}")))
    with pytest.raises(VerifierError, match="beyond the 2 partitions"):
        verify(parse_module(_module("{devices=[2,2]<=[4]}", ", num_partitions=2")))
    verify(parse_module(_module("{devices=[2,2]<=[4]}", ", num_partitions=4")))


@st.composite
def tiled_shardings(draw):
    tiles = draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    n = math.prod(tiles)
    form = draw(st.sampled_from(["iota", "transposed", "explicit"]))
    if form == "explicit":
        devices = draw(st.permutations(range(n)))
        body = "devices=[" + ",".join(map(str, tiles)) + "]" + ",".join(map(str, devices))
    else:
        body = "devices=[" + ",".join(map(str, tiles)) + "]<=[" + ",".join(map(str, tiles)) + "]"
        if form == "transposed" and len(tiles) > 1:
            perm = draw(st.permutations(range(len(tiles))))
            body += "T(" + ",".join(map(str, perm)) + ")"
    tail = draw(st.sampled_from(["", " last_tile_dim_replicate", " last_tile_dims={manual}"]))
    return "{" + body + tail + "}"


@given(tiled_shardings())
@settings(max_examples=60, deadline=None)
def test_tiled_round_trip_and_coordinates(text):
    s = parse_sharding(text)
    assert s.text() == text
    devices = s.devices()
    assert sorted(devices) == list(range(len(devices)))
    # each tile is held by as many devices as the subgroup dimensions hold
    coords = list(s.device_coords().values())
    extra = math.prod(s.tile_dims[s.data_rank :])
    assert all(coords.count(c) == extra for c in coords)
