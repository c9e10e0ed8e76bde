"""Arm NN backend (Debian's pyarmnn, CpuRef) against the TFLite interpreter on real models."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter
from models_fixtures import mlp_tflite, wakeword_tflite  # noqa: F401 - fixture

from edgepilot.backends import armnn as armnn_mod
from edgepilot.backends.armnn import ArmnnBackend
from edgepilot.backends.base import Segment, Target
from edgepilot.config import ArmnnSection
from edgepilot.errors import BackendError
from edgepilot.formats import tflite_graph

REF = Target("armnn", "CpuRef", "fp32")


def whole(path: Path) -> Segment:
    ins, outs = tflite_graph.io_names(path)
    return Segment(path, "tflite", ins, outs)


def interpret(path: Path, x: np.ndarray) -> np.ndarray:
    ip = Interpreter(model_path=str(path))
    ip.allocate_tensors()
    ip.set_tensor(ip.get_input_details()[0]["index"], x)
    ip.invoke()
    return np.array(ip.get_tensor(ip.get_output_details()[0]["index"]))


def wake_input(path: Path, seed: int = 0) -> np.ndarray:
    shape = Interpreter(model_path=str(path)).get_input_details()[0]["shape"]
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_probe_lists_registered_backends_in_preference_order() -> None:
    backend = ArmnnBackend(ArmnnSection(preferred=["GpuAcc", "CpuRef"]))
    assert backend.devices() == ["CpuRef"]  # Debian's build registers only the reference one
    assert REF in backend.probe() and Target("armnn", "CpuRef", "fp16") in backend.probe()


@pytest.mark.parametrize("model", ["alexa", "embedding_model"])
def test_cpuref_matches_tflite_on_wakeword_models(model: str) -> None:
    path = wakeword_tflite(model)
    x = wake_input(path)
    exe = ArmnnBackend().compile(whole(path), REF)
    try:
        (name,) = [s.name for s in exe.inputs]
        (out_name,) = [s.name for s in exe.outputs]
        got = exe.run({name: x})[out_name]
        want = interpret(path, x)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    finally:
        exe.close()


def test_fp16_reduction_runs_close_to_fp32() -> None:
    path = wakeword_tflite("alexa")
    x = wake_input(path, seed=3)
    backend = ArmnnBackend()
    exe = backend.compile(whole(path), Target("armnn", "CpuRef", "fp16"))
    try:
        got = exe.run({exe.inputs[0].name: x})[exe.outputs[0].name]
    finally:
        exe.close()
    np.testing.assert_allclose(got, interpret(path, x), atol=2e-2)


def test_unsupported_operators_are_refused_with_the_reason() -> None:
    support = ArmnnBackend().supports(whole(wakeword_tflite("okay_nabu")), REF)
    assert not support
    assert "RSQRT" in support.reason
    with pytest.raises(BackendError, match="RSQRT"):
        ArmnnBackend().compile(whole(wakeword_tflite("okay_nabu")), REF)


def test_chained_segments_on_cpuref_reproduce_the_mlp(mlp_tflite: Path) -> None:  # noqa: F811
    x = np.random.default_rng(4).standard_normal((1, 32)).astype(np.float32)
    backend = ArmnnBackend()
    env = {"input": x}
    for a, b in [(0, 2), (2, 5)]:
        seg = tflite_graph.segment(mlp_tflite, a, b)
        exe = backend.compile(seg, REF)
        try:
            env.update(exe.run({n: env[n] for n in seg.inputs}))
        finally:
            exe.close()
    np.testing.assert_allclose(env["output"], interpret(mlp_tflite, x), atol=1e-5)


def test_one_runtime_serves_every_network(mlp_tflite: Path) -> None:  # noqa: F811
    a, b = ArmnnBackend(), ArmnnBackend()
    exe_a = a.compile(whole(mlp_tflite), REF)
    exe_b = b.compile(whole(wakeword_tflite("alexa")), REF)
    try:
        assert armnn_mod.runtime() is armnn_mod.runtime()
        assert exe_a.net_id != exe_b.net_id  # type: ignore[attr-defined]
        x = np.ones((1, 32), np.float32)
        # both networks still run after the second was loaded into the same runtime
        assert exe_a.run({"input": x})["output"].shape == (1, 32)
        assert exe_b.run({exe_b.inputs[0].name: wake_input(wakeword_tflite("alexa"))})
    finally:
        exe_a.close()
        exe_b.close()


def test_onnx_and_int4_are_refused(tmp_path: Path, mlp_tflite: Path) -> None:  # noqa: F811
    onnx = ArmnnBackend().supports(Segment(tmp_path / "m.onnx", "onnx", ("x",), ("y",)), REF)
    assert not onnx and "ONNX" in onnx.reason
    int4 = ArmnnBackend().supports(whole(mlp_tflite), Target("armnn", "CpuRef", "int4"))
    assert not int4 and "INT4" in int4.reason


def test_workload_tensor_chatter_is_silenced_and_other_info_kept(
        mlp_tflite: Path, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    caplog.set_level(logging.INFO)
    exe = ArmnnBackend().compile(whole(mlp_tflite), REF)
    try:
        exe.run({"input": np.ones((1, 32), np.float32)})
    finally:
        exe.close()
    logging.getLogger("edgepilot.test").info("ours at info")
    logging.info("the root's own, from elsewhere")
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if m.startswith("Workload tensor")], messages
    assert "ours at info" in messages and "the root's own, from elsewhere" in messages
