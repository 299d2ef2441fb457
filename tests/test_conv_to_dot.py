"""conv-to-dot (passes/conv_to_dot.py): 1x1 convolutions that move nothing become dots
between reshapes, with the interpreter's numbers before and after and on the CPU backend;
the convolutions it must leave (strided, padded, dilated, wider windows, groups, NCHW,
column-major, bf16) stay convolutions."""

from __future__ import annotations

import numpy as np
import pytest

from xlapy.backends.cpu.backend import CpuProgram
from xlapy.backends.interpreter import evaluate
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.passes.pass_base import make_pass

RNG = np.random.default_rng(271127)


def conv_hlo(x, w, out, labels, window="size=1x1", extra="", t="f32", layout="") -> str:
    def shape(dims):
        return f"{t}[{','.join(map(str, dims))}]{layout}"

    return f"""HloModule conv
ENTRY e {{
  x = {shape(x)} parameter(0)
  w = {t}[{",".join(map(str, w))}] parameter(1)
  ROOT y = {shape(out)} convolution(x, w), window={{{window}}}, dim_labels={labels}{extra}
}}"""


def _opcodes(module) -> list[Opcode]:
    return [i.opcode for c in module.computations for i in c.instructions]


REWRITTEN = [
    ((8, 5, 7, 12), (1, 1, 12, 20), (8, 5, 7, 20), "b01f_01io->b01f"),  # NHWC / HWIO
    ((3, 9, 6), (1, 6, 4), (3, 9, 4), "b0f_0io->b0f"),  # one spatial dim
    ((2, 4, 3, 5), (5, 7, 1, 1), (2, 4, 3, 7), "b01f_io01->b01f"),  # kernel in I, O first
    ((2, 4, 3, 5), (7, 5, 1, 1), (2, 4, 3, 7), "b01f_oi01->b01f"),  # kernel O before I
    ((1, 1, 1, 1), (1, 1, 1, 1), (1, 1, 1, 1), "b01f_01io->b01f"),  # one element
]


@pytest.mark.parametrize("case", REWRITTEN, ids=range(len(REWRITTEN)))
def test_pointwise_convolutions_become_dots(case):
    x, w, out, labels = case
    window = "size=" + "x".join("1" for _ in x[1:-1])
    text = conv_hlo(x, w, out, labels, window)
    args = [RNG.standard_normal(x).astype(np.float32), RNG.standard_normal(w).astype(np.float32)]
    want = np.asarray(evaluate(parse_module(text), args))
    module = parse_module(text)
    assert make_pass("conv-to-dot").run(module)
    ops = _opcodes(module)
    assert Opcode.CONVOLUTION not in ops and ops.count(Opcode.DOT) == 1
    np.testing.assert_allclose(np.asarray(evaluate(module, args)), want, rtol=1e-5, atol=1e-5)
    program = CpuProgram(parse_module(text))
    listing = program.thunk_listing()
    assert "convolution" not in listing
    np.testing.assert_allclose(np.asarray(program.run(args)), want, rtol=1e-5, atol=1e-5)


LEFT = [
    ("b01f_01io->b01f", "size=1x1 stride=2x1", "", (8, 6, 6, 3), (8, 3, 6, 4)),  # strided
    ("b01f_01io->b01f", "size=1x1 pad=1_0x0_0", "", (8, 6, 6, 3), (8, 7, 6, 4)),  # padded
    ("b01f_01io->b01f", "size=1x1 lhs_dilate=2x1", "", (8, 6, 6, 3), (8, 11, 6, 4)),
    ("bf01_01io->bf01", "size=1x1", "", (8, 3, 6, 6), (8, 4, 6, 6)),  # NCHW
    ("b01f_01io->b01f", "size=1x1", ", feature_group_count=3", (8, 6, 6, 3), (8, 6, 6, 3)),
]


@pytest.mark.parametrize("case", LEFT, ids=range(len(LEFT)))
def test_other_convolutions_stay(case):
    labels, window, extra, x, out = case
    groups = 3 if "group" in extra else 1
    cin, cout = (
        (x[1] if labels.startswith("bf") else x[-1]),
        out[1 if labels.startswith("bf") else -1],
    )
    w = (1, 1, cin // groups, cout)
    text = conv_hlo(x, w, out, labels, window, extra)
    module = parse_module(text)
    assert not make_pass("conv-to-dot").run(module)
    assert Opcode.CONVOLUTION in _opcodes(module)


def test_wider_windows_bf16_and_column_major_stay():
    texts = [
        conv_hlo((2, 5, 5, 3), (3, 3, 3, 4), (2, 3, 3, 4), "b01f_01io->b01f", "size=3x3"),
        conv_hlo((2, 5, 5, 3), (1, 1, 3, 4), (2, 5, 5, 4), "b01f_01io->b01f", t="bf16"),
        conv_hlo((2, 5, 5, 3), (1, 1, 3, 4), (2, 5, 5, 4), "b01f_01io->b01f", layout="{0,1,2,3}"),
    ]
    for text in texts:
        module = parse_module(text)
        assert not make_pass("conv-to-dot").run(module)
        assert Opcode.CONVOLUTION in _opcodes(module)
