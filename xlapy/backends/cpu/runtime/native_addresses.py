"""Entry points a native run or loop of a program calls, looked up when the program is
loaded (kept in its table as calls of these functions: a program image stores the calls, the
addresses are this process's). They live with the runtime, not the lowering that plans the
runs, so that loading an image imports no part of the compiler."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xlapy.backends.cpu.runtime.loadable import loadable
from xlapy.backends.cpu.runtime.native_pool import native_pool

if TYPE_CHECKING:
    from xlapy.backends.cpu.runtime.control_flow_thunk import WhileThunk
    from xlapy.backends.cpu.runtime.dot_thunk import DotThunk
    from xlapy.backends.cpu.runtime.kernel_thunk import KernelThunk


@loadable
def kernel_address(kernel: Any) -> int:
    """The entry of `kernel` (a jit Kernel: the runtime does not import the jit)."""
    return kernel.address


@loadable
def data_address(thunk: KernelThunk) -> int:
    return thunk.data_address()


@loadable
def pool_run_address() -> int:
    pool = native_pool()
    assert pool is not None, "a loop plans pool calls only where the native pool runs"
    return pool.run_address


@loadable
def gemm_address(dot: DotThunk) -> int:
    gemm = dot.native_gemm(float("inf"))
    assert gemm is not None, "a loop plans gemm calls only for dots that have one"
    return gemm[0]


@loadable
def gemm_list_address(dot: DotThunk, which: int) -> int:
    return dot.gemm_list_addresses()[which]


@loadable
def native_of(thunk: WhileThunk, what: str) -> int:
    """An address of `thunk`'s native loop (`what`: "address" or "table_address")."""
    native = thunk.native
    assert native is not None, "inner loops are made native before outer ones"
    if what == "address":  # (not getattr: a program image calls this, loadable.py)
        return native.address
    if what == "table_address":
        return native.table_address
    raise ValueError(f"a native loop has no {what!r}")
