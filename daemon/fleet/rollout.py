"""``fleet rollout profile NAME|config FILE``: a change rolled out canary first, batch by batch.

1. Every target must answer ``status`` first; what each runs now is noted. A profile is undone
   with the profile it ran before, or, when it ran none, with ``profile.restore``, which puts
   back the exact files edgepilot changed, byte for byte; a config file with
   ``config.restore``, which puts the previous file back byte for byte and reloads.
2. The change goes to ``--canary N`` devices; their health is watched for ``--dwell`` seconds;
   then the rest, ``--batch K%`` of the targets at a time, each batch watched the same way.
3. At the first unhealthy device the rollout stops, every device it changed is rolled back,
   and the exit status is 1.

Healthy means: answers ``status`` and ``telemetry.get`` in time, ``ready``, the thermal guard
not engaged (no fallback profile), no thermal zone at or above its lowest trip point, and
requests failing at no more than ``--max-error-rate`` during the dwell.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgepilot.fleet.client import FleetClient

POLL_S = 0.5


@dataclass(frozen=True)
class Change:
    """What a rollout does to each device (a command) and how it is undone there."""

    what: str  # for people: "profile powersave", "config edgepilot.toml"
    verb: str
    params: dict[str, Any]

    def undo(self, before: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The command that undoes this change on a device whose status was ``before``."""
        if self.verb == "config.apply":
            return "config.restore", {}
        prev = before.get("profile")
        return ("profile.apply", {"name": prev}) if prev else ("profile.restore", {})


def profile_change(name: str) -> Change:
    return Change(f"profile {name}", "profile.apply", {"name": name})


def config_change(label: str, toml: str) -> Change:
    return Change(f"config {label}", "config.apply", {"toml": toml})


