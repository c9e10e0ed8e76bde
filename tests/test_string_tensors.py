"""Text tensors (ONNX ``string``: a label encoder's, an in-graph tokenizer's) as a scikit-learn
pipeline exports them: planned, their text outputs compared exactly with the raw runtime's,
and served over HTTP as JSON strings and ``.npy`` unicode arrays."""

from __future__ import annotations

import io
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
from models_fixtures import start_daemon

from edgepilot.backends.base import Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.dispatch.measuring.tolerance import tensor_error
from edgepilot.dispatch.model_dispatch import DispatchOptions, ModelDispatch
from edgepilot.formats.onnx_gen import label_classifier

WORD = np.array([list("edgeboar")], dtype=object)


def raw_outputs(path: Path, letters: np.ndarray) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"letters": letters}),
                    strict=True))


def test_text_tensors_compare_exactly() -> None:
    same = np.array(["north", "east"], dtype=object)
    assert tensor_error(same, same.copy()) == 0.0
    assert tensor_error(same, np.array(["north", "west"], dtype=object)) == float("inf")
    assert tensor_error(same, np.array(["north"], dtype=object)) == float("inf")
    spectrum = np.array([1 + 2j, 3 - 1j], dtype=np.complex64)  # an RFFT's output
    assert tensor_error(spectrum, spectrum) == 0.0 and tensor_error(spectrum, spectrum.real) > 0


def test_a_text_model_is_planned_and_its_text_matches_the_raw_runtime(tmp_path: Path) -> None:
    path = tmp_path / "classifier.onnx"
    label_classifier(path)
    backend = OnnxRuntimeBackend()
    targets = [Target("onnxruntime", "cpu", "fp32"), Target("onnxruntime", "cpu-1t", "fp32")]
    md = ModelDispatch("classifier", path, {"onnxruntime": backend}, targets,
                       DispatchOptions(runs=3, warmup=1))
    plan = md.prepare()  # raised ValueError on the string outputs' error before
    assert plan.error == 0.0
    # generated text inputs are letters, which the encoder knows (not numbers it maps to its
    # default): the calibration inputs exercise the model
    assert all(isinstance(x, str) and x.isalpha() for x in md.calibration[0]["letters"].ravel())
    for letters in (WORD, md.calibration[0]["letters"]):
        got, _ = md.run({"letters": letters})
        want = raw_outputs(path, letters)
        assert got["label"].tolist() == want["label"].tolist()
        np.testing.assert_allclose(got["scores"], want["scores"], rtol=1e-5, atol=1e-6)


def test_text_in_and_out_over_http(tmp_path: Path) -> None:
    models = tmp_path / "models"
    label_classifier(models / "classifier.onnx")
    want = raw_outputs(models / "classifier.onnx", WORD)
    d = start_daemon(tmp_path, "")
    try:
        code, body = d.request("POST", "/v1/infer/classifier", {"inputs": {"letters": {
            "data": WORD.tolist(), "dtype": "string", "shape": [1, 8]}}})
        assert code == 200, body
        assert body["outputs"]["label"] == {"data": want["label"].tolist(), "dtype": "string",
                                            "shape": [1]}
        assert body["outputs"]["scores"]["dtype"] == "float32"
        # not text where text is wanted, and text where numbers are: 400 naming the field
        code, body = d.request("POST", "/v1/infer/classifier", {"inputs": {"letters": {
            "data": [[1, 2, 3, 4, 5, 6, 7, 8]], "dtype": "string"}}})
        assert code == 400 and body["error"]["field"] == "inputs.letters.data", body
        code, body = d.request("POST", "/v1/infer/classifier", {"inputs": {"letters": {
            "data": [[1, 2, 3, 4, 5, 6, 7, 8]], "dtype": "float32"}}})
        assert code == 400 and body["error"]["field"] == "inputs.letters.dtype", body
        assert "wants string" in body["error"]["message"], body
        # .npy both ways: text as fixed-width unicode, no pickles
        buf = io.BytesIO()
        np.save(buf, WORD.astype(str), allow_pickle=False)
        req = urllib.request.Request(d.url + "/v1/infer/classifier?output=label",
                                     data=buf.getvalue(),
                                     headers={"Content-Type": "application/x-npy",
                                              "Accept": "application/x-npy"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            got = np.load(io.BytesIO(resp.read()), allow_pickle=False)
        assert got.dtype.kind == "U" and got.tolist() == want["label"].tolist()
    finally:
        assert d.stop() == 0
