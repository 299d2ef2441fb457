"""Differential fuzzing of whole programs (program_fuzz.py): random valid HLO modules run by
the CPU backend (default options and with its native paths off) and by the interpreter must
agree; a subset is also run by XLA (through jaxlib) against the interpreter. A fixed set of
seeds runs by default; set XLAPY_FUZZ_PROGRAMS (and XLAPY_FUZZ_PROGRAM_SEED, the first seed)
for a longer run, e.g. `XLAPY_FUZZ_PROGRAMS=2000 pytest tests/test_program_fuzz.py`, or run
benchmarks/program_fuzz.py, which also shrinks failures into reproducers.

The regression tests below are shrunk reproducers of bugs the fuzzer found."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from program_fuzz import (
    FAMILIES,
    NATIVE_OFF,
    Program,
    XlaChild,
    XlaCrashed,
    _largest_dim,
    _leaves,
    check,
    die_of_sigfpe,
    differences,
    families_from_text,
    generate,
    module_arguments,
    shrink,
    xla_run,
)

pytestmark = pytest.mark.usefixtures("kernel_cache")

PROGRAMS = int(os.environ.get("XLAPY_FUZZ_PROGRAMS", "24"))
FIRST = int(os.environ.get("XLAPY_FUZZ_PROGRAM_SEED", "20261127"))
CHUNKS = 4
XLA_EVERY = 4  # every 4th program also runs on XLA:CPU


def _report(seed: int, program: Program, found) -> str:
    lines = [f"seed {seed}: {len(found)} mismatches"]
    lines += [f"  {m.side} {m.output}: {m.message[:400]}" for m in found[:6]]
    return "\n".join(lines) + "\n" + program.text()


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_programs_agree(chunk):
    """CPU (two configurations) == interpreter, and interpreter == XLA on a subset."""
    for k in range(chunk, PROGRAMS, CHUNKS):
        seed = FIRST + k
        program = generate(seed)
        found = check(program, xla=k % XLA_EVERY == 0)
        assert not found, _report(seed, program, found)


def test_generator_covers_the_operations():
    """The default seeds draw every operation family the fuzzer is for."""
    seen: set[str] = set()
    for k in range(300):
        text = generate(FIRST + k).text().replace("lapack_d", "lapack_s")
        seen |= set(re.findall(r"[\]})] ([a-z-]+)\(", text))
        seen |= {"layout"} if re.search(r"\]\{0,1\}", text) else set()
        seen |= {"zero-dim"} if re.search(r"\[(\d+,)*0[,\]]", text) else set()
        seen |= set(re.findall(r"(f8e4m3fn|f8e5m2|input_output_alias|lapack_\w+_ffi|Sharding|"
                               r"xlapy_fuzz\.axpby|rng_three_fry|rng_philox|rng_default|"
                               r"fft_type=\w+|\{1,2,0\}|\{0,2,1\})", text))  # fmt: skip
    want = {
        "add", "multiply", "divide", "compare", "select", "clamp", "convert", "bitcast-convert",
        "broadcast", "reshape", "transpose", "slice", "dynamic-slice", "dynamic-update-slice",
        "concatenate", "pad", "reverse", "iota", "reduce", "reduce-window", "dot", "convolution",
        "gather", "scatter", "sort", "while", "conditional", "tuple", "get-tuple-element",
        "exponential", "tanh", "layout", "zero-dim",
        # second round
        "rng-bit-generator", "fft", "custom-call", "select-and-scatter", "copy",
        "f8e4m3fn", "f8e5m2", "input_output_alias", "Sharding", "xlapy_fuzz.axpby",
        "rng_three_fry", "rng_philox", "rng_default", "fft_type=FFT", "fft_type=IFFT",
        "fft_type=RFFT", "fft_type=IRFFT", "lapack_spotrf_ffi", "lapack_strsm_ffi",
        "lapack_sgetrf_ffi", "lapack_sgeqrf_ffi", "lapack_sorgqr_ffi", "lapack_ssyevd_ffi",
        "lapack_sgesdd_ffi", "{1,2,0}", "{0,2,1}",
    }  # fmt: skip
    assert want <= seen, sorted(want - seen)


def test_generated_programs_are_valid_and_vary():
    """Programs verify, their arguments are drawn fresh per seed (not all zeros), and two
    seeds give different programs."""
    from xlapy.ir.parser import parse_module
    from xlapy.ir.verifier import verify

    texts = set()
    for k in range(20):
        program = generate(FIRST + k)
        verify(parse_module(program.text()))
        texts.add(program.text())
        for arg in _leaves(program.arguments()):
            if arg.size >= 4 and arg.dtype != np.bool_:
                assert np.any(arg != 0)
    assert len(texts) == 20


def test_families_turn_on_and_off():
    """A family turned off is never drawn; `only` families draw nothing else; bad names are
    refused."""
    no_dot = families_from_text("-dot,-linalg")
    assert no_dot["dot"] == 0 and no_dot["unary"] == FAMILIES["unary"]
    for k in range(30):
        assert " dot(" not in generate(FIRST + k, families=no_dot).text()
    only = families_from_text("fft")
    for k in range(10):
        ops = set(re.findall(r"[\]})] ([a-z-]+)\(", generate(FIRST + k, families=only).text()))
        assert "fft" in ops
        assert ops <= {"fft", "parameter", "tuple"}, ops
    with pytest.raises(ValueError, match="unknown fuzzer family"):
        families_from_text("-nosuch")


def test_shrink_makes_shapes_smaller():
    """Shrinking against a stand-in failure (the program holds a reduce) draws the seed again
    with smaller dimensions: the result's largest dimension is at most 2."""
    seed = next(s for s in range(FIRST, FIRST + 500)
                if " reduce(" in generate(s).text() and _largest_dim(generate(s)) > 3)  # fmt: skip
    program = generate(seed)

    def fails(p: Program) -> bool:
        return " reduce(" in p.text()

    small = shrink(program, fails)
    assert fails(small)
    assert _largest_dim(small) <= 2 < _largest_dim(program), small.text()


