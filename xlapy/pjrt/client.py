"""The PJRT client, its devices, device descriptions, memories and topology, and the
plugin's attributes: JAX's view of an xlapy runtime Client."""

from __future__ import annotations

import hashlib
import os
from typing import Any

from xlapy.pjrt import native
from xlapy.pjrt.abi import ffi
from xlapy.pjrt.core import (
    INVALID_ARGUMENT,
    OBJECTS,
    PLATFORM_NAME,
    PjrtError,
    address,
    cstr,
    export,
    lookup,
    named_values,
    register,
)
from xlapy.runtime import (
    Client,
)
from xlapy.runtime.device import MEMORY_KINDS


def _stablehlo_versions() -> tuple[list[int], list[int]]:
    try:
        from jaxlib.mlir.dialects import stablehlo

        current = [int(p) for p in stablehlo.get_current_version().split(".")]
        minimum = [int(p) for p in stablehlo.get_minimum_version().split(".")]
        return current, minimum
    except Exception:
        return [1, 0, 0], [0, 9, 0]


_ATTRIBUTES: Any = None


@export("Plugin_Initialize")
def _plugin_initialize(args):
    return None


@export("Plugin_Attributes")
def _plugin_attributes(args):
    global _ATTRIBUTES
    if _ATTRIBUTES is None:
        from xlapy import __version__

        current, minimum = _stablehlo_versions()
        _ATTRIBUTES = named_values(
            [
                ("xla_version", 2),
                ("stablehlo_current_version", current),
                ("stablehlo_minimum_version", minimum),
                ("xlapy_version", __version__),
            ]
        )
    args.attributes, args.num_attributes = _ATTRIBUTES[0], _ATTRIBUTES[1]


# -- client, devices, memories -------------------------------------------------------------
class PMemory:
    """A PJRT_Memory (its struct starts with the memory function table)."""

    def __init__(self, space, device: PDevice):
        self.space = space
        self.device = device
        self.c = register(self, "PJRT_Memory *")
        self.c.vtable = _MEMORY_TABLE
        self.kind = cstr(space.kind)
        self.c.kind, self.c.kind_size = self.kind
        text = f"{PLATFORM_NAME}:{device.device.id} {space.kind} memory (id {space.id})"
        self.debug = cstr(text)
        self.text = cstr(f"MEMORY_SPACE_{space.id}")
        self.user_data: dict[int, Any] = {}
        self.devices = ffi.new("PJRT_Device *[]", [device.ptr])

    @property
    def ptr(self):
        return self.c


USER_DATA_SLOTS = 4


@ffi.callback("void *(PJRT_Memory *, const void *)")
def _mem_get_user_data(memory, key):
    obj = OBJECTS.get(memory.index)
    if obj is None:
        return ffi.NULL
    entry = obj.user_data.get(address(key))
    return ffi.NULL if entry is None else entry[0]


@ffi.callback("void(PJRT_Memory *, const void *, void *, void (*)(void *))")
def _mem_set_user_data(memory, key, data, dtor):
    obj = OBJECTS.get(memory.index)
    if obj is not None:
        old = obj.user_data.pop(address(key), None)
        if old is not None and old[1] != ffi.NULL:
            old[1](old[0])
        obj.user_data[address(key)] = (data, dtor)
        # what the native lookup answers: up to USER_DATA_SLOTS keys (jaxlib uses two)
        keys = [address(memory.user_keys[i]) for i in range(USER_DATA_SLOTS)]
        slot = keys.index(address(key)) if address(key) in keys else None
        if slot is None:
            slot = keys.index(0) if 0 in keys else 0
        memory.user_keys[slot], memory.user_data[slot] = key, data


_MEMORY_TABLE = ffi.new("PJRT_Memory_FunctionTable *")
_MEMORY_TABLE.struct_size = ffi.sizeof("PJRT_Memory_FunctionTable")
_MEMORY_TABLE.instance_struct_size = ffi.sizeof("PJRT_Memory")
_MEMORY_TABLE.get_user_data = _mem_get_user_data  # native.py may put a fast path here
_MEMORY_TABLE.set_user_data = _mem_set_user_data


class PDevice:
    """A PJRT_Device and its PJRT_DeviceDescription (two handles, one object)."""

    def __init__(self, device, client: PClient):
        self.device = device
        self.client = client
        self.c = register(self, "PJRT_Device *")
        self.desc_c = register(self, "PJRT_DeviceDescription *")
        self.kind = cstr(f"xlapy {device.kind}")
        self.debug = cstr(f"{PLATFORM_NAME}:{device.id} ({device.kind} via xlapy)")
        self.text = cstr(f"XlapyDevice(id={device.id})")
        self.attributes = named_values([])
        self.memories: list[PMemory] = []
        self.memory_ptrs: Any = None

    @property
    def ptr(self):
        return self.c

    @property
    def desc_ptr(self):
        return self.desc_c

    def default_memory(self) -> PMemory:
        return self.memories[0]


