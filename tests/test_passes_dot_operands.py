"""dot-matrix-operands: which dot operands get a transpose (a table of dots, layouts and the
sides expected to change), shared transposes, dots inside loops, the types it leaves alone;
and compiled (the CPU pipeline runs the pass) against the interpreter on random inputs,
each rewritten dot then one cblas gemm (or gemm list) in a native run."""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.interpreter import evaluate
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.shapes import Layout, Shape
from xlapy.ir.types import PrimitiveType
from xlapy.ir.verifier import verify
from xlapy.passes.dot_operands import DotMatrixOperands, reads_as_matrix

RNG = np.random.default_rng(20261127)


def _dot_module(lhs: str, rhs: str, out: str, dims: str, dtype: str = "f32") -> str:
    return f"""HloModule dots
ENTRY e {{
  a = {dtype}{lhs} parameter(0)
  b = {dtype}{rhs} parameter(1)
  ROOT d = {dtype}{out} dot(a, b), {dims}
}}"""


# (id, lhs, rhs, out, dimension numbers, sides expected to get a transpose)
CASES = [
    # nnx attention's key-projection gradient: dq [b,h,t,d] . w_k [D,h,d] over (h, d)
    ("attention_dx", "[2,4,32,16]{3,2,1,0}", "[64,4,16]{2,1,0}", "[2,32,64]{2,1,0}",
     "lhs_contracting_dims={1,3}, rhs_contracting_dims={1,2}", {0}),
    # its weight gradient: x [b,t,D] . dq [b,h,t,d] over (b, t): free (h, d) split by t
    ("attention_dw", "[2,32,64]{2,1,0}", "[2,4,32,16]{3,2,1,0}", "[64,4,16]{2,1,0}",
     "lhs_contracting_dims={0,1}, rhs_contracting_dims={0,2}", {1}),
    # both sides: free dims split by the contraction
    ("both", "[8,20,8]{2,1,0}", "[6,20,5]{2,1,0}", "[8,8,6,5]{3,2,1,0}",
     "lhs_contracting_dims={1}, rhs_contracting_dims={1}", {0, 1}),
    # contracting pairs in an order the layout does not store: transposed
    ("swapped_pairs", "[5,6,7]{2,1,0}", "[7,6,9]{2,1,0}", "[5,9]{1,0}",
     "lhs_contracting_dims={2,1}, rhs_contracting_dims={0,1}", {0}),
    # batched, free dims apart from each other
    ("batched", "[3,4,10,5]{3,2,1,0}", "[3,10,6]{2,1,0}", "[3,4,5,6]{3,2,1,0}",
     "lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, "
     "rhs_contracting_dims={1}", {0}),
    # already matrices: plain, transposed (BLAS flags), through a layout, merged groups
    ("plain", "[30,40]{1,0}", "[40,50]{1,0}", "[30,50]{1,0}",
     "lhs_contracting_dims={1}, rhs_contracting_dims={0}", set()),
    ("flags", "[40,30]{1,0}", "[50,40]{1,0}", "[30,50]{1,0}",
     "lhs_contracting_dims={0}, rhs_contracting_dims={1}", set()),
    ("col_major", "[30,40]{0,1}", "[40,50]{0,1}", "[30,50]{1,0}",
     "lhs_contracting_dims={1}, rhs_contracting_dims={0}", set()),
    ("merged", "[2,16,4,8]{3,2,1,0}", "[4,8,24]{2,1,0}", "[2,16,24]{2,1,0}",
     "lhs_contracting_dims={2,3}, rhs_contracting_dims={0,1}", set()),
    # a layout that makes the split dims adjacent: read in place
    ("layout_rescues", "[2,4,32,16]{3,1,2,0}", "[64,4,16]{2,1,0}", "[2,32,64]{2,1,0}",
     "lhs_contracting_dims={1,3}, rhs_contracting_dims={1,2}", set()),
    # extent-1 dims in between move nothing
    ("unit_dims", "[1,4,1,16]{3,2,1,0}", "[64,4,16]{2,1,0}", "[1,1,64]{2,1,0}",
     "lhs_contracting_dims={1,3}, rhs_contracting_dims={1,2}", set()),
]  # fmt: skip