def test_donation_side_runs_on_aliased_programs():
    """Programs with input/output aliases also run through the runtime, donated and not; the
    default seeds hold some, and they agree."""
    seeds = [s for s in range(FIRST, FIRST + 60) if generate(s).live_aliases()][:2]
    assert seeds
    for seed in seeds:
        program = generate(seed)
        assert "input_output_alias" in program.text()
        found = check(program, configs={}, donation=True)
        assert not found, _report(seed, program, found)


def test_aliases_into_tuple_parameters():
    """Aliases into tuple parameters' leaves are drawn and agree through the runtime, donated
    (the whole tuple parameter invalidated) and not (inputs untouched), and with XLA (the
    aliases left out of what XLA compiles, see KNOWN_DIFFERENCES)."""
    families = families_from_text("alias=1,tuple_gte=8,nested_control=3")
    programs = [generate(s, families=families) for s in range(FIRST, FIRST + 40)]
    leafy = [p for p in programs if any(leaf for _, _, leaf in p.live_alias_leaves())][:2]
    assert leafy
    for k, program in enumerate(leafy):
        assert re.search(r"\(\d+, \{\d+\}, (may|must)-alias\)", program.text())
        found = check(program, xla=k == 0)
        assert not found, _report(program.seed, program, found)


def test_complex_lapack_calls():
    """The linalg family draws the complex LAPACK calls as jaxlib names them, and they agree
    with XLA (eigenvectors and singular vectors compared by their entries' magnitudes)."""
    families = families_from_text("linalg")
    names: set[str] = set()
    checked = 0
    for seed in range(FIRST, FIRST + 120):
        program = generate(seed, families=families)
        found = set(re.findall(r'"lapack_([cz][a-z]+)_ffi"', program.text()))
        if found - names and checked < 3:
            checked += 1
            mismatches = check(program, xla=True)
            assert not mismatches, _report(seed, program, mismatches)
        names |= found
    routines = {n[1:] for n in names}
    assert {"potrf", "trsm", "getrf", "geqrf", "ungqr", "heevd", "gesdd"} <= routines, names
    assert {n[0] for n in names} == {"c", "z"}, names


