"""The plugin's objects over time: thousands of executions without growth, process exit
with live buffers, JAX_PLATFORMS=xlapy, and the C function table itself."""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from xlapy.pjrt import abi, capi, core

XLAPY = jax.devices("xlapy")[0]


def test_every_slot_is_filled_and_unimplemented_ones_say_so():
    api = abi.ffi.cast("PJRT_Api *", capi.api_pointer())
    assert api.pjrt_api_version.major_version == abi.PJRT_API_MAJOR
    assert all(api.slots[i] != abi.ffi.NULL for i in range(len(abi.SLOTS)))
    implemented = set(capi.implemented())
    assert {"Client_Compile", "LoadedExecutable_Execute", "Client_BufferFromHostBuffer"} <= (
        implemented
    )
    name = next(n for n in abi.SLOTS if n not in implemented)
    fn = abi.ffi.cast("PJRT_Error *(*)(void *)", api.slots[abi.SLOTS.index(name)])
    err = fn(abi.ffi.NULL)
    text = abi.ffi.string(err.message, err.message_size).decode()
    assert text == f"xlapy does not implement PJRT_{name}" and err.code == core.UNIMPLEMENTED


def test_thousands_of_executions_do_not_grow():
    fn = jax.jit(lambda a: a * 2.0 + 1.0)
    x = jax.device_put(np.ones(256, np.float32), XLAPY)
    for _ in range(50):
        fn(x).block_until_ready()
    objects, errors = len(core.OBJECTS), len(core.ERRORS)
    in_use = XLAPY.memory_stats()["bytes_in_use"]
    for _ in range(2000):
        y = fn(x)
    np.testing.assert_array_equal(np.asarray(y), 3.0)
    del y
    assert len(core.OBJECTS) <= objects + 2 and len(core.ERRORS) == errors
    assert XLAPY.memory_stats()["bytes_in_use"] <= in_use + 1024


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )


