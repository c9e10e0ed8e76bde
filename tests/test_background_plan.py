"""The first request never waits for profiling: it runs whole while the plan is made."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from daemon_proc import DaemonProcess

from edgepilot.formats.onnx_gen import mlp_stack


def infer(d: DaemonProcess, x: np.ndarray) -> dict:
    code, body = d.request("POST", "/v1/infer/mlp", {"inputs": {"x": {
        "data": x.ravel().tolist(), "dtype": "float32", "shape": list(x.shape)}}})
    assert code == 200, body
    return body


def test_first_request_runs_whole_and_later_ones_use_the_background_plan(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    mlp_stack(models / "mlp.onnx", widths=(32, 64, 64, 32), batch=2)
    d = DaemonProcess(tmp_path, f'[mqtt]\nenabled = false\n[daemon]\nmodel_dir = "{models}"\n'
                                "[dispatch]\nkernel_corpus = false\nprofile_runs = 3\n").start()
    try:
        x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
        first = infer(d, x)
        assert first["plan"].startswith("single:"), first["plan"]
        deadline = time.monotonic() + 120
        body = first
        while body["plan"].startswith("single:") and time.monotonic() < deadline:
            time.sleep(0.2)
            body = infer(d, x)
        assert not body["plan"].startswith("single:"), d.output()
        code, plan = d.request("GET", "/v1/plan/mlp")
        assert code == 200 and plan["hash"] == body["plan"]
        # the planned output stays within the model's tolerance of the whole fp32 model
        got = np.asarray(body["outputs"]["y"]["data"], np.float32)
        ref = np.asarray(first["outputs"]["y"]["data"], np.float32)
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= 0.05
        assert "planning mlp in the background" in d.output()
        # served through its plan, without the whole model resident: still loaded
        code, _ = d.request("POST", "/v1/commands/model.unload", {"name": "mlp"})
        assert code == 200
        assert infer(d, x)["plan"] == body["plan"]
        code, models = d.request("GET", "/v1/models")
        mlp = {m["id"]: m for m in models["data"]}["mlp"]
        assert code == 200 and mlp["loaded"] is True
    finally:
        assert d.stop() == 0


def test_sigterm_during_background_planning_exits_promptly(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    mlp_stack(models / "mlp.onnx", widths=(32, 64, 64, 32), batch=2)
    # the kernel corpus makes planning take many seconds: stop must not wait for it
    d = DaemonProcess(tmp_path, f'[mqtt]\nenabled = false\n[daemon]\nmodel_dir = "{models}"\n'
                                "[dispatch]\nkernel_corpus = true\n").start()
    x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
    assert infer(d, x)["plan"].startswith("single:")
    time.sleep(0.5)
    assert d.stop(timeout=10) == 0
    assert "planning mlp in the background" in d.output()


def test_the_kernel_corpus_is_measured_after_the_first_plan_not_before(tmp_path: Path) -> None:
    """The corpus (~15 s a board) changes no plan, only each layer's ``roofline_ms``: the
    first plan is served without it, and the daemon measures it once that plan is made."""
    models = tmp_path / "models"
    models.mkdir()
    mlp_stack(models / "mlp.onnx", widths=(32, 64, 64, 32), batch=2)
    d = DaemonProcess(tmp_path, f'[mqtt]\nenabled = false\n[daemon]\nmodel_dir = "{models}"\n'
                                "[dispatch]\nkernel_corpus = true\nprofile_runs = 3\n").start()
    corpus = d.state_dir / "corpus"
    try:
        code, body = d.request("GET", "/v1/plan/mlp")
        assert code == 202, body
        deadline = time.monotonic() + 120
        while code == 202 and time.monotonic() < deadline:
            time.sleep(0.1)
            code, body = d.request("GET", "/v1/plan/mlp")
        assert code == 200, body
        assert not list(corpus.glob("*.json"))  # the plan did not wait for it
        assert all(layer["roofline_ms"] > 0 for layer in body["layers"])  # layer fits
        while not list(corpus.glob("onnxruntime_cpu_*.json")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert list(corpus.glob("onnxruntime_cpu_*.json")), d.output()
        assert "measuring the kernel corpus of onnxruntime/" in d.output()
        # a replan now predicts its layers from the corpus, without measuring it again
        code, again = d.request("POST", "/v1/plan/mlp/replan", {"reprofile": True},
                                timeout=120)
        assert code == 200, again
        assert d.output().count("measuring the kernel corpus") == 1
    finally:
        assert d.stop() == 0


def _embedding(path: Path, vocab: int = 50, width: int = 8) -> None:
    """ids[1, n] -> Gather over a [vocab, width] table -> Relu: a token model in small."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = np.random.default_rng(0).standard_normal((vocab, width)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"]),
         helper.make_node("Relu", ["e"], ["y"])],
        "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n", width])],
        [numpy_helper.from_array(table, "table")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_values_the_model_refuses_are_a_422_and_exclude_no_target(tmp_path: Path) -> None:
    """An id past the vocabulary fails on every target alike: the client's data. Before, it
    was a 500 after every target was excluded in turn and the plan rebuilt around each; and
    shapes only such a request had were planned, and listed as a model that cannot run."""
    models = tmp_path / "models"
    models.mkdir()
    _embedding(models / "emb.onnx")
    d = DaemonProcess(tmp_path, f'[mqtt]\nenabled = false\n[daemon]\nmodel_dir = "{models}"\n'
                                "[dispatch]\nkernel_corpus = false\nprofile_runs = 3\n").start()

    def ids(values: list[int]) -> tuple[int, dict]:
        return d.request("POST", "/v1/infer/emb", {"inputs": {"ids": {
            "data": values, "dtype": "int64", "shape": [1, len(values)]}}})

    try:
        # a first request of shapes no one sent before, refused: those shapes are not planned
        code, body = ids([1, 2, 10**6])
        assert code == 422, body
        assert body["error"]["code"] == "input_rejected" and body["error"]["field"] == "inputs"
        assert "emb" in body["error"]["message"] and "indices" in body["error"]["message"]
        deadline = time.monotonic() + 120
        code, body = ids([1, 2, 3, 4])
        while body["plan"].startswith("single:") and time.monotonic() < deadline:
            time.sleep(0.2)
            code, body = ids([1, 2, 3, 4])
        assert code == 200 and not body["plan"].startswith("single:"), d.output()
        planned = body["plan"]
        code, bad = ids([1, 2, 3, -10**6])  # now through the plan: still the client's data
        assert code == 422 and bad["error"]["code"] == "input_rejected", bad
        code, body = ids([4, 3, 2, 1])
        assert code == 200 and body["plan"] == planned  # nothing excluded, nothing replanned
        code, plans = d.request("GET", "/v1/plan")
        assert code == 200 and "n=3" not in str(plans.get("failed"))
        log = d.output()
        assert "backend.fault" not in log and "excluding" not in log
        assert "ids=1x3" not in log  # never planned for the refused request's shapes
    finally:
        assert d.stop() == 0


def test_one_plan_is_made_at_a_time_and_the_others_say_queued() -> None:
    """Fourteen models planning at once took every inference thread (requests waited 4-16 s),
    and each one's timings were the others' load: plans are made one at a time."""
    import asyncio

    from edgepilot.dispatch.background import BackgroundPlans

    async def scenario() -> tuple[list[str], dict[str, object]]:
        plans = BackgroundPlans()
        log: list[str] = []

        def work(name: str):  # type: ignore[no-untyped-def]
            async def run() -> None:
                log.append(f"start {name}")
                await asyncio.sleep(0.05)
                log.append(f"end {name}")
            return run

        plans.start(("a", ""), work("a"))
        plans.start(("b", ""), work("b"))
        await asyncio.sleep(0.01)
        queued = plans.state(("b", ""))
        await plans.wait()
        return log, queued

    log, queued = asyncio.run(scenario())
    assert log == ["start a", "end a", "start b", "end b"]
    assert "queued" in str(queued["what"])
