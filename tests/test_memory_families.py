"""Program families whose temp bytes exceeded XLA's: an argmax's index iota now fuses into
its variadic reduce (no iota array in the arena), and a sort sorts its dying operands in
place (no second copy of them). Each is checked for the memory and for the values."""

from __future__ import annotations

import numpy as np
from hlo_snippets import ARGMAX_REDUCER

from xlapy.backends import get_backend
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module

ARGMAX = (
    "HloModule argmax\n"
    + ARGMAX_REDUCER
    + """ENTRY main {
  x = f32[256,1000] parameter(0)
  iota = s32[256,1000] iota(), iota_dimension=1
  lo = f32[] constant(-inf)
  zero = s32[] constant(0)
  r = (f32[256], s32[256]) reduce(x, iota, lo, zero), dimensions={1}, to_apply=argmax
  ROOT idx = s32[256] get-tuple-element(r), index=1
}
"""
)

ARGSORT = """HloModule argsort
less {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  i = s32[] parameter(2)
  j = s32[] parameter(3)
  ROOT lt = pred[] compare(a, b), direction=LT
}
ENTRY main {
  x = f32[64,512] parameter(0)
  iota = s32[64,512] iota(), iota_dimension=1
  s = (f32[64,512], s32[64,512]) sort(x, iota), dimensions={1}, is_stable=true, to_apply=less
  ROOT perm = s32[64,512] get-tuple-element(s), index=1
}
"""


def test_argmax_iota_fuses_into_its_variadic_reduce():
    program = get_backend("cpu").compile(parse_module(ARGMAX))
    entry = program.module.entry
    fusions = [i for i in entry.instructions if i.opcode is Opcode.FUSION]
    assert len(fusions) == 1 and fusions[0].shape.is_tuple
    body = fusions[0].attrs["calls"]
    assert body.root.opcode is Opcode.REDUCE
    assert Opcode.IOTA in {i.opcode for i in body.instructions}
    assert not program.compiled.fallbacks  # a native kernel, not the interpreter
    temp = program.buffer_assignment.temp_bytes
    assert temp < 256 * 1000 * 4  # the iota (1 MB) never exists; XLA's temp is 1,040 bytes
    assert temp <= 2 * 1024
    x = np.random.default_rng(31).standard_normal((256, 1000)).astype(np.float32)
    x[3, 7] = x[3, 9] = x[3].max() + 1  # a tie: the lower index wins
    got = program.run([x])
    np.testing.assert_array_equal(got, np.argmax(x, axis=1).astype(np.int32))


def test_sort_sorts_its_dying_operands_in_place():
    program = get_backend("cpu").compile(parse_module(ARGSORT))
    a = program.buffer_assignment
    entry = program.module.entry
    sort = next(i for i in entry.instructions if i.opcode is Opcode.SORT)
    indices = sort.operands[1]
    assert a.slice_of(sort, (1,)) == a.slice_of(indices)  # the iota's bytes are sorted
    # values: the parameter is not the program's to overwrite, so one copy in the arena
    assert a.temp_bytes <= 64 * 512 * 4 + 64
    x = np.random.default_rng(32).standard_normal((64, 512)).astype(np.float32)
    got = program.run([x])
    np.testing.assert_array_equal(got, np.argsort(x, axis=1, kind="stable").astype(np.int32))
    interpreter = get_backend("interpreter").compile(parse_module(ARGSORT))
    np.testing.assert_array_equal(got, interpreter.run([x]))
