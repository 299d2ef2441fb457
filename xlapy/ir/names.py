"""Fresh instruction and computation names, unique within a module (`stem.N`, as XLA)."""

from __future__ import annotations

import re
from operator import attrgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from xlapy.ir.module import HloModule

_SUFFIX = re.compile(r"\.\d+$")
_NAME = attrgetter("name")


class NameUniquer:
    """Hands out names not used by any instruction or computation of `module` (or by any
    name it handed out before). Every pass that creates instructions uses one."""

    def __init__(self, module: HloModule | None = None):
        self.taken: set[str] = set()
        self._next: dict[str, int] = {}
        self._stems: dict[str, str] = {}  # base -> stem (a regex substitution per name)
        if module is not None:  # (map over attrgetter: most passes make one per run)
            for comp in module.computations:
                self.taken.update(map(_NAME, comp.instructions))
            self.taken.update(map(_NAME, module.computations))

    def fresh(self, base: str, plain_first: bool = False) -> str:
        """`base` itself when `plain_first` and free, else the first free `stem.N`, where
        `stem` is `base` without a trailing `.N`."""
        stem = self._stems.get(base)
        if stem is None:
            stem = self._stems[base] = _SUFFIX.sub("", base) or "instr"
        if plain_first and stem not in self.taken:
            self.taken.add(stem)
            return stem
        n = self._next.get(stem, 1)
        name = f"{stem}.{n}"
        taken = self.taken
        while name in taken:
            n += 1
            name = f"{stem}.{n}"
        self._next[stem] = n + 1
        taken.add(name)
        return name