def test_stablehlo_and_plugin_sides():
    """The programs as StableHLO (XLA's translation), imported by xlapy and run through the
    PJRT plugin as JAX drives it, agree with the interpreter; an aliased program's donated
    argument buffers are deleted there and the others kept (the translation's aliases were
    dropped before: nothing was donated)."""
    seeds = [s for s in range(FIRST, FIRST + 60) if generate(s).live_aliases()][:2]
    for seed in [FIRST, FIRST + 1, *seeds]:
        program = generate(seed)
        found = check(program, configs={}, donation=False, stablehlo=True, plugin=True)
        assert not found, _report(seed, program, found)


def test_shrink_keeps_the_failure_and_cuts_the_rest():
    """Shrinking against a stand-in failure (the program holds a dot) leaves a small
    program that still holds one."""
    seed = next(s for s in range(FIRST, FIRST + 500) if " dot(" in generate(s).text())
    program = generate(seed)

    def fails(p: Program) -> bool:
        return " dot(" in p.text()

    small = shrink(program, fails)
    assert fails(small)
    ops = [i for i in small.instrs if i.opcode != "parameter"]
    assert len(ops) < len([i for i in program.instrs if i.opcode != "parameter"])
    assert all(i.opcode in ("dot", "constant") for i in ops), small.text()


# -- shrunk reproducers of bugs the fuzzer found ------------------------------------------

ALL_CONFIGS = [{}, NATIVE_OFF, {"optimize": False}]

# A dynamic-update-slice whose result is column-major over a row-major operand was done in
# place: the operand's row-major bytes were read back as the column-major result (buffer
# assignment accepted in-place pairs of different layouts; dataflow.same_layout).
DUS_LAYOUT = """HloModule dus_layout
%add_u32 (a: u32[], b: u32[]) -> u32[] {
  %a = u32[] parameter(0)
  %b = u32[] parameter(1)
  ROOT %r = u32[] add(%a, %b)
}
ENTRY %main {
  %p.1 = u32[2,4,4] parameter(0)
  %c.3 = u32[] constant(0)
  %red.4 = u32[2,4] reduce(%p.1, %c.3), dimensions={1}, to_apply=%add_u32
  %p.19 = u32[1,3] parameter(1)
  %c.20 = s32[] constant(1)
  %c.21 = s32[] constant(-2)
  %dus.22 = u32[2,4]{0,1} dynamic-update-slice(%red.4, %p.19, %c.20, %c.21)
  ROOT %root = (u32[2,4]{0,1}) tuple(%dus.22)
}
"""

# A tuple element, a get-tuple-element or a while loop's state declared row-major over a
# column-major parameter shared the parameter's buffer and read it transposed (copies are
# now inserted where layouts of values sharing a buffer differ: alias-layout-agreement).
TUPLE_LAYOUT = """HloModule tuple_layout
ENTRY %main {
  %p = f32[2,4]{0,1} parameter(0)
  %t = (f32[2,4], f32[2,4]{0,1}) tuple(%p, %p)
  %g = f32[2,4] get-tuple-element(%t), index=0
  %g1 = f32[2,4]{0,1} get-tuple-element(%t), index=1
  %n = f32[2,4] negate(%g)
  ROOT %r = (f32[2,4], f32[2,4], f32[2,4]{0,1}, f32[2,4]) tuple(%n, %g1, %g, %p)
}
"""

GTE_LAYOUT = """HloModule gte_layout
ENTRY %main {
  %p = (f32[3,2]{0,1}, s32[]) parameter(0)
  %g = f32[3,2] get-tuple-element(%p), index=0
  ROOT %r = f32[3,2] add(%g, %g)
}
"""

