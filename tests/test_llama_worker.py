"""GGUF models in a worker process (``[backends.llamacpp] isolation = "process"``, the default):
the worker's command line, the same tokens as in-process, cancel, the step guard honoured in the
daemon, and crash containment — a worker killed under a streamed chat over real HTTP ends that
stream with an error naming the signal while the daemon (same PID) serves the next chat from a
restarted worker. Real llama-cpp-python on the generated tiny GGUF and on SmolLM2-135M.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from daemon_proc import DaemonProcess
from models_fixtures import gguf_path, module_tmp, smollm2_gguf, start_daemon  # noqa: F401

from edgepilot.backends.llamacpp.backend import (
    LlamaCppBackend,
    LlamaExecutable,
    LlamaWorkerExecutable,
)
from edgepilot.backends.llamacpp.options import LlamacppSection
from edgepilot.backends.llamacpp.process import WorkerCrashed
from edgepilot.errors import BackendError, CommandError

QUESTION = [{"role": "user", "content": "Which city is the capital of France?"}]
STORY = [{"role": "user", "content": "Write a long story about a robot who learns to paint."}]
Event = tuple[str, dict[str, Any]]


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def served(path: Path, name: str, events: list[Event] | None = None,
           **settings: Any) -> LlamaWorkerExecutable:
    backend = LlamaCppBackend(LlamacppSection(**settings))
    exe = backend.open_served(path, model=name, emit=lambda kind, **f: (
        events.append((kind, f)) if events is not None else None))
    assert isinstance(exe, LlamaWorkerExecutable)
    return exe


@pytest.fixture(scope="module")
def smol_worker() -> Iterator[tuple[LlamaWorkerExecutable, list[Event]]]:
    events: list[Event] = []
    exe = served(smollm2_gguf(), "smol", events, n_ctx=1024)
    yield exe, events
    exe.close()


@pytest.fixture(scope="module")
def smol_inproc() -> Iterator[LlamaExecutable]:
    exe = LlamaCppBackend(LlamacppSection(n_ctx=1024, isolation="thread")).open_served(
        smollm2_gguf(), model="smol")
    assert isinstance(exe, LlamaExecutable)
    yield exe
    exe.close()


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)


def test_the_worker_is_named_by_its_command_line(gguf_path: Path) -> None:  # noqa: F811
    exe = served(gguf_path, "demo-chat", n_ctx=256)
    try:
        pid = exe.worker_pid
        assert pid is not None and pid != os.getpid()
        assert "-m edgepilot worker llamacpp demo-chat --fd " in cmdline(pid)
        assert (exe.n_ctx, exe.max_concurrency, str(exe.target)) == (256, 1, "llamacpp/cpu/q8_0")
        ref = LlamaCppBackend().open(gguf_path)
        assert exe.tokenize("hello") == ref.tokenize("hello")
        ref.close()
    finally:
        exe.close()
    assert not Path(f"/proc/{pid}").exists()  # closed: the worker left and was reaped


def test_isolation_thread_loads_in_this_process(gguf_path: Path) -> None:  # noqa: F811
    exe = LlamaCppBackend(LlamacppSection(isolation="thread")).open_served(gguf_path, model="t")
    try:
        assert isinstance(exe, LlamaExecutable) and exe.worker_pid is None
    finally:
        exe.close()


def test_temperature_zero_answers_are_identical_in_the_worker_and_in_process(
        smol_worker: tuple[LlamaWorkerExecutable, list[Event]],
        smol_inproc: LlamaExecutable) -> None:
    worker, _ = smol_worker
    for messages in (QUESTION, STORY):
        a = worker.chat(messages, temperature=0, max_tokens=32)
        b = smol_inproc.chat(messages, temperature=0, max_tokens=32)
        assert a["choices"] == b["choices"] and a["usage"] == b["usage"]
    stream = worker.chat(QUESTION, temperature=0, max_tokens=32, stream=True)
    chunks = list(stream)
    whole = smol_inproc.chat(QUESTION, temperature=0, max_tokens=32)
    assert text_of(chunks) == whole["choices"][0]["message"]["content"]
    assert stream.usage == whole["usage"]
    a = worker.complete("The capital of France is", temperature=0, max_tokens=8)
    b = smol_inproc.complete("The capital of France is", temperature=0, max_tokens=8)
    assert a["choices"] == b["choices"] and a["usage"] == b["usage"]
    tokens = {"tokens": np.asarray(worker.tokenize("Paris is"), dtype=np.int32)}
    assert (worker.run(tokens)["logits"] == smol_inproc.run(tokens)["logits"]).all()


def test_cancel_stops_a_streamed_chat_at_the_next_token(
        smol_worker: tuple[LlamaWorkerExecutable, list[Event]]) -> None:
    worker, _ = smol_worker
    cancel = threading.Event()
    stream = worker.chat(STORY, temperature=0, max_tokens=400, stream=True, cancel=cancel)
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 4:
            cancel.set()
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert stream.usage is not None and stream.usage["completion_tokens"] < 40
    # and a stream left early is cancelled in the worker, which then serves the next request
    it = iter(worker.chat(STORY, temperature=0, max_tokens=400, stream=True))
    next(it)
    it.close()  # type: ignore[attr-defined]
    assert worker.chat(QUESTION, temperature=0, max_tokens=4)["usage"]["completion_tokens"] == 4


def test_params_that_are_not_plain_data_are_refused_by_name(
        smol_worker: tuple[LlamaWorkerExecutable, list[Event]]) -> None:
    worker, _ = smol_worker
    with pytest.raises(BackendError, match="cannot be sent to the model's worker process"):
        worker.chat(QUESTION, max_tokens=2, logits_processor=[lambda ids, scores: scores])
    with pytest.raises(CommandError, match=r"llama\.cpp refused the request"):
        worker.complete("word " * 2000, max_tokens=2)  # over n_ctx: a 400, not a crash


def test_a_crashed_worker_fails_its_request_with_the_signal_and_is_restarted() -> None:
    events: list[Event] = []
    exe = served(smollm2_gguf(), "tiny", events, n_ctx=1024)
    try:
        first = exe.worker_pid
        assert first is not None
        # SmolLM2 tells this story for 232 tokens at temperature 0: still running at the kill
        stream = iter(exe.chat(STORY, max_tokens=400, temperature=0, stream=True))
        next(stream)
        os.kill(first, signal.SIGSEGV)
        with pytest.raises(WorkerCrashed, match=rf"pid {first}\) was killed by signal 11 "
                                                r"\(SIGSEGV: a crash in llama.cpp\)"):
            list(stream)
        assert events[0][0] == "backend.fault"  # told before the request got its error
        out = exe.chat(QUESTION, max_tokens=4, temperature=0)  # waits for the restart
        assert out["usage"]["completion_tokens"] == 4
        assert exe.worker_pid not in (None, first) and exe.restarts == 1
        kinds = [k for k, _ in events]
        assert kinds[:2] == ["backend.fault", "worker.restarted"]
        fault = events[0][1]
        assert (fault["model"], fault["pid"], fault["exit"], fault["in_flight"]) == (
            "tiny", first, -signal.SIGSEGV, 1)
        assert events[1][1]["previous_pid"] == first
    finally:
        exe.close()


def test_a_parallel_model_steps_under_the_daemons_step_guard() -> None:
    # SmolLM2: its greedy tokens are the same batched or alone (the random tiny model's
    # near-tied logits are not)
    exe = served(smollm2_gguf(), "par", n_ctx=1024, parallel=2)
    held = {"steps": 0, "now": 0, "most": 0}
    lock = threading.Lock()

    @contextlib.contextmanager
    def guard() -> Iterator[None]:
        with lock:
            held["steps"] += 1
            held["now"] += 1
            held["most"] = max(held["most"], held["now"])
        try:
            yield
        finally:
            with lock:
                held["now"] -= 1

    try:
        assert exe.max_concurrency == 2
        alone = exe.chat(QUESTION, temperature=0, max_tokens=6)
        exe.step_guard = guard
        outs: list[Any] = [None, None]

        def one(i: int) -> None:
            outs[i] = exe.chat(QUESTION, temperature=0, max_tokens=6)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [o["choices"] for o in outs] == [alone["choices"]] * 2
        # every decode step of the worker ran inside the guard, one at a time; the last one's
        # "done" may arrive just after the answers
        deadline = time.monotonic() + 30
        while held["now"] and time.monotonic() < deadline:
            time.sleep(0.01)
        # at least one step per token after the first (the prompts may be read in the same
        # step as each other or not, so the count itself varies with timing)
        assert held["steps"] >= 5 and held["most"] == 1 and held["now"] == 0
    finally:
        exe.close()


# ---- a real daemon over HTTP ------------------------------------------------------------------
@pytest.fixture(scope="module")
def daemon(module_tmp: Path) -> Iterator[DaemonProcess]:  # noqa: F811
    models = module_tmp / "models"
    models.mkdir()
    shutil.copy(smollm2_gguf(), models / "smol.gguf")
    d = start_daemon(module_tmp, "[backends.llamacpp]\nn_ctx = 1024\n"
                                 "[dispatch]\nenabled = false\n")
    yield d
    assert d.stop() == 0


def models_entry(d: DaemonProcess) -> dict[str, Any]:
    status, body = d.request("GET", "/v1/models")
    assert status == 200
    return next(m for m in body["data"] if m["id"] == "smol")  # type: ignore[no-any-return]


def chat(d: DaemonProcess, messages: list[dict[str, str]], **params: Any) -> dict[str, Any]:
    status, body = d.request("POST", "/v1/chat/completions",
                             {"model": "smol", "messages": messages, "temperature": 0, **params},
                             timeout=120)
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def test_killing_the_worker_under_a_streamed_chat_costs_only_that_stream(
        daemon: DaemonProcess) -> None:
    assert daemon.proc is not None
    daemon_pid = daemon.proc.pid
    chat(daemon, QUESTION, max_tokens=2)  # loaded
    worker_pid = models_entry(daemon)["worker_pid"]
    assert isinstance(worker_pid, int) and worker_pid != daemon_pid
    assert "edgepilot worker llamacpp smol" in cmdline(worker_pid)
    assert f"PPid:\t{daemon_pid}\n" in Path(f"/proc/{worker_pid}/status").read_text()

    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", json.dumps(
        {"model": "smol", "messages": STORY, "temperature": 0, "max_tokens": 400,
         "stream": True}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    events: list[str] = []
    while len(events) < 3:  # a few tokens are out: the worker is generating
        line = resp.readline().decode().strip()
        if line.startswith("data: "):
            events.append(line[6:])
    os.kill(worker_pid, signal.SIGKILL)
    rest = [ln.decode().strip()[6:] for ln in resp.readlines() if ln.startswith(b"data: ")]
    conn.close()
    assert "event backend.fault" in daemon.output()  # told before the stream's error
    errors = [json.loads(e)["error"] for e in rest if e.startswith('{"error"')]
    assert len(errors) == 1, rest[-3:]
    assert errors[0]["code"] == "worker_crashed"
    assert f"(pid {worker_pid}) was killed by signal 9 (SIGKILL" in errors[0]["message"]
    assert rest[-1] == "[DONE]" or rest[-1].startswith('{"error"')

    out = chat(daemon, QUESTION, max_tokens=24)
    assert "Paris" in out["choices"][0]["message"]["content"]
    assert daemon.proc.poll() is None and daemon.proc.pid == daemon_pid
    new_pid = models_entry(daemon)["worker_pid"]
    assert isinstance(new_pid, int) and new_pid != worker_pid
    assert "edgepilot worker llamacpp smol" in cmdline(new_pid)
    deadline = time.monotonic() + 10
    while "event worker.restarted" not in daemon.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    log = daemon.output()
    assert "event backend.fault" in log and "event worker.restarted" in log


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def children(pid: int) -> list[int]:
    """The live child processes of ``pid``."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return [c for c in out if running(c)]


