"""A failing (segment, target) pair is a planning fact, never an abort (issue 16), on real
TFLite exports shipped in registry packages:

- fp16-weight files (``DEQUANTIZE`` feeding each convolution): the unpacked weights stay with
  the operator reading them, so every layer runs on XNNPACK;
- a custom op the interpreter's default resolver registers (MediaPipe's selfie segmentation,
  ``Convolution2DTransposeBias``): the target without it is excluded where the op is, with the
  reason in the plan's ``exclusions``, and the plan serves within tolerance of the raw runtime;
- a custom op no runtime resolves (face landmarks with attention): ``plan`` exits 2 with one
  line naming the file and the op, the daemon answers 422 and keeps serving other models;
- files that are not models: exit 2, one line naming the file;
- unnamed ONNX dims (``?``, ``unk__N``) are each their own unknown.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_proc import FAST_PLANNING
from cli_proc import run_cli as cli
from daemon_proc import DaemonProcess
from onnx import numpy_helper
from real_models import UNRUNNABLE, by_name

from edgepilot.backends.base import TensorSpec
from edgepilot.dispatch.graph.partition import partition
from edgepilot.dispatch.graph.signature import resolve_shapes

CONFIG = FAST_PLANNING


def encode(feed: dict[str, np.ndarray]) -> dict[str, object]:
    return {"inputs": {n: {"data": a.ravel().tolist(), "dtype": str(a.dtype),
                           "shape": list(a.shape)} for n, a in feed.items()}}


def raw_tflite(path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path))
    interp.allocate_tensors()
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], feed[d["name"]])
    interp.invoke()
    return {d["name"]: interp.get_tensor(d["index"]).copy()
            for d in interp.get_output_details()}


def test_fp16_weights_stay_with_the_operator_that_reads_them() -> None:
    model = by_name("mp-face-detection")
    part = partition(model.path)
    assert len(part.layers) > 1
    assert not any(n.op == "DEQUANTIZE" for n in part.nodes)
    # every cut hands over one activation, never a weight
    assert all(len(lay.inputs) == 1 for lay in part.layers), [lay.inputs for lay in part.layers]
    # and a convolution's weight bytes are counted with it
    assert all(lay.weight_bytes > 0 for lay in part.layers if "CONV_2D" in lay.op_types)


def test_a_custom_op_only_xnnpack_runs_is_an_exclusion_and_the_plan_serves(
        tmp_path: Path) -> None:
    model = by_name("selfie-segmentation")
    res = cli(tmp_path, "plan", str(model.path), "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert "Traceback" not in res.stderr
    cpu = [e for e in plan["exclusions"] if e["target"] == "tflite/cpu/fp32"]
    assert cpu, plan["exclusions"]
    assert all("Convolution2DTransposeBias" in e["reason"] and "\n" not in e["reason"]
               for e in cpu)
    # the layer holding the op never runs on the target that cannot resolve it
    n = len(plan["layers"])
    for e in cpu:
        if e["layers"] != [0, n]:
            assert all(plan["layers"][i]["target"] != "tflite/cpu/fp32"
                       for i in range(*e["layers"]))
    assert plan["error"] is not None and plan["error"] <= plan["tolerance"]


def test_a_file_no_runtime_runs_exits_2_with_one_line_naming_file_and_op(
        tmp_path: Path) -> None:
    model = UNRUNNABLE[0]
    res = cli(tmp_path, "plan", str(model.path))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert model.path.name in lines[0] and "Landmarks2TransformMatrix" in lines[0]


@pytest.mark.parametrize("damage", ["truncated", "not-a-model"])
def test_a_broken_file_exits_2_with_one_line_naming_it(tmp_path: Path, damage: str) -> None:
    src = by_name("selfie-segmentation").path.read_bytes()
    bad = tmp_path / f"{damage}.tflite"
    bad.write_bytes(src[: len(src) // 3] if damage == "truncated" else b"hello " * 100)
    res = cli(tmp_path, "plan", str(bad))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and bad.name in lines[0], res.stderr


def test_a_model_saved_under_the_other_extension_is_told_its_name(tmp_path: Path) -> None:
    tflite = by_name("selfie-segmentation").path.read_bytes()
    onnx_bytes = by_name("silero-vad").path.read_bytes()
    for name, data, fix in (("seg.onnx", tflite, "name it seg.tflite"),
                            ("vad.tflite", onnx_bytes, "name it vad.onnx")):
        (tmp_path / name).write_bytes(data)
        res = cli(tmp_path, "plan", str(tmp_path / name))
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1, res.stderr
        assert name in lines[0] and fix in lines[0], lines[0]


def test_an_empty_onnx_file_and_one_without_operators_exit_2_naming_them(
        tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")  # parses as an empty ModelProto: it was "no operators to partition"
    through = tmp_path / "through.onnx"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    onnx.save(helper.make_model(helper.make_graph([], "g", [x], [x]),
                                opset_imports=[helper.make_opsetid("", 17)]), through)
    for path, words in ((empty, "not a readable ONNX model"), (through, "no operators")):
        res = cli(tmp_path, "plan", str(path))
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1, res.stderr
        assert path.name in lines[0] and words in lines[0], lines[0]


def test_an_archive_or_other_file_exits_2_naming_it_and_the_kinds(tmp_path: Path) -> None:
    # a user passing the package a model came in (a .tar.gz) was told "unknown model"
    archive = tmp_path / "model.tar.gz"
    archive.write_bytes(b"\x1f\x8b" + b"\0" * 64)
    res = cli(tmp_path, "plan", str(archive))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert archive.name in lines[0] and ".onnx" in lines[0] and "unpack" in lines[0]
    for where, words in ((tmp_path / "gone.onnx", "no model file at"),
                         (tmp_path, "is a directory")):
        res = cli(tmp_path, "plan", str(where))
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and words in lines[0], res.stderr


def zipmap_classifier(path: Path) -> Path:
    """A classifier as skl2onnx writes one by default: its probabilities a tensor and, through
    ZipMap, a sequence of maps (label -> probability)."""
    import onnx
    from onnx import TensorProto, helper

    out = onnx.ValueInfoProto(name="output_probability")
    out.type.sequence_type.elem_type.map_type.key_type = TensorProto.INT64
    out.type.sequence_type.elem_type.map_type.value_type.tensor_type.elem_type = \
        TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["input"], ["probabilities"], axis=1),
         helper.make_node("ZipMap", ["probabilities"], ["output_probability"],
                          domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2])],
        "classifier", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [1, 3]), out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 1)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_a_model_with_an_output_that_is_not_a_tensor_exits_2_naming_it(tmp_path: Path) -> None:
    model = zipmap_classifier(tmp_path / "classifier.onnx")
    res = cli(tmp_path, "plan", str(model))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "classifier.onnx: output 'output_probability' is a sequence of maps" in lines[0]
    assert "'zipmap': False" in lines[0]


def test_the_daemon_answers_422_for_an_unrunnable_model_and_keeps_serving(
        tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(UNRUNNABLE[0].path, models / "attention.tflite")
    zipmap_classifier(models / "classifier.onnx")
    good = by_name("iris-landmark")
    shutil.copy(good.path, models / "iris.tflite")
    data = good.path.read_bytes()
    (models / "truncated.tflite").write_bytes(data[: len(data) // 3])
    d = DaemonProcess(tmp_path, CONFIG + f'[daemon]\nmodel_dir = "{models}"\n',
                      extra_args=["--model-dir", str(models)]).start(timeout=120)
    try:
        code, err = d.request("POST", "/v1/infer/attention",
                              encode({"input_1": np.zeros((1, 192, 192, 3), np.float32)}),
                              timeout=120)
        assert code == 422, err
        assert err["error"]["code"] == "model_unrunnable"
        assert "Landmarks2TransformMatrix" in err["error"]["message"]
        assert "attention.tflite" in err["error"]["message"]
        code, err = d.request("POST", "/v1/infer/truncated",
                              encode({"input_1": np.zeros((1, 64, 64, 3), np.float32)}),
                              timeout=120)
        assert code == 422, err
        assert "truncated.tflite" in err["error"]["message"]
        assert "\n" not in err["error"]["message"]
        code, err = d.request("POST", "/v1/infer/classifier",
                              encode({"input": np.zeros((1, 3), np.float32)}), timeout=120)
        assert code == 422, err
        assert "'output_probability' is a sequence of maps" in err["error"]["message"]
        code, listed = d.request("GET", "/v1/models", timeout=30)  # the listing still answers
        assert code == 200, listed
        # and says why a model does not load, as the request did
        broken = {m["id"]: m.get("error", "") for m in listed["data"]}
        assert "truncated.tflite" in broken["truncated"], broken
        code, one = d.request("GET", "/v1/models/attention", timeout=30)
        assert code == 200 and "Landmarks2TransformMatrix" in one["error"], one
        feed = {"input_1": np.random.default_rng(0).uniform(0, 1, (1, 64, 64, 3))
                .astype(np.float32)}
        code, ok = d.request("POST", "/v1/infer/iris", encode(feed), timeout=120)
        assert code == 200, ok
        want = raw_tflite(good.path, feed)
        for name, ref in want.items():
            got = np.asarray(ok["outputs"][name]["data"], np.float32).reshape(ref.shape)
            assert np.allclose(got, ref, rtol=1e-4, atol=1e-5)
    finally:
        d.stop()


@pytest.mark.parametrize("unnamed", ["?", "", "unk__12", "-1"])
def test_unnamed_dims_are_each_their_own_unknown(unnamed: str) -> None:
    specs = [TensorSpec("a", "float32", (1, unnamed, 8)),
             TensorSpec("x", "float32", (1, 3, unnamed))]
    shapes = resolve_shapes("m", specs, {"a": [1, 48, 8], "x": [1, 3, 192]})
    assert shapes == {"a": (1, 48, 8), "x": (1, 3, 192)}


def test_a_named_dim_is_shared_but_given_shapes_are_taken_as_given(
        caplog: pytest.LogCaptureFixture) -> None:
    specs = [TensorSpec("a", "float32", (1, "seq")), TensorSpec("x", "float32", (1, "seq")),
             TensorSpec("m", "float32", ("seq",))]
    # a shape not given takes the name's length from one that is
    assert resolve_shapes("m", specs, {"a": [1, 48], "x": [1, 48]})["m"] == (48,)
    # exporters reuse a name for unrelated lengths (tf2onnx's "N" in a voice model that
    # onnxruntime runs at 8, 4 and 4): given shapes are taken, with a warning
    got = resolve_shapes("m", specs, {"a": [1, 48], "x": [1, 192], "m": [48]})
    assert got == {"a": (1, 48), "x": (1, 192), "m": (48,)}
    assert "'seq' is 48 in one input and 192 in 'x'" in caplog.text


def test_a_shape_tensor_of_no_elements_is_a_constant_not_a_layer_input() -> None:
    """onnx-tf writes a squeeze to a scalar as RESHAPE with a shape tensor of shape [0], whose
    buffer is empty: it is a constant like any other, never a tensor a layer waits for (the
    reference run once died on it with a KeyError)."""
    model = by_name("hey-jarvis")
    part = partition(model.path)
    produced = {t for n in part.nodes for t in n.outputs}
    model_inputs = set(part.inputs)
    for i in range(len(part.layers)):
        for name in part.segment(i, i + 1).inputs:
            assert name in produced or name in model_inputs, (i, name)


def test_open_dims_run_at_placeholder_shapes_say_which_and_how_to_set_them(
        tmp_path: Path) -> None:
    """A TFLite file whose every input dim is open allocates 1x1, a placeholder (its
    convolution does not even prepare there): ``plan`` without shapes exits 2 in one line
    naming the input, the dim, what the file allocates and ``--input-shape``, before running
    anything; with the shape it is fed, it plans and runs (the interpreter is allocated at the
    first call's shapes, as a user of the raw runtime resizes first)."""
    model = by_name("oww-melspectrogram")
    res = cli(tmp_path, "plan", str(model.path))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "'serving_default_input:0' dim 1 is dynamic [?, ?]" in lines[0]
    assert "allocates 1 there" in lines[0]
    assert "--input-shape" in lines[0] and model.path.name in lines[0]
    res = cli(tmp_path, "plan", str(model.path), *model.shape_args(), "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["error"] is not None and plan["error"] <= plan["tolerance"]


# ONNX's own test models, shipped inside the onnx wheel: exports and hand-written graphs no one
# here made
ONNX_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"


def test_sequence_values_between_nodes_plan_the_model_whole(tmp_path: Path) -> None:
    """A sequence of tensors of three shapes passed between nodes (no segment can hand one
    on): the model is planned whole, not an internal error."""
    res = cli(tmp_path, "plan", str(ONNX_DATA / "simple" / "test_sequence_model1" / "model.onnx"),
              "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert len(plan["segments"]) == 1 and plan["error"] == 0, plan


def test_initializers_listed_as_inputs_before_ir4_are_not_asked_for(tmp_path: Path) -> None:
    """IR 3 lists every initializer as a graph input too; these files make their weights with
    ConstantOfShape from such initializers, which folding removes: only the real input is fed."""
    path = ONNX_DATA / "light" / "light_squeezenet.onnx"
    assert onnx.load(str(path)).ir_version == 3
    res = cli(tmp_path, "plan", str(path), "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert list(plan["inputs_used"]["inputs"]) == ["data_0"] and plan["error"] == 0, plan


def test_an_integer_input_holding_a_shape_says_where_real_samples_go(tmp_path: Path) -> None:
    """Expand to a shape given as an input: generated ids are no valid shape. The one line says
    which input got what, and where real samples go; given there, the model plans."""
    case = ONNX_DATA / "simple" / "test_expand_shape_model1"
    res = cli(tmp_path, "plan", str(case / "model.onnx"))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr  # and no onnxruntime log line beside it
    assert "invalid expand shape (onnxruntime/cpu/fp32, " in lines[0]
    assert "'shape' ids in" in lines[0] and "calibration_dir" in lines[0]
    model = onnx.load(str(case / "model.onnx"))
    arrays = {}
    for k, vi in enumerate(model.graph.input):
        tensor = onnx.TensorProto()
        tensor.ParseFromString((case / "test_data_set_0" / f"input_{k}.pb").read_bytes())
        arrays[vi.name] = numpy_helper.to_array(tensor)
    (tmp_path / "calib").mkdir()
    np.savez(tmp_path / "calib" / "model.npz", **arrays)
    (tmp_path / "calib.toml").write_text(CONFIG.replace(
        "[dispatch]", f'[dispatch]\ncalibration_dir = "{tmp_path / "calib"}"'))
    res = subprocess.run(
        [sys.executable, "-m", "edgepilot", "--config", str(tmp_path / "calib.toml"),
         "--state-dir", str(tmp_path / "st"), "plan", str(case / "model.onnx"), "--json"],
        capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["inputs_used"]["source"] == "calibration_dir"


def test_a_file_no_runtime_loads_gets_no_hint_about_its_inputs(tmp_path: Path) -> None:
    """Real samples cannot fix an operator no runtime has: the line names the failure alone,
    even for integer inputs (the calibration_dir hint is for a model that ran and failed)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["ids"], ["out"], domain="com.example")], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("out", TensorProto.INT64, [1, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    res = cli(tmp_path, "plan", str(path))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "custom.onnx" in lines[0] and "Frobnicate" in lines[0], lines
    assert "calibration_dir" not in lines[0]


def test_an_attention_masks_infinities_agree_and_a_stray_one_does_not() -> None:
    import warnings

    from edgepilot.dispatch.measuring.tolerance import tensor_error

    mask = np.array([0.0, -np.inf, 1.5, -np.inf])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # inf - inf warned and made the error NaN
        assert tensor_error(mask, mask.copy()) == 0.0
        assert 0 < tensor_error(mask + np.array([0, 0, 0.1, 0]), mask) < 0.1
        assert tensor_error(np.array([0.0, np.inf, 1.5, -np.inf]), mask) == float("inf")
        assert tensor_error(np.array([0.0, np.nan, 1.5, -np.inf]), mask) == float("inf")


def test_a_target_failing_every_layer_and_the_whole_model_alike_is_one_exclusion() -> None:
    """An int8 variant the quantizer cannot make fails every layer and the whole model for the
    one reason: the plan JSON listed it twice (the layers' run, then the whole model)."""
    from edgepilot.dispatch.measuring.cells import Cell, exclusions

    why = "onnxruntime could not make the int8-dynamic variant: ValueError: Failed to find proper"
    rows = [{"a/fp32": Cell(1.0), "a/int8": Cell(None, reason=why)} for _ in range(3)]
    whole = {"a/fp32": Cell(3.0), "a/int8": Cell(None, reason=why)}
    assert exclusions(rows, whole) == [{"layers": [0, 3], "target": "a/int8", "reason": why}]
    # a whole model failing for a reason of its own is its own entry
    other = {"a/fp32": Cell(None, reason="out of memory"), "a/int8": Cell(None, reason=why)}
    assert exclusions(rows, other) == [
        {"layers": [0, 3], "target": "a/int8", "reason": why},
        {"layers": [0, 3], "target": "a/fp32", "reason": "out of memory"}]


def test_an_output_that_is_a_constant_at_the_planned_shapes_plans_whole(tmp_path: Path) -> None:
    """NeMo's MarbleNet VAD outputs ``signal_len``, a length computed from constants that
    shape inference folds once the shapes are fixed: no operator of the layers makes it, and
    planning its 8 layers died with KeyError. It is planned whole, its output the file's."""
    from onnx import TensorProto
    from onnx import helper as h

    rng = np.random.default_rng(0)
    nodes, inits, cur = [], [], "audio"
    for i in range(8):
        inits.append(numpy_helper.from_array(
            (rng.standard_normal((64, 64)) * 0.1).astype(np.float32), f"w{i}"))
        nodes += [h.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"]),
                  h.make_node("Relu", [f"m{i}"], [f"r{i}" if i < 7 else "y"])]
        cur = f"r{i}"
    nodes += [h.make_node("Cast", ["n"], ["c"], to=TensorProto.INT32),
              h.make_node("Sub", ["c", "k"], ["signal_len"])]
    inits += [h.make_tensor("n", TensorProto.INT64, [1], [160]),
              h.make_tensor("k", TensorProto.INT32, [1], [2])]
    graph = h.make_graph(nodes, "const_out", [h.make_tensor_value_info(
        "audio", TensorProto.FLOAT, [1, 64])], [
        h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64]),
        h.make_tensor_value_info("signal_len", TensorProto.INT32, [1])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "const_out.onnx"
    onnx.save(model, path)
    res = cli(tmp_path, "plan", str(path), "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert len(plan["segments"]) == 1 and plan["error"] == 0, plan
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(path, models / "c.onnx")
    d = DaemonProcess(tmp_path, CONFIG + f'[daemon]\nmodel_dir = "{models}"\n',
                      extra_args=["--model-dir", str(models)]).start(timeout=120)
    try:
        feed = {"audio": rng.standard_normal((1, 64)).astype(np.float32)}
        code, got = d.request("POST", "/v1/infer/c", encode(feed), timeout=120)
        assert code == 200, got
        assert got["outputs"]["signal_len"]["data"] == [158]
    finally:
        d.stop()


def test_external_data_cut_short_is_told_so_not_blamed_on_the_shapes(tmp_path: Path) -> None:
    """A copy whose external data file was cut short failed at the shapes given for its open
    dims, and the hint blamed those shapes; it says the file is shorter than the model says."""
    from onnx import TensorProto
    from onnx import helper as h

    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "ext",
                         [h.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])], [w])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, location="ext.data",
              size_threshold=0)
    data = (tmp_path / "ext.data").read_bytes()
    (tmp_path / "ext.data").write_bytes(data[: len(data) // 2])
    res = cli(tmp_path, "plan", str(path), "--input-shape", "x=1x64", "--json")
    assert res.returncode == 2, res.stderr
    line = res.stderr.strip()
    assert "\n" not in line and "ext.onnx" in line and "shorter than the model says" in line
    assert "shapes given" not in line


def nan_tail(path: Path) -> Path:
    """x -> MatMul (finite) -> 0/0 (NaN everywhere on any input) -> MatMul -> y."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((64, 256)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((256, 64)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Sub", ["h", "h"], ["zero"]),
             helper.make_node("Div", ["zero", "zero"], ["nan"]),
             helper.make_node("Add", ["h", "nan"], ["hn"]),
             helper.make_node("MatMul", ["hn", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "nan_tail", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [w1, w2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def test_a_reference_output_with_no_finite_value_checks_no_other_precision(
        tmp_path: Path) -> None:
    """An output NaN everywhere on the calibration inputs (swift-f0 at generated fmin = fmax)
    reads as error 0 for any precision NaN there too: such layers and the whole model stay on
    the reference's precision, each exclusion saying why, and the plan still serves."""
    res = cli(tmp_path, "plan", str(nan_tail(tmp_path / "nan_tail.onnx")), "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    blind = [e for e in plan["exclusions"] if "not finite anywhere" in e["reason"]]
    assert blind, plan["exclusions"]
    assert all(e["target"].rsplit("/", 1)[1] != "fp32" and "\n" not in e["reason"]
               for e in blind)
    n = len(plan["layers"])
    assert any(e["layers"] == [0, n] for e in blind)  # the whole model too
    for e in blind:
        assert all(plan["layers"][i]["target"] != e["target"] for i in range(*e["layers"]))
    assert all(seg["target"].endswith("/fp32") for seg in plan["segments"]
               if seg["layers"][1] == n)
