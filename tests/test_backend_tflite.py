"""TFLite backend: whole models and flatbuffer-cut segments against the plain interpreter."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter
from models_fixtures import mlp_tflite, wakeword_tflite  # noqa: F401 - fixture

from edgepilot.backends.base import Segment, Target
from edgepilot.backends.tflite import TfliteBackend, ops_outside_delegates
from edgepilot.config import TfliteSection
from edgepilot.errors import BackendError
from edgepilot.formats import tflite_graph
from edgepilot.formats.tflite_gen import write_mlp_tflite

XNN = Target("tflite", "xnnpack", "fp32")
CPU = Target("tflite", "cpu", "fp32")


def interpret(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ip = Interpreter(model_path=str(path))
    ip.allocate_tensors()
    for d in ip.get_input_details():
        ip.set_tensor(d["index"], feeds[d["name"]])
    ip.invoke()
    return {d["name"]: ip.get_tensor(d["index"]).copy() for d in ip.get_output_details()}


def whole(path: Path) -> Segment:
    ins, outs = tflite_graph.io_names(path)
    return Segment(path, "tflite", ins, outs)


def chain(backend: TfliteBackend, path: Path, cuts: list[int], target: Target,
          feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the model as consecutive segments, passing every produced tensor along."""
    env = dict(feeds)
    bounds = [0, *cuts, len(tflite_graph.layers(path))]
    for a, b in itertools.pairwise(bounds):
        seg = tflite_graph.segment(path, a, b)
        exe = backend.compile(seg, target)
        env.update(exe.run({n: env[n] for n in seg.inputs}))
    return env


@pytest.mark.parametrize("target", [XNN, CPU], ids=str)
def test_whole_model_equals_interpreter(mlp_tflite: Path, target: Target) -> None:  # noqa: F811
    x = np.random.default_rng(0).standard_normal((1, 32)).astype(np.float32)
    exe = TfliteBackend().compile(whole(mlp_tflite), target)
    assert [s.name for s in exe.inputs] == ["input"]
    np.testing.assert_allclose(exe.run({"input": x})["output"],
                               interpret(mlp_tflite, {"input": x})["output"], atol=1e-5)


def test_segment_boundaries_carry_skip_connections(mlp_tflite: Path) -> None:  # noqa: F811
    ops = [layer.op for layer in tflite_graph.layers(mlp_tflite)]
    assert ops == ["FULLY_CONNECTED"] * 3 + ["ADD", "LOGISTIC"]
    seg = tflite_graph.segment(mlp_tflite, 0, 2)
    # fc0 feeds the residual ADD later, so it must leave the segment too
    assert seg.inputs == ("input",) and set(seg.outputs) == {"fc0", "fc1"}
    assert seg.layers == (0, 2)
    tail = tflite_graph.segment(mlp_tflite, 2, 5)
    assert set(tail.inputs) == {"fc1", "fc0"} and tail.outputs == ("output",)


def test_chained_segments_reproduce_the_mlp(mlp_tflite: Path) -> None:  # noqa: F811
    x = np.random.default_rng(1).standard_normal((1, 32)).astype(np.float32)
    got = chain(TfliteBackend(), mlp_tflite, [1, 3], XNN, {"input": x})
    np.testing.assert_allclose(got["output"], interpret(mlp_tflite, {"input": x})["output"],
                               atol=1e-5)


