"""StableHLO in, end to end: every program of jax_programs.py (the lax primitives JAX lowers
on CPU and the model programs) is lowered by JAX to StableHLO text, in the pretty and the
generic form, imported, and run on the reference interpreter; the results must match the
HLO-text path (JAX's HLO text, parsed and run the same way), and JAX itself for the model
programs and every program that uses a chlo op (whose expansion is the importer's own). A
subset runs on the CPU backend too.
"""

from __future__ import annotations

import warnings

import jax
import numpy as np
import pytest
from jax_programs import PROGRAMS, JaxProgram, jax_outputs
from test_jax_programs import assert_leaf_matches, leaves

import xlapy
from xlapy.backends.interpreter import evaluate
from xlapy.ir.parser import parse_module
from xlapy.stablehlo import import_text

NAMES = list(PROGRAMS)
MODELS = {
    "mlp_train_step",
    "transformer_block_grad",
    "convnet_train_step",
    "attention_causal",
    "attention_masked_self",
    "layer_norm_and_gelu",
}
CPU_NAMES = [
    "mlp_train_step",
    "transformer_block_grad",
    "convnet_train_step",
    "fori_loop_static_nested",
    "cond_on_data",
    "switch_in_range",
    "scan_cumulative",
    "special_functions",
    "trig_and_hyperbolic",
    "argsort_stable_ints",
    "nextafter",
]

_TEXTS: dict[str, tuple[str, str, str]] = {}


def texts(prog: JaxProgram) -> tuple[str, str, str]:
    """(StableHLO pretty text with locations, StableHLO generic text, HLO text)."""
    if prog.name not in _TEXTS:
        with prog.context(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lowered = prog.jitted().lower(*prog.args())
            generic = lowered.compiler_ir("stablehlo").operation.get_asm(
                print_generic_op_form=True, enable_debug_info=True
            )
            _TEXTS[prog.name] = (
                lowered.as_text(debug_info=True),
                generic,
                lowered.as_text(dialect="hlo"),
            )
    return _TEXTS[prog.name]


def compare(got, expected, prog: JaxProgram, what: str) -> None:
    assert len(got) == len(expected), f"{what}: {len(got)} leaves, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(got, expected, strict=True)):
        assert_leaf_matches(np.asarray(a), np.asarray(e), prog, f"{what} leaf {i}")


@pytest.mark.parametrize("name", NAMES)
def test_stablehlo_matches_hlo_path_and_jax(name):
    prog = PROGRAMS[name]
    pretty, generic, hlo = texts(prog)
    module = import_text(pretty, f"{name}.mlir")
    got = leaves(evaluate(module, prog.args()))
    via_hlo = leaves(evaluate(parse_module(hlo), prog.args()))
    compare(got, via_hlo, prog, f"{name}: StableHLO vs HLO text")
    generic_got = leaves(evaluate(import_text(generic, f"{name}.generic.mlir"), prog.args()))
    for i, (a, b) in enumerate(zip(generic_got, got, strict=True)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), (
            f"{name}: generic form differs from the pretty form at leaf {i}"
        )
    if name in MODELS or "chlo." in pretty:
        compare(got, jax_outputs(prog), prog, f"{name}: StableHLO vs JAX")


@pytest.fixture(scope="module")
def cpu():
    return xlapy.Client("cpu")


@pytest.mark.parametrize("name", CPU_NAMES)
def test_stablehlo_on_cpu_backend(cpu, name):
    prog = PROGRAMS[name]
    pretty, _, _ = texts(prog)
    executable = cpu.compile(pretty)
    args = [cpu.buffer_from_pyval(a) for a in prog.args()]
    got = [np.asarray(b) for b in executable.execute([args])[0]]
    compare(got, jax_outputs(prog), prog, f"{name} on cpu")


def test_table_covers_chlo_and_regions():
    """The table reaches the importer's special paths: chlo ops, regions that capture
    values, func.call, multiple results."""
    joined = "\n".join(texts(PROGRAMS[n])[0] for n in NAMES)
    for needle in ("chlo.", "stablehlo.while", "stablehlo.case", "call @", "stablehlo.sort"):
        assert needle in joined, needle
    assert jax.__version__
