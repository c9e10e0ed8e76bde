"""A :class:`~edgepilot.top.snapshot.Snapshot` as titled tables of strings.

Both renderers (plain text for ``--once``, the Textual app) draw these same tables, so what a
script reads and what an operator sees cannot drift apart. Unknown values are ``-`` (a board
without a power sensor shows ``-`` for watts and joules, never 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgepilot.top.snapshot import Snapshot

NA = "-"


@dataclass
class Table:
    """One panel: ``key`` (stable id for widgets), title, column names, rows, a note."""

    key: str
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def fmt(value: Any, digits: int = 2, scale: float = 1.0) -> str:
    """A number with ``digits`` decimals (scaled), or ``-`` when there is none."""
    num = _num(value)
    return NA if num is None else f"{num * scale:.{digits}f}"


def fmt_energy(joules: Any) -> str:
    """Joules in a width that stays readable from microjoules to megajoules."""
    j = _num(joules)
    if j is None:
        return NA
    if j == 0:
        return "0"
    if abs(j) < 1e-3:
        return f"{j * 1e6:.1f}u"
    if abs(j) < 1:
        return f"{j * 1e3:.2f}m"
    return f"{j:.3f}" if abs(j) < 1000 else f"{j:.0f}"


def fmt_duration(seconds: Any) -> str:
    s = _num(seconds)
    if s is None:
        return NA
    s_int = int(s)
    d, rem = divmod(s_int, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    if d:
        return f"{d}d{h:02d}h"
    if h:
        return f"{h}h{m:02d}m"
    return f"{m}m{sec:02d}s" if m else f"{sec}s"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# ---- one line each ---------------------------------------------------------------------------
def header(snap: Snapshot) -> str:
    """Who answered: version, address, board, uptime, readiness."""
    st = snap.status
    board = _mapping(st.get("board"))
    name = board.get("family") or "?"
    if board.get("model"):
        name += f" ({board['model']})"
    ready = "ready" if st.get("ready") else "not ready: " + ", ".join(
        f"{k}: {v}" for k, v in _mapping(st.get("not_ready")).items())
    return (f"edgepilot {st.get('version', '?')} at {snap.url} | board {name} | "
            f"up {fmt_duration(st.get('uptime_s'))} | {ready}")


def profile_line(snap: Snapshot) -> str:
    """The applied DVFS profile, the thermal guard, and a power cap when the daemon has one."""
    prof = snap.profile
    dvfs = _mapping(snap.status.get("dvfs"))
    active = prof.get("active", dvfs.get("active", snap.telemetry.get("profile")))
    parts = [f"profile {active or 'none (board as found)'}"]
    thermal = _mapping(prof.get("thermal") or dvfs.get("thermal"))
    fallbacks = thermal.get("fallbacks") or []
    if fallbacks:
        parts.append(f"thermal fallback {' > '.join(map(str, fallbacks))} "
                     f"(base {thermal.get('base')})")
    limits = _mapping(thermal.get("limits"))
    if _num(limits.get("max_c")) is not None:
        zones = ",".join(limits.get("zones") or []) or "all zones"
        parts.append(f"limit {fmt(limits['max_c'], 1)} C on {zones}")
    cap = power_cap_text(snap)
    if cap:
        parts.append(cap)
    if "/v1/profile" in snap.errors:
        parts.append(f"(profile status: {snap.errors['/v1/profile']})")
    return " | ".join(parts)


def power_cap_text(snap: Snapshot) -> str:
    """``[dvfs] power_cap_w`` at work: the cap, its state, the clocks stepped down and the last
    step (empty when no cap is configured)."""
    cap = _mapping(snap.telemetry.get("power_cap") or snap.profile.get("power_cap"))
    if not cap or cap.get("state") in (None, "off"):
        return ""
    steps = [s for s in cap.get("steps") or [] if isinstance(s, Mapping)]
    text = f"power cap {fmt(cap.get('cap_w'), 1)} W: {cap.get('state')}"
    if steps:
        down = ", ".join(f"{s.get('device')} {s.get('before')}->{s.get('after')} "
                         f"{s.get('unit', '')}".rstrip() for s in steps)
        text += f", {len(steps)} step{'s' if len(steps) != 1 else ''} down ({down})"
    if cap.get("paused"):
        text += f", paused: {cap['paused']}"
    return text


def mqtt_line(snap: Snapshot) -> str:
    """Connected or not (and why), what waits in the buffer, what was dropped."""
    tel = snap.telemetry
    mqtt = _mapping(snap.config.get("mqtt"))
    if mqtt.get("enabled") is False:
        return "MQTT disabled ([mqtt] enabled = false)"
    if "mqtt_connected" not in tel:
        return "MQTT not running"
    where = f"{mqtt.get('host', '?')}:{mqtt.get('port', '?')}" if mqtt else ""
    state = "connected" if tel.get("mqtt_connected") else "disconnected"
    line = f"MQTT {state} {where}".rstrip()
    line += f" | buffered {tel.get('buffered', NA)} | dropped {tel.get('dropped', NA)}"
    line += f" | seq {tel.get('seq', NA)}"
    if tel.get("mqtt_error"):
        line += f" | {tel['mqtt_error']}"
    return line


# ---- tables ----------------------------------------------------------------------------------
def power(snap: Snapshot) -> Table:
    """Watts per rail and the board total; energy since the daemon started."""
    tel = snap.telemetry
    t = Table("power", "Power", ["rail", "W"])
    for rail, watts in sorted(_mapping(tel.get("rails_w")).items()):
        t.rows.append([str(rail), fmt(watts, 3)])
    t.rows.append(["total", fmt(tel.get("power_w"), 3)])
    if _num(tel.get("power_w")) is None:
        t.note = "no power sensor: power and energy unknown"
    else:
        t.note = (f"energy {fmt_energy(tel.get('energy_j'))} J since start, from "
                  f"{tel.get('power_source') or '?'}")
    return t


def thermal(snap: Snapshot) -> Table:
    """Temperature per zone with the kernel's trip points and the daemon's own limits."""
    tel = snap.telemetry
    trips = _mapping(tel.get("trips_c"))
    warn = _num(_mapping(snap.config.get("telemetry")).get("thermal_warn_c"))
    thermal_state = _mapping(snap.profile.get("thermal")
                             or _mapping(snap.status.get("dvfs")).get("thermal"))
    limits = _mapping(thermal_state.get("limits"))
    max_c = _num(limits.get("max_c"))
    zones = set(limits.get("zones") or [])
    t = Table("thermal", "Thermal", ["zone", "C", "trip points", "profile max"])
    for zone, temp in sorted(_mapping(tel.get("temps_c")).items()):
        trip = ", ".join(f"{tp.get('type', '?')} {fmt(tp.get('temp_c'), 1)}"
                         for tp in trips.get(zone, []) if isinstance(tp, Mapping))
        checked = max_c is not None and (not zones or zone.split("@")[0] in zones)
        t.rows.append([str(zone), fmt(temp, 1), trip or NA, fmt(max_c, 1) if checked else NA])
    if not t.rows:
        t.note = "no readable thermal zone"
    elif warn is not None:
        t.note = f"thermal event at {fmt(warn, 1)} C ([telemetry] thermal_warn_c)"
    return t


def clocks(snap: Snapshot) -> Table:
    """Per cpufreq policy and devfreq device: governor, current and min-max MHz."""
    tel = snap.telemetry
    t = Table("clocks", "Clocks", ["domain", "kind", "governor", "MHz", "min-max MHz"])
    for name, pol in _mapping(tel.get("cpu")).items():
        pol = _mapping(pol)
        cpus = pol.get("cpus") or []
        kind = f"cpu {cpus[0]}-{cpus[-1]}" if cpus else "cpu"
        t.rows.append([str(name), kind, str(pol.get("governor") or NA),
                       fmt(pol.get("cur_khz"), 0, 1e-3),
                       f"{fmt(pol.get('min_khz'), 0, 1e-3)}-{fmt(pol.get('max_khz'), 0, 1e-3)}"])
    for name, dev in _mapping(tel.get("devfreq")).items():
        dev = _mapping(dev)
        t.rows.append([str(name), str(dev.get("kind") or "devfreq"),
                       str(dev.get("governor") or NA), fmt(dev.get("cur_hz"), 0, 1e-6),
                       f"{fmt(dev.get('min_hz'), 0, 1e-6)}-{fmt(dev.get('max_hz'), 0, 1e-6)}"])
    if not t.rows:
        t.note = "no cpufreq policy or devfreq device readable"
    return t


def plan_text(segments: Any) -> str:
    """``target[first:end]`` per segment, in order (layers as the plan numbers them)."""
    out = []
    for seg in segments if isinstance(segments, list) else []:
        layers = seg.get("layers") or [None, None]
        out.append(f"{seg.get('target', '?')}[{layers[0]}:{layers[1]}]")
    return " > ".join(out) or NA


def _plans_by_model(snap: Snapshot) -> dict[str, str]:
    plans = snap.plans
    out: dict[str, str] = {}
    for p in plans.get("plans", []) if isinstance(plans.get("plans"), list) else []:
        # the listing is least recently used first: the last plan of a model is its current
        out[str(p.get("model"))] = plan_text(p.get("segments"))
    for p in plans.get("planning", []) if isinstance(plans.get("planning"), list) else []:
        model = str(p.get("model"))
        total = _num(p.get("total"))
        progress = f" {p.get('done')}/{int(total)}" if total else ""
        out.setdefault(model, f"planning{progress}")
    for p in plans.get("failed", []) if isinstance(plans.get("failed"), list) else []:
        out.setdefault(str(p.get("model")), f"no plan: {p.get('reason')}")
    return out


def models(snap: Snapshot) -> Table:
    """Per model: requests/s, tokens/s, p50/p99 latency and energy over the telemetry window
    (the publish period), energy attributed since start, and its plan."""
    tel_models = _mapping(snap.telemetry.get("models"))
    listed = {str(m.get("id")): m for m in snap.models}
    plans = _plans_by_model(snap)
    t = Table("models", "Models", ["model", "kind", "loaded", "req/s", "tok/s", "p50 ms",
                                   "p99 ms", "J/inf", "J/tok", "J total", "plan"])
    for name in sorted(set(listed) | set(tel_models)):
        m = _mapping(tel_models.get(name))
        info = listed.get(name, {})
        loaded = info.get("loaded")
        served = m.get("plan")
        plan = plans.get(name) or (str(served) if served else NA)
        t.rows.append([
            name, str(info.get("kind") or NA),
            NA if loaded is None else ("yes" if loaded else "no"),
            fmt(m.get("inferences_per_s"), 2),
            fmt(m.get("tokens_per_s"), 1) if m.get("tokens_total") else NA,
            fmt(m.get("latency_p50_ms"), 2), fmt(m.get("latency_p99_ms"), 2),
            fmt_energy(m.get("energy_per_inference_j")), fmt_energy(m.get("energy_per_token_j")),
            fmt_energy(m.get("energy_total_j")), plan])
    window = _num(_mapping(snap.config.get("telemetry")).get("publish_interval_s"))
    t.note = (f"rates, latency and J/inf over the last {fmt(window, 0)} s; J total since start; "
              "m = milli, u = micro; board energy shared by busy time, see README"
              ) if window else ""
    if not t.rows:
        t.note = "no models configured or found in the model dir"
    return t


def tables(snap: Snapshot) -> list[Table]:
    """Every panel, in the order ``--once`` prints them."""
    return [power(snap), thermal(snap), clocks(snap), models(snap)]


def errors_line(snap: Snapshot) -> str:
    """Routes that failed on a reachable daemon (empty when none did)."""
    return "; ".join(f"{route}: {why}" for route, why in sorted(snap.errors.items()))
