"""released_text (codegen/ir_release.py): a kernel's llvmlite module printed once and taken
apart, so reference counting frees it; a released module used again fails loudly."""

import gc
import weakref

import pytest
from llvmlite import ir

from xlapy.backends.cpu.codegen.ir_release import released_text


def _loop_module() -> ir.Module:
    module = ir.Module(name="m")
    i64 = ir.IntType(64)
    fn = ir.Function(module, ir.FunctionType(i64, [i64]), "count")
    entry, head, done = (fn.append_basic_block(n) for n in ("entry", "head", "done"))
    ir.IRBuilder(entry).branch(head)
    b = ir.IRBuilder(head)
    phi = b.phi(i64, "i")
    nxt = b.add(phi, ir.Constant(i64, 1))
    phi.add_incoming(ir.Constant(i64, 0), entry)
    phi.add_incoming(nxt, head)
    b.cbranch(b.icmp_signed("<", nxt, fn.args[0]), head, done)
    ir.IRBuilder(done).ret(nxt)
    return module


def test_released_text_is_the_text_and_reference_counting_frees_the_module():
    expected = str(_loop_module())
    module = _loop_module()
    probe = weakref.ref(module.get_global("count").blocks[1])
    gc.disable()
    try:
        assert released_text(module) == expected
        del module
        assert probe() is None  # no collection ran
    finally:
        gc.enable()


def test_a_released_module_fails_loudly_when_printed_again():
    module = _loop_module()
    released_text(module)
    with pytest.raises(AttributeError):
        str(module)
