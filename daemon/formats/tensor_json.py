"""Tensors as JSON (``{NAME: {"data", "dtype", "shape"}}``) and as ``.npz`` archives.

The one codec that HTTP ``/v1/infer`` and the MQTT ``infer`` command share. Every malformed
input is answered with a :class:`CommandError` naming the field (``inputs.NAME.shape``) and the
rule; nothing else escapes, whatever JSON-ish object comes in.
"""

from __future__ import annotations

import io
import math
import zipfile
from typing import Any

import numpy as np

from edgepilot.errors import CommandError
from edgepilot.formats.tensors import ALLOWED_DTYPES, JSON_DTYPES, STRING, dtype_name

# Bounds checked before numpy sees a shape: numpy's own limits (rank 32/64, sizes that wrap
# in int64 arithmetic) surface as ValueError/TypeError deep inside reshape.
MAX_RANK = 16
MAX_ELEMENTS = 1 << 28


def _shape(value: Any, field: str) -> list[int]:
    """Validate a shape list in Python ints (bool refused: it is an int in Python)."""
    if not isinstance(value, list):
        raise CommandError("shape must be a list of non-negative integers", field=field)
    if len(value) > MAX_RANK:
        raise CommandError(f"shape has rank {len(value)}; at most {MAX_RANK} dimensions",
                           field=field)
    total = 1
    for dim in value:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise CommandError(f"shape must be a list of non-negative integers, got {dim!r}",
                               field=field)
        # a 0 dim empties the tensor, but numpy still sizes the rest of the shape: counted
        # as 1, so [0, 5000, 80000, 80000, 80000] is refused here, not by numpy's reshape
        total *= max(dim, 1)
        if total > MAX_ELEMENTS:
            break
    if total > MAX_ELEMENTS:
        raise CommandError(f"shape {value} has more than {MAX_ELEMENTS} elements",
                           field=field)
    return value


def tensors_from_json(obj: Any, field_prefix: str = "inputs") -> dict[str, np.ndarray]:
    """Turn ``{NAME: {"data", "dtype", "shape"}}`` (already parsed) into named arrays.

    ``dtype`` defaults to float32 and must be one of ``JSON_DTYPES`` (``string``: the data
    are JSON strings); ``shape`` is optional (the data's own nesting then gives it). Raises
    :class:`CommandError` naming the field.
    """
    if not isinstance(obj, dict):
        raise CommandError(f'{field_prefix} must be {{NAME: {{"data", "dtype", "shape"}}}}',
                           field=field_prefix)
    out: dict[str, np.ndarray] = {}
    for name, spec in obj.items():
        field = f"{field_prefix}.{name}"
        if not isinstance(spec, dict) or "data" not in spec:
            raise CommandError(f"input {name!r} must be an object with data, dtype, shape",
                               field=field)
        unknown = sorted(set(spec) - {"data", "dtype", "shape"})
        if unknown:
            raise CommandError(f"unknown field '{field}.{unknown[0]}'",
                               field=f"{field}.{unknown[0]}")
        dtype = spec.get("dtype", "float32")
        if not isinstance(dtype, str) or dtype not in JSON_DTYPES:
            raise CommandError(f"input {name!r}: dtype {dtype!r} is not allowed; allowed: "
                               f"{', '.join(JSON_DTYPES)}", field=f"{field}.dtype")
        shape = spec.get("shape")
        if shape is not None:
            shape = _shape(shape, f"{field}.shape")
        try:
            # A value out of the dtype's range is the caller's error, not a silent inf.
            with np.errstate(over="raise", invalid="raise"):
                arr = _strings(spec["data"]) if dtype == STRING \
                    else _numbers(spec["data"], dtype)
        except (ValueError, TypeError, OverflowError, RecursionError,
                FloatingPointError) as exc:
            raise CommandError(f"input {name!r}: data is not a {dtype} array: {exc}",
                               field=f"{field}.data") from None
        if arr.ndim > MAX_RANK or arr.size > MAX_ELEMENTS:
            raise CommandError(f"input {name!r}: data exceeds rank {MAX_RANK} or "
                               f"{MAX_ELEMENTS} elements", field=f"{field}.data")
        if shape is not None:
            count = 1
            for dim in shape:
                count *= dim
            if count != arr.size:
                raise CommandError(f"input {name!r}: {arr.size} values do not fill shape "
                                   f"{shape}", field=f"{field}.shape")
            arr = arr.reshape(shape)
        out[str(name)] = arr
    return out


