"""The dispatch service on a real Daemon and event bus: one thermal move, one replan.

The DVFS thermal guard moves profiles through ProfileManager (``profile.applied``, reason
"thermal") and then reports the same move as a ``thermal`` event with an ``action``; the
dispatcher must re-predict once per move, not twice. A hot report that moved no profile
re-predicts only when the clocks moved (the kernel throttling).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from board_fixtures import BIN_DIR, fake_board

from edgepilot.config import parse_config
from edgepilot.dispatch.service import DispatchService
from edgepilot.formats import onnx_gen

__all__ = ["fake_board"]
POL0 = "/sys/devices/system/cpu/cpufreq/policy0"
TJ_TEMP = "/sys/devices/virtual/thermal/thermal_zone8/temp"   # type tj-thermal


async def until(pred: Callable[[], Any], what: str, timeout: float = 60.0) -> None:
    """Poll ``pred`` (a bound on waiting, not a measurement)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def test_a_thermal_fallback_replans_once(fake_board, tmp_path: Path,  # type: ignore[no-untyped-def]
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from edgepilot.lifecycle import Daemon

    fake = fake_board("orin")
    monkeypatch.setenv("EDGEPILOT_FAKE_ROOT", str(fake.root))  # read by the emulators only
    models = tmp_path / "models"
    onnx_gen.mlp_stack(models / "mlp.onnx", widths=(64, 128, 64), batch=2)
    config = parse_config({
        "daemon": {"sysfs_root": str(fake.root), "state_dir": str(tmp_path / "state"),
                   "model_dir": str(models), "demo_models": False},
        "dvfs": {"profile": "performance", "nvpmodel": str(BIN_DIR / "nvpmodel"),
                 "jetson_clocks": str(BIN_DIR / "jetson_clocks"), "thermal_dwell_s": 0},
        "dispatch": {"profile_runs": 3, "warmup_runs": 1, "kernel_corpus": False,
                     "targets": ["onnxruntime/cpu/fp32", "onnxruntime/cpu/int8"]},
        "telemetry": {"sample_interval_s": 0.1, "publish_interval_s": 3600}})
    daemon = Daemon(config)
    daemon.attach_capabilities({"status", "dvfs", "serving", "telemetry", "dispatch"})
    svc = next(s for s in daemon.services if isinstance(s, DispatchService))
    seen: list[str] = []   # subscribed after the service: it has handled what this sees
    daemon.events.subscribe(lambda e: seen.append(
        f"{e['type']}:{e.get('action') or e.get('reason') or ''}"))
    replans: list[list[str]] = []

    async def scenario() -> None:
        for s in daemon.services:
            await s.start()
        try:
            plan = await daemon.dispatcher.plan("mlp")
            assert plan["hash"]
            await svc.idle()
            daemon.dispatcher.clock_replans.clear()
            fake.write(TJ_TEMP, "88250\n")
            await until(lambda: "thermal:fallback" in seen, "thermal fallback")
            await asyncio.sleep(0.1)  # the loop runs the spawns queued by those events
            await svc.idle()
            replans.append(list(daemon.dispatcher.clock_replans))
            # a hot report that moved no profile and no clock: nothing to re-predict
            daemon.dispatcher.clock_replans.clear()
            hot = {"zone": "tj-thermal", "temp_c": 95.0, "action": "none"}
            await daemon.run_blocking(lambda: daemon.events.emit("thermal", **hot))
            await asyncio.sleep(0.1)
            await svc.idle()
            replans.append(list(daemon.dispatcher.clock_replans))
            # the kernel throttles the hot CPU: the same report now re-predicts once
            cur = f"{POL0}/scaling_cur_freq"
            fake.write(cur, str(int(int(fake.read(cur)) // 2)) + "\n")
            await daemon.run_blocking(lambda: daemon.events.emit("thermal", **hot))
            await asyncio.sleep(0.1)
            await svc.idle()
            replans.append(list(daemon.dispatcher.clock_replans))
        finally:
            for s in reversed(daemon.services):
                await s.stop()

    asyncio.run(scenario())
    daemon.executor.shutdown()
    assert "profile.applied:thermal" in seen and "thermal:fallback" in seen
    # the sampler's warning crossing and the guard's own report added nothing to the move
    assert replans == [["profile.applied"], [], ["thermal"]]
