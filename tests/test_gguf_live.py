"""GGUF thread choice vs the daemon's own traffic, and its check on live serving.

- Measuring rounds hold the device queues: a request in progress is waited for, and no request
  gets the device while a round is timed (real llama.cpp on a generated GGUF, real queues).
- The live trial: when the runner-up was close or the rounds were noisy, requests alternate
  between the two thread counts and the faster on observed decode speed is kept (injected
  observations: deterministic).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgepilot.config import parse_config
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.dispatch.gguf.live import (
    CLOSE_MARGIN,
    MIN_TOKENS,
    TRIAL_REQUESTS,
    LiveStats,
    LiveTrial,
    trial_reason,
)
from edgepilot.dispatch.gguf.plans import GgufDispatch
from edgepilot.dispatch.gguf.select import Measurement, spread
from edgepilot.errors import PlanError
from edgepilot.formats.gguf_gen import GgufSpec, write_gguf
from edgepilot.lifecycle import Daemon
from edgepilot.serving.devices import DeviceQueues


def m(threads: int, decode: float, prefill: float = 1.0, spread_: float = 0.0,
      ngl: int = 0) -> Measurement:
    return Measurement(threads, ngl, prefill, decode, rounds=7, decode_spread=spread_)


# ---- pure: when to try, how to decide ---------------------------------------------------------
def test_a_close_runner_up_is_tried() -> None:
    # 32-token prompt + 16 decoded: 32 + 16*10 = 192 ms vs 32 + 16*11 = 208 ms (+8%)
    why = trial_reason(m(2, 10.0), m(1, 11.0), 32, 16)
    assert why is not None and "within 15%" in why


def test_a_clear_quiet_choice_is_not_tried_but_a_noisy_one_is() -> None:
    assert trial_reason(m(2, 10.0), m(1, 17.0), 32, 16) is None
    why = trial_reason(m(2, 10.0, spread_=0.3), m(1, 17.0), 32, 16)
    assert why is not None and "noisy" in why and "30%" in why


def test_only_thread_counts_are_tried_live() -> None:
    # another n_gpu_layers would need a reload: never tried on live traffic
    assert trial_reason(m(2, 10.0), m(2, 10.1, ngl=4), 32, 16) is None
    assert trial_reason(m(2, 10.0), None, 32, 16) is None


def test_trial_alternates_and_keeps_the_runner_up_when_it_serves_faster() -> None:
    trial = LiveTrial(chosen=1, runner_up=2, reason="close")
    served = []
    live_ms = {1: 16.0, 2: 9.5}
    winner = None
    while winner is None:
        n = trial.next_threads()
        served.append(n)
        winner = trial.observe(n, live_ms[n], tokens=32)
    assert served == [1, 2] * TRIAL_REQUESTS
    assert winner == 2 and trial.done and trial.next_threads() == 2


def test_trial_keeps_the_choice_when_the_runner_up_is_not_faster_by_the_margin() -> None:
    trial = LiveTrial(chosen=2, runner_up=1, reason="close")
    for _ in range(TRIAL_REQUESTS):
        trial.observe(2, 10.0, 32)
        winner = trial.observe(1, 9.9, 32)  # 1% faster: within the keep margin
    assert winner == 2


def test_short_and_foreign_requests_are_not_evidence() -> None:
    trial = LiveTrial(chosen=1, runner_up=2, reason="noisy")
    assert trial.observe(1, 5.0, tokens=MIN_TOKENS - 1) is None   # too short to say
    assert trial.observe(3, 5.0, tokens=64) is None               # not a candidate
    assert trial.samples == {1: [], 2: []}
    assert trial.next_threads() == 1


def test_live_stats_report_drift_only_after_enough_requests() -> None:
    stats = LiveStats()
    stats.observe(1, 20.0, 32)
    stats.observe(1, 21.0, 32)
    assert stats.drifted(1, 10.0) is None
    stats.observe(1, 22.0, 32)
    assert stats.drifted(1, 10.0) == pytest.approx(2.1)
    assert stats.drifted(1, 20.0) is None
    assert stats.as_dict()["1"]["requests"] == 3


def test_spread_is_the_interquartile_range_over_the_median() -> None:
    assert spread([10.0]) == 0.0
    assert spread([10.0, 10.0, 10.0, 10.0, 10.0]) == 0.0
    assert spread([9.0, 10.0, 10.0, 10.0, 30.0]) == pytest.approx(0.0)  # one bad round
    assert spread([8.0, 9.0, 10.0, 11.0, 12.0]) == pytest.approx(0.2)


# ---- GgufDispatch: the trial on injected observations, recorded and emitted ------------------
def config(tmp: Path, **dispatch: Any) -> Any:
    return parse_config({"daemon": {"state_dir": str(tmp / "state"),
                                    "model_dir": str(tmp / "models"), "demo_models": False},
                         "mqtt": {"enabled": False},
                         "dispatch": {"gguf_prompt_tokens": 8, "gguf_decode_tokens": 4,
                                      "gguf_threads": [1, 2], **dispatch}})


def planned(tmp: Path, events: list[tuple[str, dict[str, Any]]]) -> GgufDispatch:
    write_gguf(tmp / "models" / "chat.gguf", GgufSpec())
    md = Dispatcher(config(tmp), emit=lambda kind, **f: events.append((kind, f))).get("chat")
    assert isinstance(md, GgufDispatch)
    md.prepare()
    return md


def test_a_close_choice_is_settled_on_live_traffic_and_remembered(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    md = planned(tmp_path, events)
    # what the quiet measurement could have found: 1 thread ahead by a hair
    md.measured = [m(1, 10.0), m(2, 10.5)]
    md.replan("test")
    assert md.plan is not None and md.plan.n_threads == 1
    assert md.trial is not None and md.trial.reason.startswith("runner-up 2 threads within")
    before = md.plan.hash
    # serving: each request asks for its thread count and reports what it observed; on real
    # traffic 2 threads decode faster
    live_ms = {1: 16.0, 2: 9.0}
    served = []
    for _ in range(2 * TRIAL_REQUESTS):
        n = md.threads_for_request()
        assert n is not None
        served.append(n)
        md.observed(n, live_ms[n], 32)
    assert served == [1, 2] * TRIAL_REQUESTS
    assert md.plan.n_threads == 2 and md.plan.reason == "live"
    assert md.threads_for_request() == 2
    changed = [f for kind, f in events if kind == "plan.changed"]
    assert changed[-1]["reason"] == "live" and changed[-1]["previous"] == before
    assert (changed[-1]["n_threads"], changed[-1]["previous_n_threads"]) == (2, 1)
    plan = md.explain()
    assert plan["n_threads"] == 2 and plan["hash"] == md.plan.hash
    assert plan["live"]["trial"]["winner"] == 2
    assert plan["live"]["observed"]["2"]["requests"] == TRIAL_REQUESTS
    assert plan["runner_up"]["n_threads"] == 1
    assert "decode speed on live traffic" in plan["note"]
    # a restart reads the verdict with the cached measurements: no new trial
    again = Dispatcher(config(tmp_path)).get("chat")
    assert isinstance(again, GgufDispatch)
    cached = again.load_cached()
    assert cached is not None and cached.n_threads == 2 and again.trial is None


def test_a_clear_choice_is_not_tried_and_serves_its_threads(tmp_path: Path) -> None:
    md = planned(tmp_path, [])
    md.measured = [m(1, 10.0), m(2, 10.0 * (1 + 3 * CLOSE_MARGIN))]
    md.replan("test")
    assert md.trial is None
    assert [md.threads_for_request() for _ in range(4)] == [1, 1, 1, 1]


def test_serving_slower_than_predicted_starts_a_trial(tmp_path: Path) -> None:
    md = planned(tmp_path, [])
    md.measured = [m(1, 10.0), m(2, 20.0)]
    md.replan("test")
    assert md.trial is None
    for _ in range(3):  # live: 1 thread decodes at 16 ms/token, predicted 10
        md.observed(1, 16.0, 32)
    assert md.trial is not None and "1.60x the predicted" in md.trial.reason
    assert md.threads_for_request() == 1
    md.observed(1, 16.0, 32)
    assert md.threads_for_request() == 2


# ---- measuring holds the devices ---------------------------------------------------------------
async def _until(cond: Any) -> None:
    while not cond():
        await asyncio.sleep(0.005)


def test_measuring_waits_for_the_request_holding_the_device_and_blocks_new_ones(
        tmp_path: Path) -> None:
    write_gguf(tmp_path / "models" / "chat.gguf", GgufSpec())
    d = Daemon(config(tmp_path))
    d.attach_capabilities({"serving", "dispatch"})
    md = d.dispatcher.get("chat")
    assert isinstance(md, GgufDispatch)
    in_round = threading.Event()
    rounds: list[bool] = []   # per measuring round: was a request on the device meanwhile?
    serving = threading.Event()
    real_hold = md.hold

    @contextlib.contextmanager
    def watched_hold() -> Iterator[None]:
        with real_hold():
            rounds.append(serving.is_set())
            in_round.set()
            try:
                yield
            finally:
                in_round.clear()

    md.hold = watched_hold

    async def scenario() -> None:
        d._loop = asyncio.get_running_loop()  # what Daemon.run() sets: the loop is serving
        queue = d.devices.queue("cpu")
        await queue.acquire()  # a request is on the device
        serving.set()
        planning = asyncio.ensure_future(d.run_blocking(md.prepare))
        await _until(lambda: queue.queued == 1)  # the measurement waits in line ...
        assert rounds == [] and md.plan is None  # ... having timed nothing
        serving.clear()
        queue.release()  # the request ends
        # requests arriving while it measures get the device only between rounds
        granted_in_round = []
        while not planning.done():
            async with queue.slot():
                granted_in_round.append(in_round.is_set())
            await asyncio.sleep(0.02)  # pacing, so the measurement gets its turns
        await planning
        assert granted_in_round and not any(granted_in_round)

    try:
        asyncio.run(scenario())
    finally:
        d.executor.shutdown(wait=True)
    assert rounds and not any(rounds)
    assert md.plan is not None and md.plan.n_threads in (1, 2)
    assert all(c["rounds"] >= 7 for c in md.explain()["candidates"])


def test_a_planned_model_loads_without_hashing_its_file_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgepilot.formats import files

    md = planned(tmp_path, [])
    assert md.plan is not None

    def no_hashing(path: Path) -> str:
        raise AssertionError(f"{path.name} hashed again")

    monkeypatch.setattr(files, "sha256_of", no_hashing)
    # a restart: the cached plan names this very file (size, mtime, inode) with its sha256
    again = Dispatcher(config(tmp_path)).get("chat")
    assert isinstance(again, GgufDispatch)
    cached = again.load_cached()
    assert cached is not None and cached.hash == md.plan.hash
    # another file at the same path is hashed (and so planned afresh)
    monkeypatch.undo()
    write_gguf(tmp_path / "models" / "chat.gguf", GgufSpec(seed=1))
    fresh = Dispatcher(config(tmp_path)).get("chat")
    assert isinstance(fresh, GgufDispatch) and fresh.load_cached() is None


def _loop_in_thread() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    return loop, thread


def _hold_error(hold: Any) -> tuple[threading.Thread, list[str]]:
    errors: list[str] = []

    def measure() -> None:
        try:
            with hold:
                errors.append("held")
        except PlanError as exc:
            errors.append(exc.message)

    thread = threading.Thread(target=measure, daemon=True)
    thread.start()
    return thread, errors


@pytest.mark.parametrize("how", ["stop", "busy"])
def test_a_measurement_waiting_for_the_devices_gives_up_and_says_why(how: str) -> None:
    loop, loop_thread = _loop_in_thread()
    devices = DeviceQueues(4)
    queue = devices.queue("cpu")
    asyncio.run_coroutine_threadsafe(queue.acquire(), loop).result()  # a request holds it
    measuring, errors = _hold_error(devices.hold_all(300 if how == "stop" else 1))
    while queue.queued == 0:  # the measurement is in line
        threading.Event().wait(0.01)
    if how == "stop":
        devices.close()  # the daemon stops meanwhile
    measuring.join(timeout=60)
    assert not measuring.is_alive()
    want = ("the daemon is stopping" if how == "stop" else
            "device cpu stayed busy for 1 s; retry when traffic is lower (plan.replan)")
    assert errors == [f"nothing could be measured alone: {want}"]
    loop.call_soon_threadsafe(loop.stop)
    loop_thread.join()
    loop.close()
