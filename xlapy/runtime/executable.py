"""Executables: a compiled program (Executable, serializable) and the same program bound to
a client's devices (LoadedExecutable, runnable).

An Executable keeps the compiled module (its own copy, buffer donors already turned into
aliases), the compile options, the platform and a fingerprint. A LoadedExecutable adds the
backend program for each of its devices and the `execute*` methods.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xlapy.backends import BACKENDS, get_backend
from xlapy.backends.base import Backend, CompiledProgram, LeafAlias, alias_leaves
from xlapy.backends.collectives import DEFAULT_TIMEOUT_SECONDS, CollectiveRun, DeviceGrid
from xlapy.ir.module import HloModule
from xlapy.ir.shapes import Shape
from xlapy.runtime import checks, serialize
from xlapy.runtime.buffer import Buffer
from xlapy.runtime.errors import RuntimeApiError
from xlapy.runtime.execution import (
    CallSignature,
    commit,
    parameter_numbers,
    plan_call,
    run_inline,
)
from xlapy.runtime.options import CompileOptions

if TYPE_CHECKING:
    from xlapy.memory.buffer_assignment import BufferAssignment
    from xlapy.runtime.client import Client
    from xlapy.runtime.device import Device


def fingerprint_of(platform: str, hlo_text: str, options: CompileOptions) -> str:
    """SHA-256 (hex) of what determines a compiled program: platform, text, options."""
    blob = json.dumps(
        {"platform": platform, "hlo": hlo_text, "options": options.to_json()}, sort_keys=True
    )
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class CompiledMemoryStats:
    """Bytes a program needs, read from the buffer assignment the backend executes. An
    aliased parameter is counted once: peak = argument + output - alias + temp.
    `temp_source` says where temp_bytes comes from ("buffer-assignment", or "unavailable"
    when the module could not be planned, in which case temp_bytes is 0 and peak a lower
    bound).

    As in XLA's memory_analysis(), output_bytes counts the pointer table of every tuple
    in the output shape (8 bytes per element, `tuple_table_bytes`) besides the array
    leaves. A run hands back one buffer per array leaf and allocates no table, so while
    it lasts the device allocator holds output_bytes - tuple_table_bytes(output shape) -
    the leaves written in place into donated parameters + temp_bytes more than before
    (tests/test_memory_one_plan.py checks this rule on every test program)."""

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    peak_bytes: int
    temp_source: str


def tuple_table_bytes(shape: Shape) -> int:
    """The bytes of the pointer tables of the tuples in `shape` (8 per element), which
    output_bytes counts and a run never allocates (see CompiledMemoryStats)."""
    return sum(s.byte_size for _, s in shape.subshapes() if s.is_tuple)


def memory_stats_of(plan: Callable[[], BufferAssignment], module: HloModule) -> CompiledMemoryStats:
    """The figures of the buffer assignment `plan()` returns; when `module` cannot be
    planned (MemoryPlanningError or another XlapyError), argument/output/alias bytes from
    its shapes and temp 0."""
    from xlapy.errors import XlapyError

    try:
        stats = plan().memory_analysis()
    except XlapyError:
        params, result = _entry_shapes(module)
        arg = sum(s.byte_size for p in params for _, s in p.leaves() if s.is_array)
        out = sum(s.byte_size for _, s in result.leaves() if s.is_array)
        out += tuple_table_bytes(result)
        alias = sum(result.subshape(a.output_index).byte_size for a in alias_leaves(module))
        return CompiledMemoryStats(arg, out, alias, 0, arg + out - alias, "unavailable")
    return CompiledMemoryStats(
        stats.argument_bytes,
        stats.output_bytes,
        stats.alias_bytes,
        stats.temp_bytes,
        stats.peak_bytes,
        "buffer-assignment",
    )


def _entry_shapes(module: HloModule) -> tuple[tuple[Shape, ...], Shape]:
    """The parameter shapes and the result shape of `module`'s entry computation."""
    entry = module.entry
    if entry is None or entry.root is None:
        raise RuntimeApiError(f"module {module.name} has no entry computation with a root")
    return tuple(p.shape for p in entry.parameters), entry.root.shape


def _no_donation(donate: Any, non_donatable: Any) -> bool:
    """Whether a call names no parameters at all (None or an empty list or tuple)."""
    return _empty(donate) and _empty(non_donatable)


def _empty(numbers: Any) -> bool:
    return numbers is None or (type(numbers) in (tuple, list) and not numbers)