WHILE_LAYOUT = """HloModule while_layout
%body (s: (s32[], f16[2,4], f16[2,4])) -> (s32[], f16[2,4], f16[2,4]) {
  %s = (s32[], f16[2,4], f16[2,4]) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %buf = f16[2,4] get-tuple-element(%s), index=1
  %src = f16[2,4] get-tuple-element(%s), index=2
  %z = s32[] constant(0)
  %row = f16[1,4] dynamic-slice(%src, %i, %z), dynamic_slice_sizes={1,4}
  %old = f16[1,4] dynamic-slice(%buf, %i, %z), dynamic_slice_sizes={1,4}
  %new = f16[1,4] multiply(%row, %old)
  %buf2 = f16[2,4] dynamic-update-slice(%buf, %new, %i, %z)
  %one = s32[] constant(1)
  %i2 = s32[] add(%i, %one)
  ROOT %t = (s32[], f16[2,4], f16[2,4]) tuple(%i2, %buf2, %src)
}
%cond (s: (s32[], f16[2,4], f16[2,4])) -> pred[] {
  %s = (s32[], f16[2,4], f16[2,4]) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %n = s32[] constant(2)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}
ENTRY %main {
  %p = f16[2,4]{0,1} parameter(0)
  %c = s32[] constant(1)
  %init = (s32[], f16[2,4], f16[2,4]) tuple(%c, %p, %p)
  %while = (s32[], f16[2,4], f16[2,4]) while(%init), condition=%cond, body=%body
  ROOT %r = f16[2,4] get-tuple-element(%while), index=1
}
"""

# A conditional whose operand is column-major while its branches take row-major.
CONDITIONAL_LAYOUT = """HloModule conditional_layout
%b0 (x: f32[3,4]) -> f32[3,4] {
  %x = f32[3,4] parameter(0)
  ROOT %r = f32[3,4] negate(%x)
}
%b1 (y: f32[3,4]) -> f32[3,4]{0,1} {
  %y = f32[3,4] parameter(0)
  ROOT %r1 = f32[3,4]{0,1} add(%y, %y)
}
ENTRY %main {
  %i = s32[] parameter(0)
  %p = f32[3,4]{0,1} parameter(1)
  ROOT %c = f32[3,4] conditional(%i, %p, %p), branch_computations={%b0, %b1}
}
"""

# A concatenate of operands all empty along its dimension had no value to emit: its f16
# kernel failed to compile (elemental.py, _concatenate).
EMPTY_CONCATENATE = """HloModule empty_concatenate
ENTRY %main {
  %p.1 = f16[0] parameter(0)
  %p.2 = c64[3,0] parameter(1)
  %cat.3 = f16[0] concatenate(%p.1, %p.1, %p.1), dimensions={0}
  %cat.4 = c64[3,0] concatenate(%p.2, %p.2), dimensions={1}
  %n = c64[3,0] negate(%cat.4)
  ROOT %root = (f16[0], c64[3,0]) tuple(%cat.3, %n)
}
"""

# sort(x, x): the result sorted in place over x was written before the second operand (the
# same buffer) was read, so the second result came out permuted twice (sort_thunk.py).
SORT_SAME_OPERAND = """HloModule sort_same_operand
%argmax_f32 (a0: f32[], a1: s32[], b0: f32[], b1: s32[]) -> (f32[], s32[]) {
  %a0 = f32[] parameter(0)
  %a1 = s32[] parameter(1)
  %b0 = f32[] parameter(2)
  %b1 = s32[] parameter(3)
  %gt = pred[] compare(%a0, %b0), direction=GT
  %eq = pred[] compare(%a0, %b0), direction=EQ
  %lt = pred[] compare(%a1, %b1), direction=LT
  %tie = pred[] and(%eq, %lt)
  %pick = pred[] or(%gt, %tie)
  %v = f32[] select(%pick, %a0, %b0)
  %i = s32[] select(%pick, %a1, %b1)
  ROOT %t = (f32[], s32[]) tuple(%v, %i)
}
%cmp (a: f32[], b: f32[], c: f32[], d: f32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %c = f32[] parameter(2)
  %d = f32[] parameter(3)
  ROOT %r = pred[] compare(%a, %b), direction=LT, type=TOTALORDER
}
ENTRY %main {
  %p.4 = f32[3,5,2] parameter(0)
  %iota.7 = s32[3,5,2] iota(), iota_dimension=1
  %c.8 = f32[] constant(-inf)
  %c.9 = s32[] constant(0)
  %argmax.10 = (f32[3,2], s32[3,2]) reduce(%p.4, %iota.7, %c.8, %c.9), dimensions={1},
    to_apply=%argmax_f32
  %gte.11 = f32[3,2] get-tuple-element(%argmax.10), index=0
  %sort.16 = (f32[3,2], f32[3,2]) sort(%gte.11, %gte.11), dimensions={0}, is_stable=true,
    to_apply=%cmp
  %gte.18 = f32[3,2] get-tuple-element(%sort.16), index=1
  ROOT %root = (f32[3,2]) tuple(%gte.18)
}
"""

