"""Round trips: JAX-produced HLO parses and prints back; printed text is a fixed point.

Golden texts come from JAX itself (both the unoptimized `as_text(dialect="hlo")` and the
optimized `compile().as_text()`), built once per test session. Property tests build random
modules (shapes, element types, elementwise ops, tuples, constants) and random mutations of
valid text.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xlapy.errors import HloParseError
from xlapy.ir.computation import HloComputation
from xlapy.ir.instruction import HloInstruction
from xlapy.ir.literal import Literal
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Opcode
from xlapy.ir.parser import parse_module
from xlapy.ir.printer import PrintOptions, print_module
from xlapy.ir.shapes import Layout, Shape
from xlapy.ir.types import PrimitiveType


def _jax_programs():
    import jax
    import jax.numpy as jnp
    from jax import lax

    def mlp(params, x, y):
        w1, b1, w2, b2 = params
        out = jnp.tanh(x @ w1 + b1) @ w2 + b2
        return jnp.mean((out - y) ** 2)

    def conv(x, w):
        dn = ("NHWC", "HWIO", "NHWC")
        y = lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=dn)
        return jax.nn.relu(y).sum()

    rng = np.random.default_rng(0)

    def rand(*shape):
        return jnp.asarray(rng.standard_normal(shape), jnp.float32)

    params = (rand(4, 8), rand(8), rand(8, 2), rand(2))
    return {
        "mlp_grad": (jax.grad(mlp), (params, rand(3, 4), rand(3, 2))),
        "conv_grad": (jax.grad(conv, argnums=(0, 1)), (rand(2, 8, 8, 3), rand(3, 3, 3, 4))),
        "fori_loop": (lambda x: lax.fori_loop(0, 10, lambda i, c: c * 2.0 + i, x), (rand(3),)),
        "cond": (lambda p, x: lax.cond(p, lambda v: v + 1, lambda v: v * 2, x), (True, rand(3))),
        "sort": (lambda x, y: lax.sort((x, y), num_keys=1), (rand(5), jnp.arange(5))),
        "scatter": (lambda x, i, u: x.at[i].add(u), (rand(5), jnp.array([1, 3]), rand(2))),
        "rng": (lambda k: jax.random.normal(k, (4,)), (jax.random.PRNGKey(1),)),
        "special_constants": (
            lambda x: x + jnp.array([1.5, np.nan, np.inf, -np.inf], jnp.float32),
            (rand(4),),
        ),
        "complex": (lambda x: x * jnp.array([1 + 2j, 3 - 1j], jnp.complex64), (rand(2),)),
        "reduce_window": (
            lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (1, 1), "SAME"),
            (rand(4, 4),),
        ),
        "gather_pad_cholesky": (
            lambda x, i: (
                lax.pad(x[i, 1:3], 0.0, [(1, 2, 1), (0, -1, 0)]).sum()
                + jnp.linalg.cholesky(jnp.eye(3)).sum()
            ),
            (rand(5, 4), jnp.array([1, 2])),
        ),
    }


@pytest.fixture(scope="module")
def jax_texts() -> dict[str, str]:
    """name -> HLO text, for the unoptimized (`.hlo`) and optimized (`.opt`) forms."""
    import jax

    texts = {}
    for name, (fn, args) in _jax_programs().items():
        lowered = jax.jit(fn).lower(*args)
        texts[f"{name}.hlo"] = lowered.as_text(dialect="hlo")
        texts[f"{name}.opt"] = lowered.compile().as_text()
    donate = jax.jit(lambda x, y: (x + y, y), donate_argnums=(0,))
    lowered = donate.lower(np.ones(3, np.float32), np.ones(3, np.float32))
    texts["donate.hlo"] = lowered.as_text(dialect="hlo")
    texts["donate.opt"] = lowered.compile().as_text()
    return texts


def _xla_style(name: str) -> PrintOptions:
    base = PrintOptions.long() if name.endswith(".opt") else PrintOptions.short()
    return dataclasses.replace(base, xla_floats=True)


def test_jax_text_prints_back_exactly(jax_texts):
    for name, text in jax_texts.items():
        module = parse_module(text, filename=name)
        assert print_module(module, _xla_style(name)) == text, name


@pytest.mark.parametrize(
    "options",
    [
        PrintOptions.short(),
        PrintOptions.long(),
        PrintOptions(operand_shapes=True, index_comments=True),
        PrintOptions(metadata=False, stack_frames=False),
    ],
    ids=["short", "long", "operand_shapes", "no_metadata"],
)
def test_printed_jax_text_is_a_fixed_point(jax_texts, options):
    for name, text in jax_texts.items():
        first = print_module(parse_module(text), options)
        assert print_module(parse_module(first), options) == first, name


def test_jax_modules_keep_their_structure(jax_texts):
    module = parse_module(jax_texts["fori_loop.hlo"])
    whiles = [i for i in module.instructions() if i.opcode is Opcode.WHILE]
    assert whiles and all(isinstance(w.attrs["body"], HloComputation) for w in whiles)
    donated = parse_module(jax_texts["donate.opt"])
    assert donated.config.is_scheduled
    assert [(e.output_index, e.param_number) for e in donated.config.input_output_alias] == [
        ((0,), 0)
    ]
    assert donated.stack_frames.file_names
    assert dict(donated.config.extra_attributes)["allow_spmd_sharding_propagation_to_output"]
    rng_module = parse_module(jax_texts["rng.opt"])
    assert any(i.control_predecessors for i in rng_module.instructions())


def test_short_and_long_forms_describe_the_same_module(jax_texts):
    for name, text in jax_texts.items():
        module = parse_module(text)
        short = print_module(module, PrintOptions.short())
        via_long = print_module(parse_module(print_module(module, PrintOptions.long())))
        assert via_long == short, name


# -- random modules ------------------------------------------------------------------------
_TYPES = [
    PrimitiveType.F32,
    PrimitiveType.F16,
    PrimitiveType.BF16,
    PrimitiveType.F64,
    PrimitiveType.F8E4M3FN,
    PrimitiveType.S32,
    PrimitiveType.U8,
    PrimitiveType.S4,
    PrimitiveType.PRED,
    PrimitiveType.C64,
]


@st.composite
def _values(draw, etype: PrimitiveType, dims: tuple[int, ...]) -> np.ndarray:
    count = int(np.prod(dims)) if dims else 1
    dtype = etype.dtype
    if etype.is_pred:
        data = draw(st.lists(st.booleans(), min_size=count, max_size=count))
        return np.array(data, dtype=dtype).reshape(dims)
    if etype.is_integral:
        info = ml_dtypes.iinfo(dtype)
        ints = st.integers(int(info.min), int(info.max))
        data = draw(st.lists(ints, min_size=count, max_size=count))
        return np.array(data, dtype=dtype).reshape(dims)
    bits = draw(
        st.lists(st.integers(0, 2 ** (8 * dtype.itemsize) - 1), min_size=count, max_size=count)
    )
    raw = np.array(bits, dtype=f"u{dtype.itemsize}")
    return raw.view(dtype).reshape(dims)


@st.composite
def _modules(draw) -> HloModule:
    etype = draw(st.sampled_from(_TYPES))
    dims = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    layout = None
    if dims and draw(st.booleans()):
        layout = Layout(tuple(draw(st.permutations(range(len(dims))))))
    shape = Shape.array(etype, dims, layout)
    comp = HloComputation("entry")
    values = []
    for n in range(draw(st.integers(1, 3))):
        values.append(
            comp.add_instruction(
                HloInstruction(f"p.{n}", Opcode.PARAMETER, shape, parameter_number=n)
            )
        )
    ops = [Opcode.ADD, Opcode.MULTIPLY, Opcode.MAXIMUM] if not etype.is_pred else [Opcode.AND]
    for n in range(draw(st.integers(0, 6))):
        choice = draw(st.sampled_from(["unary", "binary", "constant"]))
        name = f"v{n}" if draw(st.booleans()) else f"op-{n}.{n}"
        if choice == "constant":
            array = draw(_values(etype, dims))
            instr = HloInstruction(
                name, Opcode.CONSTANT, shape, literal=Literal(shape, array.copy())
            )
        elif choice == "unary":
            opcode = Opcode.NOT if etype.is_pred else Opcode.NEGATE
            instr = HloInstruction(name, opcode, shape, [draw(st.sampled_from(values))])
        else:
            operands = [draw(st.sampled_from(values)) for _ in range(2)]
            instr = HloInstruction(name, draw(st.sampled_from(ops)), shape, operands)
        values.append(comp.add_instruction(instr))
    picked = draw(st.lists(st.sampled_from(values), min_size=1, max_size=7))
    result = Shape.tuple([v.shape for v in picked])
    comp.add_instruction(HloInstruction("out", Opcode.TUPLE, result, picked))
    comp.root = comp.instructions[-1]
    module = HloModule(draw(st.sampled_from(["m", "jit_f", "a.b-c"])))
    module.add_computation(comp, entry=True)
    return module


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_modules(), st.sampled_from([PrintOptions.short(), PrintOptions.long()]))
def test_random_modules_round_trip(module, options):
    text = print_module(module, options)
    reparsed = parse_module(text)
    assert print_module(reparsed, options) == text
    for original, parsed in zip(module.entry.instructions, reparsed.entry.instructions):
        assert parsed.name == original.name and parsed.shape == original.shape
        if original.literal is not None:
            assert parsed.literal == original.literal  # bit-exact, NaN payloads included


# -- fuzzing -------------------------------------------------------------------------------
_SEED_TEXTS = [
    """HloModule fuzz, input_output_alias={ {0}: (0, {}, may-alias) }, buffer_donor={ (1, {}) }

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main (x: f32[2,3], y: f32[2,3]) -> (f32[2,3], f32[3]) {
  %x = f32[2,3]{1,0} parameter(0), metadata={op_name="x" source_line=3}
  %y = f32[2,3]{0,1:T(2,1)} parameter(1)
  %c = f32[2,3] constant({ {1, -2.5, nan}, {inf, -inf, 1e-30} })
  %t = (s32[], (pred[2], c64[])) constant((7, ({true, false}, (1, -2))))
  %z = f32[] constant(0)
  %m = f32[2,3] multiply(%x, %c), sharding={replicated}
  %r = f32[3] reduce(%m, %z), dimensions={0}, to_apply=%add
  %w = f32[2,3] reduce-window(%y, %z), window={size=1x2 stride=1x1 pad=0_0x0_1}, to_apply=%add
  %p = f32[4,6] pad(%w, %z), padding=1_1x0_3_1
  %s = f32[2,3] slice(%p), slice={[1:3], [0:6:2]}, backend_config={"k": [1, 2]}
  ROOT %o = (f32[2,3], f32[3]) tuple(%s, %r), control-predecessors={%m}
}
""",
    """HloModule small
