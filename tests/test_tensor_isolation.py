"""Tensor backends in worker processes (``[backends.<name>] isolation = "process"``): real
onnxruntime and the TFLite interpreter on generated models, real worker processes killed with
real signals, and a real daemon over HTTP."""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from daemon_proc import DaemonProcess
from models_fixtures import module_tmp, start_daemon  # noqa: F401 - fixtures

from edgepilot.backends.armnn import ArmnnBackend
from edgepilot.backends.armnn_options import ArmnnSection
from edgepilot.backends.backend_set import BackendSet
from edgepilot.backends.base import Backend, Executable, Segment, Target
from edgepilot.backends.onnxrt import OnnxRuntimeBackend
from edgepilot.backends.onnxrt_options import OnnxRuntimeSection
from edgepilot.backends.tensor_process import IsolatedBackend, WorkerExecutable
from edgepilot.backends.tflite import TfliteBackend
from edgepilot.backends.tflite_options import TfliteSection
from edgepilot.dispatch.model_dispatch import DispatchOptions, ModelDispatch
from edgepilot.dispatch.tolerance import output_error
from edgepilot.errors import BackendError
from edgepilot.formats import onnx_gen, tflite_graph
from edgepilot.formats.tflite_gen import write_mlp_tflite

WAIT_S = 60.0  # a bound for things that happen (a worker noticed dead), never a speed check
Events = list[tuple[str, dict[str, Any]]]


def wait_until(cond: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"never happened: {what}")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Segment]:
    root = tmp_path_factory.mktemp("iso")
    onnx_path = root / "mlp.onnx"
    onnx_gen.mlp_stack(onnx_path, widths=(64, 256, 64), batch=2)
    tfl_path = write_mlp_tflite(root / "mlp_tfl.tflite", width=32, depth=3, batch=2)
    ins, outs = tflite_graph.io_names(tfl_path)
    return {"onnxruntime": Segment(onnx_path, "onnx", ("x",), ("y",), None, "demo-mlp"),
            "tflite": Segment(tfl_path, "tflite", ins, outs, None, "demo-tfl"),
            "armnn": Segment(tfl_path, "tflite", ins, outs, None, "demo-armnn")}


SECTIONS: dict[str, Any] = {"onnxruntime": OnnxRuntimeSection, "tflite": TfliteSection,
                            "armnn": ArmnnSection}
TARGETS = {"onnxruntime": Target("onnxruntime", "cpu", "fp32"),
           "tflite": Target("tflite", "cpu", "fp32"), "armnn": Target("armnn", "CpuRef", "fp32")}


def backends(name: str, isolation: str) -> Backend:
    """The runtime in this process (``isolation`` is only carried)."""
    section = SECTIONS[name](isolation=isolation)
    if name == "onnxruntime":
        return OnnxRuntimeBackend(section)
    return TfliteBackend(section) if name == "tflite" else ArmnnBackend(section)


def feeds(segment: Segment, seed: int = 0) -> dict[str, np.ndarray]:
    exe = backends(cpu(segment).backend, "thread").compile(segment, cpu(segment))
    rng = np.random.default_rng(seed)
    return {s.name: rng.standard_normal([int(d or 1) for d in s.shape]).astype(s.dtype)
            for s in exe.inputs}


def cpu(segment: Segment) -> Target:
    backend = "onnxruntime" if segment.kind == "onnx" else "tflite"
    return Target(backend, "cpu", "fp32")


def isolated(name: str, events: Events) -> IsolatedBackend:
    """The backend as BackendSet builds it from ``isolation = "process"``."""
    section = SECTIONS[name](isolation="process")
    bset = BackendSet(lambda n: section if n == name else None, [name])
    bset.emit = lambda kind, **fields: events.append((kind, fields))
    backend = bset.get(name)
    assert isinstance(backend, IsolatedBackend)
    return backend


@pytest.fixture(params=["onnxruntime", "tflite", "armnn"])
def served(request: pytest.FixtureRequest, models: dict[str, Segment]
           ) -> Iterator[tuple[WorkerExecutable, Executable, Segment, Events]]:
    """(the executable in a worker, the same compiled in this process, the segment, events)"""
    name = request.param
    segment = models[name]
    events: Events = []
    backend = isolated(name, events)
    exe = backend.compile(segment, TARGETS[name])
    assert isinstance(exe, WorkerExecutable)
    ref = backends(name, "thread").compile(segment, TARGETS[name])
    yield exe, ref, segment, events
    exe.close()
    ref.close()
    backend.close()


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")


