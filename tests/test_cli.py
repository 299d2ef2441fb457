"""The command line: run, check and fmt, the .npz convention, and errors without tracebacks."""

import ml_dtypes
import numpy as np
import pytest

ADD = """HloModule add_mul

ENTRY main {
  a = f32[2,3] parameter(0)
  b = f32[2,3] parameter(1)
  sum = f32[2,3] add(a, b)
  ROOT t = (f32[2,3], f32[2,3]) tuple(sum, a)
}
"""

BF16 = """HloModule halve

ENTRY main {
  x = bf16[4] parameter(0)
  c = bf16[] constant(0.5)
  h = bf16[4] broadcast(c), dimensions={}
  ROOT y = bf16[4] multiply(x, h)
}
"""

TUPLE_PARAM = """HloModule tuple_param

ENTRY main {
  p = (f32[2], s32[3]) parameter(0)
  a = f32[2] get-tuple-element(p), index=0
  ROOT n = f32[2] negate(a)
}
"""


def test_check_ok(run_cli, write):
    code, out, _ = run_cli("check", write("m.hlo", ADD))
    assert code == 0
    assert "ok" in out and "add_mul" in out


def test_run_with_inputs_writes_outputs_in_preorder(run_cli, write, tmp_path):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 2, 3)).astype(np.float32)
    inputs, outputs = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inputs, param_0=a, param_1=b)
    code, out, err = run_cli(
        "run", write("m.hlo", ADD), "--inputs", str(inputs), "--output", str(outputs)
    )
    assert code == 0
    assert "output_0: f32[2,3]" in out and "output_1: f32[2,3]" in out
    assert "compiled in" in err and "ran once in" in err  # compile time is not run time
    with np.load(outputs) as result:
        assert sorted(result.files) == ["output_0", "output_1"]
        np.testing.assert_array_equal(result["output_0"], a + b)
        np.testing.assert_array_equal(result["output_1"], a)


def test_bf16_travels_as_bit_patterns(run_cli, write, tmp_path):
    x = np.random.default_rng(2).standard_normal(4).astype(ml_dtypes.bfloat16)
    inputs, outputs = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inputs, param_0=x.view(np.uint16))
    code, _, _ = run_cli(
        "run", write("m.hlo", BF16), "--inputs", str(inputs), "--output", str(outputs)
    )
    assert code == 0
    with np.load(outputs) as result:
        got = result["output_0"]
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got.view(ml_dtypes.bfloat16), x * ml_dtypes.bfloat16(0.5))


def test_tuple_parameter_takes_its_leaves(run_cli, write, tmp_path):
    f = np.random.default_rng(3).standard_normal(2).astype(np.float32)
    inputs, outputs = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inputs, param_0=f, param_1=np.arange(3, dtype=np.int32))
    code, _, _ = run_cli(
        "run",
        write("m.hlo", TUPLE_PARAM),
        "--inputs",
        str(inputs),
        "--output",
        str(outputs),
    )
    assert code == 0
    with np.load(outputs) as result:
        np.testing.assert_array_equal(result["output_0"], -f)


@pytest.mark.parametrize(
    "arrays, message",
    [
        (
            {"param_0": np.ones((3, 2), np.float32), "param_1": np.ones((2, 3), np.float32)},
            "param_0: expected f32[2,3], got an array of shape float32[3, 2]",
        ),
        (
            {"param_0": np.ones((2, 3), np.float64), "param_1": np.ones((2, 3), np.float32)},
            "param_0: expected f32[2,3], got an array of dtype float64[2, 3]",
        ),
        ({"param_0": np.ones((2, 3), np.float32)}, "missing param_1"),
        (
            {
                "param_0": np.ones((2, 3), np.float32),
                "param_1": np.ones((2, 3), np.float32),
                "param_7": np.ones(1),
            },
            "unexpected param_7",
        ),
    ],
)
def test_mismatched_inputs_name_the_parameter(run_cli, write, tmp_path, arrays, message):
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **arrays)
    code, _, err = run_cli("run", write("m.hlo", ADD), "--inputs", str(inputs))
    assert code == 1
    assert message in err
    assert "Traceback" not in err


def test_random_inputs_are_not_zero(run_cli, write, tmp_path):
    outputs = tmp_path / "out.npz"
    code, _, _ = run_cli("run", write("m.hlo", ADD), "--random-inputs", "--output", str(outputs))
    assert code == 0
    with np.load(outputs) as result:
        assert np.count_nonzero(result["output_0"]) == 6


def test_parse_error_prints_position_and_caret(run_cli, write):
    path = write("bad.hlo", ADD.replace("add(a, b)", "add(a, b"))
    code, _, err = run_cli("check", path)
    assert code == 1
    assert f"{path}:6:26: error: expected ',' or ')' after operand, found 'ROOT'" in err
    assert "  sum = f32[2,3] add(a, b\n" + " " * 25 + "^" in err
    assert "Traceback" not in err


def test_invalid_program_is_a_verifier_error(run_cli, write):
    path = write("bad.hlo", ADD.replace("sum = f32[2,3] add", "sum = f32[3,2] add"))
    code, _, err = run_cli("check", path)
    assert code == 1
    assert "sum" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "{m}", "--backend", "tpu", "--random-inputs"], "unknown backend 'tpu'"),
        (["run", "{m}"], "--random-inputs"),
        (["run", "/nonexistent/m.hlo"], "No such file"),
        (["run", "{m}", "--inputs", "/nonexistent/in.npz"], "cannot read inputs"),
    ],
)
def test_usage_errors(run_cli, write, argv, message):
    path = write("m.hlo", ADD)
    code, _, err = run_cli(*[a.replace("{m}", path) for a in argv])
    assert code != 0
    assert message in err
    assert "Traceback" not in err


def test_fmt_is_a_fixed_point(run_cli, write):
    code, once, _ = run_cli("fmt", write("m.hlo", ADD))
    assert code == 0
    code, twice, _ = run_cli("fmt", write("m2.hlo", once))
    assert code == 0
    assert once == twice
    code, long_form, _ = run_cli("fmt", "--long", write("m3.hlo", ADD))
    assert "ENTRY %main (a: f32[2,3], b: f32[2,3])" in long_form


def test_internal_errors_print_one_line_and_traceback_on_request(run_cli, write, monkeypatch):
    import xlapy.tools.cli as cli_module

    def broken(path, verify=True):
        raise ZeroDivisionError("integer modulo by zero")

    monkeypatch.setattr(cli_module, "load_module", broken)
    path = write("m.hlo", ADD)
    code, out, err = run_cli("check", path)
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0
    assert "internal error: ZeroDivisionError: integer modulo by zero" in err
    assert "Traceback" not in err and "--traceback" in err
    with pytest.raises(ZeroDivisionError):
        run_cli("--traceback", "check", path)
