"""C custom-call targets given as addresses are checked at registration: NULL, made-up
integers and addresses of data are refused there, not crashed on at run time."""

import ctypes
import ctypes.util

import pytest

from xlapy.backends.custom_calls import CustomCallRegistry, make_target
from xlapy.errors import CustomCallError
from xlapy.runtime import Client

LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
DATA = ctypes.create_string_buffer(64)


@pytest.mark.parametrize(
    "address",
    [
        0,
        42,
        -1,
        1 << 70,
        ctypes.addressof(DATA),  # readable, writable data: not code
        ctypes.cast(None, ctypes.CFUNCTYPE(None)),  # a NULL ctypes function pointer
    ],
    ids=["null", "42", "negative", "huge", "data", "null-ctypes"],
)
@pytest.mark.parametrize("version", ["ORIGINAL", "STATUS_RETURNING"])
def test_bogus_address_is_refused_at_registration(address, version):
    with pytest.raises(CustomCallError, match=r"null|not the address of code"):
        make_target("bogus", address, "Host", version)
    client = Client("cpu")
    with pytest.raises(CustomCallError):
        client.register_custom_call("bogus", address, "Host", version)
    registry = CustomCallRegistry()
    with pytest.raises(CustomCallError):
        registry.register("bogus", address, "CUDA", "ORIGINAL")
    client.close()


def test_a_real_function_address_is_accepted():
    address = ctypes.cast(LIBM.cos, ctypes.c_void_p).value
    target = make_target("cos_as_target", address, "Host", "ORIGINAL")
    assert target.name == "cos_as_target"
