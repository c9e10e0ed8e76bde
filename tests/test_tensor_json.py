"""The tensor codec: any JSON-ish object gives arrays or a CommandError naming the field."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgepilot.errors import CommandError
from edgepilot.formats.tensor_json import (
    tensors_from_json,
    tensors_from_npz,
    tensors_to_json,
    tensors_to_npz,
)

json_ish = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["data", "dtype", "shape", "x", "a"]), children,
                      max_size=4),
    max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(json_ish)
def test_any_object_gives_arrays_or_command_error(obj: object) -> None:
    try:
        out = tensors_from_json({"x": obj})
    except CommandError as exc:
        assert exc.field is not None and exc.field.startswith("inputs")
    else:
        assert all(isinstance(a, np.ndarray) for a in out.values())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-2, max_value=1 << 40) | st.booleans(), max_size=40),
       st.lists(st.floats(allow_nan=False), max_size=6))
def test_any_shape_is_checked_before_numpy(shape: list[object], data: list[float]) -> None:
    try:
        out = tensors_from_json({"x": {"data": data, "shape": shape}})
    except CommandError as exc:
        assert exc.field in ("inputs.x.shape", "inputs.x.data")
    else:
        assert list(out["x"].shape) == shape


def test_huge_shape_that_wraps_to_zero_is_refused() -> None:
    with pytest.raises(CommandError) as err:
        tensors_from_json({"x": {"data": [], "shape": [4294967296, 4294967296]}})
    assert err.value.field == "inputs.x.shape"
    assert "elements" in err.value.message


def test_an_empty_shape_whose_other_dims_numpy_cannot_size_is_refused() -> None:
    # found by the property test above: 0 elements, yet numpy's reshape overflowed sizing it
    with pytest.raises(CommandError) as err:
        tensors_from_json({"x": {"data": [], "shape": [0, 4889, 77593, 77842, 78086]}})
    assert err.value.field == "inputs.x.shape"
    assert tensors_from_json({"x": {"data": [], "shape": [0, 3]}})["x"].shape == (0, 3)


def test_bool_dimension_is_refused() -> None:
    with pytest.raises(CommandError) as err:
        tensors_from_json({"x": {"data": [1, 2], "shape": [True, 2]}})
    assert err.value.field == "inputs.x.shape"


def test_rank_bound() -> None:
    with pytest.raises(CommandError) as err:
        tensors_from_json({"x": {"data": [1], "shape": [1] * 40}})
    assert err.value.field == "inputs.x.shape" and "rank" in err.value.message


def test_bad_dtype_names_field() -> None:
    with pytest.raises(CommandError) as err:
        tensors_from_json({"x": {"data": [1], "dtype": "complex64"}}, field_prefix="inputs")
    assert err.value.field == "inputs.x.dtype"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=12))
def test_json_and_npz_round_trip(values: list[float]) -> None:
    arrays = {"a": np.asarray(values, dtype=np.float32), "b": np.arange(6).reshape(2, 3)}
    back = tensors_from_json(tensors_to_json(arrays))
    assert back["a"].dtype == np.float32 and back["b"].dtype == np.int64
    np.testing.assert_array_equal(back["a"], arrays["a"])
    np.testing.assert_array_equal(back["b"], arrays["b"])
    npz = tensors_from_npz(tensors_to_npz(arrays))
    np.testing.assert_array_equal(npz["b"], arrays["b"])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_npz_or_command_error(raw: bytes) -> None:
    try:
        tensors_from_npz(raw)
    except CommandError as exc:
        assert exc.field in ("payload",) or exc.field.endswith(".dtype")


def test_npy_is_not_npz() -> None:
    import io
    buf = io.BytesIO()
    np.save(buf, np.zeros(3))
    with pytest.raises(CommandError) as err:
        tensors_from_npz(buf.getvalue())
    assert err.value.field == "payload"


def test_npz_names_that_are_savez_keywords_survive() -> None:
    arrays = {"file": np.ones(2, np.float32), "allow_pickle": np.zeros(3, np.int8)}
    back = tensors_from_npz(tensors_to_npz(arrays))
    assert sorted(back) == ["allow_pickle", "file"]
    np.testing.assert_array_equal(back["allow_pickle"], arrays["allow_pickle"])


def test_non_finite_outputs_are_strict_json_and_read_back() -> None:
    import json

    y = np.array([1.5, np.nan, np.inf, -np.inf], np.float32)
    text = json.dumps(tensors_to_json({"y": y}), allow_nan=False)  # strict JSON: no bare NaN
    assert json.loads(text)["y"]["data"] == [1.5, "NaN", "Infinity", "-Infinity"]
    back = tensors_from_json(json.loads(text))
    np.testing.assert_array_equal(back["y"], y)


def test_a_fraction_for_an_integer_dtype_is_refused_naming_the_input() -> None:
    with pytest.raises(CommandError) as err:
        tensors_from_json({"ids": {"data": [101, 2.7], "dtype": "int64"}})
    assert err.value.field == "inputs.ids.data" and "2.7 is no whole number" in err.value.message
    ok = tensors_from_json({"ids": {"data": [101.0, 7.0], "dtype": "int32"}})
    np.testing.assert_array_equal(ok["ids"], np.array([101, 7], np.int32))