def test_outputs_are_identical_in_a_worker_and_in_process(
        served: tuple[WorkerExecutable, Executable, Segment, Events]) -> None:
    exe, ref, segment, _ = served
    assert [(s.name, s.dtype) for s in exe.inputs] == [(s.name, s.dtype) for s in ref.inputs]
    for seed in range(3):  # the blocks are reused from call to call
        x = feeds(segment, seed)
        got, want = exe.run(x), ref.run(x)
        assert set(got) == set(want)
        for name in want:
            assert got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name], want[name])
    assert exe.memory_bytes == ref.memory_bytes


def test_the_worker_command_line_names_backend_and_model(
        served: tuple[WorkerExecutable, Executable, Segment, Events]) -> None:
    exe, _, segment, _ = served
    pid = exe.worker_pid
    assert pid is not None and pid != os.getpid()
    assert f"edgepilot worker {exe.target.backend} {segment.name} --fd" in cmdline(pid)
    assert psutil.Process(pid).ppid() == os.getpid()


def test_segments_of_one_model_share_its_worker_which_outlives_its_last_one_a_while(
        models: dict[str, Segment]) -> None:
    seg = models["onnxruntime"]
    backend = isolated("onnxruntime", [])

    def compile_part(name: str) -> WorkerExecutable:
        exe = backend.compile(Segment(seg.model_path, "onnx", ("x",), ("y",), None, name),
                              cpu(seg))
        assert isinstance(exe, WorkerExecutable)
        return exe

    # plan segments are named '<file stem>[start:end]': one worker per (backend, model)
    a, b = compile_part("mlp[0:1]"), compile_part("mlp[1:3]")
    pid = a.worker_pid
    assert pid is not None and pid == b.worker_pid and "worker onnxruntime mlp " in cmdline(pid)
    x = feeds(seg)
    # a plan passes every tensor so far; only the segment's own inputs cross
    np.testing.assert_array_equal(a.run(x)["y"], b.run({**x, "unused": np.ones(3)})["y"])
    a.close()
    assert b.worker_pid == pid and b.run(x)["y"].shape == (2, 64)  # b keeps the worker
    b.close()
    # the profiler compiles, times and closes cell after cell: the worker waits for the next
    c = compile_part("mlp[0:3]")
    assert c.worker_pid == pid
    c.close()
    backend.close()  # the backend's end is every worker's
    assert not psutil.pid_exists(pid)


def test_an_unused_worker_leaves_after_lingering(models: dict[str, Segment]) -> None:
    seg = models["tflite"]
    backend = IsolatedBackend(TfliteBackend(TfliteSection()), TfliteSection(isolation="process"),
                              linger_s=0.2)
    exe = backend.compile(seg, cpu(seg))
    assert isinstance(exe, WorkerExecutable)
    pid = exe.worker_pid
    assert pid is not None
    exe.close()
    wait_until(lambda: not psutil.pid_exists(pid), "the unused worker left")
    assert backend.worker("demo-tfl").pid is None


def test_kill_9_during_a_request_fails_only_that_request_and_the_next_gets_a_new_worker(
        served: tuple[WorkerExecutable, Executable, Segment, Events]) -> None:
    exe, ref, segment, events = served
    x = feeds(segment)
    exe.run(x)
    pid = exe.worker_pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # the worker cannot answer: the request stays in flight
    outcome: dict[str, Any] = {}

    def request() -> None:
        try:
            outcome["value"] = exe.run(x)
        except BackendError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=request)
    thread.start()
    wait_until(lambda: exe.worker.in_flight, "the request was sent to the worker")
    os.kill(pid, signal.SIGKILL)
    thread.join(WAIT_S)
    err = outcome["error"]
    assert err.code == "worker_crashed" and "SIGKILL" in err.message
    assert f"pid {pid}" in err.message and segment.name in err.message
    fault = next(f for k, f in events if k == "backend.fault")
    assert fault["target"] == str(exe.target) and fault["pid"] == pid and fault["exit"] == -9
    assert fault["in_flight"] == 1 and "SIGKILL" in fault["message"]
    # the next request starts a new worker (after the backoff) and is answered
    got = exe.run(x)
    np.testing.assert_array_equal(got[ref.outputs[0].name], ref.run(x)[ref.outputs[0].name])
    assert exe.worker_pid not in (None, pid)
    restarted = next(f for k, f in events if k == "worker.restarted")
    assert restarted["previous_pid"] == pid and restarted["pid"] == exe.worker_pid


@pytest.mark.parametrize(("sig", "named"), [
    (signal.SIGSEGV, "SIGSEGV: a crash in the runtime"),
    (signal.SIGABRT, "SIGABRT: the runtime aborted")])