def _numbers(data: Any, dtype: str) -> np.ndarray:
    """A numeric tensor's data in ``dtype``; a fraction for an integer dtype is refused (numpy
    would truncate 2.7 to the token id 2 without a word)."""
    if np.dtype(dtype).kind in "iu":
        raw = np.asarray(data).ravel()
        if raw.dtype.kind == "f":
            fractional = raw[~(np.isfinite(raw) & (raw == np.round(raw)))]
            if fractional.size:
                raise ValueError(f"{float(fractional[0])} is no whole number")
    return np.asarray(data, dtype=dtype)


def _strings(data: Any) -> np.ndarray:
    """A ``string`` tensor's data: (nested lists of) JSON strings, as onnxruntime takes them."""
    arr = np.asarray(data, dtype=object)
    bad = next((x for x in arr.ravel() if not isinstance(x, str)), None) if arr.size else None
    if bad is not None or (arr.ndim == 0 and not isinstance(data, str)):
        raise ValueError(f"{bad!r} is not a string (or the lists are ragged)")
    return arr


def tensors_to_json(outputs: dict[str, np.ndarray]) -> dict[str, Any]:
    """Named arrays as ``{NAME: {"data": flat list, "dtype", "shape"}}``. A NaN or infinity is
    the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (protobuf's JSON mapping; JSON has
    no such numbers, and strict parsers refused the bare ``NaN`` Python writes)."""
    result: dict[str, Any] = {}
    for name, value in outputs.items():
        arr = np.asarray(value)
        dtype = dtype_name(arr.dtype)
        data: list[Any] = [_text(x) for x in arr.ravel()] if dtype == STRING \
            else arr.ravel().tolist()
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            data = [_finite(x) for x in data]
        result[name] = {"data": data, "dtype": dtype, "shape": list(arr.shape)}
    return result


def _finite(x: float) -> float | str:
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else "Infinity" if x > 0 else "-Infinity"


def _text(x: Any) -> str:
    return x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)


def tensors_from_npz(raw: bytes, field_prefix: str = "inputs") -> dict[str, np.ndarray]:
    """Read an ``.npz`` archive (no pickles) into named arrays; names come from the archive."""
    try:
        archive = np.load(io.BytesIO(raw), allow_pickle=False)
        # A bare .npy also loads (as one ndarray); only an archive carries names.
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise CommandError("payload is not an .npz archive", field="payload")
        with archive:
            out = {name: archive[name] for name in archive.files}
    except CommandError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise CommandError(f"payload is not an .npz archive: {exc}", field="payload") from None
    for name, arr in list(out.items()):
        if arr.dtype.kind == "U":  # text, stored without pickles as fixed-width unicode
            out[name] = arr = arr.astype(object)
            continue
        if str(arr.dtype) not in ALLOWED_DTYPES:
            raise CommandError(f"input {name!r}: dtype {arr.dtype} is not allowed; allowed: "
                               f"{', '.join(ALLOWED_DTYPES)}",
                               field=f"{field_prefix}.{name}.dtype")
    return out


def tensors_to_npz(outputs: dict[str, np.ndarray]) -> bytes:
    """Named arrays as ``.npz`` bytes (uncompressed: tensors rarely compress well)."""
    # Written member by member rather than with np.savez, whose own keyword arguments
    # (file, allow_pickle) would collide with tensors of those names.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        for name, value in outputs.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, storable(value), allow_pickle=False)
    return buf.getvalue()


def storable(value: np.ndarray) -> np.ndarray:
    """``value`` as ``.npy``/``.npz`` store it without pickles: a text tensor (Python str
    objects, bytes) as fixed-width unicode, anything else as it is."""
    arr = np.asarray(value)
    if arr.dtype.kind not in "OS":
        return arr
    return np.vectorize(_text, otypes=[str])(arr) if arr.size else arr.astype(str)