def test_default_platform_and_clean_exit_with_live_buffers():
    done = run_python(
        """
        import numpy as np
        import xlapy.pjrt
        xlapy.pjrt.initialize()
        import jax, jax.numpy as jnp
        assert jax.default_backend() == "xlapy", jax.default_backend()
        assert len(jax.devices()) == 2
        keep = [jnp.arange(1000.0) * i for i in range(10)]
        y = jax.jit(lambda a: a.sum())(keep[3])
        print("sum", float(y))
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
        mesh = Mesh(np.array(jax.devices()), ("x",))
        sharded = jax.device_put(np.arange(8.0), NamedSharding(mesh, PartitionSpec("x")))
        doubled = jax.jit(lambda a: a * 2)(sharded)  # partitioned over the 2 devices
        print("spmd", np.asarray(doubled).tolist(), doubled.sharding.spec)
        print("shards", [s.data.shape for s in doubled.addressable_shards])
        """,
        JAX_PLATFORMS="xlapy",
        XLAPY_DEVICE_COUNT="2",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sum 1498500.0" in done.stdout
    assert "spmd [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0] P('x',)" in done.stdout
    assert "shards [(4,), (4,)]" in done.stdout
    assert "Exception ignored" not in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("platforms", ["cpu,xlapy", ""])
def test_exit_with_cpu_and_xlapy_clients_alive(platforms):
    """JAX destroys its clients in the interpreter's last garbage collections, calling
    PJRT_Client_Destroy through xlapy's table: the table and its callbacks must outlive
    the modules torn down around them (every such process died with SIGSEGV/SIGILL)."""
    done = run_python(
        """
        import numpy as np
        import xlapy.pjrt
        xlapy.pjrt.initialize()
        import jax
        x = jax.device_put(np.ones(3, np.float32), jax.devices("xlapy")[0])
        y = jax.jit(lambda a: a + 1)(x)
        z = jax.jit(lambda a: a * 2)(jax.device_put(np.ones(3, np.float32), jax.devices("cpu")[0]))
        print("ok", np.asarray(y).tolist(), np.asarray(z).tolist())
        """,
        JAX_PLATFORMS=platforms,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "ok [2.0, 2.0, 2.0] [2.0, 2.0, 2.0]" in done.stdout


def test_exit_with_zero_copy_host_buffers_alive_is_silent():
    """A zero-copy buffer lets go of the caller's memory when the interpreter tears down;
    telling JAX then (its side is gone) printed 'Exception ignored' at every exit."""
    done = run_python(
        """
        import numpy as np
        import xlapy.pjrt
        xlapy.pjrt.initialize()
        import jax
        host = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
        x = jax.device_put(host, jax.devices("xlapy")[0])
        y = jax.jit(lambda a: a @ a)(x)
        print("ok", float(np.asarray(y).sum()) != 0.0)
        """,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ok True" in done.stdout
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_unsupported_jaxlib_gets_a_message(monkeypatch):
    from xlapy.pjrt import jax_plugin

    monkeypatch.setattr(jax_plugin, "SUPPORTED_JAXLIB", ("0.0.1",))
    with pytest.raises(jax_plugin.UnsupportedJaxlibError, match=r"supports jaxlib 0\.0\.1"):
        jax_plugin.check_jaxlib()


def test_entry_point_makes_jax_find_xlapy(tmp_path):
    """The pyproject entry point, as an installed distribution would expose it."""
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["jax_plugins"]["xlapy"]
    info = tmp_path / "xlapy_ep-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: xlapy-ep\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[jax_plugins]\nxlapy = {target}\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", ""), os.getcwd()])
    done = run_python(
        """
        import jax, jax.numpy as jnp
        jax.config.update("jax_pjrt_client_create_options", "device_count:2")
        print(jax.devices("xlapy"), (jnp.arange(3) + 1).devices())
        """,
        PYTHONPATH=path,
        JAX_PLATFORMS="cpu,xlapy",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[XlapyDevice(id=0), XlapyDevice(id=1)]" in done.stdout
    assert "CpuDevice" in done.stdout  # "cpu" stays the default


def test_destroys_after_exit_began_do_not_enter_python():
    """Once the interpreter is exiting (atexit ran), a destroy coming from one of JAX's own
    threads must not enter Python: Python ends such a thread with pthread_exit, and its
    unwinding through jaxlib's noexcept destructor aborted the process ("terminate called
    without an active exception", seen at exit after recompiling a program). Here each
    destroy is made after the exit hook with its object live: it answers natively and
    Python never drops the object; and a process recompiling a program exits cleanly."""
    done = run_python(
        """
        import threading
        import numpy as np
        import xlapy.pjrt
        xlapy.pjrt.initialize()
        import jax, jax.numpy as jnp
        from xlapy.pjrt import abi, capi, core, native
        from xlapy.pjrt.executables import PExecutable
        x = jax.device_put(np.ones(5, np.float32), jax.devices("xlapy")[0])
        f = lambda a: jnp.sin(a) * 3
        jax.jit(f)(x)
        jax.clear_caches()
        y = jax.jit(f)(x)
        api = abi.ffi.cast("PJRT_Api *", capi.api_pointer())
        loaded = next(o for o in core.OBJECTS.values() if isinstance(o, PExecutable) and o.loaded)
        before = len(core.OBJECTS)
        native._set_exiting()
        for name in ("LoadedExecutable_Destroy", "Executable_Destroy"):
            args = abi.ffi.new(f"PJRT_{name}_Args *")
            args.struct_size = abi.ffi.sizeof(f"PJRT_{name}_Args")
            args.executable = abi.ffi.cast(f"PJRT_{name.split('_')[0]} *", loaded.c)
            fn = abi.ffi.cast(f"PJRT_Error *(*)(PJRT_{name}_Args *)",
                              api.slots[abi.SLOTS.index(name)])
            result = []
            t = threading.Thread(target=lambda: result.append(fn(args) == abi.ffi.NULL))
            t.start(); t.join()
            assert result == [True], name
        assert len(core.OBJECTS) == before and loaded.c.index != 0
        print("ok", np.asarray(y)[0].round(3))
        """,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "ok 2.524" in done.stdout
    assert "terminate called" not in done.stderr
