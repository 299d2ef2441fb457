"""PJRT executables over xlapy LoadedExecutables: compile (StableHLO + CompileOptionsProto),
what JAX asks about a program (outputs, devices, memory and cost analysis, optimized
text), serialization, and execution with donation."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from xlapy.ir.shapes import Shape
from xlapy.pjrt.abi import ffi
from xlapy.pjrt.buffers import BUFFER_TYPE_OF, PBuffer
from xlapy.pjrt.client import PClient, get_client, get_device
from xlapy.pjrt.core import (
    FAILED_PRECONDITION,
    INVALID_ARGUMENT,
    KEEP,
    NOT_FOUND,
    OBJECTS,
    UNIMPLEMENTED,
    PEvent,
    PjrtError,
    address,
    cstr,
    export,
    forget,
    lookup,
    named_values,
    register,
)
from xlapy.pjrt.native_execute import arm_pending, build, materialize, retire_all
from xlapy.pjrt.options import (
    compile_options_from_proto,
    device_assignment_proto,
    fields,
    proto_field,
)
from xlapy.pjrt.program import check_format, module_from_mlir
from xlapy.runtime import (
    Buffer,
    Future,
    LoadedExecutable,
)
from xlapy.runtime.futures import COMPLETED
from xlapy.runtime.host_callbacks import PARTITIONED_TARGET, TARGET, callbacks_of

_HOST_CALLBACK_TARGETS = tuple(f'custom_call_target="{t}"' for t in (TARGET, PARTITIONED_TARGET))
"""One of them is in the text of every program that calls host callbacks."""
_MEMORY_KINDS = "xla.output_memory_kinds"
"""In the text of every program whose outputs ask for memory kinds (ModuleConfig)."""


# -- executables -----------------------------------------------------------------------------
class PExecutable:
    """A PJRT_Executable or PJRT_LoadedExecutable over a runtime LoadedExecutable; the
    per-executable C arrays are shared between the two."""

    def __init__(self, info: ExecInfo, loaded: bool):
        self.info = info
        self.loaded = loaded
        self.deleted = False
        self.c = c = register(self, "PJRT_LoadedExecutable *" if loaded else "PJRT_Executable *")
        executable = info.executable  # what the Num* functions answer natively
        c.num_replicas, c.num_partitions = executable.num_replicas, executable.num_partitions
        c.num_outputs = len(info.outputs)
        if loaded:  # the native Execute of its common call (NULL: none)
            c.fast = ffi.cast("void *", info.native_entry())

    @property
    def ptr(self):
        return self.c


class ExecInfo:
    """What JAX asks about one compiled program, as C values made once."""

    def __init__(self, executable: LoadedExecutable, client: PClient):
        self.executable = executable
        self.client = client
        self.name = cstr(executable.name)
        self.fingerprint = cstr(executable.fingerprint)
        # Token outputs count, as XLA's do: JAX's ordered effects thread a token through
        # main (`!stablehlo.token {jax.token = true}`) and take it back as an output.
        leaves = [s for _, s in executable.output_shape.leaves() if s.is_array or s.is_token]
        self.outputs: list[Shape] = leaves
        self.token_outputs = tuple(i for i, s in enumerate(leaves) if s.is_token)
        """Positions of token outputs (the runtime returns the array outputs only)."""
        self.types = ffi.new("int[]", [BUFFER_TYPE_OF[s.element_type] for s in leaves] or [0])
        shapes = [s.dims if s.is_array else () for s in leaves]
        self.dims = ffi.new("int64_t[]", [d for dims in shapes for d in dims] or [0])
        self.dim_sizes = ffi.new("size_t[]", [len(dims) for dims in shapes] or [0])
        self.devices = [client.device_of(d) for d in executable.addressable_devices]
        self.device_ptrs = ffi.new("PJRT_Device *[]", [d.ptr for d in self.devices])
        assignment = executable.device_assignment
        self.logical_ids = ffi.new(
            "PJRT_LogicalDeviceIds[]",
            [(r, p) for r, row in enumerate(assignment) for p, _ in enumerate(row)],
        )
        params = executable.parameter_shapes
        kind = cstr("device")
        self.kind = kind
        self.param_kinds = ffi.new("const char *[]", [kind[0]] * max(len(params), 1))
        self.param_kind_sizes = ffi.new("size_t[]", [kind[1]] * max(len(params), 1))
        self.num_params = len(params)
        kinds = _output_kinds(executable, len(leaves))
        self.placed = tuple((i, k) for i, k in enumerate(kinds) if k != "device")
        """(position, memory kind) of the outputs wanted outside device memory."""
        self.kind_texts = [cstr(k) for k in kinds]  # kept alive with the arrays below
        self.out_kinds = ffi.new("const char *[]", [t[0] for t in self.kind_texts] or [kind[0]])
        self.out_kind_sizes = ffi.new("size_t[]", [t[1] for t in self.kind_texts] or [kind[1]])
        self.python_outputs = bool(self.token_outputs or self.placed)
        """Outputs the runtime does not make as they are (tokens, other memories): these
        calls take the Python Execute, which adds or moves them."""
        self.single = executable.num_replicas * executable.num_partitions == 1
        self.donated = tuple(sorted({a.param_number for a in _aliases(executable)}))
        """The parameters an output aliases: donated unless JAX says they may not be."""
        self._memory: Any = None  # the PMemory of inline runs' outputs (made on first use)
        self._native: Any = None  # (engine, address) of the native Execute, once built
        self.cost: Any = None
        self.proto: bytes | None = None
        self.options = b""
        """The serialized CompileOptionsProto it was compiled with."""
        text = executable.hlo_text()  # (a program image's module is parsed only if needed)
        self.host_callbacks = (
            callbacks_of(executable.module)
            if any(t in text for t in _HOST_CALLBACK_TARGETS)
            else []
        )
        """The host callbacks the program calls (kept alive with it; a deserialized
        program whose callbacks are gone is refused here)."""

    def native_entry(self) -> int:
        """The address of this executable's native Execute (native_execute.build), 0
        when its calls always take the Python path."""
        if self._native is None:
            try:
                self._native = build(self) or (None, 0)
            except Exception as e:  # never fatal: the Python Execute serves
                import warnings

                warnings.warn(f"xlapy: {self.executable.name} has no native Execute: {e}",
                              stacklevel=2)  # fmt: skip
                self._native = (None, 0)
        return self._native[1]

    def output_buffer(self, buffer: Buffer):
        """The handle of an output of an inline run (on the executable's one device, in
        its default memory)."""
        memory = self._memory
        if memory is None:
            device = self.executable.addressable_devices[0]
            memory = self._memory = self.client.by_space[id(device.default_memory_space)]
        return PBuffer.in_memory(buffer, self.client, memory).c


def _output_kinds(executable: LoadedExecutable, count: int) -> list[str]:
    """The memory kind of each of `count` outputs (ModuleConfig.output_memory_kinds), each
    checked to be one the executable's devices have."""
    if _MEMORY_KINDS not in executable.hlo_text():  # (a program image's module is not parsed)
        return ["device"] * count
    kinds = executable.module.config.output_memory_kinds
    if kinds is None:
        return ["device"] * count
    if len(kinds) != count:
        raise PjrtError(
            INVALID_ARGUMENT,
            f"{executable.name}: {len(kinds)} output memory kinds for {count} outputs",
        )
    for device in executable.addressable_devices:
        have = {space.kind for space in device.memory_spaces}
        for i, kind in enumerate(kinds):
            if kind not in have:
                raise PjrtError(
                    INVALID_ARGUMENT,
                    f"{executable.name}: output {i} asks for memory kind {kind!r}; "
                    f"xlapy device {device.id} has {sorted(have)}",
                )
    return list(kinds)


