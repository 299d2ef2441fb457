"""An llvmlite module printed once and then taken apart.

llvmlite's IR objects point both ways (a module's globals and their `parent`, a function's
blocks and arguments and their `parent`, a block's instructions and terminator and their
`parent`, metadata and its module, a loop's phi and the values it feeds), so every kernel's
IR is one large reference cycle that only Python's cyclic collector frees: a tenth of a
second of collection after a cold compile of a training step (benchmarks/RESULTS.md, twelfth
session). A kernel needs its IR only as text; `released_text` prints it and removes the
containers that close the cycles, so reference counting frees the IR when the emitter drops
it. A released module used again fails loudly (an AttributeError on the removed container),
never prints an empty module."""

from __future__ import annotations

from llvmlite import ir


def released_text(module: ir.Module) -> str:
    """`str(module)`, then `module` taken apart (see the module's docstring)."""
    text = str(module)
    for value in module.globals.values():
        if isinstance(value, ir.Function):
            for block in value.blocks:
                for instr in block.instructions:
                    if isinstance(instr, ir.PhiInstr):  # a loop's values reach themselves
                        del instr.incomings
                del block.instructions, block.terminator
            del value.blocks, value.args, value.return_value
    del module.globals, module.metadata, module.namedmetadata, module._metadatacache
    return text
