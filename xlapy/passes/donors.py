"""Buffer donors become concrete input/output aliases.

`buffer_donor={ (0, {}) }` says parameter 0 may give its buffer to any output of its size.
Compilation turns each such promise into a fixed `input_output_alias` entry (may-alias) so
that later stages see one kind of aliasing. Matching is greedy and deterministic, as XLA's
is by shape: output leaves are visited in pre-order; each takes the first donor (ordered by
parameter number, then index) whose array leaf has the same element type and byte size and
that no alias uses yet. Outputs that already have an alias are skipped. Matched donors leave
`buffer_donors`; unmatched ones stay (a reader sees which donations were not usable).
"""

from __future__ import annotations

from xlapy.ir.module import AliasEntry, BufferDonor, HloModule
from xlapy.ir.shapes import Shape
from xlapy.passes.pass_base import HloPass, register_pass


def _key(shape: Shape):
    if not shape.is_array or shape.is_dynamic:
        return None
    return shape.element_type, shape.byte_size


@register_pass
class BufferDonorToAlias(HloPass):
    """Turns `buffer_donor` entries into may-alias `input_output_alias` entries."""

    name = "buffer-donor-to-alias"

    def run(self, module: HloModule) -> bool:
        config = module.config
        entry = module.entry
        if not config.buffer_donors or entry is None or entry.root is None:
            return False
        params = {p.parameter_number: p.shape for p in entry.parameters}
        aliased_params = {(e.param_number, e.param_index) for e in config.input_output_alias}
        aliased_outputs = {e.output_index for e in config.input_output_alias}
        donors: list[BufferDonor] = sorted(
            (
                d
                for d in config.buffer_donors
                if (d.param_number, d.param_index) not in aliased_params
            ),
            key=lambda d: (d.param_number, d.param_index),
        )

        def donor_key(d: BufferDonor):
            shape = params.get(d.param_number)
            if shape is None or not shape.has_index(d.param_index):
                return None
            return _key(shape.subshape(d.param_index))

        new_aliases: list[AliasEntry] = []
        used: set[BufferDonor] = set()
        for index, leaf in entry.root.shape.leaves():
            key = _key(leaf)
            if key is None or index in aliased_outputs:
                continue
            for d in donors:
                if d not in used and donor_key(d) == key:
                    used.add(d)
                    new_aliases.append(AliasEntry(index, d.param_number, d.param_index))
                    break
        if not new_aliases:
            return False
        config.input_output_alias = (*config.input_output_alias, *new_aliases)
        config.buffer_donors = tuple(d for d in config.buffer_donors if d not in used)
        return True
