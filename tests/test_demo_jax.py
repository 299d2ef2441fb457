"""`make demo` (examples/jax_on_xlapy.py) end to end, with fewer steps: the loss falls on
xlapy and agrees with XLA:CPU's, and the memory report of the step is printed."""

import importlib.util
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "examples" / "jax_on_xlapy.py"


def test_demo_trains_on_xlapy_and_reports_memory(capsys):
    spec = importlib.util.spec_from_file_location("jax_on_xlapy", DEMO)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    assert demo.main(["--steps", "40", "--timing-steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "same steps on XLA:CPU" in out and "xlapy / XLA:CPU" in out
    assert "alias" in out and "memory_analysis:" in out and "Peak buffers:" in out