class Executable:
    """A compiled program, not bound to devices (PJRT's PjRtExecutable)."""

    def __init__(self, module: HloModule, options: CompileOptions, platform: str, hlo_text: str):
        self._module: HloModule | None = module
        self.options = options
        self.platform = platform
        self._hlo_text = hlo_text
        self.fingerprint = fingerprint_of(platform, hlo_text, options)
        self._name = module.name
        self._param_shapes, self._output_shape = _entry_shapes(module)
        self._known_aliases: tuple[LeafAlias, ...] | None = None
        self._memory: CompiledMemoryStats | None = None
        self._cost: dict[str, float] | None = None

    @classmethod
    def from_facts(cls, facts: Mapping[str, Any], options: CompileOptions, platform: str):
        """The executable a backend's program image describes (`facts()`), its module
        parsed from its text only when something asks for it."""
        executable = cls.__new__(cls)
        executable._module = None
        executable.options, executable.platform = options, platform
        executable._hlo_text = facts["hlo_text"]
        executable.fingerprint = facts["fingerprint"]
        executable._name = facts["name"]
        executable._param_shapes = tuple(facts["parameter_shapes"])
        executable._output_shape = facts["output_shape"]
        executable._known_aliases = tuple(facts["aliases"])
        executable._memory, executable._cost = None, None
        return executable

    def facts(self) -> dict[str, Any]:
        """What `from_facts` needs: the name, text, fingerprint, entry shapes and aliases."""
        return {
            "name": self._name,
            "hlo_text": self._hlo_text,
            "fingerprint": self.fingerprint,
            "parameter_shapes": self._param_shapes,
            "output_shape": self._output_shape,
            "aliases": alias_leaves(self.module),
        }

    @property
    def module(self) -> HloModule:
        """The compiled module (for an executable from a program image, parsed from its
        text on first use)."""
        if self._module is None:
            from xlapy.ir.parser import parse_module

            self._module = parse_module(self._hlo_text)
        return self._module

    @property
    def name(self) -> str:
        return self._name

    @property
    def num_replicas(self) -> int:
        return self.options.num_replicas

    @property
    def num_partitions(self) -> int:
        return self.options.num_partitions

    @property
    def parameter_shapes(self) -> list[Shape]:
        return list(self._param_shapes)

    @property
    def output_shape(self) -> Shape:
        return self._output_shape

    def hlo_text(self) -> str:
        """The compiled module as HLO text (aliases from buffer donors included)."""
        return self._hlo_text

    def memory_plan(self) -> BufferAssignment:
        """The buffer assignment this program runs over on its platform's backend (planned
        without generating code; MemoryPlanningError when the module cannot be planned)."""
        name = self.platform if self.platform in BACKENDS else "interpreter"
        return get_backend(name).plan_memory(
            self.module, dict(self.options.backend_options), text=self._hlo_text
        )

    def memory_stats(self) -> CompiledMemoryStats:
        """The figures of `memory_plan()`: what one run needs (see CompiledMemoryStats)."""
        if self._memory is None:
            self._memory = memory_stats_of(self.memory_plan, self.module)
        return self._memory

    def cost_analysis(self) -> dict[str, float]:
        """Estimated "flops", "transcendentals" and "bytes accessed" of one run."""
        if self._cost is None:
            from xlapy.analysis.cost import analyze_cost

            self._cost = analyze_cost(self.module).as_dict()
        return dict(self._cost)

    def serialize(self) -> bytes:
        """The executable as bytes in the format of xlapy.runtime.serialize."""
        from xlapy import __version__

        metadata = {
            "platform": self.platform,
            "fingerprint": self.fingerprint,
            "module_name": self.name,
            "options": self.options.to_json(),
            "xlapy_version": __version__,
        }
        return serialize.encode(metadata, self._hlo_text)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} on {self.platform} {self.fingerprint[:12]}>"