# An f16 cbrt (computed in f64, truncated to f32, stored as f16) over a transposed operand:
# LLVM narrowed f64 -> f16 in one step with a call to __truncdfhf2, which the JIT left
# unresolved; the kernel jumped to address 0 (a segfault; jit/engine.py RUNTIME_BUILTINS).
F16_CBRT_TRANSPOSED = """HloModule f16_cbrt_transposed
ENTRY %main {
  %p.3 = f16[2,3,6]{2,0,1} parameter(0)
  %u.4 = f16[2,3,6] cbrt(%p.3)
  %rs.6 = f16[12,3] reshape(%u.4)
  ROOT %root = (f16[12,3]) tuple(%rs.6)
}
"""

# Outputs aliased with row-major parameters but declared in other layouts ({0,1}, a 3-D
# permutation), run through the runtime: the program wrote each result in its own layout over
# the argument's bytes (donated, or the copy-protection copy), and the CPU backend handed
# those bytes back as the row-major argument, transposed (backends/cpu/backend.py, _outputs).
ALIAS_LAYOUTS = (
    "HloModule alias_layouts, "
    "input_output_alias={ {0}: (0, {}, may-alias), {1}: (1, {}, may-alias) }"
    + """
ENTRY %main {
  %p0 = f32[3,5] parameter(0)
  %p1 = s32[2,3,4] parameter(1)
  %o0 = f32[3,5]{0,1} negate(%p0)
  %o1 = s32[2,3,4]{0,2,1} reverse(%p1), dimensions={1}
  ROOT %t = (f32[3,5]{0,1}, s32[2,3,4]{0,2,1}) tuple(%o0, %o1)
}
"""
)


@pytest.mark.parametrize("donate", [[], [0, 1]])
def test_aliased_output_in_another_layout(donate):
    from program_fuzz import _client

    from xlapy.backends.interpreter import evaluate
    from xlapy.ir.parser import parse_module

    client = _client()
    exe = client.compile(ALIAS_LAYOUTS)
    for seed in range(3):
        args = module_arguments(ALIAS_LAYOUTS, seed)
        want = _leaves(evaluate(parse_module(ALIAS_LAYOUTS), [a.copy() for a in args]))
        buffers = [client.buffer_from_pyval(a.copy()) for a in args]
        outs = exe.execute_portable(buffers, client.devices()[0], donate=donate)
        for got, w in zip(outs, want, strict=True):
            np.testing.assert_array_equal(got.to_numpy(), w)


def test_xla_child_reports_a_crash_and_goes_on():
    """XLA run in a child process: a signal there (XLA:CPU died of SIGFPE at seed 600605) is
    an XlaCrashed naming it, `check` reports it as an xla-crash, not a finding about xlapy,
    and the next call starts a fresh child that answers as XLA in this process does."""
    import program_fuzz

    program = generate(FIRST)
    crashing = XlaChild(timeout=120, runner=die_of_sigfpe)
    with pytest.raises(XlaCrashed, match="signal 8"):
        crashing.run(program.text(), program.arguments())
    saved = program_fuzz._XLA_RUNNER[0]
    program_fuzz._XLA_RUNNER[0] = crashing.run
    try:
        found = check(program, xla=True, configs={})
    finally:
        program_fuzz._XLA_RUNNER[0] = saved
        crashing.close()
    assert [m.side for m in found] == ["xla-crash"], found
    child = XlaChild(timeout=120)
    try:
        text = program_fuzz._for_xla(program, program.text())
        got = child.run(text, program.arguments())
        want = xla_run(text, program.arguments())
    finally:
        child.close()
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


