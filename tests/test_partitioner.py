"""Partitioner on generated ONNX graphs: cuts at small live sets, coalescing, segments."""

from __future__ import annotations

from pathlib import Path

import dispatch_fixtures
import numpy as np
import onnx
import pytest

from edgepilot.backends.base import Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.graph.partition import merge_layers, merge_to, partition
from edgepilot.errors import PlanError
from edgepilot.formats import onnx_gen

transformer_path = dispatch_fixtures.transformer_path
ort_backend = dispatch_fixtures.ort_backend


def test_transformer_cut_at_residuals(transformer_path: Path) -> None:
    part = partition(transformer_path)
    # 2 blocks x (attention, FFN) sublayers: one tensor crosses each residual cut
    assert len(part.layers) == 4
    for layer in part.layers[1:]:
        assert len(layer.inputs) == 1 and len(layer.outputs) == 1
        assert layer.in_bytes == 16 * 64 * 4
    model = onnx.load(str(transformer_path))
    assert sum(layer.end - layer.start for layer in part.layers) == len(model.graph.node)
    # the large FFN (block 1) costs more than the small one (block 0)
    assert part.layers[3].flops > 4 * part.layers[1].flops
    assert "Softmax" in part.layers[0].op_types
    assert part.segment(0, 4).is_whole
    assert part.segment(1, 3).layers == (1, 3)


def test_segments_compose_to_the_whole_model(transformer_path: Path,
                                             ort_backend: OnnxRuntimeBackend) -> None:
    part = partition(transformer_path)
    fp32 = Target("onnxruntime", "cpu", "fp32")
    feed = onnx_gen.sample_inputs(transformer_path)[0]
    env = dict(feed)
    for i in range(len(part.layers)):
        env.update(ort_backend.compile(part.segment(i, i + 1), fp32).run(env))
    whole = ort_backend.compile(part.segment(0, len(part.layers)), fp32).run(feed)
    np.testing.assert_allclose(env["y"], whole["y"], rtol=1e-4, atol=1e-4)


def test_coalescing_and_layer_cap(tmp_path: Path) -> None:
    path = tmp_path / "cnn.onnx"
    onnx_gen.small_cnn(path)
    fine = partition(path, min_layer_flops=1)
    assert len(fine.layers) == len(onnx.load(str(path)).graph.node)  # a chain: cut everywhere
    default = partition(path)
    # Relu/MaxPool alone are too cheap to be worth a hop: merged with their conv
    assert len(default.layers) < len(fine.layers)
    assert all(any(op in ("Conv", "Gemm") for op in lay.op_types) for lay in default.layers)
    assert len(partition(path, min_layer_flops=1, max_layers=2).layers) <= 2
    assert len(partition(path, min_layer_flops=10**12).layers) == 1


def test_unsupported_files_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF")
    with pytest.raises(PlanError) as err:
        partition(bad)
    assert err.value.field == "model" and ".onnx" in err.value.message
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    with pytest.raises(PlanError):
        partition(junk)


def test_merge_to_makes_the_layers_a_board_of_the_same_kind_merged(
        transformer_path: Path) -> None:
    """Adopting a published plan merges this board's layers into the published ones instead of
    running every layer alone on the reference to find them; anything but such a merge of
    neighbours is refused and leaves the layers as they were."""
    theirs = partition(transformer_path)
    merge_layers(theirs, 1)  # what runnable_layers does for a layer the reference cannot run
    names = [lay.name for lay in theirs.layers]
    mine = partition(transformer_path)
    assert len(mine.layers) == 4 and len(names) == 3
    assert merge_to(mine, names)
    assert [(lay.start, lay.end) for lay in mine.layers] == \
        [(lay.start, lay.end) for lay in theirs.layers]
    fresh = partition(transformer_path)
    before = [lay.name for lay in fresh.layers]
    assert not merge_to(fresh, [*names[:2], "L2:Gemm:elsewhere"])
    assert not merge_to(fresh, [*before, "L4:extra"])
    assert [lay.name for lay in fresh.layers] == before

