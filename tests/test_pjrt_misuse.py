"""The PJRT C API misused through cffi, as a C caller could (issue 16, fourth attack): NULL
argument structs, argument structs smaller than this version's, NULL handles, and handles
used after their destroy must return a PJRT_Error, never crash the process or answer as if
the handle were alive. Before the fourth attack every function given NULL args, and
Error_GetCode given a NULL error, crashed the process (SIGSEGV), and the native fast paths
answered Buffer_Device / Buffer_Memory for a destroyed buffer. The calls run in a child
process, so a regression fails the test instead of killing the test run."""

import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from xlapy.ir.types import PrimitiveType
    from xlapy.pjrt import abi, capi
    from xlapy.pjrt.buffers import BUFFER_TYPE_OF

    ffi = abi.ffi
    API = ffi.cast("PJRT_Api *", capi.api_pointer())
    results = {}

    def fn(name, args_type):
        return ffi.cast(f"PJRT_Error *(*)({args_type} *)", API.slots[abi.SLOTS.index(name)])

    def new(args_type, size=None, **fields):
        a = ffi.new(f"{args_type} *")
        a.struct_size = ffi.sizeof(args_type) if size is None else size
        for k, v in fields.items():
            setattr(a, k, v)
        return a

    def outcome(err):
        if err == ffi.NULL:
            return "ok"
        code = fn("Error_GetCode", "PJRT_Error_GetCode_Args")
        args = new("PJRT_Error_GetCode_Args", error=err)
        assert code(args) == ffi.NULL
        destroy = ffi.cast("void(*)(PJRT_Error_Destroy_Args *)",
                           API.slots[abi.SLOTS.index("Error_Destroy")])
        destroy(new("PJRT_Error_Destroy_Args", error=err))
        return args.code

    def record(name, value):
        results[name] = value
        print(json.dumps([name, value]), flush=True)

    FUNCTIONS = {  # Python implementations and native fast paths (native.py)
        "Client_PlatformName": "PJRT_Client_PlatformName_Args",
        "Client_Devices": "PJRT_Client_Devices_Args",
        "Buffer_Dimensions": "PJRT_Buffer_Dimensions_Args",
        "Buffer_Device": "PJRT_Buffer_Device_Args",
        "Buffer_Memory": "PJRT_Buffer_Memory_Args",
        "Buffer_ToHostBuffer": "PJRT_Buffer_ToHostBuffer_Args",
        "Executable_NumOutputs": "PJRT_Executable_Count_Args",
        "Event_IsReady": "PJRT_Event_IsReady_Args",
        "Event_OnReady": "PJRT_Event_OnReady_Args",
        "Event_Await": "PJRT_Event_Await_Args",
        "Memory_Kind": "PJRT_Memory_Text_Args",
        "LoadedExecutable_Execute": "PJRT_LoadedExecutable_Execute_Args",
        "Client_Compile": "PJRT_Client_Compile_Args",
        "Error_GetCode": "PJRT_Error_GetCode_Args",
    }
    for name, args_type in FUNCTIONS.items():
        record(f"{name} NULL args", outcome(fn(name, args_type)(ffi.NULL)))
        record(f"{name} struct_size 8", outcome(fn(name, args_type)(new(args_type, 8))))
        record(f"{name} NULL handle", outcome(fn(name, args_type)(new(args_type))))

    create = new("PJRT_Client_Create_Args")
    assert outcome(fn("Client_Create", "PJRT_Client_Create_Args")(create)) == "ok"
    devices = new("PJRT_Client_Devices_Args", client=create.client)
    assert outcome(fn("Client_Devices", "PJRT_Client_Devices_Args")(devices)) == "ok"
    data = np.random.default_rng(16).standard_normal(4).astype(np.float32)
    dims = ffi.new("int64_t[]", [4])
    made = new("PJRT_Client_BufferFromHostBuffer_Args", client=create.client,
               data=ffi.from_buffer(data), type=BUFFER_TYPE_OF[PrimitiveType.F32], dims=dims,
               num_dims=1, host_buffer_semantics=0, device=devices.devices[0])
    assert outcome(fn("Client_BufferFromHostBuffer",
                      "PJRT_Client_BufferFromHostBuffer_Args")(made)) == "ok"
    buffer = made.buffer
    destroy = fn("Buffer_Destroy", "PJRT_Buffer_Only_Args")
    record("Buffer_Destroy", outcome(destroy(new("PJRT_Buffer_Only_Args", buffer=buffer))))
    for _ in range(1000):  # give the allocator a chance to reuse freed memory
        ffi.new("char[]", 32)
    for name in ("Buffer_Device", "Buffer_Memory", "Buffer_Dimensions"):
        args_type = FUNCTIONS[name]
        record(f"{name} after destroy",
               outcome(fn(name, args_type)(new(args_type, buffer=buffer))))
    record("Buffer_Destroy twice", outcome(destroy(new("PJRT_Buffer_Only_Args", buffer=buffer))))
    message = ffi.cast("void(*)(PJRT_Error_Message_Args *)",
                       API.slots[abi.SLOTS.index("Error_Message")])
    message(ffi.NULL)
    empty = new("PJRT_Error_Message_Args")
    message(empty)
    record("Error_Message NULL error", ffi.string(empty.message, empty.message_size).decode())
    print("END", flush=True)
    """
)
INVALID_ARGUMENT = 3


def test_c_api_misuse_returns_errors_and_never_crashes():
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))}
    p = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600
    )
    results = dict(json.loads(line) for line in p.stdout.splitlines() if line.startswith("["))
    assert p.returncode == 0 and "END" in p.stdout, (p.returncode, list(results)[-1:], p.stderr)
    for case, value in results.items():
        if case in ("Buffer_Destroy", "Buffer_Destroy twice"):
            assert value == "ok", case  # a second destroy is a no-op, as free(NULL)
        elif case == "Error_Message NULL error":
            assert "not a live PJRT_Error" in value
        else:
            assert value == INVALID_ARGUMENT, (case, value)
