"""Inputs that look real: rules read from the ONNX graph and from names, the real MiniLM's
vocabulary bound, and real samples from a calibration dir or recent requests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from real_models import by_name

from edgepilot.backends.base import TensorSpec
from edgepilot.dispatch.graph.samples import generate, name_rule, onnx_rules, pick
from edgepilot.errors import PlanError
from edgepilot.formats.io import tensor_specs


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto],
           inits: Sequence[onnx.TensorProto] = ()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


# ---- graph rules ----------------------------------------------------------------------------
def test_ids_through_cast_stay_below_the_gather_table() -> None:
    table = np.random.default_rng(0).standard_normal((1000, 8)).astype(np.float32)
    model = _model(
        [helper.make_node("Cast", ["ids"], ["ids32"], to=TensorProto.INT32),
         helper.make_node("Gather", ["table", "ids32"], ["emb"], axis=0)],
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 256])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, 256, 8])],
        [numpy_helper.from_array(table, "table")])
    specs = [TensorSpec("ids", "int64", (1, 256))]
    rules = onnx_rules(model, specs)
    assert rules["ids"].kind == "ids" and rules["ids"].high == 1000
    samples = generate(specs, {"ids": (1, 256)}, rules, count=4)
    assert samples.source == "generated" and len(samples.feeds) == 4
    for feed in samples.feeds:
        ids = feed["ids"]
        assert ids.dtype == np.int64 and ids.shape == (1, 256)
        assert ids.min() >= 0 and ids.max() < 1000
        _run(model, feed)      # every id is a valid row
    # drawn over the whole table, not a corner of it (8 is the name rule's bound)
    assert max(int(f["ids"].max()) for f in samples.feeds) >= 8
    assert samples.rules["ids"] == "ids in [0, 1000)"


def test_ids_indexing_two_tables_stay_below_the_smaller() -> None:
    # a word segmenter's [1, 2, seq] input: channel 0 indexes 139 characters, channel 1 a
    # 6227-syllable table; ids drawn up to the larger one broke the smaller's Gather
    rng = np.random.default_rng(0)
    model = _model(
        [helper.make_node("Gather", ["x", "zero"], ["ch"], axis=1),
         helper.make_node("Gather", ["x", "one"], ["sy"], axis=1),
         helper.make_node("Gather", ["chars", "ch"], ["ce"], axis=0),
         helper.make_node("Gather", ["syllables", "sy"], ["se"], axis=0),
         helper.make_node("Concat", ["ce", "se"], ["emb"], axis=-1)],
        [helper.make_tensor_value_info("x", TensorProto.INT64, [1, 2, 32])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, 32, 8])],
        [numpy_helper.from_array(rng.standard_normal((139, 4)).astype(np.float32), "chars"),
         numpy_helper.from_array(rng.standard_normal((6227, 4)).astype(np.float32),
                                 "syllables"),
         numpy_helper.from_array(np.array(0, np.int64), "zero"),
         numpy_helper.from_array(np.array(1, np.int64), "one")])
    specs = [TensorSpec("x", "int64", (1, 2, 32))]
    rules = onnx_rules(model, specs)
    assert rules["x"].kind == "ids" and rules["x"].high == 139
    for feed in generate(specs, {"x": (1, 2, 32)}, rules, count=3).feeds:
        _run(model, feed)      # both tables' rows


def test_a_quantized_table_is_traced_through_cast_and_mul() -> None:
    table_q = np.random.default_rng(0).integers(-128, 128, (500, 4)).astype(np.int8)
    model = _model(
        [helper.make_node("Cast", ["table_q"], ["table_f"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["table_f", "scale"], ["table"]),
         helper.make_node("Gather", ["table", "tok"], ["emb"], axis=0)],
        [helper.make_tensor_value_info("tok", TensorProto.INT64, [1, 16])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, 16, 4])],
        [numpy_helper.from_array(table_q, "table_q"),
         numpy_helper.from_array(np.array(0.02, np.float32), "scale")])
    specs = [TensorSpec("tok", "int64", (1, 16))]
    rule = onnx_rules(model, specs)["tok"]
    assert rule.kind == "ids" and rule.high == 500


def test_an_input_compared_with_constants_takes_them() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    model = _model(
        [helper.make_node("Constant", [], ["k16"], value=numpy_helper.from_array(
            np.array(16000, np.int64))),
         helper.make_node("Equal", ["freq", "k16"], ["is16"]),
         helper.make_node("Equal", ["k8", "freq"], ["is8"]),   # constant on the left
         helper.make_node("Or", ["is16", "is8"], ["ok"]),
         helper.make_node("Cast", ["ok"], ["okf"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["x", "okf"], ["y"])],
        [x, helper.make_tensor_value_info("freq", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.array(8000, np.int64), "k8")])
    specs = [TensorSpec("x", "float32", (1, 4)), TensorSpec("freq", "int64", ())]
    rules = onnx_rules(model, specs)
    # the name says nothing ("freq" would get small ids): the graph says 16000 or 8000
    assert name_rule(specs[1]).kind == "ids"
    assert rules["freq"].kind == "choice" and rules["freq"].values == [16000.0, 8000.0]
    feed = generate(specs, {"x": (1, 4), "freq": ()}, rules, 1).feeds[0]
    assert feed["freq"].shape == () and int(feed["freq"]) == 16000
    np.testing.assert_array_equal(_run(model, feed)[0], feed["x"])  # the branch taken


@pytest.mark.parametrize(("spec", "kind"), [
    (TensorSpec("attention_mask", "int64", ("batch", "seq")), "ones"),
    (TensorSpec("input_mask", "bool", (1, 8)), "ones"),
    (TensorSpec("token_type_ids", "int64", ("batch", "seq")), "zeros"),
    (TensorSpec("segment_ids", "int32", (1, 8)), "zeros"),
    (TensorSpec("position_ids", "int64", (1, 8)), "arange"),
    (TensorSpec("sample_rate", "int64", ()), "choice"),
    (TensorSpec("state", "float32", (2, 1, 128)), "zeros"),
    (TensorSpec("h0", "float32", (1, 1, 64)), "zeros"),
    (TensorSpec("past_key_values.0.key", "float32", (1, 4, 8, 16)), "zeros"),
    (TensorSpec("images", "float32", (1, 3, 32, 32)), "uniform"),
    (TensorSpec("input:0", "float32", (1, 32, 32, 3)), "uniform"),
    (TensorSpec("features", "float32", (1, 80, 100)), "normal"),
    (TensorSpec("shape", "float32", (1, 16)), "normal"),   # 'h' inside a word is no state
    # a scalar or a vector of at most three floats is a control (speed, length/noise scales)
    (TensorSpec("speed", "float32", (1,)), "choice"),
    (TensorSpec("scales", "float32", (3,)), "choice"),
    (TensorSpec("alpha", "float32", ()), "choice"),
    (TensorSpec("x", "float32", (4,)), "normal"),
    (TensorSpec("x", "float32", ("n",)), "normal"),
    (TensorSpec("x", "float32", (1, 1)), "normal"),
])
def test_name_rules(spec: TensorSpec, kind: str) -> None:
    assert name_rule(spec).kind == kind


def test_name_rules_generate_what_they_say() -> None:
    specs = [TensorSpec("attention_mask", "int64", (2, 8)),
             TensorSpec("token_type_ids", "int64", (2, 8)),
             TensorSpec("position_ids", "int64", (2, 8)),
             TensorSpec("state", "float32", (2, 1, 16)),
             TensorSpec("image", "float32", (1, 3, 16, 16)),
             TensorSpec("sr", "int64", ()),
             TensorSpec("q8", "int8", (64, 64)),
             TensorSpec("u8", "uint8", (64, 64)),
             TensorSpec("speed", "float32", (1,))]
    shapes = {s.name: tuple(d for d in s.shape) for s in specs}
    feed = generate(specs, shapes, {}, 1, seed=3).feeds[0]
    for s in specs:
        assert feed[s.name].shape == shapes[s.name] and feed[s.name].dtype == np.dtype(s.dtype)
    np.testing.assert_array_equal(feed["attention_mask"], np.ones((2, 8)))
    np.testing.assert_array_equal(feed["token_type_ids"], np.zeros((2, 8)))
    np.testing.assert_array_equal(feed["position_ids"], np.tile(np.arange(8), (2, 1)))
    np.testing.assert_array_equal(feed["state"], np.zeros((2, 1, 16)))
    img = feed["image"]
    assert img.min() >= 0.0 and img.max() < 1.0 and img.std() > 0.1
    assert int(feed["sr"]) == 16000
    # N(0, 1) made a TTS model's speed near zero or negative: minutes of audio a run
    np.testing.assert_array_equal(feed["speed"], np.ones(1))
    # quantized inputs cover their whole range, both ends included
    q8, u8 = feed["q8"], feed["u8"]
    assert q8.min() == -128 and q8.max() == 127
    assert u8.min() == 0 and u8.max() == 255


# ---- the real MiniLM ------------------------------------------------------------------------
def test_minilm_ids_stay_in_the_real_vocabulary() -> None:
    path = by_name("minilm").path
    specs = tensor_specs(path, "onnx")[0]
    model = onnx.load(str(path), load_external_data=False)
    rules = onnx_rules(model, specs)
    assert rules["input_ids"].kind == "ids" and rules["input_ids"].high == 30522
    assert rules["attention_mask"].kind == "ones"
    shapes = {s.name: (1, 32) for s in specs}
    feeds = generate(specs, shapes, rules, count=2).feeds
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for feed in feeds:
        assert feed["input_ids"].min() >= 0 and feed["input_ids"].max() < 30522
        out = sess.run(None, feed)[0]
        assert out.shape[:2] == (1, 32) and np.isfinite(out).all()
    # the bound is the table itself: its last row is valid, one past it is not
    edge = dict(feeds[0], input_ids=np.full((1, 32), 30521, np.int64))
    assert np.isfinite(sess.run(None, edge)[0]).all()
    with pytest.raises(Exception, match=r"(?i)out of bounds|indices"):
        sess.run(None, dict(feeds[0], input_ids=np.full((1, 32), 30522, np.int64)))


# ---- real samples ---------------------------------------------------------------------------
SPECS = [TensorSpec("x", "float32", ("batch", 4)), TensorSpec("ids", "int64", ("batch", 6))]
SHAPES = {"x": (1, 4), "ids": (1, 6)}


def _sample(batch: int = 1, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, 4)),            # float64 on disk
            "ids": rng.integers(0, 100, (batch, 6)).astype(np.int64)}


def test_calibration_dir_samples_are_used(tmp_path: Path) -> None:
    a, b = _sample(seed=1), _sample(seed=2)
    (tmp_path / "m").mkdir()
    np.savez(tmp_path / "m" / "a.npz", **a)
    np.savez(tmp_path / "m" / "b.npz", **b)
    got = pick(SPECS, SHAPES, {}, count=8, model="m", calibration_dir=tmp_path,
               recent=[_sample(seed=9)])
    assert got.source == "calibration_dir" and len(got.feeds) == 2
    for feed, want in zip(got.feeds, (a, b), strict=True):    # sorted by file name
        assert feed["x"].dtype == np.float32 and feed["ids"].dtype == np.int64
        np.testing.assert_allclose(feed["x"], want["x"].astype(np.float32))
        np.testing.assert_array_equal(feed["ids"], want["ids"])
    assert got.describe()["inputs"] == {"x": "2 real sample(s)", "ids": "2 real sample(s)"}
    assert len(pick(SPECS, SHAPES, {}, count=1, model="m", calibration_dir=tmp_path).feeds) == 1


def test_single_file_and_per_input_npy_layouts(tmp_path: Path) -> None:
    one = _sample(seed=4)
    np.savez(tmp_path / "m.npz", **one)
    (tmp_path / "m").mkdir()
    two = _sample(seed=5)
    for name, arr in two.items():
        np.save(tmp_path / "m" / f"{name}.npy", arr)
    got = pick(SPECS, SHAPES, {}, count=8, model="m", calibration_dir=tmp_path)
    assert got.source == "calibration_dir" and len(got.feeds) == 2
    np.testing.assert_array_equal(got.feeds[0]["ids"], one["ids"])
    np.testing.assert_array_equal(got.feeds[1]["ids"], two["ids"])


def test_samples_of_other_shapes_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    np.savez(tmp_path / "m" / "a.npz", **_sample(batch=2))
    got = pick(SPECS, SHAPES, {}, count=3, model="m", calibration_dir=tmp_path)
    assert got.source == "generated" and len(got.feeds) == 3
    assert all(f["x"].shape == (1, 4) and f["ids"].shape == (1, 6) for f in got.feeds)
    # with one fitting sample next to it, only that one is used
    fit = _sample(seed=7)
    np.savez(tmp_path / "m" / "b.npz", **fit)
    got = pick(SPECS, SHAPES, {}, count=3, model="m", calibration_dir=tmp_path)
    assert got.source == "calibration_dir" and len(got.feeds) == 1
    np.testing.assert_array_equal(got.feeds[0]["ids"], fit["ids"])


def test_a_sample_missing_an_input_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    np.savez(tmp_path / "m" / "a.npz", x=np.zeros((1, 4), np.float32))
    with pytest.raises(PlanError) as err:
        pick(SPECS, SHAPES, {}, count=2, model="m", calibration_dir=tmp_path)
    assert "'m'" in err.value.message and "ids" in err.value.message
    assert err.value.field == "dispatch.calibration_dir"


def test_recent_requests_used_when_no_dir(tmp_path: Path) -> None:
    recent = [_sample(batch=2, seed=0), _sample(seed=1), _sample(seed=2), _sample(seed=3)]
    recent[2] = {"x": recent[2]["x"]}           # a request without every input: skipped
    got = pick(SPECS, SHAPES, {}, count=8, model="m", recent=recent)
    assert got.source == "requests" and len(got.feeds) == 2
    np.testing.assert_array_equal(got.feeds[0]["ids"], recent[1]["ids"])
    np.testing.assert_array_equal(got.feeds[1]["ids"], recent[3]["ids"])
    # the newest ones when there are more than wanted
    got = pick(SPECS, SHAPES, {}, count=1, model="m", recent=recent)
    np.testing.assert_array_equal(got.feeds[0]["ids"], recent[3]["ids"])
    # an empty calibration dir falls through to the requests too
    got = pick(SPECS, SHAPES, {}, count=8, model="m", calibration_dir=tmp_path, recent=recent)
    assert got.source == "requests"
    # requests of other shapes only: generated
    got = pick(SPECS, SHAPES, {}, count=2, model="m", recent=recent[:1])
    assert got.source == "generated"


def test_an_integer_input_computed_with_is_a_mask_whatever_its_name() -> None:
    """A PyTorch export named its attention mask ``onnx::Unsqueeze_1``: drawn as small ids
    (0..7) its softmax saturated and an int8 tagger 0.49 off on real text checked at 0.0. An
    integer [batch, sequence] input no table is indexed by, whose values go into arithmetic
    after a Cast, is a mask: ones."""
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 8])
    model = _model(
        [helper.make_node("Cast", ["onnx::Unsqueeze_1"], ["m"], to=TensorProto.FLOAT),
         helper.make_node("Sub", ["one", "m"], ["inv"]),
         helper.make_node("Mul", ["inv", "big"], ["bias"]),
         helper.make_node("Add", ["scores", "bias"], ["y"]),
         helper.make_node("Cast", ["lens"], ["lensf"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["y", "lensf"], ["z"])],
        [scores, helper.make_tensor_value_info("onnx::Unsqueeze_1", TensorProto.INT64, [1, 8]),
         helper.make_tensor_value_info("lens", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
         numpy_helper.from_array(np.array(-10000.0, np.float32), "big")])
    specs = [TensorSpec("scores", "float32", (1, 8)),
             TensorSpec("onnx::Unsqueeze_1", "int64", (1, 8)), TensorSpec("lens", "int64", (1,))]
    rules = onnx_rules(model, specs)
    assert rules["onnx::Unsqueeze_1"].kind == "ones"
    assert rules["lens"].kind == "ids"   # rank 1: a length, not a mask; the name rule stands
    feed = generate(specs, {s.name: s.shape for s in specs}, rules, 1).feeds[0]
    assert (feed["onnx::Unsqueeze_1"] == 1).all()