# XLA:CPU simplifies abs(x * x) to x * x for integers too (KNOWN_DIFFERENCES["abs-of-square"]):
# xlapy must not, where the square wrapped negative
ABS_OF_SQUARE = """
HloModule abs_of_square
ENTRY %main {
  %p = s32[1,2] parameter(0)
  %m = s32[1,2] multiply(%p, %p)
  ROOT %a = s32[1,2] abs(%m)
}
"""


def test_abs_of_a_wrapped_square():
    x = np.array([[60000, -46341]], np.int32)
    want = np.abs(x * x)
    assert (want > 0).all()
    for options in ALL_CONFIGS:
        assert differences(ABS_OF_SQUARE, [x], [options]) == []
    from xlapy.backends.interpreter import evaluate
    from xlapy.ir.parser import parse_module

    np.testing.assert_array_equal(evaluate(parse_module(ABS_OF_SQUARE), [x]), want)


REPRODUCERS = {
    "dus_layout": DUS_LAYOUT,
    "tuple_layout": TUPLE_LAYOUT,
    "gte_layout": GTE_LAYOUT,
    "while_layout": WHILE_LAYOUT,
    "conditional_layout": CONDITIONAL_LAYOUT,
    "empty_concatenate": EMPTY_CONCATENATE,
    "sort_same_operand": SORT_SAME_OPERAND,
    "f16_cbrt_transposed": F16_CBRT_TRANSPOSED,
}


@pytest.mark.parametrize("name", list(REPRODUCERS))
def test_reproducer(name):
    text = REPRODUCERS[name]
    for seed in range(3):
        args = module_arguments(text, seed)
        assert differences(text, args, ALL_CONFIGS) == []


def test_truncdfhf2_rounds_as_numpy():
    """The JIT's __truncdfhf2 (f64 -> f16) rounds every double as NumPy does: halfway cases
    to even, subnormal results, overflow to infinity, NaN kept a NaN."""
    import ctypes

    import llvmlite.binding as llvm

    from xlapy.backends.cpu.jit import engine

    engine.host_target()  # LLVM initialized
    engine._provide_builtins(b"__truncdfhf2")
    caller = llvm.parse_assembly(
        "declare half @__truncdfhf2(double)\n"
        "define void @conv(ptr %x, ptr %out, i64 %n) {\n"
        "entry:\n  br label %loop\n"
        "loop:\n  %i = phi i64 [0, %entry], [%j, %loop]\n"
        "  %px = getelementptr double, ptr %x, i64 %i\n  %v = load double, ptr %px\n"
        "  %h = call half @__truncdfhf2(double %v)\n"
        "  %po = getelementptr half, ptr %out, i64 %i\n  store half %h, ptr %po\n"
        "  %j = add i64 %i, 1\n  %more = icmp slt i64 %j, %n\n"
        "  br i1 %more, label %loop, label %done\n"
        "done:\n  ret void\n}\n"
    )
    jit = llvm.create_mcjit_compiler(caller, engine.new_target_machine())
    jit.finalize_object()
    conv = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
        jit.get_function_address("conv")
    )
    rng = np.random.default_rng(0)
    halves = rng.integers(0, 1 << 16, size=20000, dtype=np.uint16).view(np.float16)
    halves = halves[np.isfinite(halves)]
    mid = halves.astype(np.float64) * (1 + 2.0**-11)  # near the halfway points
    x = np.concatenate([
        rng.standard_normal(20000) * 10.0 ** rng.integers(-9, 6, size=20000),
        mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf),
        [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 65519.99, 2.0**-24, 2.0**-25,
         2.0**-25 * (1 + 2.0**-40), 1e-300, -1e300],
    ]).astype(np.float64)  # fmt: skip
    out = np.empty(x.shape, np.float16)
    conv(x.ctypes.data, out.ctypes.data, x.size)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    same = (out.view(np.uint16) == want.view(np.uint16)) | (np.isnan(out) & np.isnan(want))
    assert same.all(), (x[~same][:5], out[~same][:5], want[~same][:5])