def test_a_native_crash_under_a_request_is_named(models: dict[str, Segment], sig: int,
                                                 named: str) -> None:
    # no core file from the crash below (the worker inherits this limit)
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    segment = models["onnxruntime"]
    backend = isolated("onnxruntime", [])
    exe = backend.compile(segment, cpu(segment))
    assert isinstance(exe, WorkerExecutable)
    try:
        pid = exe.worker_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        outcome: dict[str, Any] = {}

        def request() -> None:
            try:
                exe.run(feeds(segment))
            except BackendError as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=request)
        thread.start()
        wait_until(lambda: exe.worker.in_flight, "the request was sent to the worker")
        os.kill(pid, sig)  # delivered as the worker resumes, before it reads the request
        os.kill(pid, signal.SIGCONT)
        thread.join(WAIT_S)
        assert named in outcome["error"].message
        assert exe.run(feeds(segment))["y"].shape == (2, 64)  # and the next one is served
    finally:
        exe.close()
        backend.close()


def test_kill_9_between_requests_costs_no_request_and_the_backoff_grows(
        models: dict[str, Segment]) -> None:
    segment = models["onnxruntime"]
    events: Events = []
    backend = isolated("onnxruntime", events)
    exe = backend.compile(segment, cpu(segment))
    assert isinstance(exe, WorkerExecutable)
    x = feeds(segment)
    want = exe.run(x)["y"]
    pids = []
    try:
        for _ in range(2):
            pid = exe.worker_pid
            assert pid is not None
            pids.append(pid)
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: len([k for k, _ in events if k == "backend.fault"]) == len(pids),
                       "the fault reported")
            np.testing.assert_array_equal(exe.run(x)["y"], want)  # on a restarted worker
        faults = [f for k, f in events if k == "backend.fault"]
        assert [f["pid"] for f in faults] == pids and [f["in_flight"] for f in faults] == [0, 0]
        # a worker that dies again soon after its restart waits twice as long for the next
        assert [f["restart_in_s"] for f in faults] == [0.5, 1.0]
        assert exe.worker_pid not in (None, *pids)
    finally:
        exe.close()
        backend.close()


# ---- a real daemon over HTTP ------------------------------------------------------------------
@pytest.fixture(scope="module")
def daemon(module_tmp: Path, models: dict[str, Segment]) -> Iterator[DaemonProcess]:  # noqa: F811
    model_dir = module_tmp / "models"
    model_dir.mkdir()
    shutil.copy(models["onnxruntime"].model_path, model_dir / "mlp.onnx")
    # dispatch off: the registry's whole-model path (a plan's segments compile the same way)
    d = start_daemon(module_tmp, '[backends.onnxruntime]\nisolation = "process"\n'
                                 "[dispatch]\nenabled = false\n")
    yield d
    assert d.stop() == 0


def infer(d: DaemonProcess, x: np.ndarray) -> tuple[int, Any]:
    return d.request("POST", "/v1/infer/mlp", {"inputs": {"x": {
        "data": x.ravel().tolist(), "dtype": "float32", "shape": list(x.shape)}}})


def worker_pid(d: DaemonProcess) -> int | None:
    status, body = d.request("GET", "/v1/models")
    assert status == 200
    entry = next(m for m in body["data"] if m["id"] == "mlp")
    return entry.get("worker_pid")  # type: ignore[no-any-return]


def queued_bytes(pid: int) -> int:
    """Bytes waiting unread in the sockets of ``pid`` (``ss``: the kernel's own count)."""
    out = subprocess.run(["ss", "-xpH"], capture_output=True, text=True, check=True).stdout
    return sum(int(line.split()[2]) for line in out.splitlines()
               if re.search(rf"pid={pid},", line))


def test_killing_the_worker_leaves_the_daemon_serving(daemon: DaemonProcess,
                                                      models: dict[str, Segment]) -> None:
    assert daemon.proc is not None
    daemon_pid = daemon.proc.pid
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    want = backends("onnxruntime", "thread").compile(models["onnxruntime"],
                                                     cpu(models["onnxruntime"])).run({"x": x})
    status, body = infer(daemon, x)
    assert status == 200, body
    np.testing.assert_allclose(body["outputs"]["y"]["data"], want["y"].ravel(), rtol=1e-6)
    pid = worker_pid(daemon)
    assert pid is not None and "edgepilot worker onnxruntime mlp --fd" in cmdline(pid)
    assert psutil.Process(pid).ppid() == daemon_pid

    # killed during a request: that request is answered with the fault, named
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is needed to see the request waiting in the worker")
    os.kill(pid, signal.SIGSTOP)
    answer: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: answer.update(r=infer(daemon, x)))
    thread.start()
    wait_until(lambda: queued_bytes(pid) > 0, "the request reached the worker's socket")
    os.kill(pid, signal.SIGKILL)
    thread.join(WAIT_S)
    status, body = answer["r"]
    assert status == 503 and body["error"]["code"] == "worker_crashed", body
    assert "SIGKILL" in body["error"]["message"]

    # the daemon is the same process and keeps answering, on a restarted worker
    assert daemon.proc.poll() is None and daemon.proc.pid == daemon_pid
    status, body = infer(daemon, x)
    assert status == 200, body
    np.testing.assert_allclose(body["outputs"]["y"]["data"], want["y"].ravel(), rtol=1e-6)
    new = worker_pid(daemon)
    assert new not in (None, pid) and psutil.Process(new).ppid() == daemon_pid

    # killed between requests: no request is lost
    os.kill(new, signal.SIGKILL)
    wait_until(lambda: f"worker for model mlp (pid {new}) was killed by signal 9 (SIGKILL"
               in daemon.output(), "the daemon logged its worker's death")
    status, body = infer(daemon, x)
    assert status == 200, body
    assert worker_pid(daemon) not in (None, pid, new)