@dataclass
class RolloutResult:
    """What a rollout did: changed, rolled back, and why it stopped (None: it finished)."""

    change: str
    targets: list[str]
    changed: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    unhealthy: dict[str, list[str]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # devices whose change was refused
    stopped: str | None = None

    @property
    def ok(self) -> bool:
        return self.stopped is None

    def as_dict(self) -> dict[str, Any]:
        return {"change": self.change, "targets": self.targets, "changed": self.changed,
                "rolled_back": self.rolled_back, "unhealthy": self.unhealthy,
                "failed": self.failed, "stopped": self.stopped, "ok": self.ok}


def batches(devices: list[str], canary: int, batch_pct: float) -> list[list[str]]:
    """The canaries, then the rest in batches of ``batch_pct`` % of all targets (at least 1)."""
    first, rest = devices[:canary], devices[canary:]
    size = max(1, math.ceil(len(devices) * batch_pct / 100))
    return [b for b in [first, *(rest[i:i + size] for i in range(0, len(rest), size))] if b]


def problems(status: dict[str, Any] | None, telemetry: dict[str, Any] | None,
             errors_before: dict[str, int], max_error_rate: float) -> list[str]:
    """Why one device is unhealthy (empty: healthy), from its replies to ``status`` and
    ``telemetry.get``."""
    out: list[str] = []
    if status is None or not status.get("ok"):
        return ["no answer to status" if status is None else f"status failed: {status}"]
    st = status["result"]
    if not st.get("ready"):
        out.append(f"not ready: {st.get('not_ready')}")
    thermal = (st.get("dvfs") or {}).get("thermal") or {}
    if thermal.get("fallbacks"):
        out.append(f"thermal guard engaged: fell back to {thermal['fallbacks']}")
    if telemetry is None or not telemetry.get("ok"):
        return [*out, "no answer to telemetry.get"]
    tm = telemetry["result"]
    trips = tm.get("trips_c") or {}
    for zone, temp in sorted((tm.get("temps_c") or {}).items()):
        limits = [t["temp_c"] for t in trips.get(zone, []) if isinstance(t, dict)
                  and isinstance(t.get("temp_c"), (int, float))]
        if limits and isinstance(temp, (int, float)) and temp >= min(limits):
            out.append(f"{zone} at {temp:.1f} C, at or over its trip point {min(limits):.1f} C")
    requests, errors = _work(tm)
    new_req = requests - errors_before.get("requests", 0)
    new_err = errors - errors_before.get("errors", 0)
    if new_req > 0 and new_err / new_req > max_error_rate:
        out.append(f"{new_err} of {new_req} requests failed during the dwell")
    return out


def _work(tm: dict[str, Any]) -> tuple[int, int]:
    """Requests and failed requests since start, every model together."""
    models = tm.get("models") or {}
    rows = [m for m in (models.values() if isinstance(models, dict) else models)
            if isinstance(m, dict)]
    return (sum(int(m.get("requests_total") or 0) for m in rows),
            sum(int(m.get("errors_total") or 0) for m in rows))


class Rollout:
    """One rollout of ``change`` over ``targets`` through ``fleet``."""

    def __init__(self, fleet: FleetClient, change: Change, targets: list[str], *, canary: int,
                 batch_pct: float, dwell_s: float, timeout_s: float,
                 max_error_rate: float = 0.05, say: Callable[[str], None] = lambda _: None
                 ) -> None:
        self.fleet, self.change, self.targets = fleet, change, targets
        self.canary, self.batch_pct, self.dwell_s = canary, batch_pct, dwell_s
        self.timeout_s, self.max_error_rate, self.say = timeout_s, max_error_rate, say
        self.before: dict[str, dict[str, Any]] = {}
        self.work_before: dict[str, dict[str, int]] = {}

    def run(self) -> RolloutResult:
        result = RolloutResult(self.change.what, list(self.targets))
        first = self.fleet.run("status", devices=self.targets, timeout_s=self.timeout_s)
        if first.missing:
            result.stopped = "before start"
            result.unhealthy = {d: ["no answer to status"] for d in first.missing}
            return result
        self.before = {d: first.replies[d].get("result") or {} for d in self.targets}
        for k, batch in enumerate(batches(self.targets, self.canary, self.batch_pct)):
            what = "canary" if k == 0 and self.canary else f"batch {k}"
            self.say(f"{what}: {', '.join(batch)} -> {self.change.what}")
            self._baseline(batch)
            applied = self.fleet.run(self.change.verb, self.change.params, devices=batch,
                                     timeout_s=self.timeout_s)
            for dev in batch:
                reply = applied.replies.get(dev)
                if reply is None or not reply.get("ok"):
                    result.failed[dev] = "no answer" if reply is None else str(
                        (reply.get("error") or {}).get("message"))
                if reply is not None:  # answered: it may have changed something
                    result.changed.append(dev)
            bad = {d: [f"apply failed: {w}"] for d, w in result.failed.items()}
            if not bad:
                bad = self._watch(batch)
            if bad:
                result.unhealthy, result.stopped = bad, what
                self.say(f"{what} unhealthy: {bad}; rolling back {', '.join(result.changed)}")
                self._roll_back(result)
                return result
        return result

    def _baseline(self, batch: list[str]) -> None:
        tm = self.fleet.run("telemetry.get", devices=batch, timeout_s=self.timeout_s)
        for dev, reply in tm.replies.items():
            req, err = _work(reply.get("result") or {}) if reply.get("ok") else (0, 0)
            self.work_before[dev] = {"requests": req, "errors": err}

    def _watch(self, batch: list[str]) -> dict[str, list[str]]:
        """Poll the batch's health for the dwell; the first unhealthy reading stops it."""
        deadline = time.monotonic() + self.dwell_s
        while True:
            st = self.fleet.run("status", devices=batch, timeout_s=self.timeout_s)
            tm = self.fleet.run("telemetry.get", devices=batch, timeout_s=self.timeout_s)
            bad = {d: why for d in batch
                   if (why := problems(st.replies.get(d), tm.replies.get(d),
                                       self.work_before.get(d, {}), self.max_error_rate))}
            if bad or time.monotonic() >= deadline:
                return bad
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    def _roll_back(self, result: RolloutResult) -> None:
        by_undo: dict[str, tuple[str, dict[str, Any], list[str]]] = {}
        for dev in result.changed:
            verb, params = self.change.undo(self.before.get(dev, {}))
            key = f"{verb} {sorted(params.items())}"
            by_undo.setdefault(key, (verb, params, []))[2].append(dev)
        for verb, params, devs in by_undo.values():
            back = self.fleet.run(verb, params, devices=devs, timeout_s=self.timeout_s)
            result.rolled_back += [d for d in devs if (back.replies.get(d) or {}).get("ok")]
