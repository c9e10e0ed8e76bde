"""Tensor isolation on real exported models no one here wrote: the same outputs from a worker
process as in the daemon — int64 token ids and mask (MiniLM int8, an onnxruntime-quantized
export) and a float TFLite audio embedding with a dynamic batch (openWakeWord)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from isolation_fixtures import Events, backends, isolated
from real_models import CORPUS

from edgepilot.backends.base import Segment, Target
from edgepilot.formats.io import tensor_specs

REAL = {m.name: m for m in CORPUS}


@pytest.fixture
def events() -> Iterator[Events]:
    yield Events()


def whole(name: str) -> Segment:
    model = REAL[name]
    kind = "onnx" if model.suffix == ".onnx" else "tflite"
    ins, outs = tensor_specs(model.path, kind)
    return Segment(model.path, kind, tuple(s.name for s in ins), tuple(s.name for s in outs),
                   None, name)


def feed(segment: Segment) -> dict[str, np.ndarray]:
    ins, _ = tensor_specs(segment.model_path, segment.kind)
    shapes = REAL[segment.name].input_shapes
    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray] = {}
    for s in ins:
        dims = shapes.get(s.name) or [int(d) if isinstance(d, int) and d > 0 else 1
                                      for d in s.shape]
        if s.name in ("attention_mask", "token_type_ids"):
            dims = shapes.get("input_ids", dims)
            out[s.name] = (np.ones if s.name == "attention_mask" else np.zeros)(dims, s.dtype)
        elif np.issubdtype(np.dtype(s.dtype), np.integer):
            out[s.name] = rng.integers(100, 5000, dims).astype(s.dtype)
        else:
            out[s.name] = rng.standard_normal(dims).astype(s.dtype)
    return out


@pytest.mark.parametrize(("name", "backend"), [("minilm", "onnxruntime"),
                                               ("wake-embedding", "tflite")])
def test_a_real_model_answers_the_same_from_its_worker(name: str, backend: str,
                                                       events: Events) -> None:
    segment = whole(name)
    target = Target(backend, "cpu", "fp32")
    x = feed(segment)
    want = backends(backend, "thread").compile(segment, target).run(x)
    iso = isolated(backend, events)
    exe = iso.compile(segment, target)
    try:
        assert exe.worker_pid is not None  # really in another process
        got = exe.run(x)
        assert set(got) == set(want)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    finally:
        exe.close()
