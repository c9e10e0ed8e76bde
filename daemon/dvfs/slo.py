"""The SLO pick: ``[dvfs] slo_ms`` + ``slo_model`` choose the DVFS profile from measurements.

At start the daemon measures ``slo_model`` under every profile valid on this board, as
``edgepilot sweep`` does (apply, plan for those clocks, time the plan with p50/p95 while
sampling board power, restore), and applies the lowest-energy profile whose p95 latency meets
``slo_ms`` (:func:`edgepilot.dvfs.pareto.slo_pick`). When none meets it, the fastest (lowest
p95) is applied as the best effort and the ``slo.pick`` event says ``met: false``; on a board
without a power sensor (energy unknown) the slowest profile that meets it is applied (the
lowest clocks that do), with the reason.

The measurements are cached in ``<state_dir>/slo/`` keyed by the board, the model file's
sha256, every runtime's version, edgepilot's version and the candidate profiles' definitions:
a restart on the same board with the same model picks again in milliseconds; anything that
changes the numbers re-measures.

After a thermal fallback away from a profile, the guard asks :meth:`SloPicker.choose_fallback`
first: among the profiles that measured *less power* than the hot one (cooler) and are not
already on the guard's stack, the lowest-energy one that meets the SLO replaces the profile's
configured fallback; when none does, the configured fallback stands (safety first). The guard
returns to the picked profile once the zones have cooled, as with any fallback.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from edgepilot import __version__
from edgepilot.config import Config, ConfigSource
from edgepilot.dispatch.dispatcher import Dispatcher
from edgepilot.dvfs.manager import ProfileManager
from edgepilot.dvfs.pareto import slo_pick
from edgepilot.errors import ConfigError, EdgepilotError, PlanError
from edgepilot.events import EventBus

log = logging.getLogger(__name__)

FORMAT = 1
# the bench's fewest rounds and timed seconds per profile (the CLI's defaults)
RUNS = 30
BUDGET_S = 0.3
TENSOR_SUFFIXES = (".onnx", ".tflite")


def check_model(dispatcher: Dispatcher, config: Config) -> Path | None:
    """The slo_model's file, refused when the model is unknown or not a tensor model."""
    name = config.dvfs.slo_model
    if name is None:
        return None
    try:
        _, path, _ = dispatcher.resolve(name)
    except EdgepilotError as exc:
        raise ConfigError(f"[dvfs] slo_model: {exc.message}", field="dvfs.slo_model") from None
    if path.suffix.lower() not in TENSOR_SUFFIXES:
        raise ConfigError(f"[dvfs] slo_model {name!r} is a {path.suffix or 'suffix-less'} file; "
                          "allowed: an ONNX or TFLite model (GGUF latency depends on the "
                          "prompt: use `edgepilot plan` per profile)", field="dvfs.slo_model")
    return Path(path)


