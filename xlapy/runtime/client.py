"""The client: owns a platform's devices, memory spaces, compile cache and transfers
(PJRT's PjRtClient).

Custom calls: each client has its own custom-call registry (`register_custom_call`), looked
up before the global one, at compile time (unknown targets are compile errors) and at run
time (the backend gets the client's registry). Its targets are registered for the platform
"Host" on the "interpreter" and "cpu" clients.

Platforms: "interpreter" runs programs with the NumPy reference interpreter; "cpu" is the
platform name of the CPU backend. Until that backend exists, "cpu" runs on the interpreter
backend too, but stays a distinct platform: its executables, fingerprints and serialized
bytes say "cpu" and do not load on an "interpreter" client (nor the reverse).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from xlapy.backends import BACKENDS, get_backend
from xlapy.backends.base import Backend
from xlapy.backends.custom_calls import (
    GLOBAL_REGISTRY,
    ApiVersion,
    CustomCallRegistry,
    CustomCallTarget,
)
from xlapy.ir.module import HloModule
from xlapy.ir.opcodes import Opcode
from xlapy.ir.shapes import Shape
from xlapy.ir.types import PrimitiveType
from xlapy.runtime import checks, serialize
from xlapy.runtime.buffer import Buffer, HostBufferSemantics, host_storage
from xlapy.runtime.compiler import Compiler, check_options, check_program, phase
from xlapy.runtime.device import Device, MemorySpace
from xlapy.runtime.errors import RuntimeApiError, SerializationError
from xlapy.runtime.executable import Executable, LoadedExecutable, fingerprint_of
from xlapy.runtime.futures import COMPLETED
from xlapy.runtime.options import CompileOptions

PLATFORM_VERSION = "xlapy-pjrt 1"
# platform -> (backend name, device kind); "cpu" falls back to the interpreter until a
# backend named "cpu" is registered.
PLATFORMS = {"interpreter": ("interpreter", "interpreter"), "cpu": ("cpu", "cpu")}
MAX_DEVICES = 4096
"""The most devices a client may have per process (each has a worker thread and an
allocator; more is a mistake, not a machine)."""


class Client:
    """Devices of one platform and everything that runs on them. `distributed="mpi"`
    makes one client of the processes of an MPI job, `device_count` devices each (see
    xlapy.runtime.distributed)."""

    def __init__(
        self,
        platform: str = "cpu",
        device_count: int = 1,
        cache_size: int = 256,
        inline_execution: bool = True,
        distributed: str | None = None,
    ):
        if not isinstance(platform, str) or platform not in PLATFORMS:
            raise RuntimeApiError(
                f"unknown platform {platform!r}; available: {', '.join(sorted(PLATFORMS))}"
            )
        device_count = checks.integer(device_count, "device_count", 1, MAX_DEVICES)
        cache_size = checks.integer(cache_size, "cache_size", 0)
        inline_execution = checks.flag(inline_execution, "inline_execution")
        backend_name, kind = PLATFORMS[platform]
        self.platform = platform
        self.backend: Backend = get_backend(
            backend_name if backend_name in BACKENDS else "interpreter"
        )
        self.platform_version = f"{PLATFORM_VERSION} ({self.backend.name} backend)"
        self.process_index = 0
        self._inline_execution = bool(inline_execution)
        self._transport = None
        """How collectives reach devices of other processes (a distributed client)."""
        processes = 1
        if distributed is not None:
            if distributed != "mpi":
                raise RuntimeApiError(
                    f"unknown distributed mode {distributed!r}; the one there is is 'mpi'"
                )
            from xlapy.runtime.distributed import MpiTransport

            self._transport = MpiTransport(device_count)
            self.process_index = self._transport.process_index
            processes = self._transport.process_count
        self._devices = tuple(Device(self, i, kind) for i in range(device_count * processes))
        for device in self._devices:
            device.process_index = device.id // device_count
        self.custom_calls = CustomCallRegistry()
        self.compiler = Compiler(platform, self.custom_calls)
        self._cache: OrderedDict[tuple[str, int, int], LoadedExecutable] = OrderedDict()
        self._imaged: dict[str, str] = {}  # program image key -> the executable's fingerprint
        self._cache_size = cache_size
        self._cache_lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        self._closed = False

    # -- devices and memory ----------------------------------------------------------------
    @property
    def inline_execution(self) -> bool:
        """Whether a single-device execution on an idle device with ready inputs runs on
        the calling thread (before execute returns) instead of the device's worker thread.
        On by default: it saves the thread hand-off, tens of microseconds per call."""
        return self._inline_execution

    @inline_execution.setter
    def inline_execution(self, value: bool) -> None:
        self._inline_execution = checks.flag(value, "inline_execution")
        for device in self._devices:
            device.inline_execution = self._inline_execution

    @property
    def platform_name(self) -> str:
        return self.platform

    def devices(self) -> list[Device]:
        return list(self._devices)

    def addressable_devices(self) -> list[Device]:
        return [d for d in self._devices if d.process_index == self.process_index]

    @property
    def device_count(self) -> int:
        return len(self._devices)

    def memory_spaces(self) -> list[MemorySpace]:
        return [s for d in self._devices for s in d.memory_spaces]

    def is_local_device(self, device_id: int) -> bool:
        """Whether device `device_id` belongs to this process."""
        return self.lookup_device(device_id).process_index == self.process_index

    def lookup_device(self, device_id: int) -> Device:
        """The device with id `device_id`."""
        device_id = checks.integer(device_id, "device id")
        if not 0 <= device_id < len(self._devices):
            raise RuntimeApiError(
                f"no device {device_id} on this {self.platform} client "
                f"(it has devices 0..{len(self._devices) - 1})"
            )
        return self._devices[device_id]

    def default_device_assignment(
        self, num_replicas: int, num_partitions: int = 1
    ) -> tuple[tuple[int, ...], ...]:
        """Replica r, partition p runs on device r * num_partitions + p."""
        num_replicas = checks.integer(num_replicas, "num_replicas", 1)
        num_partitions = checks.integer(num_partitions, "num_partitions", 1)
        needed = num_replicas * num_partitions
        if needed > len(self._devices):
            raise RuntimeApiError(
                f"{num_replicas} replicas x {num_partitions} partitions need {needed} devices; "
                f"this client has {len(self._devices)}"
            )
        return tuple(
            tuple(r * num_partitions + p for p in range(num_partitions))
            for r in range(num_replicas)
        )

    def device_assignment(self, options: CompileOptions) -> tuple[tuple[int, ...], ...]:
        """The device ids of each replica (rows) and partition (columns) for `options`:
        the given assignment, checked, or the default one."""
        if options.device_assignment is None:
            return self.default_device_assignment(options.num_replicas, options.num_partitions)
        for row in options.device_assignment:
            for d in row:
                self.lookup_device(d)
        return options.device_assignment

    def memory_stats(self, device: Device | int = 0):
        """The allocator counters of a device."""
        if not isinstance(device, Device):
            device = self.lookup_device(device)
        return checks.device(self, device, "memory_stats(device)").memory_stats()

    # -- transfers -------------------------------------------------------------------------
    def buffer_from_pyval(
        self,
        array,
        device: Device | MemorySpace | None = None,
        semantics: HostBufferSemantics = HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL,
    ) -> Buffer:
        """A buffer holding `array` (NumPy or anything with the buffer protocol) on `device`
        (or in a memory space; default: device 0's default memory space)."""
        self.check_open("buffer_from_pyval")
        if not isinstance(semantics, HostBufferSemantics):
            raise RuntimeApiError(f"semantics must be a HostBufferSemantics, got {semantics!r}")
        if device is None:
            space = self._devices[0].default_memory_space
        elif isinstance(device, MemorySpace):
            space = checks.memory_space(self, device, "buffer_from_pyval")
        else:
            space = checks.device(self, device, "buffer_from_pyval").default_memory_space
        if space.device.process_index != self.process_index:
            raise RuntimeApiError(
                f"device {space.device.id} belongs to process {space.device.process_index}; "
                f"this is process {self.process_index} (see addressable_devices())"
            )
        try:
            arr = np.asarray(array)
        except (ValueError, TypeError) as e:  # ragged nesting, unconvertible objects
            raise RuntimeApiError(f"buffer_from_pyval: cannot make an array of it: {e}") from e
        try:
            etype = PrimitiveType.from_dtype(arr.dtype)
        except KeyError:
            raise RuntimeApiError(f"no xlapy element type holds NumPy dtype {arr.dtype}") from None
        shape = Shape.array(etype, arr.shape)
        return Buffer(shape, host_storage(arr, space, semantics), COMPLETED)

    # -- custom calls ----------------------------------------------------------------------
    def register_custom_call(
        self,
        name: str,
        fn,
        platform: str = "Host",
        api_version: ApiVersion | str | None = None,
    ) -> CustomCallTarget:
        """Register custom-call target `name` for programs compiled by this client only (see
        xlapy.backends.custom_calls.make_target for `fn` and `api_version`). It is found
        before a global target of the same name; registering a name twice is an error."""
        self.check_open("register_custom_call")
        return self.custom_calls.register(name, fn, platform, api_version)

    def unregister_custom_call(self, name: str, platform: str = "Host") -> None:
        """Remove this client's target `name` (no error if it is not there)."""
        self.custom_calls.unregister(name, platform)

    # -- compilation -----------------------------------------------------------------------
    def compile(
        self,
        program: HloModule | str | bytes,
        options: CompileOptions | None = None,
        *,
        importer: Callable[[bytes], HloModule] | None = None,
    ) -> LoadedExecutable:
        """A LoadedExecutable for `program` (a module, or HLO / StableHLO text or bytes as
        xlapy.load takes them), from the compile cache when the same program
        text, platform and options were compiled before and no custom-call registry it
        sees (this client's, the global one) has changed since. CustomCallError when a
        custom call's target is unknown or rejects the call. Without `options`, the
        program runs with its own replica and partition counts (`replica_count=`,
        `num_partitions=` in the module header; for a global program imported from sharded
        StableHLO, the partition count it asks for: ModuleConfig.spmd_partitions).
        `importer` turns bytes into a module instead of xlapy.load (the PJRT plugin's:
        JAX's StableHLO and its runtime tokens); its name is part of the program image's
        key, so bytes imported two ways never share an image."""
        self.check_open("compile")
        check_program(program, (HloModule, str, bytes, bytearray))
        check_options(options)
        # Text is parsed once; a module the caller passed is printed and compiled from a
        # copy, so it is never modified. Text or bytes compiled before (by this process or
        # another) come from the backend's program image, unparsed; a module, printed.
        module: HloModule | None = None
        image_key: str | None = None
        if isinstance(program, str | bytes | bytearray):  # HLO or StableHLO, text or bytes
            raw = program if isinstance(program, str) else bytes(program)
            keyed = _options_json(options)
            if importer is not None:
                keyed += f" importer={importer.__module__}.{importer.__qualname__}"
            with phase("program image key"):
                image_key = self.backend.image_key(raw, keyed)
            if image_key is not None:
                found = self._compile_from_image(image_key, options)
                if found is not None:
                    return found
            with phase("parsing"):
                if importer is not None and isinstance(raw, bytes):
                    module = importer(raw)
                else:  # (imported here: a warm compile, from the image, never reads it)
                    from xlapy.stablehlo import load

                    module = load(program)
            with phase("printing the module"):
                text = module.to_text()
        else:
            with phase("printing the module"):
                text = program.to_text()
            # a module (the PJRT plugin's programs) compiles as its text would (it is
            # compiled from a parse of that text, below), so the text keys its image; with
            # options given (without, its own config gives them, not all of it printed)
            if options is not None:
                image_key = self.backend.image_key(text, _options_json(options))
                if image_key is not None:
                    found = self._compile_from_image(image_key, options)
                    if found is not None:
                        return found
        if options is None:  # the module's own replica and partition counts
            config = (module or program).config  # type: ignore[union-attr]
            options = CompileOptions.make(
                num_replicas=max(config.replica_count, 1),
                num_partitions=max(config.num_partitions, config.spmd_partitions, 1),
            )
        key = (
            fingerprint_of(self.platform, text, options),
            self.custom_calls.version,
            GLOBAL_REGISTRY.version,
        )
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._hits += 1
                self._cache.move_to_end(key)
                return hit
            self._misses += 1
        if module is None:
            from xlapy.ir.parser import parse_module

            with phase("parsing"):
                module = parse_module(text)
        loaded = self.load(self.compiler.compile_canonical(module, options, text))
        with self._cache_lock:
            self._cache[key] = loaded
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        if image_key is not None and _imageable(loaded):
            facts = {**loaded.facts(), "options": loaded.options.to_json()}
            if self.backend.save_image(image_key, facts, loaded.backend_program()):
                self._remember_image(image_key, loaded.fingerprint)
        return loaded

    def _compile_from_image(
        self, image_key: str, options: CompileOptions | None
    ) -> LoadedExecutable | None:
        """The executable of the program imaged under `image_key` (see Backend.image_key):
        this client's own when it compiled it before, else made from the image; None on a
        miss."""
        fingerprint = self._imaged.get(image_key)
        if fingerprint is not None:
            key = (fingerprint, self.custom_calls.version, GLOBAL_REGISTRY.version)
            with self._cache_lock:
                hit = self._cache.get(key)
                if hit is not None:
                    self._hits += 1
                    self._cache.move_to_end(key)
                    return hit
        state = {"custom_calls": self.custom_calls, "replica_id": 0, "partition_id": 0}
        found = self.backend.load_image(image_key, state)
        if found is None:
            return None
        facts, program = found
        try:
            resolved = options or CompileOptions.from_json(facts["options"])
            executable = Executable.from_facts(facts, resolved, self.platform)
        except (KeyError, TypeError, ValueError):
            return None
        loaded = LoadedExecutable(executable, self, self.backend, program)
        key = (executable.fingerprint, self.custom_calls.version, GLOBAL_REGISTRY.version)
        with self._cache_lock:
            self._misses += 1
            self._cache[key] = loaded
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        self._remember_image(image_key, executable.fingerprint)
        return loaded

    def _remember_image(self, image_key: str, fingerprint: str) -> None:
        """Note which executable the program imaged under `image_key` is (a few entries
        more than the compile cache holds; the oldest are forgotten)."""
        if len(self._imaged) >= 2 * self._cache_size:
            self._imaged.pop(next(iter(self._imaged)))
        self._imaged[image_key] = fingerprint

    def load(self, executable: Executable) -> LoadedExecutable:
        """Bind a compiled executable to this client's devices; its custom calls are
        checked against this client's registry (CustomCallError)."""
        self.check_open("load")
        if executable.platform != self.platform:
            raise RuntimeApiError(
                f"executable {executable.name} was compiled for platform "
                f"'{executable.platform}', this client is '{self.platform}'"
            )
        self.compiler.check_custom_calls(executable.module)
        return LoadedExecutable(executable, self, self.backend)

    def compile_cache_stats(self) -> dict[str, int]:
        with self._cache_lock:
            return {"hits": self._hits, "misses": self._misses, "entries": len(self._cache)}

    def clear_compile_cache(self) -> None:
        with self._cache_lock:
            self._cache.clear()

    def deserialize_executable(self, data: bytes) -> LoadedExecutable:
        """Load bytes made by Executable.serialize(); SerializationError when they are
        truncated, corrupted, of another format version or another platform."""
        decoded = serialize.decode(data)
        meta = decoded.metadata
        platform = meta.get("platform")
        if platform != self.platform:
            raise SerializationError(
                f"serialized executable is for platform '{platform}', this client is "
                f"'{self.platform}'"
            )
        try:
            options = CompileOptions.from_json(meta["options"])
        except (KeyError, TypeError) as e:
            raise SerializationError(f"serialized executable has bad options: {e}") from e
        executable = self.compiler.load_text(decoded.hlo_text, options)
        if executable.fingerprint != meta.get("fingerprint"):
            raise SerializationError(
                "serialized executable's fingerprint does not match its contents"
            )
        return self.load(executable)

    def close(self) -> None:
        """Stop the device worker threads (queued work finishes first). Later compiles,
        transfers and executions raise RuntimeApiError; existing buffers stay readable."""
        self._closed = True
        for d in self._devices:
            d.stop()

    def check_open(self, what: str) -> None:
        """RuntimeApiError naming `what` once the client was closed."""
        if self._closed:
            raise RuntimeApiError(
                f"{what}: the client was closed (client.close()); make a new Client"
            )

    @property
    def transport(self):
        """The transport between processes (MPI), None in a one-process client."""
        return self._transport

    def __repr__(self) -> str:
        return f"Client(platform={self.platform!r}, device_count={len(self._devices)})"


_NOT_IMAGED = frozenset({Opcode.INFEED, Opcode.OUTFEED, Opcode.SEND, Opcode.RECV})
"""Instructions whose run depends on the process beyond a program image's key (a client's
feeds and channels). A custom call's target is looked up again where an image is loaded
(the backend's load_image)."""


def _options_json(options: CompileOptions | None) -> str:
    """`options` as the JSON a program image is keyed by ("null": the module's own)."""
    return json.dumps(None if options is None else options.to_json(), sort_keys=True, default=repr)


def _imageable(loaded: LoadedExecutable) -> bool:
    """Whether a backend may image `loaded`: one device, no debug options (they dump at
    compile time), no instruction in _NOT_IMAGED, every custom call still in the program
    the backend compiled."""
    if loaded.options.debug_options or loaded.num_replicas * loaded.num_partitions != 1:
        return False
    if len(loaded.addressable_devices) != 1:
        return False
    opcodes = [instr.opcode for instr in loaded.module.instructions()]
    if any(op in _NOT_IMAGED for op in opcodes):
        return False
    # A custom call the passes removed was checked by the compile against the registry;
    # an image could not check it again: such a program has no image.
    compiled = loaded.backend_program().module.instructions()
    kept = sum(1 for instr in compiled if instr.opcode is Opcode.CUSTOM_CALL)
    return kept == opcodes.count(Opcode.CUSTOM_CALL)