class PClient:
    """A PJRT_Client over an xlapy runtime Client."""

    def __init__(self, device_count: int):
        self.client = Client("cpu", device_count=device_count)
        self.c = register(self, "PJRT_Client *")
        if native.ADDRESSES:  # native code allocates and frees: the counts go native
            for device in self.client.devices():
                device.allocator.use_counters(native.NativeCounters(MEMORY_KINDS))
        self.name = cstr(PLATFORM_NAME)
        self.version = cstr(self.client.platform_version)
        self.devices = [PDevice(d, self) for d in self.client.devices()]
        self.by_device = {d.device.id: d for d in self.devices}
        self.memories: list[PMemory] = []
        for d in self.devices:
            d.memories = [PMemory(s, d) for s in d.device.memory_spaces]
            d.memory_ptrs = ffi.new("PJRT_Memory *[]", [m.ptr for m in d.memories])
            self.memories.extend(d.memories)
        self.by_space = {id(m.space): m for m in self.memories}
        self.device_ptrs = ffi.new("PJRT_Device *[]", [d.ptr for d in self.devices])
        self.memory_ptrs = ffi.new("PJRT_Memory *[]", [m.ptr for m in self.memories])
        self.topology = PTopology(self)

    @property
    def ptr(self):
        return self.c

    def device_of(self, device) -> PDevice:
        return self.by_device[device.id]

    def memory_of(self, space) -> PMemory:
        return self.by_space[id(space)]


class PTopology:
    """The client's PJRT_TopologyDescription."""

    def __init__(self, client: PClient):
        self.client = client
        self.c = register(self, "PJRT_TopologyDescription *")
        self.descs = ffi.new("PJRT_DeviceDescription *[]", [d.desc_ptr for d in client.devices])
        self.attributes = named_values([])

    @property
    def ptr(self):
        return self.c


def _device_count(args) -> int:
    count = int(os.environ.get("XLAPY_DEVICE_COUNT", "1"))
    for i in range(args.num_options):
        option = args.create_options[i]
        name = ffi.string(option.name, option.name_size).decode()
        if name == "device_count" and option.type == 1:
            count = int(option.int64_value)
        elif name == "device_count" and option.type == 0:  # jax_pjrt_client_create_options
            count = int(ffi.string(option.string_value, option.value_size))
    if count < 1:
        raise PjrtError(INVALID_ARGUMENT, f"device_count must be >= 1, got {count}")
    return count


@export("Client_Create")
def _client_create(args):
    args.client = PClient(_device_count(args)).ptr


@export("Client_Destroy")
def _client_destroy(args):
    # The client's devices and memories stay valid: buffers JAX still holds may refer to
    # them until the process ends. Its worker threads are daemons.
    return None


def get_client(ptr) -> PClient:
    return lookup(ptr, "client")


@export("Client_PlatformName")
def _client_platform_name(args):
    c = get_client(args.client)
    args.platform_name, args.platform_name_size = c.name


@export("Client_ProcessIndex")
def _client_process_index(args):
    args.process_index = get_client(args.client).client.process_index


@export("Client_PlatformVersion")
def _client_platform_version(args):
    c = get_client(args.client)
    args.platform_version, args.platform_version_size = c.version


@export("Client_Devices")
def _client_devices(args):
    c = get_client(args.client)
    args.devices, args.num_devices = c.device_ptrs, len(c.devices)


@export("Client_AddressableDevices")
def _client_addressable_devices(args):
    c = get_client(args.client)
    args.addressable_devices, args.num_addressable_devices = c.device_ptrs, len(c.devices)


@export("Client_LookupDevice")
def _client_lookup_device(args):
    c = get_client(args.client)
    args.device = c.device_of(c.client.lookup_device(args.id)).ptr


@export("Client_LookupAddressableDevice")
def _client_lookup_addressable_device(args):
    c = get_client(args.client)
    args.addressable_device = c.device_of(c.client.lookup_device(args.local_hardware_id)).ptr


@export("Client_AddressableMemories")
def _client_addressable_memories(args):
    c = get_client(args.client)
    args.addressable_memories, args.num_addressable_memories = c.memory_ptrs, len(c.memories)


@export("Client_DefaultDeviceAssignment")
def _client_default_device_assignment(args):
    c = get_client(args.client)
    rows = c.client.default_device_assignment(args.num_replicas, args.num_partitions)
    flat = [d for row in rows for d in row]
    if args.default_assignment_size < len(flat):
        raise PjrtError(INVALID_ARGUMENT, "default_assignment_size is too small")
    for i, d in enumerate(flat):
        args.default_assignment[i] = d


@export("Client_TopologyDescription")
def _client_topology(args):
    args.topology = get_client(args.client).topology.ptr


@export("TopologyDescription_Destroy")
def _topology_destroy(args):
    return None  # owned by the client


@export("TopologyDescription_PlatformName", "PJRT_TopologyDescription_Text_Args")
def _topology_platform_name(args):
    t = lookup(args.topology, "topology")
    args.text, args.text_size = t.client.name


