"""Shared test fixtures."""

import jax
import pytest


@pytest.fixture(scope="module")
def x64_mode():
    """64-bit JAX for one test module, restored afterwards so other modules keep the default
    32-bit mode (the JAX programs are checked as users run them)."""
    with jax.enable_x64(True):
        yield
