"""Compile options from the serialized `xla.CompileOptionsProto` JAX passes to
`PJRT_Client_Compile`: a few fields read with a small protobuf wire-format decoder (no
protobuf dependency). Fields read: executable_build_options (3) -> num_replicas (4),
num_partitions (5), device_assignment (9) -> computation_devices (3) -> replica_device_ids
(1), debug_options (3) -> the dump options xlapy honours (see _DEBUG_STRING_FIELDS) and
those it warns about (IGNORED_DEBUG_FIELDS); env_option_overrides (7) (the compiler options
of `jax.jit(...).lower(...).compile(compiler_options)`) become debug options, which the
runtime honours or rejects (xlapy.runtime.debug). Everything else is ignored."""

from __future__ import annotations

import struct
import warnings

from xlapy.runtime import CompileOptions, RuntimeApiError
from xlapy.runtime.debug import DEBUG_OPTIONS, DebugOptionWarning


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise RuntimeApiError("truncated compile options (bad varint)")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """The (field number, value) pairs of one protobuf message: varints as ints,
    length-delimited fields as bytes, fixed-width fields as ints."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            out.append((number, value))
        elif wire == 2:
            size, pos = _varint(data, pos)
            out.append((number, data[pos : pos + size]))
            pos += size
        elif wire == 1:
            out.append((number, int.from_bytes(data[pos : pos + 8], "little")))
            pos += 8
        elif wire == 5:
            out.append((number, int.from_bytes(data[pos : pos + 4], "little")))
            pos += 4
        else:
            raise RuntimeApiError(f"compile options: unsupported protobuf wire type {wire}")
    return out


def _packed_ints(value: int | bytes) -> list[int]:
    if isinstance(value, int):
        return [value]
    ints, pos = [], 0
    while pos < len(value):
        v, pos = _varint(value, pos)
        ints.append(v)
    return ints


_DEBUG_STRING_FIELDS = {109: "xla_dump_to", 110: "xla_dump_hlo_module_re"}
"""DebugOptions string fields xlapy honours (field number -> option): a non-empty value is
a request (xlapy.runtime.debug acts on it)."""
_DEBUG_TRUE_FIELDS = {112: "xla_dump_hlo_as_text"}
"""DebugOptions bool fields xlapy honours when true."""
_DUMP_MAX_MODULES_FIELD = 132
"""DebugOptions.xla_dump_max_hlo_modules (int32; -1, JAX's default, is no limit)."""

IGNORED_DEBUG_FIELDS: dict[int, tuple[str, int | bytes]] = {
    30: ("xla_disable_hlo_passes", b""),
    99: ("xla_cpu_enable_fast_math", 0),
    111: ("xla_dump_hlo_pass_re", b""),
    113: ("xla_dump_hlo_as_proto", 0),
    114: ("xla_dump_hlo_as_dot", 0),
    115: ("xla_dump_hlo_as_url", 0),
    116: ("xla_dump_hlo_as_html", 0),
    118: ("xla_dump_hlo_snapshots", 0),
    124: ("xla_enable_hlo_passes_only", b""),
    144: ("xla_dump_module_metadata", 0),
    149: ("xla_dump_fusion_visualization", 0),
    151: ("xla_dump_compress_protos", 0),
    154: ("xla_dump_hlo_pipeline_re", b""),
}
"""DebugOptions fields xlapy does not honour (field number -> (option, the default JAX
sends)): the dump family beyond text dumps, pass selection and fast math. JAX fills the
DebugOptions from $XLA_FLAGS, which the process's XLA:CPU reads too, so a value other than
the default is not rejected (that would break the user's program on every backend); as XLA
does with a flag its backend does not use, the compile goes on, but with a
DebugOptionWarning naming it: never silently. The other fields of DebugOptions (hundreds,
mostly GPU) carry their defaults. Options asked for explicitly (`compile(compiler_options=
...)`, env_option_overrides) are all checked and an unknown one is an error, as in XLA."""


def _option_override(data: bytes) -> str | int | float | bool:
    """The value of an OptionOverrideProto: string (1), bool (2), int (3) or double (4)."""
    for n, v in fields(data):
        if n == 1 and isinstance(v, bytes):
            return v.decode("utf-8", "replace")
        if n == 2 and isinstance(v, int):
            return bool(v)
        if n == 3 and isinstance(v, int):
            return v - (1 << 64) if v >= 1 << 63 else v
        if n == 4 and isinstance(v, int):
            return struct.unpack("<d", v.to_bytes(8, "little"))[0]
    return ""


def _debug_options(data: bytes, debug: dict[str, str | int | float | bool]) -> None:
    for n, v in fields(data):
        if n in _DEBUG_STRING_FIELDS and isinstance(v, bytes) and v:
            debug[_DEBUG_STRING_FIELDS[n]] = v.decode("utf-8", "replace")
        elif n in _DEBUG_TRUE_FIELDS and v == 1:
            debug[_DEBUG_TRUE_FIELDS[n]] = True
        elif n == _DUMP_MAX_MODULES_FIELD and isinstance(v, int) and v != (1 << 64) - 1:
            debug["xla_dump_max_hlo_modules"] = v - (1 << 64) if v >= 1 << 63 else v
        elif n in IGNORED_DEBUG_FIELDS and v != IGNORED_DEBUG_FIELDS[n][1]:
            name = IGNORED_DEBUG_FIELDS[n][0]
            shown = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
            warnings.warn(
                DebugOptionWarning(
                    f"debug option {name}={shown!r} (from $XLA_FLAGS or DebugOptions) is not "
                    f"honoured by xlapy and is ignored; honoured: {', '.join(DEBUG_OPTIONS)}"
                ),
                stacklevel=2,
            )


def compile_options_from_proto(data: bytes) -> CompileOptions:
    """xlapy CompileOptions for a serialized CompileOptionsProto."""
    num_replicas = num_partitions = 1
    assignment: list[list[int]] | None = None
    debug: dict[str, str | int | float | bool] = {}
    for number, value in fields(data):
        if number == 7 and isinstance(value, bytes):  # env_option_overrides: key, value
            entry = dict(fields(value))
            key, override = entry.get(1), entry.get(2)
            if isinstance(key, bytes) and isinstance(override, bytes):
                debug[key.decode("utf-8", "replace")] = _option_override(override)
        if number != 3 or not isinstance(value, bytes):
            continue
        for n, v in fields(value):
            if n == 3 and isinstance(v, bytes):
                _debug_options(v, debug)
            if n == 4 and isinstance(v, int):
                num_replicas = max(v, 1)
            elif n == 5 and isinstance(v, int):
                num_partitions = max(v, 1)
            elif n == 9 and isinstance(v, bytes):
                columns = [
                    [d for k, ids in fields(c) if k == 1 for d in _packed_ints(ids)]
                    for k2, c in fields(v)
                    if k2 == 3 and isinstance(c, bytes)
                ]
                if columns and all(columns):
                    # computation_devices[partition].replica_device_ids[replica]
                    assignment = [list(row) for row in zip(*columns, strict=True)]
    return CompileOptions.make(
        num_replicas=num_replicas,
        num_partitions=num_partitions,
        device_assignment=assignment,
        debug_options=debug,
    )


def _encode_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def proto_field(number: int, value: int | bytes) -> bytes:
    """One protobuf field: a varint, or length-delimited bytes."""
    if isinstance(value, int):
        return _encode_varint(number << 3) + _encode_varint(value)
    return _encode_varint(number << 3 | 2) + _encode_varint(len(value)) + value


def device_assignment_proto(assignment: tuple[tuple[int, ...], ...]) -> bytes:
    """A serialized xla.DeviceAssignmentProto: replica_count (1), computation_count (2),
    computation_devices (3) each holding replica_device_ids (1, packed)."""
    replicas, partitions = len(assignment), len(assignment[0]) if assignment else 0
    out = proto_field(1, replicas) + proto_field(2, partitions)
    for p in range(partitions):
        ids = b"".join(_encode_varint(assignment[r][p]) for r in range(replicas))
        out += proto_field(3, proto_field(1, ids))
    return out