def test_chained_segments_reproduce_a_real_wakeword_model() -> None:
    path = wakeword_tflite("embedding_model")
    (name,), (out,) = tflite_graph.io_names(path)
    shape = [int(d) for d in Interpreter(model_path=str(path)).get_input_details()[0]["shape"]]
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    n = len(tflite_graph.layers(path))
    got = chain(TfliteBackend(), path, [n // 3, 2 * n // 3], XNN, {name: x})
    np.testing.assert_allclose(got[out], interpret(path, {name: x})[out], atol=1e-5)


def test_a_cut_segment_is_smaller_than_the_model(mlp_tflite: Path) -> None:  # noqa: F811
    seg = tflite_graph.segment(mlp_tflite, 0, 1)
    cut = TfliteBackend().model_bytes(seg)
    assert len(cut) < mlp_tflite.stat().st_size
    ip = Interpreter(model_content=cut)
    assert [d["name"] for d in ip.get_output_details()] == ["fc0"]


def test_bad_cuts_name_the_problem(mlp_tflite: Path) -> None:  # noqa: F811
    with pytest.raises(BackendError, match="not tensors") as err:
        tflite_graph.cut(mlp_tflite, ("nope",), ("output",))
    assert err.value.field == "segment.inputs"
    with pytest.raises(BackendError, match="neither a segment input") as err:
        tflite_graph.cut(mlp_tflite, ("fc1",), ("output",))  # the residual needs fc0 too
    with pytest.raises(BackendError, match="outside"):
        tflite_graph.segment(mlp_tflite, 3, 9)


def test_supports_and_probe(mlp_tflite: Path, tmp_path: Path) -> None:  # noqa: F811
    backend = TfliteBackend(TfliteSection(delegates={"npu": tmp_path / "missing.so"}))
    devices = {t.device for t in backend.probe()}
    assert devices == {"xnnpack", "cpu"}  # the delegate's .so is missing, so no npu device
    assert backend.supports(whole(mlp_tflite), XNN)
    int8 = backend.supports(whole(mlp_tflite), Target("tflite", "xnnpack", "int8"))
    assert not int8 and "fp32" in int8.reason
    npu = backend.supports(whole(mlp_tflite), Target("tflite", "npu", "fp32"))
    assert not npu and "does not exist" in npu.reason
    assert not backend.supports(Segment(tmp_path / "m.onnx", "onnx", ("x",), ("y",)), XNN)
    with pytest.raises(BackendError, match="cannot run"):
        backend.compile(whole(mlp_tflite), Target("tflite", "gpu", "fp32"))


def test_xnnpack_runs_what_it_leaves_on_the_builtin_kernels_of_the_same_interpreter(
        tmp_path: Path) -> None:
    """LOG_SOFTMAX is not an XNNPACK operator. XNNPACK is a CPU delegate, so what it leaves
    runs on the builtin kernels of the same interpreter (same device, no hop): the whole model
    is still supported on tflite/xnnpack, with the split named; cpu runs everything."""
    path = write_mlp_tflite(tmp_path / "logsoftmax.tflite", head="log_softmax")
    ops = [layer.op for layer in tflite_graph.layers(path)]
    assert ops == ["FULLY_CONNECTED"] * 3 + ["ADD", "LOG_SOFTMAX"]
    # what the runtime itself did: one delegate node, and LOG_SOFTMAX still on its own
    ip = Interpreter(model_path=str(path))
    ip.allocate_tensors()
    assert [n["op_name"] for n in ip._get_ops_details()][5:] == ["DELEGATE"]
    assert ops_outside_delegates(ip, 5) == ["LOG_SOFTMAX#4"]

    backend = TfliteBackend()
    verdict = backend.supports(whole(path), XNN)
    assert verdict
    assert "takes 4 of 5 operators" in verdict.reason and "LOG_SOFTMAX" in verdict.reason
    x0 = np.random.default_rng(2).standard_normal((1, 32)).astype(np.float32)
    np.testing.assert_allclose(backend.compile(whole(path), XNN).run({"input": x0})["output"],
                               interpret(path, {"input": x0})["output"], atol=1e-5)
    assert backend.supports(tflite_graph.segment(path, 0, 4), XNN)  # FCs and ADD: all taken
    assert not backend.supports(tflite_graph.segment(path, 0, 4), XNN).reason
    assert backend.supports(whole(path), CPU)
    # the MLP with a LOGISTIC head is XNNPACK's entirely
    plain = write_mlp_tflite(tmp_path / "logistic.tflite")
    assert backend.supports(whole(plain), XNN)

    # a plan that splits there runs and matches the interpreter: XNNPACK head, cpu tail
    x = np.random.default_rng(3).standard_normal((1, 32)).astype(np.float32)
    head = tflite_graph.segment(path, 0, 4)
    tail = tflite_graph.segment(path, 4, 5)
    env = {"input": x, **backend.compile(head, XNN).run({"input": x})}
    got = backend.compile(tail, CPU).run({n: env[n] for n in tail.inputs})["output"]
    np.testing.assert_allclose(got, interpret(path, {"input": x})["output"], atol=1e-5)


def test_dynamic_batch_resizes_the_interpreter_per_request() -> None:
    """A float TFLite export with shape_signature [-1, 76, 32, 1]: the same executable runs
    batch 1, 3 and 1 again, each equal to LiteRT resized by hand."""
    from real_models import by_name

    path = by_name("wake-embedding").path
    ins, outs = tflite_graph.io_names(path)
    exe = TfliteBackend().compile(Segment(path, "tflite", ins, outs), XNN)
    rng = np.random.default_rng(5)
    for batch in (1, 3, 1):
        x = rng.uniform(0, 4, (batch, 76, 32, 1)).astype(np.float32)
        got = exe.run({ins[0]: x})[outs[0]]
        ip = Interpreter(model_path=str(path))
        ip.resize_tensor_input(ip.get_input_details()[0]["index"], list(x.shape))
        ip.allocate_tensors()
        ip.set_tensor(ip.get_input_details()[0]["index"], x)
        ip.invoke()
        ref = ip.get_tensor(ip.get_output_details()[0]["index"])
        assert got.shape[0] == batch
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