ENTRY e {
  a = s8[4] parameter(0)
  b = s8[4] constant({-128, 0, 5, 127})
  ROOT c = s8[4] add(a, b), frontend_attributes={k="v"}
}
""",
]

_NOISE = [*'{}()[],=%:;"x_<>?*/ \n0123456789', "/*", "*/", "ROOT", "f32", "-1", "1e99"]


@st.composite
def _mutated(draw) -> str:
    text = draw(st.sampled_from(_SEED_TEXTS))
    for _ in range(draw(st.integers(1, 4))):
        if not text:
            break
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 12)))
        action = draw(st.sampled_from(["truncate", "delete", "insert", "duplicate", "replace"]))
        if action == "truncate":
            text = text[:i]
        elif action == "delete":
            text = text[:i] + text[j:]
        elif action == "insert":
            text = text[:i] + draw(st.sampled_from(_NOISE)) + text[i:]
        elif action == "duplicate":
            text = text[:j] + text[i:j] + text[j:]
        else:
            text = text[:i] + draw(st.sampled_from(_NOISE)) + text[j:]
    return text


def test_fuzz_seeds_are_valid():
    for text in _SEED_TEXTS:
        module = parse_module(text)
        assert print_module(parse_module(print_module(module))) == print_module(module)


@settings(max_examples=200, deadline=None)
@given(_mutated())
def test_mutated_text_only_ever_raises_parse_errors(text):
    try:
        module = parse_module(text)
    except HloParseError as err:
        assert err.line >= 1 and err.column >= 1
        return
    printed = print_module(module)
    assert print_module(parse_module(printed)) == printed
