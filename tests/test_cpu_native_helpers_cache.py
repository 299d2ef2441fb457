"""The runtime's native helpers (the MXCSR wrappers, the flushing gemm, the gemm list) are
objects of the disk cache: their IR names the gemm and OpenBLAS's thread setter as external
symbols bound to this process's addresses, so a second process loads them without LLVM
and they still call the right gemm and flush subnormals."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from xlapy.backends.cpu.codegen.emit_helpers import flushing_gemm_ir, gemm_list_ir
from xlapy.backends.cpu.jit import native_helpers
from xlapy.backends.cpu.runtime import dot_thunk

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run in a child: with argv[1] == "warm", LLVM's pipeline raises (everything must come from
# the disk cache). Prints the results of 1x1 products of 1e-20 * 1e-20 terms (a subnormal
# product) through the flushing gemm, through the gemm list in both modes, and of a normal
# product through each (float32 and float64).
CHILD = r"""
import json, sys
import numpy as np
import xlapy.backends.cpu
from xlapy.backends.cpu.jit import engine
from xlapy.backends.cpu.runtime import dot_thunk

if sys.argv[1] == "warm":
    def refuse(*args, **kwargs):
        raise AssertionError("a helper was compiled, not read from the disk cache")
    engine._run_pipeline = refuse

out = {}
for dtype, tiny in ((np.float32, 1e-20), (np.float64, 1e-160)):
    dtype = np.dtype(dtype)
    gemm = dot_thunk.flushing_gemm(dtype)
    if gemm is None:
        print(json.dumps(None))
        sys.exit(0)
    row = []
    for value in (tiny, 3.0):
        a, b, c = (np.array([[value]], dtype), np.array([[value]], dtype), np.zeros((1, 1), dtype))
        gemm(101, 111, 111, 1, 1, 1, 1.0, a.ctypes.data, 1, b.ctypes.data, 1, 0.0, c.ctypes.data, 1)
        row.append(float(c[0, 0]))
        for flush in (True, False):
            kernel = dot_thunk.gemm_list_kernel(dtype, flush)
            listed = dot_thunk.GemmList(kernel, (False, False), 1, (1, 1, 1), [(0, 0, 0, 1, 1)])
            c[0, 0] = -1
            listed.run(a.ctypes.data, b.ctypes.data, c.ctypes.data)
            row.append(float(c[0, 0]))
    lo, hi = dot_thunk._mxcsr_flush()
    out[dtype.name] = row
print(json.dumps(out))
"""


def _child(mode: str, cache: str) -> dict | None:
    env = {**os.environ, "XLAPY_CACHE_DIR": cache, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_helpers_come_from_the_disk_cache_in_a_second_process(tmp_path):
    cold = _child("cold", str(tmp_path))
    if cold is None:
        pytest.skip("no OpenBLAS gemm or not x86")
    objects = sorted(p.name for p in tmp_path.rglob("*.o"))
    assert objects  # the helpers were written
    warm = _child("warm", str(tmp_path))
    assert warm == cold
    assert sorted(p.name for p in tmp_path.rglob("*.o")) == objects
    for name, tiny in (("float32", 1e-40), ("float64", 1e-320)):
        flushed, listed_flush, listed_plain, normal, *normals = warm[name]
        assert flushed == 0.0 and listed_flush == 0.0  # the subnormal product flushed
        assert listed_plain == pytest.approx(tiny, rel=0.01)  # the plain gemm keeps it
        assert [normal, *normals] == [9.0, 9.0, 9.0]


def test_helper_ir_holds_no_address():
    found = dot_thunk.cblas_gemm_address(np.dtype(np.float32))
    if found is None:
        pytest.skip("no OpenBLAS gemm in this process")
    address, wide = found
    for text in (
        flushing_gemm_ir(np.float32, wide),
        gemm_list_ir(np.float32, wide, "blas", True),
        gemm_list_ir(np.float32, wide, "flushing", False),
    ):
        assert str(address) not in text and f"{address:x}" not in text


def test_an_external_symbol_is_bound_once():
    native_helpers._bind("xlapy_test_bound_symbol", 4096)
    native_helpers._bind("xlapy_test_bound_symbol", 4096)  # the same address again: fine
    with pytest.raises(RuntimeError, match="xlapy_test_bound_symbol is bound to 0x1000"):
        native_helpers._bind("xlapy_test_bound_symbol", 8192)