def _run(text: str, **options):
    module = parse_module(text)
    args = []
    for p in module.entry.parameters:
        x = RNG.standard_normal(p.shape.dims)
        args.append(
            x.astype(np.float64 if p.shape.element_type is PrimitiveType.F64 else np.float32)
        )
    expected = np.asarray(evaluate(parse_module(text), args))
    program = CpuProgram(parse_module(text), options)
    got = np.asarray(program.run(args))
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)
    return program


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_which_operands_get_a_transpose(case):
    _, lhs, rhs, out, dims, sides = case
    module = parse_module(_dot_module(lhs, rhs, out, dims))
    before = [o.name for o in module.entry.root.operands]
    changed = DotMatrixOperands().run(module)
    verify(module)
    dot = module.entry.root
    assert dot.opcode is Opcode.DOT and dot.name == "d" and dot.shape.to_text() == f"f32{out}"
    got = {i for i, o in enumerate(dot.operands) if o.name != before[i]}
    assert changed == bool(sides) and got == sides
    for i in sides:
        t = dot.operands[i]
        assert t.opcode is Opcode.TRANSPOSE and t.shape.layout.is_default
    dn = dot.dot_dimension_numbers
    for side, (b, c) in enumerate(((dn.lhs_batch, dn.lhs_contracting),
                                   (dn.rhs_batch, dn.rhs_contracting))):  # fmt: skip
        shape = dot.operands[side].shape
        free = [d for d in range(shape.rank) if d not in b and d not in c]
        assert reads_as_matrix(shape, free, c) if side == 0 else reads_as_matrix(shape, c, free)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_compiled_dots_match_the_interpreter(case):
    """Through the CPU pipeline: the interpreter's numbers, and the dot one planned gemm (or
    gemm list) run natively, never the NumPy matmul path."""
    _, lhs, rhs, out, dims, _ = case
    text = _dot_module(lhs, rhs, out, dims)
    program = _run(text, native_gemv=False)
    line = next(x for x in program.thunk_listing().splitlines() if "= dot [" in x)
    assert "cblas gemm" in line, line


def test_f64_and_gemv_shaped_dots_match_the_interpreter():
    text = _dot_module("[3,4,9,5]{3,2,1,0}", "[4,5]{1,0}", "[3,9]{1,0}",
                       "lhs_contracting_dims={1,3}, rhs_contracting_dims={0,1}", "f64")  # fmt: skip
    module = parse_module(text)
    assert DotMatrixOperands().run(module)
    _run(text)  # a matrix-vector product: the native gemv kernel reads the transposed lhs


def test_dots_share_one_transpose_of_a_value():
    """The attention pattern: one [b,h,t,d] value read by the input gradient (contracting
    h, d) and the weight gradient (free h, d): one transpose to [b,t,h,d] serves both."""
    text = """HloModule shared
ENTRY e {
  q = f32[2,4,32,16]{3,2,1,0} parameter(0)
  w = f32[64,4,16]{2,1,0} parameter(1)
  x = f32[2,32,64]{2,1,0} parameter(2)
  dx = f32[2,32,64]{2,1,0} dot(q, w), lhs_contracting_dims={1,3}, rhs_contracting_dims={1,2}
  dw = f32[64,4,16]{2,1,0} dot(x, q), lhs_contracting_dims={0,1}, rhs_contracting_dims={0,2}
  ROOT r = (f32[2,32,64]{2,1,0}, f32[64,4,16]{2,1,0}) tuple(dx, dw)
}"""
    module = parse_module(text)
    assert DotMatrixOperands().run(module)
    transposes = [i for i in module.entry.instructions if i.opcode is Opcode.TRANSPOSE]
    assert len(transposes) == 1 and transposes[0].dimensions == (0, 2, 1, 3)
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((2, 4, 32, 16), (64, 4, 16),
                                                                (2, 32, 64))]  # fmt: skip
    want = evaluate(parse_module(text), args)
    program = CpuProgram(parse_module(text))
    got = program.run(args)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=2e-5, atol=2e-5)
    entry = program.compiled.entry
    assert entry.steps is not None and [s.kind for s in entry.steps] == ["native-run"]


