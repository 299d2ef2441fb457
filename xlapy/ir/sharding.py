"""HloSharding: how an array value is laid out over the devices of an SPMD program.

The forms XLA prints, all parsed and printed back exactly:

  {replicated}                       every device holds the whole array
  {maximal device=3}                 one device holds it
  {manual}                           the program already works on per-device data
  {unknown}                          no decision yet (Shardy's open dimensions)
  {devices=[2,1,4]<=[8]}             tiled: a tile assignment of shape [2,1,4] holding the
  {devices=[4,2]<=[2,4]T(1,0)}         device ids iota(8), or iota reshaped and transposed,
  {devices=[2,2]0,2,1,3}               or an explicit list
  {devices=[2,1,2]<=[4] last_tile_dim_replicate}
                                     the last tile dimension replicates (devices along it
                                     hold the same tile)
  {devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}
                                     the last tile dimensions are subgroups of the named kinds
  {{replicated}, {devices=[2]<=[2]}} one sharding per leaf of a tuple-shaped value

A trailing `metadata={...}` is kept as text and printed back; nothing reads it.

The tile assignment is an array of device ids whose leading `rank` dimensions tile the
array's dimensions (dimension i cut into tile_dims[i] equal pieces); device `d` holds the
tile at its coordinates in that array. `device_coords()` gives those coordinates per device,
which is what the partitioner works with.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_SUBGROUP_KINDS = ("manual", "replicated", "unreduced")


@dataclass(frozen=True, slots=True)
class HloSharding:
    """A sharding annotation. `kind` is replicated, maximal, manual, unknown, tiled or tuple.

    Tiled: `tile_dims` is the tile assignment's shape; the device ids are either the iota
    form (`iota_reshape`, `iota_perm`: iota(n) reshaped to iota_reshape, transposed by
    iota_perm) or `explicit_devices` in row-major order. `subgroups` names the kinds of the
    trailing tile dimensions that do not tile the array (`last_tile_dim_replicate` is one
    `replicated` subgroup printed the short way, `replicate_on_last_tile_dim`).
    """

    kind: str
    tile_dims: tuple[int, ...] = ()
    iota_reshape: tuple[int, ...] = ()
    iota_perm: tuple[int, ...] = ()
    explicit_devices: tuple[int, ...] | None = None
    replicate_on_last_tile_dim: bool = False
    subgroups: tuple[str, ...] = ()  # last_tile_dims={...}
    device: int = 0  # maximal
    elements: tuple[HloSharding, ...] = ()  # tuple
    metadata: str = ""  # ` metadata={...}` text, kept verbatim

    # -- constructors ----------------------------------------------------------------------
    @staticmethod
    def replicated() -> HloSharding:
        return HloSharding("replicated")

    @staticmethod
    def manual() -> HloSharding:
        return HloSharding("manual")

    @staticmethod
    def tile(tile_dims, devices, replicate_last: bool = False) -> HloSharding:
        """A tiled sharding from a tile shape and the device ids in row-major order; printed
        in the iota form when the ids are 0..n-1 in order."""
        tile_dims = tuple(int(t) for t in tile_dims)
        devices = tuple(int(d) for d in devices)
        if replicate_last and tile_dims[-1] == 1:
            tile_dims, replicate_last = tile_dims[:-1], False
        if devices == tuple(range(len(devices))):
            return HloSharding(
                "tiled",
                tile_dims,
                iota_reshape=(len(devices),),
                replicate_on_last_tile_dim=replicate_last,
            )
        return HloSharding(
            "tiled", tile_dims, explicit_devices=devices, replicate_on_last_tile_dim=replicate_last
        )

    # -- queries ---------------------------------------------------------------------------
    @property
    def is_replicated(self) -> bool:
        if self.kind == "replicated":
            return True
        if self.kind != "tiled":
            return False
        if "manual" in self.subgroups or "unreduced" in self.subgroups:
            return False
        return math.prod(self.tile_dims[: self.data_rank]) == 1

    @property
    def is_manual(self) -> bool:
        return self.kind == "manual" or (self.kind == "tiled" and "manual" in self.subgroups)

    @property
    def is_unreduced(self) -> bool:
        """Whether devices hold partial sums (an `unreduced` subgroup: the value is the sum
        of the pieces held along it, JAX's `P(unreduced={...})`)."""
        return self.kind == "tiled" and "unreduced" in self.subgroups

    def unreduced_groups(self) -> list[list[int]]:
        """The device groups whose pieces sum to the value (ordered by their coordinate
        along the unreduced subgroup); [] when the sharding is not unreduced."""
        if not self.is_unreduced:
            return []
        axis = self.data_rank + self.subgroups.index("unreduced")
        groups: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for flat, dev in enumerate(self.devices()):
            coords = []
            for t in reversed(self.tile_dims):
                flat, i = divmod(flat, t)
                coords.append(i)
            coords.reverse()
            key = tuple(c for k, c in enumerate(coords) if k != axis)
            groups.setdefault(key, []).append((coords[axis], dev))
        return [[d for _, d in sorted(g)] for _, g in sorted(groups.items())]

    @property
    def is_tuple(self) -> bool:
        return self.kind == "tuple"

    @property
    def data_rank(self) -> int:
        """How many tile dimensions tile the array (the array's rank) for a tiled sharding."""
        return len(self.tile_dims) - len(self.subgroups) - int(self.replicate_on_last_tile_dim)

    @property
    def num_devices(self) -> int:
        return math.prod(self.tile_dims) if self.kind == "tiled" else 1

    def devices(self) -> tuple[int, ...]:
        """The tile assignment's device ids in row-major order (tiled shardings)."""
        if self.explicit_devices is not None:
            return self.explicit_devices
        n = math.prod(self.iota_reshape)
        if not self.iota_perm:
            return tuple(range(n))
        strides = [math.prod(self.iota_reshape[i + 1 :]) for i in range(len(self.iota_reshape))]
        dims = [self.iota_reshape[p] for p in self.iota_perm]
        ids = []
        for flat in range(n):
            rest, offset = flat, 0
            for axis in reversed(range(len(dims))):
                rest, i = divmod(rest, dims[axis])
                offset += i * strides[self.iota_perm[axis]]
            ids.append(offset)
        return tuple(ids)

    def device_coords(self) -> dict[int, tuple[int, ...]]:
        """Device id -> its tile's coordinates over the array's dimensions (tiled shardings)."""
        rank = self.data_rank
        out: dict[int, tuple[int, ...]] = {}
        for flat, dev in enumerate(self.devices()):
            coords = []
            for t in reversed(self.tile_dims):
                flat, i = divmod(flat, t)
                coords.append(i)
            out[dev] = tuple(reversed(coords))[:rank]
        return out

    def with_metadata(self, metadata: str) -> HloSharding:
        return HloSharding(
            self.kind,
            self.tile_dims,
            self.iota_reshape,
            self.iota_perm,
            self.explicit_devices,
            self.replicate_on_last_tile_dim,
            self.subgroups,
            self.device,
            self.elements,
            metadata,
        )

    def check(self, rank: int | None, num_devices: int | None = None) -> list[str]:
        """Problems of this sharding for an array of `rank` dimensions over `num_devices`
        devices (either may be None: not checked); tuple shardings are checked per leaf by
        the caller."""
        problems: list[str] = []
        if self.kind == "maximal" and num_devices is not None and self.device >= num_devices:
            problems.append(f"maximal device {self.device} is not below {num_devices} devices")
        if self.kind != "tiled":
            return problems
        if rank is not None and self.data_rank != rank:
            extra = len(self.tile_dims) - self.data_rank
            problems.append(
                f"sharding {self.text()} has {len(self.tile_dims)} tile dimensions; an array "
                f"of rank {rank} needs {rank + extra}"
            )
        devs = self.devices()
        if num_devices is not None and len(devs) != num_devices:
            problems.append(
                f"sharding {self.text()} names {len(devs)} devices; the program has {num_devices}"
            )
        return problems

    # -- text ------------------------------------------------------------------------------
    def text(self) -> str:
        """The sharding as XLA prints it, braces included."""
        meta = self.metadata
        if self.kind == "tuple":
            return "{" + ", ".join(e.text() for e in self.elements) + "}"
        if self.kind == "maximal":
            return f"{{maximal device={self.device}{meta}}}"
        if self.kind != "tiled":
            return f"{{{self.kind}{meta}}}"
        parts = ["devices=[" + ",".join(map(str, self.tile_dims)) + "]"]
        if self.explicit_devices is not None:
            parts[0] += ",".join(map(str, self.explicit_devices))
        else:
            parts[0] += "<=[" + ",".join(map(str, self.iota_reshape)) + "]"
            if self.iota_perm:
                parts[0] += "T(" + ",".join(map(str, self.iota_perm)) + ")"
        if self.replicate_on_last_tile_dim:
            parts.append("last_tile_dim_replicate")
        if self.subgroups:
            parts.append("last_tile_dims={" + ", ".join(self.subgroups) + "}")
        return "{" + " ".join(parts) + meta + "}"

    def __str__(self) -> str:
        return self.text()


class ShardingSyntaxError(ValueError):
    """A sharding that cannot be read; `offset` is where, in the text given to the parser."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.offset = offset


def parse_sharding(text: str) -> HloSharding:
    """Read one sharding, braces included (`{devices=[2,1]<=[2]}`); ShardingSyntaxError
    with the offset of the problem otherwise. Checks that the tile assignment is consistent
    (as many devices as tiles, each id once); rank and device count are the verifier's."""
    reader = _Reader(text)
    sharding = reader.sharding()
    reader.skip()
    if reader.pos != len(text):
        raise ShardingSyntaxError("unexpected text after the sharding", reader.pos)
    return sharding


class _Reader:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self, token: str) -> bool:
        self.skip()
        return self.text.startswith(token, self.pos)

    def accept(self, token: str) -> bool:
        if self.peek(token):
            self.pos += len(token)
            return True
        return False

    def expect(self, token: str, what: str) -> None:
        if not self.accept(token):
            raise ShardingSyntaxError(f"expected {what}", self.pos)

    def word(self) -> str:
        self.skip()
        m = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(self.text, self.pos)
        if not m:
            raise ShardingSyntaxError("expected a sharding keyword", self.pos)
        self.pos = m.end()
        return m.group(0)

    def integer(self, what: str) -> int:
        self.skip()
        m = re.compile(r"\d+").match(self.text, self.pos)
        if not m:
            raise ShardingSyntaxError(f"expected {what}", self.pos)
        self.pos = m.end()
        return int(m.group(0))

    def ints(self, close: str, what: str) -> tuple[int, ...]:
        values = [self.integer(what)]
        while self.accept(","):
            values.append(self.integer(what))
        self.expect(close, f"'{close}' closing {what}s")
        return tuple(values)

    def balanced(self) -> str:
        start = self.pos
        depth = 0
        in_string = False
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            self.pos += 1
            if in_string:
                if ch == "\\":
                    self.pos += 1
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return self.text[start : self.pos]
        raise ShardingSyntaxError("unbalanced braces in sharding metadata", start)

    def sharding(self) -> HloSharding:
        start = self.pos
        self.expect("{", "'{' opening a sharding")
        if self.peek("{"):
            elements = [self.sharding()]
            while self.accept(","):
                elements.append(self.sharding())
            self.expect("}", "'}' closing a tuple sharding")
            return HloSharding("tuple", elements=tuple(elements))
        if self.accept("}"):  # `{}`: a tuple sharding of an empty tuple
            return HloSharding("tuple")
        word_pos = self.pos
        word = self.word()
        if word in ("replicated", "manual", "unknown"):
            result = HloSharding(word)
        elif word == "maximal":
            self.expect("device", "'device=' after 'maximal'")
            self.expect("=", "'=' after 'device'")
            result = HloSharding("maximal", device=self.integer("a device id"))
        elif word == "devices":
            result = self.tiled(start)
        else:
            raise ShardingSyntaxError(
                f"unknown sharding '{word}' (expected replicated, maximal, manual, unknown, "
                "devices=[...] or a tuple of shardings)",
                word_pos,
            )
        meta = ""
        self.skip()
        meta_start = self.pos
        if self.accept("metadata"):
            self.expect("=", "'=' after 'metadata'")
            self.skip()
            if not self.peek("{"):
                raise ShardingSyntaxError("expected '{' opening sharding metadata", self.pos)
            self.balanced()
            meta = " " + self.text[meta_start : self.pos]
        self.expect("}", "'}' closing the sharding")
        return result.with_metadata(meta) if meta else result

    def tiled(self, start: int) -> HloSharding:
        self.expect("=", "'=' after 'devices'")
        self.expect("[", "'[' opening the tile assignment's dimensions")
        dims_pos = self.pos
        tile_dims = self.ints("]", "tile dimension")
        if any(t < 1 for t in tile_dims):
            raise ShardingSyntaxError("tile dimensions must be positive", dims_pos)
        n = math.prod(tile_dims)
        reshape: tuple[int, ...] = ()
        perm: tuple[int, ...] = ()
        explicit: tuple[int, ...] | None = None
        list_pos = self.pos
        if self.accept("<="):
            self.expect("[", "'[' after '<='")
            reshape = self.ints("]", "iota dimension")
            if math.prod(reshape) != n:
                raise ShardingSyntaxError(
                    f"iota [{','.join(map(str, reshape))}] holds {math.prod(reshape)} devices; "
                    f"the tile assignment [{','.join(map(str, tile_dims))}] needs {n}",
                    list_pos,
                )
            if self.accept("T"):
                self.expect("(", "'(' after 'T'")
                perm_pos = self.pos
                perm = self.ints(")", "transpose dimension")
                if sorted(perm) != list(range(len(reshape))):
                    raise ShardingSyntaxError(
                        f"T({','.join(map(str, perm))}) is not a permutation of the "
                        f"{len(reshape)} iota dimensions",
                        perm_pos,
                    )
        else:
            explicit = (self.integer("a device id or '<='"),)
            while self.accept(","):
                explicit += (self.integer("a device id"),)
            if len(explicit) != n:
                raise ShardingSyntaxError(
                    f"{len(explicit)} device ids for a tile assignment of {n} tiles", list_pos
                )
            if sorted(explicit) != list(range(n)):
                raise ShardingSyntaxError(
                    "the device ids of a tile assignment must be 0..n-1, each once", list_pos
                )
        replicate_last = False
        subgroups: tuple[str, ...] = ()
        while True:
            self.skip()
            if self.text.startswith("last_tile_dim_replicate", self.pos):
                self.pos += len("last_tile_dim_replicate")
                replicate_last = True
            elif self.text.startswith("last_tile_dims", self.pos):
                self.pos += len("last_tile_dims")
                self.expect("=", "'=' after 'last_tile_dims'")
                self.expect("{", "'{' opening last_tile_dims")
                kinds = [self.word()]
                while self.accept(","):
                    kinds.append(self.word())
                self.expect("}", "'}' closing last_tile_dims")
                for kind in kinds:
                    if kind not in _SUBGROUP_KINDS:
                        raise ShardingSyntaxError(
                            f"unknown subgroup kind '{kind}' (expected one of "
                            f"{', '.join(_SUBGROUP_KINDS)})",
                            self.pos,
                        )
                subgroups = tuple(kinds)
            else:
                break
        extra = len(subgroups) + int(replicate_last)
        if extra > len(tile_dims):
            raise ShardingSyntaxError(
                f"{extra} subgroup dimensions but only {len(tile_dims)} tile dimensions", start
            )
        return HloSharding(
            "tiled",
            tile_dims,
            iota_reshape=reshape,
            iota_perm=perm,
            explicit_devices=explicit,
            replicate_on_last_tile_dim=replicate_last,
            subgroups=subgroups,
        )


def leaf_count(shape) -> int:
    """How many array leaves a (possibly tuple) shape has: a tuple sharding has one each."""
    if shape.is_tuple:
        return sum(leaf_count(e) for e in shape.tuple_shapes)
    return 1
