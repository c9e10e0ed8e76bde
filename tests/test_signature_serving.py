"""Plans per input-shape signature in a real daemon: request shapes start their own plan,
recent requests calibrate it when asked to, and the number of signatures per model is bounded.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from daemon_proc import DaemonProcess

from edgepilot.formats.onnx_gen import mlp_stack


def dynamic_mlp(path: Path) -> Path:
    """The generated MLP with its batch dim made symbolic, and no value_info (like an export)."""
    mlp_stack(path, widths=(32, 64, 64, 32), batch=2)
    model = onnx.load(str(path))
    for vi in [*model.graph.input, *model.graph.output]:
        vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    del model.graph.value_info[:]
    onnx.save(model, str(path))
    return path


def infer(d: DaemonProcess, x: np.ndarray) -> dict[str, Any]:
    code, body = d.request("POST", "/v1/infer/mlp", {"inputs": {"x": {
        "data": x.ravel().tolist(), "dtype": "float32", "shape": list(x.shape)}}})
    assert code == 200, body
    return body


def planned(d: DaemonProcess, x: np.ndarray, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    body = infer(d, x)
    while body["plan"].startswith("single:") and time.monotonic() < deadline:
        time.sleep(0.2)
        body = infer(d, x)
    assert not body["plan"].startswith("single:"), d.output()
    return body


def start(tmp: Path, extra: str) -> DaemonProcess:
    models = tmp / "models"
    models.mkdir()
    dynamic_mlp(models / "mlp.onnx")
    return DaemonProcess(tmp, f'[mqtt]\nenabled = false\n[daemon]\nmodel_dir = "{models}"\n'
                              "[dispatch]\nkernel_corpus = false\nprofile_runs = 3\n"
                              f"profile_passes = 1\n{extra}").start()


def test_each_signature_gets_its_own_plan_calibrated_on_real_requests(tmp_path: Path) -> None:
    d = start(tmp_path, "sample_requests = 4\n")
    try:
        rng = np.random.default_rng(0)
        x2 = rng.standard_normal((2, 32)).astype(np.float32)
        x5 = rng.standard_normal((5, 32)).astype(np.float32)
        a = planned(d, x2)
        code, plan_a = d.request("GET", "/v1/plan/mlp")
        assert code == 200 and plan_a["hash"] == a["plan"]
        assert plan_a["input_shapes"] == {"x": [2, 32]}
        # calibrated on the request that started the plan, not on made-up inputs
        assert plan_a["inputs_used"]["source"] == "requests"
        # another batch size: answered at once (whole), then through a plan of its own
        first5 = infer(d, x5)
        assert first5["plan"].startswith("single:")
        b = planned(d, x5)
        assert b["plan"] != a["plan"]
        code, plan_b = d.request("GET", "/v1/plan/mlp")
        assert plan_b["input_shapes"] == {"x": [5, 32]} and plan_b["hash"] == b["plan"]
        # the first signature still has its plan
        assert infer(d, x2)["plan"] == a["plan"]
        got = np.asarray(b["outputs"]["y"]["data"], np.float32)
        ref = np.asarray(first5["outputs"]["y"]["data"], np.float32)
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= 0.05
    finally:
        assert d.stop() == 0


def test_signatures_per_model_are_bounded(tmp_path: Path) -> None:
    d = start(tmp_path, "max_signatures = 1\n")
    try:
        rng = np.random.default_rng(1)
        x2 = rng.standard_normal((2, 32)).astype(np.float32)
        x3 = rng.standard_normal((3, 32)).astype(np.float32)
        a = planned(d, x2)
        planned(d, x3)
        assert "dropping the plan for shapes x=2x32" in d.output()
        # the dropped signature is served whole again (never an error), then replanned
        again = infer(d, x2)
        assert again["plan"].startswith("single:")
        assert planned(d, x2)["plan"] == a["plan"]  # same shapes, same cached plan
    finally:
        assert d.stop() == 0