def test_a_dot_in_a_loop_body_is_rewritten():
    text = """HloModule loop
body {
  s = (s32[], f32[2,32,64]{2,1,0}, f32[2,4,32,16]{3,2,1,0}, f32[64,4,16]{2,1,0}) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  acc = f32[2,32,64]{2,1,0} get-tuple-element(s), index=1
  q = f32[2,4,32,16]{3,2,1,0} get-tuple-element(s), index=2
  w = f32[64,4,16]{2,1,0} get-tuple-element(s), index=3
  d = f32[2,32,64]{2,1,0} dot(q, w), lhs_contracting_dims={1,3}, rhs_contracting_dims={1,2}
  sum = f32[2,32,64]{2,1,0} add(acc, d)
  one = s32[] constant(1)
  next = s32[] add(i, one)
  ROOT t = (s32[], f32[2,32,64]{2,1,0}, f32[2,4,32,16]{3,2,1,0}, f32[64,4,16]{2,1,0}) tuple(next, sum, q, w)
}
cond {
  c = (s32[], f32[2,32,64]{2,1,0}, f32[2,4,32,16]{3,2,1,0}, f32[64,4,16]{2,1,0}) parameter(0)
  k = s32[] get-tuple-element(c), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(k, n), direction=LT
}
ENTRY e {
  q0 = f32[2,4,32,16]{3,2,1,0} parameter(0)
  w0 = f32[64,4,16]{2,1,0} parameter(1)
  z = s32[] constant(0)
  f = f32[] constant(0)
  acc0 = f32[2,32,64]{2,1,0} broadcast(f), dimensions={}
  init = (s32[], f32[2,32,64]{2,1,0}, f32[2,4,32,16]{3,2,1,0}, f32[64,4,16]{2,1,0}) tuple(z, acc0, q0, w0)
  loop = (s32[], f32[2,32,64]{2,1,0}, f32[2,4,32,16]{3,2,1,0}, f32[64,4,16]{2,1,0}) while(init), condition=cond, body=body
  ROOT out = f32[2,32,64]{2,1,0} get-tuple-element(loop), index=1
}"""  # noqa: E501
    module = parse_module(text)
    assert DotMatrixOperands().run(module)
    body = next(c for c in module.computations if c.name == "body")
    dot = next(i for i in body.instructions if i.opcode is Opcode.DOT)
    assert dot.operands[0].opcode is Opcode.TRANSPOSE
    _run(text)


@pytest.mark.parametrize(
    "dtype,why",
    [("s32", "integer dots go to the library path, which copies its operands"),
     ("bf16", "a narrow float dot (before dot-upcast makes it an f32 dot)")],
)  # fmt: skip
def test_other_types_are_left_alone(dtype, why):
    text = _dot_module("[8,20,8]{2,1,0}", "[6,20,5]{2,1,0}", "[8,8,6,5]{3,2,1,0}",
                       "lhs_contracting_dims={1}, rhs_contracting_dims={1}", dtype)  # fmt: skip
    assert not DotMatrixOperands().run(parse_module(text)), why


def test_reads_as_matrix():
    shape = Shape.array(PrimitiveType.F32, (2, 4, 32, 16), Layout.default(4))
    assert reads_as_matrix(shape, (0, 2), (1, 3)) is False  # t between h and d
    assert reads_as_matrix(shape, (0, 1, 2), (3,))  # row-major [b*h*t, d]
    assert reads_as_matrix(shape, (3,), (0, 1, 2))  # its transpose (BLAS flag)
    assert reads_as_matrix(shape, (0, 1), (2, 3))
    assert reads_as_matrix(shape, (2, 3), (0, 1))  # [t*d, b*h] stored transposed
    assert not reads_as_matrix(shape, (1, 0), (2, 3))  # h before b: no one stride