def _aliases(executable: LoadedExecutable):
    return executable.call_signature.aliases


def get_executable(ptr) -> PExecutable:
    return lookup(ptr, "executable")


def _compile(c: PClient, code: bytes, fmt: str, options: bytes) -> PExecutable:
    """Compile a program JAX hands over. A program sharded over several partitions (jit
    with NamedShardings, shard_map) is a global program: the client's compiler
    SPMD-partitions it (xlapy.passes.spmd) and each device runs its piece."""
    check_format(fmt)
    compile_options = compile_options_from_proto(options)
    # Handed over as bytes, so that a program compiled before (by this process or another)
    # comes from the CPU backend's program image, without import, passes or lowering.
    executable = c.client.compile(code, compile_options, importer=module_from_mlir)
    info = ExecInfo(executable, c)
    info.options = options
    return PExecutable(info, loaded=True)


@export("Client_Compile")
def _client_compile(args):
    c = get_client(args.client)
    program = args.program
    code = bytes(ffi.buffer(program.code, program.code_size))
    fmt = ffi.string(program.format, program.format_size).decode()
    options = bytes(ffi.buffer(args.compile_options, args.compile_options_size))
    args.executable = _compile(c, code, fmt, options).ptr


@export("Executable_Destroy")
def _executable_destroy(args):
    forget(args.executable)