# ---- plan segments through the dispatcher -----------------------------------------------------
def test_a_planned_model_in_a_worker_survives_its_kill(tmp_path: Path) -> None:
    path = tmp_path / "mlp.onnx"
    onnx_gen.mlp_stack(path, widths=(64, 256, 256, 64), batch=4)
    worker_events: Events = []
    section = OnnxRuntimeSection(isolation="process")
    bset = BackendSet(lambda n: section, ["onnxruntime"], tmp_path / "cache")
    bset.emit = lambda kind, **fields: worker_events.append((kind, fields))
    backend = bset.get("onnxruntime")
    assert isinstance(backend, IsolatedBackend)
    plan_events: list[dict[str, Any]] = []
    targets = [Target("onnxruntime", "cpu", "fp32"), Target("onnxruntime", "cpu", "int8")]
    md = ModelDispatch("mlp", path, {"onnxruntime": backend}, targets,
                       DispatchOptions(tolerance=0.1, runs=3, warmup=1, passes=1),
                       emit=lambda kind, **f: plan_events.append({"type": kind, **f}))
    try:
        md.prepare()  # profiled and compiled in the worker of (onnxruntime, mlp)
        assert md.compiled is not None
        exes = [seg.exe for seg in md.compiled.segments]
        assert all(isinstance(e, WorkerExecutable) for e in exes)
        pid = backend.worker("mlp").pid
        assert pid is not None and "edgepilot worker onnxruntime mlp --fd" in cmdline(pid)
        feed = md.calibration[0]
        before, _ = md.run(feed)
        assert output_error(before, md.ref_outputs[0]) < 0.1

        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: any(k == "backend.fault" for k, _ in worker_events),
                   "the fault reported")
        after, _ = md.run(feed)  # answered: on the restarted worker
        assert output_error(after, md.ref_outputs[0]) < 0.1
        assert backend.worker("mlp").pid not in (None, pid)
        fault = next(f for k, f in worker_events if k == "backend.fault")
        assert fault["pid"] == pid and "SIGKILL" in fault["message"]
        assert fault["target"] in {str(t) for t in targets}
        assert not [e for e in plan_events if e["type"] == "backend.fault"]  # nothing was lost

        # killed under a request: that segment's target is left out, the plan is made again
        # and the request retried on it — the caller gets its answer
        pid = backend.worker("mlp").pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        answer: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: answer.update(out=md.run(feed)[0]))
        thread.start()
        wait_until(lambda: backend.worker("mlp").in_flight, "a segment was sent to the worker")
        os.kill(pid, signal.SIGKILL)
        thread.join(WAIT_S)
        assert output_error(answer["out"], md.ref_outputs[0]) < 0.1
        faulted = [e for e in plan_events if e["type"] == "backend.fault"]
        assert len(faulted) == 1 and "SIGKILL" in faulted[0]["message"]
        assert md.explain()["excluded"] == [faulted[0]["target"]]
    finally:
        backend.close()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_no_tensor_worker_outlives_a_killed_daemon(tmp_path: Path,
                                                   models: dict[str, Segment]) -> None:
    (tmp_path / "models").mkdir()
    shutil.copy(models["tflite"].model_path, tmp_path / "models" / "tfl.tflite")
    d = start_daemon(tmp_path, '[backends.tflite]\nisolation = "process"\n'
                               "[dispatch]\nenabled = false\n")
    try:
        x = np.zeros((2, 32), np.float32)
        status, body = d.request("POST", "/v1/infer/tfl", {"inputs": {"input": {
            "data": x.ravel().tolist(), "dtype": "float32", "shape": [2, 32]}}})
        assert status == 200, body
        body = d.request("GET", "/v1/models")[1]
        pid = next(m for m in body["data"] if m["id"] == "tfl")["worker_pid"]
        assert "edgepilot worker tflite tfl --fd" in cmdline(pid)
    finally:
        d.stop(signal.SIGKILL)
    # the kernel closed the daemon's end of the socket: the worker sees EOF and leaves
    wait_until(lambda: gone(pid), "the worker left with its daemon")
