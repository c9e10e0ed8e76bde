"""One owner per request, planned or not: device queues proven with an instrumented backend.

The backend is the real onnxruntime one with a second device (``testnpu``) the serving layer
queues separately (see instrumented_backend.py); every run records how many runs were inside
its device at that moment.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from daemon_proc import DaemonProcess
from instrumented_backend import RECORDER, SPEC

from edgepilot.backends import BACKENDS
from edgepilot.config import parse_config
from edgepilot.dispatch.model_dispatch import ModelDispatch
from edgepilot.formats.onnx_gen import mlp_stack
from edgepilot.lifecycle import Daemon

CPU, NPU = "onnxruntime/cpu/fp32", "onnxruntime/testnpu/fp32"
WIDTHS = (64, 128, 128, 128, 64)


@pytest.fixture
def instrumented(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "onnxruntime", SPEC)
    RECORDER.reset()


def daemon(tmp: Path, **extra: Any) -> Daemon:
    models = tmp / "models"
    models.mkdir(exist_ok=True)
    mlp_stack(models / "m.onnx", widths=WIDTHS, batch=1)
    d = Daemon(parse_config({
        "daemon": {"state_dir": str(tmp / "state"), "model_dir": str(models),
                   "demo_models": False},
        "mqtt": {"enabled": False},
        "backends": {"enabled": ["onnxruntime"]},
        "dispatch": {"targets": [CPU, NPU], "kernel_corpus": False, "profile_runs": 3,
                     "warmup_runs": 1},
        **extra}))
    d.attach_capabilities({"serving", "dispatch"})
    return d


def reference(path: Path, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {"x": x})[0])


def requests(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((1, WIDTHS[0])).astype(np.float32) for _ in range(n)]


async def serve_all(d: Daemon, xs: list[np.ndarray]) -> list[Any]:
    d._loop = asyncio.get_running_loop()
    return await asyncio.gather(*(d.serving.infer("m", {"x": x}) for x in xs))


def test_unplanned_requests_never_overlap_in_their_device(tmp_path: Path,
                                                          instrumented: None) -> None:
    d = daemon(tmp_path, dispatch={"enabled": False})
    xs = requests(16)
    try:
        results = asyncio.run(serve_all(d, xs))
    finally:
        d.executor.shutdown(wait=True)
    assert {r.plan for r in results} == {f"single:{CPU}"}
    assert RECORDER.runs["cpu"] == 16
    assert RECORDER.max_inside["cpu"] == 1
    for x, r in zip(xs, results, strict=True):
        np.testing.assert_allclose(r.outputs["y"], reference(tmp_path / "models" / "m.onnx", x),
                                   rtol=1e-4, atol=1e-5)


def two_device_plan(d: Daemon) -> ModelDispatch:
    """Plan the model, then pin its first half to cpu and the rest to testnpu (the planner's
    own repair hook, ``forced``), so the plan surely spans both devices."""
    RECORDER.hold_s = 0.0  # profiling measures the real kernels
    d.dispatcher.plan_for("m")
    md = d.dispatcher.latest("m")
    assert isinstance(md, ModelDispatch) and md.builder is not None
    n = len(md.builder.part.layers)
    assert n >= 2
    md.builder.forced.update({i: (CPU if i < n // 2 else NPU) for i in range(n)})
    # a negative margin keeps the pinned split: the side-by-side check against one target
    # would otherwise (rightly) serve a tiny MLP whole
    md.opts = dataclasses.replace(md.opts, hysteresis=-1.0)
    _, plan = md.replan("test: two devices", force=True)
    assert [t for t, _, _ in plan.segments] == [CPU, NPU]
    RECORDER.reset()
    return md


def test_a_two_device_plan_holds_each_device_only_for_its_segment(tmp_path: Path,
                                                                  instrumented: None) -> None:
    d = daemon(tmp_path)
    md = two_device_plan(d)
    assert md.plan is not None
    xs = requests(12)
    try:
        results = asyncio.run(serve_all(d, xs))
    finally:
        d.executor.shutdown(wait=True)
    assert {r.plan for r in results} == {md.plan.hash}
    assert RECORDER.runs == {"cpu": 12, "testnpu": 12}
    # never two requests inside one device ...
    assert RECORDER.max_inside == {"cpu": 1, "testnpu": 1}
    # ... but a request's second segment ran while the next one's first did: pipelined
    assert RECORDER.max_devices_busy == 2
    for x, r in zip(xs, results, strict=True):
        np.testing.assert_allclose(r.outputs["y"], reference(tmp_path / "models" / "m.onnx", x),
                                   rtol=1e-4, atol=1e-5)


def test_a_planned_model_turns_the_excess_of_64_concurrent_requests_into_503(
        tmp_path: Path) -> None:
    """Over real HTTP, the daemon's own backends: once the model runs on its plan, requests
    still queue per device, and the line is bounded by ``[http] max_queue``."""
    models = tmp_path / "models"
    models.mkdir()
    mlp_stack(models / "mlp.onnx", widths=(256, 1024, 1024, 256), batch=8)
    d = DaemonProcess(tmp_path, f'[mqtt]\nenabled = false\n[daemon]\nmodel_dir = "{models}"\n'
                                "[http]\nmax_queue = 2\n"
                                "[dispatch]\nkernel_corpus = false\nprofile_runs = 3\n").start()
    x = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)
    body = {"inputs": {"x": {"data": x.ravel().tolist(), "dtype": "float32", "shape": [8, 256]}}}
    try:
        plan = d.wait_for("/v1/plan/mlp", timeout=180)  # 202 while it plans, then the plan
        want = reference(models / "mlp.onnx", x)
        barrier = threading.Barrier(64)

        def one(_: int) -> tuple[int, Any]:
            barrier.wait()
            return d.request("POST", "/v1/infer/mlp", body, timeout=120)

        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(one, range(64)))
    finally:
        assert d.stop() == 0
    ok = [b for c, b in answers if c == 200]
    busy = [b for c, b in answers if c == 503]
    assert len(ok) + len(busy) == 64, [c for c, _ in answers]
    assert busy and ok
    assert {b["error"]["code"] for b in busy} == {"busy"}
    assert all("max_queue = 2" in b["error"]["message"] for b in busy)
    # every answered request ran on a plan (the first, or one the monitor moved to when
    # segments ran slower under this load than profiled), never around the queue
    assert plan["hash"] in {b["plan"] for b in ok}
    assert not any(b["plan"].startswith("single:") for b in ok)
    for b in ok:
        got = np.asarray(b["outputs"]["y"]["data"], np.float32).reshape(want.shape)
        assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 0.05


def test_a_request_past_its_deadline_is_refused_before_it_runs(tmp_path: Path,
                                                               instrumented: None) -> None:
    d = daemon(tmp_path, dispatch={"enabled": False})
    RECORDER.hold_s = 0.5  # the first request keeps the device half a second
    xs = requests(3)

    async def scenario() -> list[Any]:
        d._loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(d.serving.infer("m", {"x": xs[0]}))
        while RECORDER.runs["cpu"] == 0:  # it is inside the device now
            await asyncio.sleep(0.005)
        late = [d.serving.infer("m", {"x": x}, timeout_s=0.1) for x in xs[1:]]
        return await asyncio.gather(first, *late, return_exceptions=True)

    try:
        first, *late = asyncio.run(scenario())
    finally:
        d.executor.shutdown(wait=True)
    assert not isinstance(first, BaseException)
    assert [type(e).__name__ for e in late] == ["DeadlineExceeded"] * 2
    assert all(e.http_status == 504 and e.field == "timeout_ms" for e in late)
    assert RECORDER.runs["cpu"] == 1  # nothing was computed for the late ones


def test_a_cancelled_request_leaves_the_line(tmp_path: Path, instrumented: None) -> None:
    d = daemon(tmp_path, dispatch={"enabled": False})
    RECORDER.hold_s = 0.3
    xs = requests(2)

    async def scenario() -> int:
        d._loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(d.serving.infer("m", {"x": xs[0]}))
        while RECORDER.runs["cpu"] == 0:
            await asyncio.sleep(0.005)
        waiting = asyncio.ensure_future(d.serving.infer("m", {"x": xs[1]}))
        queue = d.devices.queue("cpu")
        while queue.queued == 0:
            await asyncio.sleep(0.005)
        waiting.cancel()  # the client went away
        await asyncio.sleep(0.01)
        left = queue.queued
        await first
        return left

    try:
        assert asyncio.run(scenario()) == 0
    finally:
        d.executor.shutdown(wait=True)
    assert RECORDER.runs["cpu"] == 1