@export("LoadedExecutable_Destroy")
def _loaded_destroy(args):
    forget(args.executable)


@export("LoadedExecutable_GetExecutable")
def _loaded_get_executable(args):
    e = get_executable(args.loaded_executable)
    args.executable = PExecutable(e.info, loaded=False).ptr


@export("Executable_Name", "PJRT_Executable_Text_Args")
def _executable_name(args):
    args.text, args.text_size = get_executable(args.executable).info.name


@export("Executable_NumReplicas", "PJRT_Executable_Count_Args")
def _executable_num_replicas(args):
    args.count = get_executable(args.executable).info.executable.num_replicas


@export("Executable_NumPartitions", "PJRT_Executable_Count_Args")
def _executable_num_partitions(args):
    args.count = get_executable(args.executable).info.executable.num_partitions


@export("Executable_NumOutputs", "PJRT_Executable_Count_Args")
def _executable_num_outputs(args):
    args.count = len(get_executable(args.executable).info.outputs)


@export("Executable_SizeOfGeneratedCodeInBytes")
def _executable_code_size(args):
    args.size_in_bytes = len(get_executable(args.executable).info.executable.hlo_text())


@export("Executable_OutputElementTypes")
def _executable_output_types(args):
    info = get_executable(args.executable).info
    args.output_types, args.num_output_types = info.types, len(info.outputs)


@export("Executable_OutputDimensions")
def _executable_output_dims(args):
    info = get_executable(args.executable).info
    args.num_outputs, args.dims, args.dim_sizes = len(info.outputs), info.dims, info.dim_sizes


@export("Executable_OutputMemoryKinds", "PJRT_Executable_MemoryKinds_Args")
def _executable_output_kinds(args):
    info = get_executable(args.executable).info
    args.num_kinds = len(info.outputs)
    args.memory_kinds, args.memory_kind_sizes = info.out_kinds, info.out_kind_sizes


@export("Executable_ParameterMemoryKinds", "PJRT_Executable_MemoryKinds_Args")
def _executable_param_kinds(args):
    info = get_executable(args.executable).info
    args.num_kinds = info.num_params
    args.memory_kinds, args.memory_kind_sizes = info.param_kinds, info.param_kind_sizes


@export("Executable_Fingerprint")
def _executable_fingerprint(args):
    e = get_executable(args.executable)
    args.executable_fingerprint, args.executable_fingerprint_size = e.info.fingerprint


@export("LoadedExecutable_Fingerprint")
def _loaded_fingerprint(args):
    e = get_executable(args.executable)
    args.executable_fingerprint, args.executable_fingerprint_size = e.info.fingerprint


@export("Executable_GetCostAnalysis")
def _executable_cost(args):
    info = get_executable(args.executable).info
    if info.cost is None:
        costs = info.executable.cost_analysis()
        info.cost = named_values([(k, float(v)) for k, v in sorted(costs.items())])
    args.properties, args.num_properties = info.cost[0], info.cost[1]


