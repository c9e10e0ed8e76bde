"""Tensor backends in worker processes (``[backends.<name>] isolation = "process"``): real
onnxruntime, TFLite interpreter and Arm NN on generated models, real worker processes killed
with real signals, and a planned model through the dispatcher."""

from __future__ import annotations

import os
import resource
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import isolation_fixtures
import numpy as np
import psutil
import pytest
from isolation_fixtures import (
    TARGETS,
    WAIT_S,
    Events,
    backends,
    cmdline,
    cpu,
    feeds,
    isolated,
    wait_until,
)

from edgepilot.backends.backend_set import BackendSet
from edgepilot.backends.base import Executable, Segment, Target
from edgepilot.backends.onnxrt_options import OnnxRuntimeSection
from edgepilot.backends.tflite import TfliteBackend
from edgepilot.backends.tflite_options import TfliteSection
from edgepilot.backends.workers.tensor_process import IsolatedBackend, WorkerExecutable
from edgepilot.dispatch.measuring.tolerance import output_error
from edgepilot.dispatch.model_dispatch import DispatchOptions, ModelDispatch
from edgepilot.errors import BackendError
from edgepilot.formats import onnx_gen

models = isolation_fixtures.models  # the fixture, shared with test_tensor_isolation_daemon


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
