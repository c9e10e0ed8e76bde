"""Checking request tensors against a model's declared inputs, with messages naming the field."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgepilot.errors import CommandError
from edgepilot.formats.spec import TensorSpec

# dtypes accepted in requests (JSON and .npy); anything else is refused by name
ALLOWED_DTYPES = ("float32", "float16", "float64", "int8", "uint8", "int16", "int32", "int64",
                  "bool")
# a tensor of text (an ONNX string tensor: a label encoder's, an in-graph tokenizer's); numpy
# holds it as an array of Python str (dtype ``object``), which is what onnxruntime takes
STRING = "string"
JSON_DTYPES = (*ALLOWED_DTYPES, STRING)


def dtype_name(dtype: str | np.dtype) -> str:
    """A dtype as requests name it: ``string`` for numpy's text dtypes, else numpy's name."""
    d = np.dtype(dtype)
    return STRING if d.kind in "OSU" else d.name


def check_inputs(specs: Sequence[TensorSpec], inputs: dict[str, np.ndarray]) -> None:
    """Raise CommandError (400) unless ``inputs`` has exactly the named tensors, right dtype/shape.

    Symbolic or unknown dimensions (str/None/-1) accept any size.
    """
    want = {s.name: s for s in specs}
    unknown = sorted(set(inputs) - set(want))
    if unknown:
        raise CommandError(f"unknown input(s) {unknown}; the model takes {sorted(want)}",
                           field=f"inputs.{unknown[0]}")
    missing = sorted(set(want) - set(inputs))
    if missing:
        raise CommandError(f"missing input(s) {missing}; the model takes {sorted(want)}",
                           field=f"inputs.{missing[0]}")
    for name, arr in inputs.items():
        spec = want[name]
        if str(arr.dtype) != spec.dtype:
            raise CommandError(f"input {name!r} has dtype {dtype_name(arr.dtype)}; the model "
                               f"wants {dtype_name(spec.dtype)}", field=f"inputs.{name}.dtype")
        if spec.rank_known and not shape_matches(spec.shape, arr.shape):
            raise CommandError(f"input {name!r} has shape {list(arr.shape)}; the model wants "
                               f"{shape_text(spec.shape)}", field=f"inputs.{name}.shape")


def shape_matches(spec: Sequence[int | str | None], shape: Sequence[int]) -> bool:
    if len(spec) != len(shape):
        return False
    return all(not isinstance(d, int) or d < 0 or d == s for d, s in zip(spec, shape, strict=True))


def shape_text(spec: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in spec) + "]"
