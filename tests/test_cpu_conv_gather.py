"""The CPU backend's gather path for small float convolutions (conv_thunk.py, `_gathered`)
against the interpreter: every float convolution of the fast-path table and every gradient
forced through it, operands and results in layouts that are not row-major, and fresh results
on every run of one program (the index arrays are kept, the values are not)."""

import zlib

import numpy as np
import pytest
from test_cpu_conv import (
    CONVS,
    GRADS,
    check,
    convolutions_stay,  # noqa: F401 (autouse fixture: 1x1 cases stay convolutions)
    random,
    test_convolution_gradients_match_interpreter,
    use_blas_paths,
)

from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.cpu.runtime import conv_thunk
from xlapy.backends.interpreter import evaluate
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module

pytestmark = pytest.mark.usefixtures("x64_mode")


@pytest.fixture(autouse=True)
def library_paths(monkeypatch):
    """No direct kernels (f32 convolutions with 4 or more output features run one on the
    arena, whatever their size): the library's paths, the gather path first."""
    use_blas_paths(monkeypatch)


@pytest.fixture
def gathers(monkeypatch):
    """Count the runs that took the gather path (every small float convolution does, with
    the direct kernels off)."""
    calls, make = [], conv_thunk._gathered

    def counted(geo, instr):
        body = make(geo, instr)

        def run(*args):
            calls.append(instr.name)
            return body(*args)

        return run

    monkeypatch.setattr(conv_thunk, "_gathered", counted)
    return calls


FLOAT_CONVS = [c for c in CONVS if np.dtype(c[3]).kind not in "iu"]  # bf16 is kind "V"


@pytest.mark.parametrize("name,xdims,kdims,dtype,f", FLOAT_CONVS, ids=[c[0] for c in FLOAT_CONVS])
def test_gather_path_matches_interpreter(gathers, name, xdims, kdims, dtype, f):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    x, k = random(rng, xdims, dtype), random(rng, kdims, dtype)
    check(f, x, k, opcode=Opcode.CONVOLUTION, scale=4.0)
    assert gathers


@pytest.mark.parametrize(
    "name,xdims,kdims,strides,padding,groups", GRADS, ids=[g[0] for g in GRADS]
)
def test_gather_path_gradients_match_interpreter(
    gathers, name, xdims, kdims, strides, padding, groups
):
    test_convolution_gradients_match_interpreter(name, xdims, kdims, strides, padding, groups)
    assert len(gathers) >= 2  # the backward-data and backward-filter convolutions


def test_integer_convolutions_keep_their_exact_path(gathers):
    rng = np.random.default_rng(11)
    _name, xdims, kdims, dtype, f = next(c for c in CONVS if c[0] == "int8_to_int32")
    check(f, random(rng, xdims, dtype), random(rng, kdims, dtype), opcode=Opcode.CONVOLUTION)
    assert not gathers


def test_large_convolutions_do_not_gather(gathers, monkeypatch):
    monkeypatch.setattr(conv_thunk, "_GATHER_MAX", 100)
    rng = np.random.default_rng(12)
    _name, xdims, kdims, dtype, f = CONVS[0]
    check(f, random(rng, xdims, dtype), random(rng, kdims, dtype), opcode=Opcode.CONVOLUTION)
    assert not gathers


LAYOUTS = """
HloModule m
ENTRY e {
  x = f32[2,5,6,3]{0,1,2,3} parameter(0)
  k = f32[4,2,3,3]{1,0,3,2} parameter(1)
  ROOT c = f32[2,4,5,6]{2,0,3,1} convolution(x, k),
    window={size=2x3 stride=1x2 pad=1_0x1_1 lhs_dilate=1x2 rhs_reversal=0x1},
    dim_labels=b01f_o01i->bf01
}
"""


def test_gather_path_with_layouts_and_fresh_runs(gathers):
    """Column-major and permuted layouts on both operands and the result, run three times
    on fresh inputs: each run's result is that run's convolution."""
    program = CpuProgram(parse_module(LAYOUTS))
    assert "fast NumPy path" in program.thunk_listing()
    rng = np.random.default_rng(13)
    for _ in range(3):
        x, k = random(rng, (2, 5, 6, 3), np.float32), random(rng, (4, 2, 3, 3), np.float32)
        want = evaluate(parse_module(LAYOUTS), [x, k])
        np.testing.assert_allclose(program.run([x, k]), want, rtol=2e-5, atol=2e-5)
    assert len(gathers) == 3