def wait_for(what: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := what()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def spares(daemon_pid: int) -> list[int]:
    return [c for c in children(daemon_pid) if "worker llamacpp (spare) --fd" in cmdline(c)]


def test_a_spare_worker_serves_the_next_load_and_none_outlives_a_killed_daemon(
        tmp_path: Path, gguf_path: Path) -> None:  # noqa: F811
    """Once ready the daemon keeps one spare worker (imports done, no model); the next load is
    handed it (ps then names the model), the load's split is in model.loaded, a new spare is
    started after it; a SIGKILLed daemon takes the worker and the spare with it."""
    (tmp_path / "models").mkdir()
    shutil.copy(gguf_path, tmp_path / "models" / "tiny.gguf")
    d = start_daemon(tmp_path, "[dispatch]\nenabled = false\n")
    assert d.proc is not None
    try:
        spare = wait_for(lambda: spares(d.proc.pid))  # type: ignore[union-attr]
        assert len(spare) == 1
        chat_body = {"model": "tiny", "messages": QUESTION, "max_tokens": 2}
        assert d.request("POST", "/v1/chat/completions", chat_body, timeout=120)[0] == 200
        body = d.request("GET", "/v1/models")[1]
        worker_pid = next(m for m in body["data"] if m["id"] == "tiny")["worker_pid"]
        assert worker_pid == spare[0]  # the spare took the model ...
        assert "edgepilot worker llamacpp tiny --fd " in cmdline(worker_pid)  # ... and says so
        loaded = next(line for line in d.output().splitlines()
                      if "event model.loaded" in line and "'tiny'" in line)
        assert "'spare': True" in loaded and "'worker_start_ms': " in loaded
        assert "'model_ms': " in loaded and "'context_ms': " in loaded
        new_spare = wait_for(lambda: [p for p in spares(d.proc.pid)  # type: ignore[union-attr]
                                      if p != worker_pid])
        assert len(new_spare) == 1
    finally:
        d.stop(signal.SIGKILL)
    # the kernel closed the daemon's end of each socket: the worker and the spare see EOF
    assert wait_for(lambda: not any(running(p) for p in (worker_pid, new_spare[0])),
                    timeout=30)


def test_the_gguf_plan_governs_the_worker(tmp_path: Path, gguf_path: Path) -> None:  # noqa: F811
    import asyncio

    from edgepilot.config import parse_config
    from edgepilot.dispatch.gguf.live import MIN_TOKENS
    from edgepilot.dispatch.gguf.plans import GgufDispatch
    from edgepilot.lifecycle import Daemon

    (tmp_path / "models").mkdir()
    shutil.copy(gguf_path, tmp_path / "models" / "chat.gguf")
    d = Daemon(parse_config({
        "daemon": {"state_dir": str(tmp_path / "state"), "model_dir": str(tmp_path / "models"),
                   "demo_models": False},
        "mqtt": {"enabled": False}, "backends": {"llamacpp": {"n_ctx": 512}},
        "dispatch": {"gguf_prompt_tokens": 8, "gguf_decode_tokens": 4, "gguf_threads": [1]}}))
    d.attach_capabilities({"serving", "dispatch"})
    assert d.dispatcher.plan_for("chat")["n_threads"] == 1  # measured in this process
    lm = asyncio.run(d.models.load("chat"))
    exe = lm.executable
    try:
        assert isinstance(exe, LlamaWorkerExecutable) and exe.worker_pid != os.getpid()
        assert exe.n_threads == 1  # the plan's thread count, applied in the worker
        gd = d.dispatcher.get("chat")
        assert isinstance(gd, GgufDispatch) and exe.governor is gd
        before = gd.live.counts.get(1, 0)
        out = exe.chat(QUESTION, max_tokens=64, temperature=0)
        # the live check counts requests that decoded at least MIN_TOKENS after the first
        assert out["usage"]["completion_tokens"] > MIN_TOKENS
        assert gd.live.counts.get(1, 0) == before + 1  # the worker's decode speed came back
    finally:
        asyncio.run(d.models.close())


def cpu_ticks(pid: int) -> int:
    """User plus system CPU time of ``pid`` in clock ticks (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def kill_while_generating(daemon: DaemonProcess, ask: Callable[[], Any]) -> BaseException:
    """Run ``ask`` (a non-streamed chat) in a thread, SIGKILL the worker once it has computed
    for a while (reading a short prompt takes a fraction of that: it is generating), and
    return what ``ask`` raised."""
    pid = wait_for(lambda: models_entry(daemon)["worker_pid"])  # None while restarting
    assert isinstance(pid, int)
    before = cpu_ticks(pid)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            ask()
        except BaseException as exc:  # handed to the test
            raised.append(exc)

    t = threading.Thread(target=run)
    t.start()
    tick = os.sysconf("SC_CLK_TCK")
    assert wait_for(lambda: cpu_ticks(pid) - before >= tick // 2 or not t.is_alive())
    assert t.is_alive(), "the answer came before the kill"
    os.kill(pid, signal.SIGKILL)
    t.join(120)
    assert len(raised) == 1
    return raised[0]


def test_a_worker_killed_under_a_whole_answer_is_503_with_retry_after(
        daemon: DaemonProcess) -> None:
    import ollama
    import openai
    chat(daemon, QUESTION, max_tokens=2)  # loaded
    client = ollama.Client(host=daemon.url)
    err = kill_while_generating(daemon, lambda: client.chat(
        model="smol", messages=STORY, stream=False,
        options={"temperature": 0, "num_predict": 400}))
    assert isinstance(err, ollama.ResponseError), err
    assert err.status_code == 503 and "was killed by signal 9" in err.error
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="-", max_retries=0)
    err = kill_while_generating(daemon, lambda: oa.chat.completions.create(
        model="smol", messages=STORY, temperature=0, max_tokens=400))  # type: ignore[arg-type]
    assert isinstance(err, openai.InternalServerError) and err.status_code == 503, err
    assert err.response.headers["retry-after"] == "1"
    assert isinstance(err.body, dict) and err.body["code"] == "worker_crashed"
    # the daemon serves on, from a restarted worker
    got = client.chat(model="smol", messages=QUESTION, options={"temperature": 0,
                                                                 "num_predict": 24})
    assert "Paris" in got.message.content