class SloPicker:
    """Measures (or loads), picks and re-picks; its state is plain data (:meth:`status`)."""

    def __init__(self, manager: ProfileManager, *, config: ConfigSource, events: EventBus,
                 dispatcher: Dispatcher,
                 hold_devices: Callable[[], AbstractContextManager[Any]]) -> None:
        """``hold_devices``: held while a profile is timed, so the daemon's requests wait."""
        self.manager = manager
        self.config = config
        self.events = events
        self.dispatcher = dispatcher
        self.hold_devices = hold_devices
        self.rows: list[dict[str, Any]] | None = None
        self.pick: str | None = None
        self.met: bool | None = None
        self.source: str | None = None       # "measured" or "cache"
        self.state = "off"
        self.reason: str | None = None
        self.last_repick: dict[str, Any] | None = None
        # set by cancel() (the daemon is stopping): the measurement stops at its next step
        self.cancelled = False
        self._lock = threading.Lock()

    @property
    def slo_ms(self) -> float | None:
        return self.config().dvfs.slo_ms

    # ---- measuring --------------------------------------------------------------------------
    def cache_path(self, model: str, key: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in model)[:64]
        return self.config().state_dir / "slo" / f"{safe}-{key}.json"

    def _key(self, path: Path, names: list[str]) -> str:
        from edgepilot.dispatch.planning.cache import cache_key
        from edgepilot.dispatch.targets import board_id, runtime_versions
        from edgepilot.formats.files import sha256_of

        manager = self.manager
        profiles = manager.profiles()
        return cache_key({
            "what": "slo-measurements", "board": board_id(manager.board),
            "model_sha256": sha256_of(path),
            "runtimes": runtime_versions(self.dispatcher.backends),
            "edgepilot": __version__, "runs": RUNS, "budget_s": BUDGET_S,
            "profiles": {n: profiles[n].as_dict() for n in names}})

    def measure_or_load(self) -> list[dict[str, Any]]:
        """Blocking: the cached measurements of this board/model/runtimes, else measured now
        (every valid profile in turn, the board restored after each) and cached."""
        from edgepilot.dispatch.planning.cache import read_keyed, write_atomic
        from edgepilot.dvfs.sweep import measure_profiles

        config = self.config()
        model = config.dvfs.slo_model
        path = check_model(self.dispatcher, config)
        assert model is not None and path is not None
        manager = self.manager
        names = [p["name"] for p in manager.list() if p.get("valid")]
        if not names:
            raise ConfigError("[dvfs] slo_ms: no DVFS profile is valid on this board (see "
                              "`edgepilot profile list`)", field="dvfs.slo_ms")
        key = self._key(path, names)
        cached = read_keyed(self.cache_path(model, key), key, FORMAT, "SLO measurements")
        if cached is not None and isinstance(cached.get("rows"), list):
            self.source = "cache"
            return list(cached["rows"])
        rows = measure_profiles(
            config, manager.board, manager, model, names, RUNS, BUDGET_S, None,
            backends=self.dispatcher.backends, reason="slo-measure",
            progress=self._progress,
            hold=self.hold_devices, catalog=self.dispatcher.catalog,
            each=self._each_profile)
        if self.cancelled:  # rows cut short by the stop must not be cached as measurements
            raise PlanError("SLO measurement cancelled: the daemon is stopping")
        if any(r["ok"] for r in rows):
            write_atomic(self.cache_path(model, key),
                         {"format": FORMAT, "key": key, "model": model, "rows": rows,
                          "measured_at": round(time.time(), 3)})
        self.source = "measured"
        return rows

    @contextlib.contextmanager
    def _each_profile(self) -> Iterator[None]:
        """Around one profile's apply, measurement and restore: the DVFS lock (no thermal or
        power-cap move in between); a cancelled measurement goes no further."""
        self._progress(0, 0, "")
        with self.manager.lock:
            yield

    def _progress(self, done: int, total: int, what: str) -> None:
        if self.cancelled:
            raise PlanError("SLO measurement cancelled: the daemon is stopping")

    def cancel(self) -> None:
        """Stop a measurement under way at its next step (nothing is cached or applied)."""
        self.cancelled = True

    # ---- picking ----------------------------------------------------------------------------
    def choose(self, rows: list[dict[str, Any]]) -> tuple[str, bool, str | None]:
        """(profile, whether it meets the SLO, why the plain pick was not possible): the SLO
        pick; without energies the slowest profile meeting it; else the fastest."""
        slo = self.slo_ms
        assert slo is not None
        pick = slo_pick(rows, slo)
        if pick.profile is not None:
            return pick.profile, True, None
        timed = [r for r in rows if r.get("ok") and r.get("p95_ms") is not None]
        meeting = [r for r in timed if r["p95_ms"] <= slo]
        if meeting:  # no power sensor: the slowest that meets it runs the lowest clocks
            slowest = max(meeting, key=lambda r: (r["p95_ms"], r["profile"]))
            return slowest["profile"], True, (f"{pick.reason}; applied the slowest profile "
                                              "that meets it")
        if not timed:
            raise ConfigError(f"[dvfs] slo_model: no profile could be measured: "
                              f"{'; '.join(r.get('reason', '?') for r in rows)}",
                              field="dvfs.slo_model")
        fastest = min(timed, key=lambda r: (r["p95_ms"], r["profile"]))
        return fastest["profile"], False, pick.reason

    def pick_and_apply(self) -> dict[str, Any]:
        """Blocking: measure or load, pick, apply (reason ``slo``); returns the ``slo.pick``
        event's fields."""
        self.state = "measuring"
        rows = self.measure_or_load()
        name, met, why = self.choose(rows)
        row = next(r for r in rows if r["profile"] == name)
        self.manager.apply(name, reason="slo")
        with self._lock:
            self.rows, self.pick, self.met, self.reason = rows, name, met, why
            self.state = "picked"
        fields = {"profile": name, "met": met, "slo_ms": self.slo_ms,
                  "model": self.config().dvfs.slo_model, "p95_ms": row.get("p95_ms"),
                  "p50_ms": row.get("median_ms"), "power_w": row.get("power_w"),
                  "energy_mj_per_inference": row.get("energy_mj_per_inference"),
                  "source": self.source, "cause": "start"}
        if why is not None:
            fields["reason"] = why if met else f"{why}; applied the fastest as the best effort"
        self.events.emit("slo.pick", **fields)
        return fields

    def choose_fallback(self, hot: str, configured: str | None, taken: list[str]) -> str | None:
        """The guard's question after ``hot`` ran too hot (called under the DVFS lock): the
        profile to apply instead of ``configured``, or None to keep the configured one."""
        slo = self.slo_ms
        with self._lock:
            rows = self.rows
        if slo is None or rows is None:
            return None
        hot_row = next((r for r in rows if r["profile"] == hot and r.get("ok")), None)
        if hot_row is None or hot_row.get("power_w") is None:
            return None   # not a profile we measured: its own fallback applies
        pick = slo_pick(rows, slo, exclude={hot, *taken}, below_power_w=hot_row["power_w"])
        fields: dict[str, Any] = {"hot": hot, "configured_fallback": configured,
                                  "slo_ms": slo, "cause": "thermal"}
        if pick.profile is None:
            fields.update(profile=None, reason=f"{pick.reason}; the configured fallback "
                          f"{configured or '(none)'} stands")
        else:
            row = next(r for r in rows if r["profile"] == pick.profile)
            fields.update(profile=pick.profile, met=True, p95_ms=row.get("p95_ms"),
                          power_w=row.get("power_w"),
                          energy_mj_per_inference=row.get("energy_mj_per_inference"))
        with self._lock:
            self.last_repick = dict(fields)
        self.events.emit("slo.pick", **fields)
        return pick.profile

    def fail(self, message: str) -> None:
        with self._lock:
            self.state, self.reason = "failed", message

    def forget(self) -> None:
        """The SLO was removed from the config: no pick, no re-picks."""
        with self._lock:
            self.rows = self.pick = self.met = self.reason = self.source = None
            self.last_repick = None
            self.state = "off"

    # ---- reporting ------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Plain data for ``status`` and ``GET /v1/profile`` (``slo``)."""
        cfg = self.config().dvfs
        with self._lock:
            return {"slo_ms": cfg.slo_ms, "model": cfg.slo_model, "state": self.state,
                    "pick": self.pick, "met": self.met, "reason": self.reason,
                    "source": self.source, "last_repick": self.last_repick,
                    "measurements": [
                        {k: r.get(k) for k in ("profile", "ok", "median_ms", "p95_ms",
                                               "power_w", "energy_mj_per_inference", "reason")}
                        for r in self.rows or []]}