@export("Executable_GetCompiledMemoryStats")
def _executable_memory_stats(args):
    executable = get_executable(args.executable).info.executable
    stats = executable.memory_stats()
    args.generated_code_size_in_bytes = len(executable.hlo_text())
    args.argument_size_in_bytes = stats.argument_bytes
    args.output_size_in_bytes = stats.output_bytes
    args.alias_size_in_bytes = stats.alias_bytes
    args.temp_size_in_bytes = stats.temp_bytes
    args.host_generated_code_size_in_bytes = 0
    args.host_argument_size_in_bytes = 0
    args.host_output_size_in_bytes = 0
    args.host_alias_size_in_bytes = 0
    args.host_temp_size_in_bytes = 0
    if args.struct_size > ffi.offsetof(
        "PJRT_Executable_GetCompiledMemoryStats_Args", "peak_memory_in_bytes"
    ):
        args.peak_memory_in_bytes = stats.peak_bytes
        args.total_size_in_bytes = stats.peak_bytes
        args.total_allocation_bytes = stats.peak_bytes
        args.indefinite_allocations = 0
        args.peak_unpadded_heap_bytes = stats.temp_bytes


_OPTIMIZED_FORMAT = cstr("hlo_with_config")


def _hlo_proto(info: ExecInfo) -> bytes:
    """xlapy's compiled module as a serialized HloModuleProtoWithConfig (what JAX reads for
    `compiled.as_text()`, the output layouts and the shardings of a partitioned program):
    XLA's HLO parser reads xlapy's HLO text; the config carries the entry layout (the
    module's program shape) and the replica and partition counts. Made once per
    executable. Not StableHLO: jaxlib asks for the optimized program 8 times per compile
    (4 GetHloModules, each a size query and a copy) and would parse MLIR text and convert
    it back to HLO on each (24 ms of a 47 ms small compile); a proto it only decodes."""
    if info.proto is None:
        from jax._src.lib import xla_client

        executable = info.executable
        text = executable.hlo_text()
        try:
            module = xla_client.hlo.hlo_module_from_text(text)
        except Exception as e:
            raise PjrtError(
                UNIMPLEMENTED,
                f"XLA's parser does not read xlapy's HLO text of "
                f"{executable.name} ({e}); xlapy's text:\n{text}",
            ) from e
        proto = module.as_serialized_hlo_module_proto()
        # HloModuleProto.host_program_shape (4) is the config's entry_computation_layout (1)
        shape = next((v for n, v in fields(proto) if n == 4 and isinstance(v, bytes)), b"")
        config = (
            proto_field(1, shape)
            + proto_field(4, executable.num_replicas)
            + proto_field(5, executable.num_partitions)
        )
        if executable.num_partitions > 1:
            proto += _spmd_shardings_proto(executable.module)
        info.proto = proto_field(1, proto) + proto_field(2, config)
    return info.proto


def _spmd_shardings_proto(module) -> bytes:
    """HloModuleProto fields spmd_output_sharding (12) and spmd_parameters_shardings (14)
    of a partitioned module: where each device's piece of every parameter and output sits
    in the global array. JAX reads them (through this optimized program) to build the
    global arrays of a partitioned program's results."""
    from jax._src.lib import xla_client

    from xlapy.ir.sharding import HloSharding

    def op_sharding(s) -> bytes:
        text = s.text() if isinstance(s, HloSharding) else "{replicated}"
        return xla_client.HloSharding.from_string(text).to_proto().SerializeToString()

    entry = module.entry_computation()
    root = entry.root_instruction()
    out = root.sharding
    if root.shape.is_tuple and not root.shape.tuple_shapes:
        # XLA gives an empty tuple one (replicated) element sharding, and checks for it
        out = HloSharding("tuple", elements=(HloSharding.replicated(),))
    elif out is None and root.shape.is_tuple:
        parts = len(root.shape.tuple_shapes)
        out = HloSharding("tuple", elements=(HloSharding.replicated(),) * parts)
    data = proto_field(12, op_sharding(out))
    for p in entry.parameters:
        data += proto_field(14, op_sharding(p.sharding))
    return data