@export("TopologyDescription_PlatformVersion", "PJRT_TopologyDescription_Text_Args")
def _topology_platform_version(args):
    t = lookup(args.topology, "topology")
    args.text, args.text_size = t.client.version


@export("TopologyDescription_GetDeviceDescriptions")
def _topology_descriptions(args):
    t = lookup(args.topology, "topology")
    args.descriptions, args.num_descriptions = t.descs, len(t.client.devices)


@export("TopologyDescription_Fingerprint")
def _topology_fingerprint(args):
    t = lookup(args.topology, "topology")
    digest = hashlib.sha256(f"{PLATFORM_NAME}:{len(t.client.devices)}".encode()).digest()
    args.fingerprint = int.from_bytes(digest[:8], "little")


@export("TopologyDescription_Attributes")
def _topology_attributes(args):
    t = lookup(args.topology, "topology")
    args.attributes, args.num_attributes = t.attributes[0], t.attributes[1]


def get_description(ptr) -> PDevice:
    return lookup(ptr, "device description")


@export("DeviceDescription_Id")
def _desc_id(args):
    args.id = get_description(args.device_description).device.id


@export("DeviceDescription_ProcessIndex")
def _desc_process_index(args):
    args.process_index = get_description(args.device_description).device.process_index


@export("DeviceDescription_Attributes")
def _desc_attributes(args):
    d = get_description(args.device_description)
    args.attributes, args.num_attributes = d.attributes[0], d.attributes[1]


@export("DeviceDescription_Kind", "PJRT_DeviceDescription_Text_Args")
def _desc_kind(args):
    args.text, args.text_size = get_description(args.device_description).kind


@export("DeviceDescription_DebugString", "PJRT_DeviceDescription_Text_Args")
def _desc_debug_string(args):
    args.text, args.text_size = get_description(args.device_description).debug


@export("DeviceDescription_ToString", "PJRT_DeviceDescription_Text_Args")
def _desc_to_string(args):
    args.text, args.text_size = get_description(args.device_description).text


def get_device(ptr) -> PDevice:
    return lookup(ptr, "device")


@export("Device_GetDescription")
def _device_get_description(args):
    args.device_description = get_device(args.device).desc_ptr


@export("Device_IsAddressable")
def _device_is_addressable(args):
    args.is_addressable = get_device(args.device).device.is_addressable()


@export("Device_LocalHardwareId")
def _device_local_hardware_id(args):
    args.local_hardware_id = get_device(args.device).device.local_hardware_id


@export("Device_AddressableMemories")
def _device_memories(args):
    d = get_device(args.device)
    args.memories, args.num_memories = d.memory_ptrs, len(d.memories)


@export("Device_DefaultMemory")
def _device_default_memory(args):
    args.memory = get_device(args.device).default_memory().ptr


@export("Device_MemoryStats")
def _device_memory_stats(args):
    stats = get_device(args.device).device.memory_stats()
    args.bytes_in_use = stats.bytes_in_use
    args.peak_bytes_in_use, args.peak_bytes_in_use_is_set = stats.peak_bytes_in_use, True
    args.num_allocs, args.num_allocs_is_set = stats.num_allocs, True
    args.largest_alloc_size, args.largest_alloc_size_is_set = stats.largest_alloc_size, True
    args.bytes_limit_is_set = args.bytes_reserved_is_set = False
    args.peak_bytes_reserved_is_set = args.bytes_reservable_limit_is_set = False
    args.largest_free_block_bytes_is_set = args.pool_bytes_is_set = False
    args.peak_pool_bytes_is_set = False


@ffi.callback("void(void *)")
def _attributes_deleter(handle):
    return None  # the attributes belong to the device


@export("Device_GetAttributes")
def _device_get_attributes(args):
    d = get_device(args.device)
    args.attributes, args.num_attributes = d.attributes[0], d.attributes[1]
    args.device_attributes = ffi.NULL
    args.attributes_deleter = _attributes_deleter


@export("Device_ClearMemoryStats")
def _device_clear_memory_stats(args):
    get_device(args.device).device.allocator.reset_peak()


def get_memory(ptr) -> PMemory:
    return lookup(ptr, "memory")


@export("Memory_Id")
def _memory_id(args):
    args.id = get_memory(args.memory).space.id


@export("Memory_Kind", "PJRT_Memory_Text_Args")
def _memory_kind(args):
    args.text, args.text_size = get_memory(args.memory).kind


@export("Memory_Kind_Id")
def _memory_kind_id(args):
    m = get_memory(args.memory)
    args.kind_id = m.device.memories.index(m)


@export("Memory_DebugString", "PJRT_Memory_Text_Args")
def _memory_debug_string(args):
    args.text, args.text_size = get_memory(args.memory).debug


@export("Memory_ToString", "PJRT_Memory_Text_Args")
def _memory_to_string(args):
    args.text, args.text_size = get_memory(args.memory).text


@export("Memory_AddressableByDevices")
def _memory_devices(args):
    m = get_memory(args.memory)
    args.devices, args.num_devices = m.devices, 1