class LoadedExecutable(Executable):
    """An executable bound to a client's devices, ready to run (PJRT's PjRtLoadedExecutable).
    Its backend programs resolve custom calls in the client's registry, then the global one.

    Every execute method returns the output buffers at once (one per array leaf of the
    output, pre-order); the run happens on each device's worker thread, in the order calls
    were made, or on the calling thread before returning when the call runs on one idle
    device with ready inputs and the device's `inline_execution` is on. `donate` lists
    parameter numbers whose buffers the caller gives up; `non_donatable` vetoes donation
    of parameters; `strict_donation` overrides the compile option (see
    xlapy.runtime.execution for the rules)."""

    def __init__(
        self,
        executable: Executable,
        client: Client,
        backend: Backend,
        program: CompiledProgram | None = None,
    ):
        """`program`: the backend's program for the executable's one device, already made
        (from a program image); else the backend compiles it."""
        self._module = executable._module
        self.options, self.platform = executable.options, executable.platform
        self._hlo_text, self.fingerprint = executable._hlo_text, executable.fingerprint
        self._name = executable._name
        self._param_shapes, self._output_shape = executable._param_shapes, executable._output_shape
        self._known_aliases = executable._known_aliases
        self._memory, self._cost = None, None
        self.client = client
        self.backend = backend
        known = self._known_aliases
        self._aliases = alias_leaves(self.module) if known is None else known
        self._assignment = client.device_assignment(self.options)
        self._programs: dict[int, CompiledProgram] = {}
        self._positions: dict[int, tuple[int, int]] = {}
        """device id -> (replica, partition)."""
        shared: CompiledProgram | None = None
        for r, row in enumerate(self._assignment):
            for p, device_id in enumerate(row):
                self._positions[device_id] = (r, p)
                if not client.is_local_device(device_id):
                    continue
                if shared is None and program is not None:
                    shared = program
                if shared is None:  # one program; each run gets its ids from its DeviceCollectives
                    shared = backend.compile(
                        self.module,
                        {**self._backend_options(), "replica_id": r, "partition_id": p},
                        text=self.hlo_text(),
                    )
                self._programs[device_id] = shared
        self._runs = itertools.count()
        self._sharded_lock = threading.Lock()
        self._sharded_calls: dict[int, int] = {}  # device id -> execute_sharded calls
        self._sharded_runs: dict[int, tuple[CollectiveRun, int]] = {}  # k -> (run, users)
        self._portable: CompiledProgram | None = None
        self._signature = CallSignature(
            self.name, self._param_shapes, self.output_shape, self._aliases
        )
        self._devices = tuple(
            client.lookup_device(d) for row in self._assignment for d in row if d in self._programs
        )
        self._multi_device = len(self._positions) > 1
        self._only = (self._devices[0], self._programs[self._devices[0].id])
        """(device, program) of the call `execute` makes when there is one device."""
        if self.options.debug_options:
            from xlapy.runtime.debug import dump_compiled

            dump_compiled(self)

    def execute_inline(self, arguments: Sequence[Any]) -> list[Buffer] | None:
        """The common call of a one-device executable with outputs, nothing donated
        (`execute([arguments])[0]` when `run_inline` applies to it: see there), run on the
        calling thread; None, having touched nothing, when it does not apply (the caller then
        makes the general call, which also reports any error in the arguments)."""
        if self._multi_device or not self._signature.output_leaves:
            return None
        device, program = self._only
        return run_inline(self._signature, program, device, arguments)

    @property
    def call_signature(self) -> CallSignature:
        """What every call shares (parameter and output leaves, aliasing), for callers
        that replay the common call themselves (the PJRT plugin's native Execute)."""
        return self._signature

    def backend_program(self) -> CompiledProgram:
        """The backend's compiled program this executable runs (on its first device)."""
        return self._only[1]

    def memory_plan(self) -> BufferAssignment:
        """The buffer assignment the backend program of this executable's devices runs
        over (the very object it executes; MemoryPlanningError when it has none)."""
        return self.backend_program().buffer_assignment

    def _backend_options(self) -> dict[str, Any]:
        """The options' backend settings plus the client's custom-call registry (which the
        backend resolves targets in before the global registry)."""
        return {**dict(self.options.backend_options), "custom_calls": self.client.custom_calls}

    @property
    def addressable_devices(self) -> list[Device]:
        """The devices this executable runs on, replica-major."""
        return list(self._devices)

    @property
    def device_assignment(self) -> tuple[tuple[int, ...], ...]:
        return self._assignment

    def execute(
        self,
        argument_lists: Sequence[Sequence[Any]],
        *,
        donate: Iterable[int] | None = (),
        non_donatable: Iterable[int] | None = (),
        strict_donation: bool | None = None,
    ) -> list[list[Buffer]]:
        """Run on every addressable device: `argument_lists[i]` are the arguments for
        `addressable_devices[i]`; returns one list of output buffers per device."""
        devices = self._devices
        checks.sequence(argument_lists, f"{self.name}: execute's argument lists")
        if len(argument_lists) != len(devices):
            raise RuntimeApiError(
                f"{self.name} runs on {len(devices)} devices, {len(argument_lists)} argument "
                "lists were given (one per device)"
            )
        no_outputs = not self._signature.output_leaves
        if strict_donation is not None:
            checks.flag(strict_donation, f"{self.name}: strict_donation")
        if _no_donation(donate, non_donatable) and not (self._multi_device or no_outputs):
            device, program = self._only
            outputs = run_inline(self._signature, program, device, argument_lists[0])
            if outputs is not None:
                return [outputs]
        donate = parameter_numbers(self.name, "donate", donate)
        non_donatable = parameter_numbers(self.name, "non_donatable", non_donatable)
        plans = [
            self._plan(self._programs[d.id], args, d, donate, non_donatable, strict_donation)
            for d, args in zip(devices, argument_lists, strict=True)
        ]
        if self._multi_device:
            run = self._collective_run()
            for plan in plans:
                plan.collectives = run.for_device(*self._positions[plan.device.id])
        results = commit(plans, whole_execution=True)
        if no_outputs:  # nothing carries a failure (a failed check.expect_*): raise it here
            for plan in plans:
                if plan.completion is not None:
                    plan.completion.result()
        return results

    def _collective_run(self, run_id: Any = None) -> CollectiveRun:
        """What the devices of one execution share to meet in collectives. Every process
        of a distributed client numbers its executions of this executable alike, so the
        run id names the same execution everywhere."""
        timeout = dict(self.options.backend_options).get("collective_timeout")
        return CollectiveRun(
            (self.fingerprint[:16], next(self._runs) if run_id is None else run_id),
            DeviceGrid(self._assignment),
            DEFAULT_TIMEOUT_SECONDS if timeout is None else float(timeout),
            self.client.transport,
        )

    def execute_sharded(self, arguments: Sequence[Any], device: Device, **donation) -> list[Buffer]:
        """Run only the replica/partition assigned to `device`. The k-th call on each of
        the executable's devices form one execution: their collectives meet (call it
        once per device, e.g. from one thread each)."""
        checks.device(self.client, device, f"{self.name}: execute_sharded's device")
        program = self._programs.get(device.id)
        if program is None:
            raise RuntimeApiError(
                f"{self.name} is not assigned to device {device.id}; its devices are "
                f"{[d.id for d in self.addressable_devices]}"
            )
        if not self._multi_device:
            return self._run_one(program, arguments, device, **donation)
        plan = self._plan(
            program,
            arguments,
            device,
            parameter_numbers(self.name, "donate", donation.get("donate")),
            parameter_numbers(self.name, "non_donatable", donation.get("non_donatable")),
            donation.get("strict_donation"),
        )
        plan.collectives = self._sharded_run(device.id).for_device(*self._positions[device.id])
        return commit([plan])[0]

    def _sharded_run(self, device_id: int) -> CollectiveRun:
        """The run the k-th `execute_sharded` call on a device takes part in: the one of
        the k-th calls on the executable's other devices (as XLA's run ids tie the
        per-device executions of one step together)."""
        with self._sharded_lock:
            k = self._sharded_calls.get(device_id, 0)
            self._sharded_calls[device_id] = k + 1
            run, users = self._sharded_runs.get(k, (None, 0))
            if run is None:
                run = self._collective_run(("sharded", k))
            users += 1
            if users == len(self._devices):
                self._sharded_runs.pop(k, None)
            else:
                self._sharded_runs[k] = (run, users)
            return run

    def execute_portable(
        self, arguments: Sequence[Any], device: Device, **donation
    ) -> list[Buffer]:
        """Run a single-replica, single-partition program on any device of the client."""
        if self.num_replicas * self.num_partitions != 1:
            raise RuntimeApiError(
                f"{self.name} has {self.num_replicas} replicas x {self.num_partitions} "
                "partitions; execute_portable needs exactly one"
            )
        checks.device(self.client, device, f"{self.name}: execute_portable's device")
        if self._portable is None:
            self._portable = self.backend.compile(
                self.module, self._backend_options(), text=self.hlo_text()
            )
        return self._run_one(self._portable, arguments, device, **donation)

    def _run_one(
        self, program, arguments, device, *, donate=(), non_donatable=(), strict_donation=None
    ) -> list[Buffer]:
        if strict_donation is not None:
            checks.flag(strict_donation, f"{self.name}: strict_donation")
        if _no_donation(donate, non_donatable):
            outputs = run_inline(self._signature, program, device, arguments)
            if outputs is not None:
                return outputs
        plan = self._plan(
            program,
            arguments,
            device,
            parameter_numbers(self.name, "donate", donate),
            parameter_numbers(self.name, "non_donatable", non_donatable),
            strict_donation,
        )
        return commit([plan])[0]

    def _plan(self, program, args, device, donate, non_donatable, strict):
        strict = (
            self.options.strict_donation
            if strict is None
            else checks.flag(strict, f"{self.name}: strict_donation")
        )
        return plan_call(self._signature, program, args, device, donate, non_donatable, strict)