@export("Executable_OptimizedProgram")
def _executable_optimized_program(args):
    data = _hlo_proto(get_executable(args.executable).info)
    program = args.program
    program.format, program.format_size = _OPTIMIZED_FORMAT
    if program.code == ffi.NULL:
        program.code_size = len(data)
        return
    if program.code_size < len(data):
        raise PjrtError(INVALID_ARGUMENT, "program buffer too small for the optimized HLO")
    ffi.memmove(program.code, data, len(data))
    program.code_size = len(data)


SERIALIZED: dict[int, Any] = {}


@ffi.callback("void(void *)")
def serialized_deleter(handle):
    SERIALIZED.pop(address(handle), None)


@export("Executable_Serialize")
def _executable_serialize(args):
    data = get_executable(args.executable).info.executable.serialize()
    blob = ffi.new("char[]", data)
    handle = ffi.new("XlapyHandle *")
    SERIALIZED[address(handle)] = (blob, handle)
    args.serialized_bytes, args.serialized_bytes_size = blob, len(data)
    args.serialized_executable = ffi.cast("void *", handle)
    args.serialized_executable_deleter = serialized_deleter


@export("Executable_GetCompileOptions")
def _executable_compile_options(args):
    data = get_executable(args.executable).info.options
    blob = ffi.new("char[]", data or b"\0")
    handle = ffi.new("XlapyHandle *")
    SERIALIZED[address(handle)] = (blob, handle)
    args.serialized_bytes, args.serialized_bytes_size = blob, len(data)
    args.serialized_compile_options = ffi.cast("void *", handle)
    args.serialized_compile_options_deleter = serialized_deleter


@export("Client_Load")
def _client_load(args):
    e = get_executable(args.executable)
    args.loaded_executable = PExecutable(e.info, loaded=True).ptr


@export("Executable_DeserializeAndLoad")
def _executable_deserialize(args):
    c = get_client(args.client)
    data = bytes(ffi.buffer(args.serialized_executable, args.serialized_executable_size))
    executable = c.client.deserialize_executable(data)
    args.loaded_executable = PExecutable(ExecInfo(executable, c), loaded=True).ptr


@export("LoadedExecutable_AddressableDevices")
def _loaded_devices(args):
    info = get_executable(args.executable).info
    args.addressable_devices = info.device_ptrs
    args.num_addressable_devices = len(info.devices)


@export("LoadedExecutable_AddressableDeviceLogicalIds")
def _loaded_logical_ids(args):
    info = get_executable(args.executable).info
    args.addressable_device_logical_ids = info.logical_ids
    args.num_addressable_device_logical_ids = len(info.devices)


@export("LoadedExecutable_GetDeviceAssignment")
def _loaded_device_assignment(args):
    info = get_executable(args.executable).info
    data = device_assignment_proto(info.executable.device_assignment)
    blob = ffi.new("char[]", data)
    handle = ffi.new("XlapyHandle *")
    SERIALIZED[address(handle)] = (blob, handle)
    args.serialized_bytes, args.serialized_bytes_size = blob, len(data)
    args.serialized_device_assignment = ffi.cast("void *", handle)
    args.serialized_device_assignment_deleter = serialized_deleter


@export("LoadedExecutable_Delete")
def _loaded_delete(args):
    e = get_executable(args.executable)
    e.deleted = True
    e.c.fast = ffi.NULL  # its calls now fail in Python


@export("LoadedExecutable_IsDeleted")
def _loaded_is_deleted(args):
    args.is_deleted = get_executable(args.executable).deleted


