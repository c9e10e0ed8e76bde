"""A TFLite model that keeps state between invokes in variable tensors (an SVDF's activation
history here; a stateful LSTM export's the same way): it runs whole, its plan's check starts
from a fresh state, and so does its first request once the plan is installed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgepilot.config import Config
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.dispatch.graph.partition import partition
from edgepilot.dispatch.model_dispatch import ModelDispatch
from edgepilot.formats.tflite_gen import write_stateful_svdf_tflite
from edgepilot.formats.tflite_graph import has_variable_tensors


def fresh_outputs(path: Path, x: np.ndarray, calls: int) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path))
    interp.allocate_tensors()
    i, o = interp.get_input_details()[0]["index"], interp.get_output_details()[0]["index"]
    out = []
    for _ in range(calls):
        interp.set_tensor(i, x)
        interp.invoke()
        out.append(interp.get_tensor(o).copy())
    return out


def test_a_model_with_variable_tensors_runs_whole_from_a_fresh_state(tmp_path: Path) -> None:
    path = write_stateful_svdf_tflite(tmp_path / "svdf.tflite")
    assert has_variable_tensors(path)
    assert len(partition(path).layers) == 1  # three layers if its state were not seen
    x = np.full((1, 8), 0.5, np.float32)
    first, second = fresh_outputs(path, x, 2)
    assert not np.allclose(first, second)  # it does keep state
    cfg = Config.model_validate({
        "daemon": {"state_dir": str(tmp_path / "state"), "demo_models": False},
        "backends": {"enabled": ["tflite"]},
        "dispatch": {"profile_runs": 3, "warmup_runs": 1, "profile_passes": 1,
                     "kernel_corpus": False}})
    md = Dispatcher(cfg).get(str(path), None)
    assert isinstance(md, ModelDispatch)
    md.prepare()  # checked and timed: dozens of invokes of the plan's interpreter
    plan = md.explain()
    # whole, from a fresh state: the reference's outputs up to the kernels' rounding (the
    # builtin kernels and XNNPACK time within microseconds here, either may serve)
    assert len(plan["segments"]) == 1 and plan["error"] <= 1e-5, plan
    assert md.compiled is not None
    got = [md.compiled.run({"input": x})[0]["output"] for _ in range(2)]
    np.testing.assert_allclose(got[0], first, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], second, rtol=1e-5, atol=1e-6)


def test_a_resource_variable_model_starts_fresh_after_a_reset() -> None:
    """A streaming wake-word model keeps its state in resource variables (VAR_HANDLE, set up
    by CALL_ONCE). LiteRT's reset_all_variables leaves those as they are: the state planning
    left leaked into the first requests (a wake score of 6/255 on silence). A reset is a new
    interpreter for such a file."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from ai_edge_litert.interpreter import Interpreter
    from real_models import by_name

    from edgepilot.backends.base import Segment, Target
    from edgepilot.backends.tflite import TfliteBackend
    from edgepilot.formats.tflite_graph import has_resource_variables

    path = by_name("micro-wakeword").path
    assert has_resource_variables(path.read_bytes())
    fresh = Interpreter(model_path=str(path))
    fresh.allocate_tensors()
    [d] = fresh.get_input_details()
    loud = np.full(d["shape"], 100, d["dtype"])
    silence = np.full(d["shape"], -128, d["dtype"])

    def scores(run: object, frames: list[np.ndarray]) -> list[int]:
        return [int(np.asarray(run(f)).ravel()[0]) for f in frames]

    def raw(x: np.ndarray) -> np.ndarray:
        fresh.set_tensor(d["index"], x)
        fresh.invoke()
        return fresh.get_tensor(fresh.get_output_details()[0]["index"])

    want = scores(raw, [silence] * 10)
    ins, outs = tuple(x["name"] for x in fresh.get_input_details()), tuple(
        x["name"] for x in fresh.get_output_details())
    exe = TfliteBackend().compile(Segment(path, "tflite", ins, outs),
                                  Target("tflite", "xnnpack", "int8"))
    name = ins[0]

    def run(x: np.ndarray) -> np.ndarray:
        return next(iter(exe.run({name: x}).values()))

    scores(run, [loud] * 30)
    assert scores(run, [silence] * 10) != want  # the loud frames are in its state
    scores(run, [loud] * 30)
    exe.reset_state()
    assert scores(run, [silence] * 10) == want
