"""What `fleet ls`, `fleet run` and `fleet top` print: rows from statuses, replies, telemetry."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from edgepilot.fleet.client import Device, RunResult


def device_row(dev: Device, now: float | None = None) -> dict[str, Any]:
    """One device as `fleet ls --json` lists it."""
    s = dev.status
    board = s.get("board") or {}
    ts = s.get("ts")
    return {"device_id": dev.device_id, "state": s.get("state"),
            "health": "online" if dev.online else f"offline ({s.get('reason') or 'last will'})",
            "board": board.get("model") or board.get("family"), "family": board.get("family"),
            "profile": s.get("profile"), "models": list(s.get("models") or []),
            "power_w": s.get("power_w"), "groups": dev.groups,
            "ready": s.get("ready"), "version": s.get("version"),
            "fingerprint": (s.get("fleet") or {}).get("fingerprint"),
            "last_seen": ts, "age_s": round((now or time.time()) - ts, 1)
            if isinstance(ts, (int, float)) else None}


def table(headers: list[str], rows: Iterable[list[Any]]) -> str:
    """Plain columns, each as wide as its widest cell."""
    text = [[("-" if c is None or c == "" else str(c)) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in text)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in text]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def render_ls(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no devices: no retained status under this prefix\n"
    return table(["device", "health", "board", "profile", "power", "models", "groups", "seen"],
                 ([r["device_id"], r["health"], r["board"], r["profile"],
                   None if r["power_w"] is None else f"{r['power_w']:.2f} W",
                   ",".join(r["models"]), ",".join(r["groups"]),
                   None if r["age_s"] is None else f"{r['age_s']:.0f}s ago"] for r in rows))


def render_run(result: RunResult) -> str:
    rows: list[list[Any]] = []
    for dev in sorted(result.asked):
        body = result.replies.get(dev)
        if body is None:
            rows.append([dev, "NO ANSWER", None, None])
            continue
        if body.get("ok"):
            what = _short(body.get("result"))
        else:
            err = body.get("error") or {}
            what = f"{err.get('code')}: {err.get('message')}"
        rows.append([dev, "ok" if body.get("ok") else "error", result.elapsed_s.get(dev), what])
    out = table(["device", "result", "seconds", "answer"], rows)
    if result.missing:
        out += f"not answering: {', '.join(result.missing)}\n"
    return out


def _short(value: Any, limit: int = 80) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