def _all_ready(buffers: list[Buffer]) -> Future:
    if buffers:  # the outputs of one run share its future (runtime.execution._commit_one)
        first = buffers[0].ready()
        if all(b.contents_ready is first for b in buffers):
            return first
    pending = []
    for b in buffers:
        future = b.ready()
        if not future.done():
            pending.append(future)
        elif future.exception() is not None:
            return future
    if not pending:
        return COMPLETED
    done = Future()
    remaining = [len(pending)]
    lock = threading.Lock()

    def on_done(fut: Future) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
            if done.done():
                return
            error = fut.exception()
            if error is not None:
                done.set_exception(error)
                return
        if last:
            done.set_result(None)

    for f in pending:
        f.add_done_callback(on_done)
    return done


@export("LoadedExecutable_Execute")
def _loaded_execute(args):
    e = get_executable(args.executable)
    if e.deleted:
        raise PjrtError(FAILED_PRECONDITION, f"executable {e.info.executable.name} was deleted")
    info = e.info
    executable = info.executable
    if (
        args.num_devices == 1
        and args.execute_device == ffi.NULL
        and not info.donated
        and not info.python_outputs
    ):
        outputs = executable.execute_inline(_arguments(args.argument_lists[0], args.num_args))
        if outputs is not None:  # the common call, run already (see runtime.execution)
            if info.host_callbacks:
                _raise_failure([outputs])
            row, make = args.output_lists[0], info.output_buffer
            events = args.device_complete_events
            if events != ffi.NULL:  # the outputs of an inline run share one future
                events[0] = PEvent.of(outputs[0].ready() if outputs else COMPLETED)
            for i, out in enumerate(outputs):
                row[i] = make(out)
            return
    lists = [_arguments(args.argument_lists[d], args.num_args) for d in range(args.num_devices)]
    donate = info.donated
    options = args.options
    if donate and options != ffi.NULL and options.num_non_donatable_input_indices:
        indices = options.non_donatable_input_indices
        kept = {indices[i] for i in range(options.num_non_donatable_input_indices)}
        donate = tuple(p for p in donate if p not in kept)
    if donate:
        donate = _donatable(lists, donate)
    if donate:  # no native reader may use a buffer given away (see native_execute)
        _retire_donated(args, donate)
    if args.execute_device != ffi.NULL:
        device = get_device(args.execute_device).device
        if info.single:
            results = [executable.execute_portable(lists[0], device, donate=donate)]
        else:
            results = [executable.execute_sharded(lists[0], device, donate=donate)]
        devices = [device]
    else:
        results = executable.execute(lists, donate=donate)
        devices = executable.addressable_devices
    if info.host_callbacks:
        _raise_failure(results)
    if info.python_outputs:
        results = [_as_declared(info, out, dev) for out, dev in zip(results, devices, strict=True)]
    client = info.client
    events = args.device_complete_events
    # the runtime's outputs of one device's run are in its default memory, unless moved
    default = args.execute_device == ffi.NULL and not info.python_outputs
    for d, outputs in enumerate(results):
        row = args.output_lists[d]
        if default and info.single:
            make = info.output_buffer
            for i, out in enumerate(outputs):
                row[i] = make(out)
        else:
            for i, out in enumerate(outputs):
                row[i] = PBuffer(out, client).c
        if events != ffi.NULL:
            events[d] = PEvent.of(_all_ready(outputs))


def _raise_failure(results: list[list[Buffer]]) -> None:
    """Wait for the runs of a program that calls host callbacks and raise the first failure:
    as on XLA:CPU, a callback's exception fails the jitted call itself (left in the
    outputs, it would also fail every later call through JAX's ordered-effect tokens)."""
    for outputs in results:
        failed = outputs[0].ready().exception() if outputs else None
        if failed is not None:
            raise failed


def _as_declared(info: ExecInfo, outputs: list[Buffer], device) -> list[Buffer]:
    """`outputs` (the array outputs of one device's run) as the executable declares them:
    a buffer for each token output in its place (an empty bool array, the value JAX
    itself uses for a token), and each output wanted in another memory (pinned_host)
    moved there."""
    if info.token_outputs:
        arrays = iter(outputs)
        tokens = set(info.token_outputs)
        client = info.client.client
        empty = np.zeros(0, np.bool_)
        outputs = [
            client.buffer_from_pyval(empty, device) if i in tokens else next(arrays)
            for i in range(len(info.outputs))
        ]
    for i, kind in info.placed:
        outputs[i] = outputs[i].copy_to_memory_space(device.memory_space(kind))
    return outputs


