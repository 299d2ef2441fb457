"""JAX host callbacks on the xlapy platform: `jax.debug.print` / `jax.debug.callback`,
`jax.pure_callback` and `jax.experimental.io_callback` (ordered and unordered), and
`checkify.check` lowered to a runtime error (`jax_experimental_unsafe_xla_runtime_errors`).

JAX lowers these three primitives through `callback.emit_python_callback`, which serves
its own platforms only ("cpu", "cuda", "rocm", "tpu"): on the CPU it emits a custom call
to `xla_ffi_python_cpu_callback` whose `index` names an entry of the lowering's
`host_callbacks`, and jaxlib hands the callables to XLA:CPU's FFI handler through an
execute context of its C++ client; a PJRT C API plugin never receives them. xlapy runs in
JAX's process, so it needs no channel (TPU's send/recv path) and no C++ context: its
lowering rules for the platform "xlapy" register the Python callable in xlapy's runtime
(xlapy.runtime.host_callbacks) and emit a custom call to `xlapy_host_callback` carrying the
callable's id. The rules below keep JAX's semantics: the same shardings (a callback runs
once, on device 0, in a program with automatic sharding; once per device under pmap or a
fully manual shard_map), the same ordered-effect tokens, the same result checks and
messages, and the same argument staging (the callable gets jax.Arrays on the CPU device,
under `default_device(cpu)`; with JAX_PLATFORMS=xlapy, where there is no CPU backend, on
an xlapy device).

The lowering also registers the callable with JAX (`add_host_callback`), which keeps it
alive with the lowered program and tells JAX that the program holds host callbacks (its
persistent cache and export refuse such programs); the compiled xlapy executable keeps
its callbacks alive as well.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from xlapy.runtime.host_callbacks import PARTITIONED_TARGET, TARGET, HostCallback

logger = logging.getLogger(__name__)


def install() -> None:
    """Register the "xlapy" lowering rules of JAX's callback primitives (once), and let
    `jax.debug.callback` outside jit stage its arguments on xlapy when JAX has no CPU
    backend."""
    from jax._src import callback as cb
    from jax._src import debugging
    from jax._src.interpreters import mlir

    if getattr(install, "done", False):
        return
    mlir.register_lowering(cb.pure_callback_p, _pure_lowering, platform="xlapy", cacheable=False)
    mlir.register_lowering(cb.io_callback_p, _io_lowering, platform="xlapy", cacheable=False)
    mlir.register_lowering(
        debugging.debug_callback_p, _debug_lowering, platform="xlapy", cacheable=False
    )
    mlir.register_lowering(
        debugging.debug_print_p, _debug_print_lowering, platform="xlapy", cacheable=False
    )
    from jax._src import checkify

    mlir.register_lowering(checkify.check_p, _check_lowering, platform="xlapy", cacheable=False)
    for prim in (debugging.debug_callback_p, debugging.debug_print_p):
        prim.def_impl(functools.partial(_debug_impl, prim.impl, prim))
    from jax.interpreters import mlir as public_mlir

    emit = functools.partial(_emit_python_callback, cb.emit_python_callback)
    cb.emit_python_callback = public_mlir.emit_python_callback = emit
    install.done = True  # type: ignore[attr-defined]


def _emit_python_callback(
    original: Callable,
    ctx,
    callback: Callable,
    token: Any,
    operands: Sequence[Any],
    operand_avals: Sequence[Any],
    result_avals: Sequence[Any],
    *,
    has_side_effect: bool,
    returns_token: bool = True,
    partitioned: bool = False,
    sharding: Any = None,
):
    """JAX's `mlir.emit_python_callback` (lowering rules call it directly: the sparse
    solver's CPU rule, `spsolve`), which refuses any platform but cpu / cuda / rocm / tpu:
    for xlapy the same custom call as the callback primitives' (`callback` gets and returns
    NumPy arrays, one per result aval). Returns (results, token out, None)."""
    if tuple(ctx.module_context.platforms) != ("xlapy",):
        return original(
            ctx, callback, token, operands, operand_avals, result_avals,
            has_side_effect=has_side_effect, returns_token=returns_token,
            partitioned=partitioned, sharding=sharding,
        )  # fmt: skip
    if partitioned and result_avals:
        raise ValueError("Partitioned callback not supported with return values.")
    results, token_out = emit_callback(
        ctx.replace(avals_out=list(result_avals)),
        lambda *args: tuple(callback(*args)),
        token,
        operands,
        has_side_effect=has_side_effect,
        sharding=sharding,
        name=getattr(callback, "__name__", "python callback"),
        partitioned=partitioned,
    )
    return results, token_out, None


# -- staging: where the callable's arguments live ---------------------------------------------
def _host_device() -> Any:
    """The device JAX stages callback arguments on: the first CPU device, as JAX does;
    without a CPU backend (JAX_PLATFORMS=xlapy), the first xlapy device."""
    from jax._src import xla_bridge as xb

    try:
        return xb.local_devices(backend="cpu")[0]
    except RuntimeError:
        return xb.local_devices(backend="xlapy")[0]


def _run_staged(callback: Callable, args: Sequence[Any], what: str) -> Any:
    """`callback(*args)` with the args put on the host device and that device the default
    (JAX's `*_callback_impl`); a failure is logged as JAX logs it, then raised."""
    from jax._src import api, config, mesh, sharding_impls

    device = _host_device()
    args = api.device_put(list(args), device)
    with (
        config.default_device(device),
        sharding_impls._internal_use_concrete_mesh(mesh.empty_concrete_mesh),
        mesh.use_abstract_mesh(mesh.empty_abstract_mesh),
    ):
        try:
            return callback(*args)
        except BaseException:
            logger.exception("%s failed", what)
            raise


def _debug_impl(original: Callable, prim: Any, *args, **params):
    """The impl of debug_callback_p / debug_print_p (a call outside jit): JAX's, unless JAX
    has no CPU backend, where JAX refuses; then the arguments are staged on xlapy."""
    from jax._src import xla_bridge as xb

    try:
        xb.local_devices(backend="cpu")
    except RuntimeError:
        callback = params["callback"] if "callback" in params else _print_callback(params)[0]
        _run_staged(callback, args, "jax.debug.callback")
        return ()
    return original(*args, **params)


def _print_callback(params: dict) -> tuple[Callable, Any]:
    """debug_print_p's flat callback and effect, made as JAX's rules make them."""
    from jax._src import debugging as dbg

    callback = functools.partial(
        dbg._format_print_callback,
        params["fmt"],
        dict(params["np_printoptions"]),
        params["has_placeholders"],
        params["logging_record"],
    )
    flat = dbg._make_flat_callback(params["in_tree"], callback, params["static_args"])
    return flat, dbg.ordered_debug_effect if params["ordered"] else dbg.debug_effect


# -- the custom call ----------------------------------------------------------------------
def _checked(callback: Callable, result_avals: Sequence[Any]) -> Callable:
    """`callback` with JAX's checks of its results (emit_python_callback's wrapper: count,
    shape and dtype, the same messages)."""
    from jax._src import dtypes

    def call(*args):
        out_vals = callback(*args)
        if len(out_vals) != len(result_avals):
            raise RuntimeError(
                "Mismatched number of outputs from callback. "
                f"Expected: {len(result_avals)}, Actual: {len(out_vals)}"
            )
        out_vals = tuple(dtypes.canonicalize_value(np.asarray(a)) for a in out_vals)
        for i, (out_val, out_aval) in enumerate(zip(out_vals, result_avals, strict=True)):
            if out_val.shape != out_aval.shape:
                raise RuntimeError(
                    f"Incorrect output shape for return value #{i}: "
                    f"Expected: {out_aval.shape}, Actual: {out_val.shape}"
                )
            if out_val.dtype != out_aval.dtype:
                raise RuntimeError(
                    f"Incorrect output dtype for return value #{i}: "
                    f"Expected: {out_aval.dtype}, Actual: {out_val.dtype}"
                )
        return out_vals

    return call


def _physical(aval):
    from jax._src import core, dtypes

    aval = core.physical_aval(aval)
    dtype = np.dtype("bool") if aval.dtype == dtypes.float0 else np.dtype(aval.dtype)
    return tuple(aval.shape), dtype


def emit_callback(
    ctx,
    callback: Callable,
    token: Any,
    operands: Sequence[Any],
    *,
    has_side_effect: bool,
    sharding: Any,
    name: str,
    partitioned: bool = False,
) -> tuple[list[Any], Any]:
    """The custom call to `callback` (returning one array per result of `ctx.avals_out`)
    on `operands`, threading `token` when it is not None; `partitioned`: each device calls
    it on its own pieces of the operands. Returns (results, token out)."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir.dialects import hlo
    from jax._src.sharding_impls import SdyArray, SdyArrayList

    avals_out = list(ctx.avals_out)
    entry = HostCallback(
        _checked(callback, avals_out),
        [_physical(a) for a in avals_out],
        token=token is not None,
        name=name,
    )
    ctx.module_context.add_host_callback(entry)
    result_types = [mlir.aval_to_ir_type(ctx.module_context, a) for a in avals_out]
    operands = list(operands)
    if token is not None:
        operands = [token, *operands]
        result_types = [hlo.TokenType.get(), *result_types]
        if isinstance(sharding, SdyArrayList) and avals_out:
            # one annotation per result: the token's too (as emit_python_callback does)
            first = sharding.shardings[0]
            token_sharding = SdyArray(
                mesh_shape=(), dim_shardings=(), logical_device_ids=first.logical_device_ids
            )
            sharding = SdyArrayList((token_sharding, *sharding.shardings))
    op = mlir.custom_call(
        PARTITIONED_TARGET if partitioned else TARGET,
        result_types=result_types,
        operands=operands,
        backend_config=str(entry.id),
        has_side_effect=has_side_effect,
    )
    if sharding is not None:
        mlir.set_sharding(ctx.module_context, op, sharding)
    results = list(op.results)
    token_out = results.pop(0) if token is not None else None
    return results, token_out


def _check_platform(ctx) -> None:
    if len(ctx.module_context.platforms) > 1:
        raise NotImplementedError("multi-platform lowering for python_callback")


def _pure_lowering(ctx, *args, callback, sharding, **params):
    from jax._src import callback as cb
    from jax._src import tree_util

    _check_platform(ctx)

    def host(*flat_args):
        out = _run_staged(callback, flat_args, "jax.pure_callback")
        return tuple(tree_util.tree_map(np.asarray, out))

    op_sharding = cb._callback_op_sharding(ctx.module_context.axis_context, sharding, ctx.avals_out)
    results, _ = emit_callback(
        ctx,
        host,
        None,
        args,
        has_side_effect=False,
        sharding=op_sharding,
        name="jax.pure_callback",
    )
    return results


def _io_lowering(ctx, *args, callback, sharding, ordered, **params):
    from jax._src import callback as cb
    from jax._src import tree_util
    from jax._src.interpreters import mlir

    _check_platform(ctx)

    def host(*flat_args):
        out = _run_staged(callback, flat_args, "jax.io_callback")
        return tuple(tree_util.tree_map(np.asarray, out))

    op_sharding = cb._callback_op_sharding(ctx.module_context.axis_context, sharding, ctx.avals_out)
    if not ordered:
        results, _ = emit_callback(
            ctx,
            host,
            None,
            args,
            has_side_effect=True,
            sharding=op_sharding,
            name="jax.io_callback",
        )
        return results
    effect = cb._OrderedIOEffect
    results, token = emit_callback(
        ctx,
        host,
        ctx.tokens_in.get(effect),
        args,
        has_side_effect=True,
        sharding=op_sharding,
        name="jax.io_callback (ordered)",
    )
    ctx.set_tokens_out(ctx.tokens_in.update_tokens(mlir.TokenSet({effect: token})))
    return results


def _debug_lowering(ctx, *args, effect, partitioned, callback, **params):
    """JAX's debug_callback_lowering (the shardings it picks for each axis context, the
    ordered effect's token), emitting xlapy's custom call."""
    from jax._src import callback as cb
    from jax._src import config, effects, sharding_impls
    from jax._src import debugging as dbg
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client as xc

    _check_platform(ctx)
    axis_context = ctx.module_context.axis_context
    sharding: Any = None
    if isinstance(axis_context, sharding_impls.SPMDAxisContext):
        if set(axis_context.mesh.axis_names) - axis_context.manual_axes:
            # partly manual: JAX runs the callback on the first index of the automatic axes
            lower = functools.partial(
                dbg._debug_callback_partial_auto,
                axis_context,
                effect=effect,
                partitioned=partitioned,
                callback=callback,
                **params,
            )
            return mlir.lower_fun(lower)(ctx, *args)
        if config.use_shardy_partitioner.value:
            sharding = cb._get_sdy_array_list_for_callbacks(ctx.avals_out)
        else:
            sharding = xc.OpSharding()
            sharding.type = xc.OpSharding.Type.MANUAL
    elif isinstance(axis_context, sharding_impls.ShardingContext) and not partitioned:
        if config.use_shardy_partitioner.value:
            sharding = sharding_impls.SdyArrayList(
                (sharding_impls.SdyArray(mesh_shape=(), dim_shardings=(), logical_device_ids=(0,)),)
            )
        else:
            sharding = xc.OpSharding()
            sharding.type = xc.OpSharding.Type.MAXIMAL
            sharding.tile_assignment_dimensions = [1]
            sharding.tile_assignment_devices = [0]

    def host(*flat_args):
        _run_staged(callback, flat_args, "jax.debug.callback")
        return ()

    name = "jax.debug.callback"
    if effects.ordered_effects.contains(effect):
        results, token = emit_callback(
            ctx,
            host,
            ctx.tokens_in.get(effect),
            args,
            has_side_effect=True,
            sharding=None,
            name=name + " (ordered)",
            partitioned=partitioned,
        )
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(mlir.TokenSet({effect: token})))
        return results
    results, _ = emit_callback(
        ctx,
        host,
        None,
        args,
        has_side_effect=True,
        sharding=sharding,
        name=name,
        partitioned=partitioned,
    )
    return results


def _debug_print_lowering(ctx, *args, **params):
    callback, effect = _print_callback(params)
    return _debug_lowering(
        ctx, *args, effect=effect, partitioned=params["partitioned"], callback=callback
    )


def _check_lowering(ctx, *args, err_tree, debug):
    """checkify's check_lowering_rule: with `jax_experimental_unsafe_xla_runtime_errors`
    a `checkify.check` left in a jitted program (not functionalized by `checkify.checkify`)
    becomes a callback that raises JAX's JaxRuntimeError with the check's message when the
    predicate fails; that failure fails the call, as on XLA:CPU. Without the option JAX's
    own error (a check must be functionalized)."""
    from jax._src import checkify, config

    if debug:  # a debug check only triggers when discharged
        return []
    if not config.xla_runtime_errors.value:
        raise checkify.functionalization_error
    _check_platform(ctx)
    results, _ = emit_callback(
        ctx,
        functools.partial(checkify.python_err, err_tree),
        None,
        args,
        has_side_effect=True,
        sharding=None,
        name="checkify.check",
    )
    return results
