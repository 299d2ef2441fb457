"""xlapy: XLA, the machine-learning compiler, written in Python."""

__version__ = "0.1.0"
