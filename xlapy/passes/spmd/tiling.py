"""Tiling: a sharding as the partitioner reasons about it, one tile coordinate per device.

An HloSharding's tile assignment is an array of device ids; what the partitioner needs is
the inverse: for each device, which tile (coordinates over some named axes) it holds. A
Tiling is exactly that: `tiles[axis]` pieces per axis and `coords[device][axis]`. Devices
with the same coordinates hold the same data (replication). A tiling is uniform: every
combination of coordinates is held by the same number of devices.

Axes are an array's dimensions (then a Tiling is a sharding of that array) or the "labels"
of an operation's iteration space (xlapy.passes.spmd.labels): projecting a label tiling on
an operand's labels gives the operand's tiling, which is how one op's decision becomes the
tilings of its operands and result. Two tilings merge when the devices' coordinates in
both can be combined into one uniform tiling (a row-sharded x and a column-sharded w of a
2-D mesh merge into the dot's fully sharded iteration space).

Collective groups come from the coordinates too: the devices that differ only along the
axes `over` (and hold the same replica) form one group, ordered by their coordinates along
`over`, which is the order an all-gather concatenates and an all-reduce combines in.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from xlapy.ir.sharding import HloSharding


@dataclass(frozen=True, slots=True)
class Tiling:
    """`tiles[i]` pieces along axis i; `coords[d]` device d's piece index along each axis."""

    tiles: tuple[int, ...]
    coords: tuple[tuple[int, ...], ...]

    @staticmethod
    def replicated(rank: int, num_devices: int) -> Tiling:
        return Tiling((1,) * rank, ((0,) * rank,) * num_devices)

    @staticmethod
    def from_sharding(sharding: HloSharding, rank: int, num_devices: int) -> Tiling:
        """The tiling of an array of `rank` dimensions; replicated and maximal shardings
        give the replicated tiling (every device computes a maximal value)."""
        if sharding.kind != "tiled" or sharding.is_replicated:
            return Tiling.replicated(rank, num_devices)
        if sharding.data_rank != rank:
            raise ValueError(f"sharding {sharding.text()} does not fit an array of rank {rank}")
        by_device = sharding.device_coords()
        if sorted(by_device) != list(range(num_devices)):
            raise ValueError(f"sharding {sharding.text()} does not cover {num_devices} devices")
        tiles = sharding.tile_dims[:rank]
        return Tiling(tuple(tiles), tuple(by_device[d] for d in range(num_devices)))

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self.coords)

    @property
    def rank(self) -> int:
        return len(self.tiles)

    @property
    def is_replicated(self) -> bool:
        return all(t == 1 for t in self.tiles)

    @property
    def replication(self) -> int:
        return self.num_devices // math.prod(self.tiles)

    def local_dims(self, dims: Sequence[int]) -> tuple[int, ...]:
        return tuple(d // t for d, t in zip(dims, self.tiles, strict=True))

    def divides(self, dims: Sequence[int]) -> bool:
        return all(d % t == 0 for d, t in zip(dims, self.tiles, strict=True))

    def offsets(self, axis: int, size: int) -> list[int]:
        """Per device, where its piece of an axis of `size` elements starts."""
        step = size // self.tiles[axis]
        return [c[axis] * step for c in self.coords]

    def slices(self, dims: Sequence[int]) -> list[tuple[slice, ...]]:
        """Per device, the part of a global array of `dims` it holds (to shard inputs and
        reassemble outputs on the host)."""
        steps = [d // t for d, t in zip(dims, self.tiles, strict=True)]
        return [
            tuple(slice(x * s, (x + 1) * s) for x, s in zip(c, steps, strict=True))
            for c in self.coords
        ]

    def same_axis(self, other: Tiling, axis: int, other_axis: int | None = None) -> bool:
        """Whether every device holds the same piece along `axis` in both tilings."""
        b = axis if other_axis is None else other_axis
        if self.tiles[axis] != other.tiles[b]:
            return False
        return self.tiles[axis] == 1 or all(
            x[axis] == y[b] for x, y in zip(self.coords, other.coords, strict=True)
        )

    # -- derived tilings -------------------------------------------------------------------
    def project(self, axes: Sequence[int | None]) -> Tiling:
        """The tiling over `axes` (indices into this tiling; None: an axis held whole)."""
        tiles = tuple(1 if a is None else self.tiles[a] for a in axes)
        coords = tuple(tuple(0 if a is None else c[a] for a in axes) for c in self.coords)
        return Tiling(tiles, coords)

    def with_axes_whole(self, axes: Sequence[int]) -> Tiling:
        """This tiling with `axes` no longer cut (what all-gathers along them produce)."""
        gone = set(axes)
        tiles = tuple(1 if i in gone else t for i, t in enumerate(self.tiles))
        coords = tuple(tuple(0 if i in gone else x for i, x in enumerate(c)) for c in self.coords)
        return Tiling(tiles, coords)

    def groups(self, over: Sequence[int]) -> list[list[int]]:
        """Collective groups along `over`: the devices that differ only along those axes,
        one replica each, ordered by their coordinates along `over`."""
        over = list(over)
        rest = [i for i in range(self.rank) if i not in over]
        replica_rank: dict[int, int] = {}
        seen: dict[tuple[int, ...], int] = defaultdict(int)
        for d, c in enumerate(self.coords):
            replica_rank[d] = seen[c]
            seen[c] += 1
        grouped: dict[Hashable, list[int]] = defaultdict(list)
        for d, c in enumerate(self.coords):
            grouped[(tuple(c[i] for i in rest), replica_rank[d])].append(d)
        out = []
        for members in grouped.values():
            members.sort(key=lambda d: tuple(self.coords[d][i] for i in over))
            out.append(members)
        out.sort()
        return out

    def to_sharding(self) -> HloSharding:
        """The HloSharding of this tiling (the array's dimensions are its axes)."""
        if self.is_replicated:
            return HloSharding.replicated()
        by_tile: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for d, c in enumerate(self.coords):
            by_tile[c].append(d)
        devices = [d for c in sorted(by_tile) for d in by_tile[c]]
        r = self.replication
        return HloSharding.tile((*self.tiles, r) if r > 1 else self.tiles, devices, r > 1)


def uniform(tiles: Sequence[int], coords: Sequence[tuple[int, ...]]) -> bool:
    """Whether every combination of coordinates is held by the same number of devices."""
    counts: dict[tuple[int, ...], int] = defaultdict(int)
    for c in coords:
        counts[c] += 1
    if len(counts) != math.prod(tiles):
        return False
    return len(set(counts.values())) == 1


def merge(a: Tiling, b: Tiling) -> Tiling | None:
    """One tiling cutting every axis that `a` or `b` cuts, each device keeping its pieces
    from both (a's where both cut an axis differently); None if no uniform one exists."""
    tiles = []
    take_b = []
    for i, (ta, tb) in enumerate(zip(a.tiles, b.tiles, strict=True)):
        if ta == 1 and tb > 1:
            tiles.append(tb)
            take_b.append(i)
        else:
            tiles.append(ta)
    if not take_b:
        return None
    coords = tuple(
        tuple(cb[i] if i in take_b else ca[i] for i in range(a.rank))
        for ca, cb in zip(a.coords, b.coords, strict=True)
    )
    if not uniform(tiles, coords):
        return None
    return Tiling(tuple(tiles), coords)
