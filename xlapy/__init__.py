"""xlapy: XLA, the machine-learning compiler, written in Python.

`xlapy.Client` (the PJRT-style runtime's entry point) is imported on first use, so that
`import xlapy.ir` stays light.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "Client":
        from xlapy.runtime import Client

        return Client
    if name == "stablehlo":
        import xlapy.stablehlo

        return xlapy.stablehlo
    raise AttributeError(f"module 'xlapy' has no attribute {name!r}")


def load(source, filename: str | None = None):
    """An HloModule from HLO text, StableHLO text or bytes (MLIR bytecode, a portable
    artifact, a jax.export serialization), or a path to any of them; see xlapy.stablehlo."""
    from xlapy.stablehlo import load as load_source

    return load_source(source, filename)