def _donatable(lists: list[list[Buffer]], donate: tuple[int, ...]) -> tuple[int, ...]:
    """`donate` less the parameters whose buffer lends an external reference (a NumPy view
    from `np.asarray(x)`, a DLPack export): XLA:CPU keeps such a buffer and runs on a copy
    rather than fail the call, and JAX users rely on it (donating a model's parameters after
    printing one). A reference taken after this check still fails the call (DonationError)."""
    kept = {p for row in lists for p in donate if p < len(row) and row[p].has_external_references}
    return tuple(p for p in donate if p not in kept) if kept else donate


def _retire_donated(args, donate: tuple[int, ...]) -> None:
    get = OBJECTS.get
    donated = []
    for d in range(args.num_devices):
        row = args.argument_lists[d]
        for p in donate:
            if p < args.num_args:
                pb = get(row[p].index) if row[p] != ffi.NULL else None
                if pb is not None:
                    donated.append(pb)
    retire_all(donated)


def _arguments(row, count: int) -> list[Buffer]:
    """The runtime buffers of one device's argument list (a C array of PJRT_Buffer*)."""
    buffers = []
    get = OBJECTS.get
    for i in range(count):
        ptr = row[i]
        pb = get(ptr.index) if ptr != ffi.NULL else None
        if pb is None:
            pb = materialize(ptr)
        elif not pb.c.plain:
            arm_pending(pb)  # ready by now, maybe: native calls may read it from now on
        if pb is None:
            raise PjrtError(INVALID_ARGUMENT, f"argument {i} is not a live xlapy PJRT buffer")
        buffers.append(pb.buffer)
    return buffers


# -- execute contexts (accepted, unused) -----------------------------------------------------
class _ExecuteContext:
    """What an execute context handle stands for (nothing yet); `c` is its handle."""

    __slots__ = ("c",)


@export("ExecuteContext_Create")
def _execute_context_create(args):
    context = _ExecuteContext()
    context.c = c = register(context, "PJRT_ExecuteContext *")
    args.context = c
    KEEP.append(c)


@export("ExecuteContext_Destroy")
def _execute_context_destroy(args):
    forget(args.context)


# -- for users: the xlapy program behind a JAX executable -------------------------------------
def executable_of(compiled: Any) -> LoadedExecutable:
    """The xlapy LoadedExecutable behind a JAX executable compiled for the "xlapy" platform
    (`jax.jit(f).lower(...).compile()`, or its `runtime_executable()`), found by its
    fingerprint. PjrtError (NOT_FOUND) when xlapy's plugin did not compile it."""
    runtime = compiled.runtime_executable() if hasattr(compiled, "runtime_executable") else compiled
    fingerprint = getattr(runtime, "fingerprint", None)
    if isinstance(fingerprint, bytes):
        fingerprint = fingerprint.decode(errors="replace")
    for obj in list(OBJECTS.values()):
        if isinstance(obj, PExecutable) and obj.info.executable.fingerprint == fingerprint:
            return obj.info.executable
    raise PjrtError(
        NOT_FOUND,
        f"{type(compiled).__name__} (fingerprint {fingerprint!r}) was not compiled by xlapy's "
        "PJRT plugin: compile it for a device of the 'xlapy' platform",
    )


def memory_report(compiled: Any, top: int = 10) -> str:
    """xlapy's memory report of the program behind a JAX executable (see `executable_of`):
    the figures of its buffer assignment (the ones `compiled.memory_analysis()` reports,
    and the peak) and the `top` buffers live at the peak with the instructions that made
    them. `xlapy memory` on `executable_of(compiled).hlo_text()` prints the full report."""
    from xlapy.memory import report

    assignment = executable_of(compiled).memory_plan()  # the plan its program runs over
    return report.stats_text(assignment) + "\n" + report.peak_text(assignment, top)
