"""Model lifecycle under Ollama's ``keep_alive``: unloading gives the memory back (the
daemon's RSS where it was before the load, the worker process gone) and a request arriving
while a model unloads succeeds."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ollama
import psutil
import pytest
from daemon_proc import DaemonProcess
from models_fixtures import module_tmp, smollm2_gguf, start_daemon  # noqa: F401


@pytest.fixture(scope="module")
def daemon(module_tmp: Path) -> Iterator[DaemonProcess]:  # noqa: F811
    models = module_tmp / "models"
    models.mkdir()
    shutil.copy(smollm2_gguf(), models / "smol.gguf")
    d = start_daemon(module_tmp, "[backends.llamacpp]\nn_ctx = 512\n"
                     '[[models]]\nname = "smol"\nfile = "smol.gguf"\nload_at_start = false\n')
    yield d
    assert d.stop() == 0


def _rss(d: DaemonProcess) -> int:
    assert d.proc is not None
    return int(psutil.Process(d.proc.pid).memory_info().rss)


def _worker_pid(d: DaemonProcess) -> int | None:
    code, body = d.request("GET", "/v1/models")
    assert code == 200
    return {m["id"]: m for m in body["data"]}["smol"]["worker_pid"]


def test_rss_returns_after_keep_alive_zero(daemon: DaemonProcess) -> None:
    client = ollama.Client(host=daemon.url)
    # two first cycles: what the daemon keeps once it has served at all (imports, pools, and
    # the malloc arenas of the threads a load and an unload start, the spare worker's link
    # among them: in one full-suite run the second cycle still grew by 15 MB, never after)
    for _ in range(2):
        client.generate(model="smol", prompt="hello", keep_alive=0, options={"num_predict": 4})
        client.generate(model="smol", prompt="", keep_alive=0)
    before = _rss(daemon)
    got = client.generate(model="smol", prompt="hello", keep_alive="1m",
                          options={"num_predict": 4})
    assert got.load_duration and got.load_duration > 0
    worker = _worker_pid(daemon)
    assert worker is not None and psutil.pid_exists(worker)
    loaded = [m.model for m in client.ps().models]
    assert loaded == ["smol:latest"]  # tagged, as Ollama lists it
    assert client.generate(model="smol", prompt="", keep_alive=0).done_reason == "unload"
    assert client.ps().models == []
    after = _rss(daemon)
    assert abs(after - before) <= 0.05 * before, (before, after)
    psutil.Process(worker).wait(timeout=30) if psutil.pid_exists(worker) else None
    assert not psutil.pid_exists(worker)


def test_a_request_during_an_unload_succeeds(daemon: DaemonProcess) -> None:
    client = ollama.Client(host=daemon.url)
    results: dict[str, Any] = {}
    started = threading.Event()

    def long() -> None:
        parts = []
        for part in client.generate(model="smol", prompt="Once upon a time", raw=True, stream=True,
                                    options={"num_predict": 200, "temperature": 0}):
            started.set()
            parts.append(part)
        results["long"] = parts[-1]

    def unload() -> None:
        results["unload"] = client.generate(model="smol", prompt="", keep_alive=0)

    # (200 tokens: the stream must outlast the unload request and the polls below, also on a
    # machine generating several times faster than this one)
    first = threading.Thread(target=long)
    first.start()
    assert started.wait(60)
    second = threading.Thread(target=unload)
    second.start()
    # the unload took the model off the list and waits for the first request to finish
    deadline = time.monotonic() + 30
    while client.ps().models and time.monotonic() < deadline:
        time.sleep(0.01)
    assert second.is_alive() and first.is_alive()
    during = client.chat(model="smol", messages=[{"role": "user", "content": "hi"}],
                         options={"num_predict": 3})
    first.join(120)
    second.join(120)
    assert during.done and during.eval_count
    assert results["long"].done and results["long"].eval_count
    assert results["unload"].done_reason == "unload"
