"""Other work while planning times something (measuring/contention.py): metered, and a
contended side by side is made again and not kept as a verdict for later plans."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import psutil
import pytest
from other_load import burners

from edgepilot.dispatch.measuring.contention import CONTENDED, OtherLoad
from edgepilot.dispatch.planning.versus import (
    CLOSE,
    CONTENDED_TRIES,
    CONTENDED_WITHIN,
    RIVAL_WITHIN,
    VERDICT_FRESH_S,
    keep_verdict,
    prior_verdict,
    rivals,
    versus,
)

FP32, ONE, INT8 = "onnxruntime/cpu/fp32", "onnxruntime/cpu-1t/fp32", "onnxruntime/cpu/int8"


def test_other_processes_are_metered_as_other_work() -> None:
    with burners():
        meter = OtherLoad()
        time.sleep(1.0)
        share = meter.share()
    assert share > 0.6, share


def test_this_process_and_its_children_are_not_other_work() -> None:
    """The timed work itself (this process burning a core, or a backend's worker process) is
    not contention: the share is what the whole machine did less what we did."""
    me = psutil.Process()

    def ours() -> float:
        t = me.cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def machine() -> float:
        t = psutil.cpu_times()
        return t.user + t.nice + t.system + t.irq + t.softirq + t.steal

    busy0, own0, t0 = machine(), ours(), time.monotonic()
    meter = OtherLoad()
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nt=time.time()\nwhile time.time()-t<1.0: pass"])
    a = np.ones((256, 256), np.float32)
    while time.monotonic() - t0 < 1.0:
        a = (a @ a) / 256.0  # this process busy too
    child.wait()  # (reaped: its CPU time is in children_*)
    share = meter.share()
    capacity = (time.monotonic() - t0) * (psutil.cpu_count() or 1)
    own, total = (ours() - own0) / capacity, (machine() - busy0) / capacity
    assert own > 0.05  # (whatever else the machine ran, we got some of it)
    assert abs(share - max(0.0, total - own)) < 0.05, (share, total, own)


def test_a_contended_side_by_side_is_made_again_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the retries are what is tested, not RETRY_MAX_S: a try sized from one quick 2 ms call can
    # run past 1.5 s when the burners slow every later one
    monkeypatch.setattr("edgepilot.dispatch.planning.versus.RETRY_MAX_S", 60.0)
    calls: list[int] = []

    def run(feed: dict[str, Any]) -> None:
        calls.append(1)
        time.sleep(0.002)

    with burners():
        v = versus(run, run, {}, 0.05)
    assert v.contention > CONTENDED and v.tries == CONTENDED_TRIES
    one = versus(run, run, {}, 0.05, tries=1)  # quiet or not: asked for one, one is made
    assert one.tries == 1


def test_whole_models_timed_under_load_widen_the_rivals() -> None:
    """A two-thread session timed while a build took a core read 1.45x the one-thread one,
    past RIVAL_WITHIN, and was never timed side by side again: it served 0.69x on the quiet
    board. Whole models timed under load make every target within CONTENDED_WITHIN a rival."""
    whole = {ONE: 3.6, FP32: 1.45 * 3.6, INT8: 1.1 * 3.6}
    assert RIVAL_WITHIN < 1.45 < CONTENDED_WITHIN

    def builder(contention: float) -> Any:
        extra = {"whole_ms": whole, "whole_error": {INT8: 0.2}, "whole_twins": {},
                 "whole_contention": contention}
        return SimpleNamespace(profile=SimpleNamespace(extra=extra, targets=list(whole)),
                               excluded=set(), tolerance=0.05)

    plan = SimpleNamespace(segments=[(ONE, 0, 4)])
    assert rivals(builder(0.0), plan) == []          # int8 over tolerance, fp32 far
    assert rivals(builder(CONTENDED + 0.3), plan) == [FP32]


def test_a_contended_verdict_is_timed_again_not_served_from_the_profile() -> None:
    """Verdicts are kept with the profile so a restart serves what was decided; one timed
    while other work took the CPUs is not decided, and the next one on its pairing replaces it."""
    seg = [[ONE, 0, 4]]
    quiet = {"segments": seg, "target": FP32, "kept": "plan", "contention": 0.05}
    busy = {"segments": seg, "target": INT8, "kept": "single", "contention": CONTENDED + 0.2}
    old = {"segments": seg, "target": ONE, "kept": "plan"}  # kept before contention was metered
    verdicts = [quiet, busy, old]
    assert prior_verdict(verdicts, seg, FP32) is quiet
    assert prior_verdict(verdicts, seg, ONE) is old
    assert prior_verdict(verdicts, seg, INT8) is None
    again = {**busy, "kept": "plan", "contention": 0.01}
    keep_verdict(verdicts, again)
    assert verdicts == [quiet, old, again]
    assert prior_verdict(verdicts, seg, INT8) is again


def test_no_try_again_past_the_planning_budget() -> None:
    def run(feed: dict[str, Any]) -> None:
        time.sleep(0.002)

    with burners():
        v = versus(run, run, {}, 0.05, deadline=time.monotonic() + 0.1)
    assert v.contention > CONTENDED and v.tries == 1


def test_a_near_tie_is_timed_again_once_it_is_old_a_clear_verdict_stands() -> None:
    """ppocr-det's two thread counts were 3% apart when planned and 26% apart fifteen minutes
    later, and the plan from the cache served the slower: a close verdict says only which was
    faster then. Within VERDICT_FRESH_S (a crash loop, a test's restart) it stands."""
    seg = [[ONE, 0, 4]]
    t = 1_000_000.0
    tie = {"segments": seg, "target": FP32, "kept": "plan", "ratio": 1.03, "at": t}
    clear = {"segments": seg, "target": INT8, "kept": "plan", "ratio": 1.6, "at": t}
    verdicts = [tie, clear]
    assert prior_verdict(verdicts, seg, FP32, now=t + 5) is tie
    assert prior_verdict(verdicts, seg, FP32, now=t + VERDICT_FRESH_S + 1) is None
    assert abs(tie["ratio"] - 1) <= CLOSE < abs(clear["ratio"] - 1)
    assert prior_verdict(verdicts, seg, INT8, now=t + 10 * VERDICT_FRESH_S) is clear
    undated = {"segments": seg, "target": FP32, "kept": "single", "ratio": 0.95}
    assert prior_verdict([undated], seg, FP32, now=t) is None  # kept before verdicts were dated
