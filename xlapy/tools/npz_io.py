"""The .npz convention every command uses for a module's inputs and outputs.

Inputs are arrays named `param_0`, `param_1`, ... for the leaves of the entry parameters in
pre-order (a tuple-shaped parameter contributes one array per leaf). Outputs are named
`output_0`, `output_1`, ... for the leaves of the result in pre-order. .npz cannot hold bf16,
f8 or sub-byte integers, so such an input may be stored as its unsigned-integer bit pattern
(any dtype of the same item size is reinterpreted), and such outputs are written that way.
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence

import numpy as np

from xlapy.errors import XlapyError
from xlapy.ir.shapes import Shape

NATIVE_KINDS = "biufc"


class NpzError(XlapyError):
    """An .npz file does not match the module's parameters."""


def leaf_shapes(shapes: Sequence[Shape]) -> list[Shape]:
    """The array leaves of `shapes` in pre-order (tokens have no data and are skipped)."""
    return [leaf for shape in shapes for _, leaf in shape.leaves() if leaf.is_array]


def assemble(shape: Shape, leaves: list[np.ndarray]):
    """Build the value of `shape` from its leaves, consuming them from the front of `leaves`."""
    from xlapy.backends.interpreter.registry import TOKEN

    if shape.is_tuple:
        return tuple(assemble(s, leaves) for s in shape.tuple_shapes)
    if shape.is_token:
        return TOKEN
    return leaves.pop(0)


def flatten(value) -> list[np.ndarray]:
    """The array leaves of a value (ndarray or nested tuples) in pre-order."""
    if isinstance(value, tuple):
        return [leaf for v in value for leaf in flatten(v)]
    if isinstance(value, np.ndarray):
        return [value]
    return []


def coerce_input(array: np.ndarray, shape: Shape, name: str) -> np.ndarray:
    """`array` as the value of a parameter leaf of `shape`, or NpzError naming both shapes."""
    want = shape.to_text(with_layout=False)
    got = f"{array.dtype}{list(array.shape)}"
    if array.shape != shape.dims:
        raise NpzError(f"{name}: expected {want}, got an array of shape {got}")
    if array.dtype == shape.dtype:
        return array
    if array.dtype.itemsize == shape.dtype.itemsize and array.dtype.kind in NATIVE_KINDS:
        return np.ascontiguousarray(array).view(shape.dtype)
    raise NpzError(f"{name}: expected {want}, got an array of dtype {got}")


def load_inputs(path: str, parameters: Sequence[Shape]) -> list:
    """Read `path` and return one value per entry parameter."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise NpzError(f"cannot read inputs from {path}: {e}") from e
    leaves = leaf_shapes(parameters)
    expected = [f"param_{i}" for i in range(len(leaves))]
    missing = [k for k in expected if k not in arrays]
    extra = sorted(set(arrays) - set(expected))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if extra:
            parts.append(f"unexpected {', '.join(extra)}")
        raise NpzError(
            f"{path}: the module takes {len(leaves)} input arrays "
            f"(param_0..param_{len(leaves) - 1}); {'; '.join(parts)}"
        )
    values = [
        coerce_input(arrays[name], shape, name)
        for name, shape in zip(expected, leaves, strict=True)
    ]
    return [assemble(p, values) for p in parameters]


def random_inputs(parameters: Sequence[Shape], seed: int = 0) -> list:
    """Fresh random values for the parameters: normal floats, small ints, random bools."""
    rng = np.random.default_rng(seed)
    leaves = [random_array(s, rng) for s in leaf_shapes(parameters)]
    return [assemble(p, leaves) for p in parameters]


def random_array(shape: Shape, rng: np.random.Generator) -> np.ndarray:
    t = shape.element_type
    if t.is_pred:
        return rng.random(shape.dims) < 0.5
    if t.is_unsigned_integral:
        hi = min(20, 2 ** min(t.bits, 62) - 1)
        return rng.integers(0, hi, shape.dims, endpoint=True).astype(t.dtype)
    if t.is_signed_integral:
        hi = min(10, 2 ** (t.bits - 1) - 1)
        return rng.integers(-hi - 1 if t.bits < 4 else -hi, hi, shape.dims, endpoint=True).astype(
            t.dtype
        )
    if t.is_complex:
        data = rng.standard_normal(shape.dims) + 1j * rng.standard_normal(shape.dims)
        return data.astype(t.dtype)
    return rng.standard_normal(shape.dims).astype(t.dtype)


def output_arrays(value) -> dict[str, np.ndarray]:
    """The result's leaves named output_0..., non-native dtypes as unsigned bit patterns."""
    out = {}
    for i, leaf in enumerate(flatten(value)):
        if leaf.dtype.kind not in NATIVE_KINDS:
            leaf = leaf.view(f"u{leaf.dtype.itemsize}")
        out[f"output_{i}"] = leaf
    return out


def input_arrays(values) -> dict[str, np.ndarray]:
    """Parameter values as the param_0... arrays of an inputs file."""
    arrays = output_arrays(tuple(values))
    return {k.replace("output_", "param_"): v for k, v in arrays.items()}
