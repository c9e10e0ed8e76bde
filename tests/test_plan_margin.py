"""A plan that mixes in another precision is kept only inside PLAN_MARGIN of its budget: its
error is measured on calibration inputs, and real requests took a 9-segment int8/fp32 plan
checked at 0.048 to 0.059 (tolerance 0.05). Over the margin, its worst layers go back to the
reference, as they go over the tolerance."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from edgepilot.backends.base import Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.measuring.tolerance import PLAN_MARGIN
from edgepilot.dispatch.model_dispatch import DispatchOptions, ModelDispatch
from edgepilot.formats.onnx_gen import transformer_stack

FP32, INT8 = "onnxruntime/cpu/fp32", "onnxruntime/cpu/int8"


def test_a_mixed_plan_within_tolerance_but_past_the_margin_is_repaired(tmp_path: Path) -> None:
    path = tmp_path / "tf.onnx"
    transformer_stack(path, n_blocks=2, d_model=64, seq=16, ffn_small=32, ffn_large=256)
    md = ModelDispatch("tf", path, {"onnxruntime": OnnxRuntimeBackend()},
                       [Target.parse(FP32), Target.parse(INT8)],
                       DispatchOptions(tolerance=1.0, runs=3, warmup=1, passes=1,
                                       hysteresis=-1.0))
    md.prepare()
    assert md.builder is not None
    n = len(md.builder.part.layers)
    md.builder.forced.update(dict.fromkeys(range(n), INT8))  # every layer int8, as pinned
    _, pinned = md.replan("test: all int8", force=True)
    assert set(pinned.targets) == {INT8} and pinned.error is not None and pinned.error > 0
    md.builder.forced.update(dict.fromkeys(range(n), FP32))
    _, plain = md.replan("test: all fp32", force=True)
    assert set(plain.targets) == {FP32}
    # a budget the all-int8 plan meets, but not with the margin
    tolerance = pinned.error / ((1 + PLAN_MARGIN) / 2)
    md.opts = dataclasses.replace(md.opts, tolerance=tolerance)
    md.builder.forced.update(dict.fromkeys(range(n), INT8))
    _, kept = md.replan("test: margin", force=True)
    assert FP32 in kept.targets  # its worst layer went back to the reference
    assert kept.error is not None and kept.error <= PLAN_MARGIN * tolerance
