"""What the MQTT spool (written by ``outbox``) and the telemetry sequence file in the state dir
hold, for ``doctor``: a read-only report, never a writer.

Pure file reads (no broker, no paho): safe to call while the daemon runs, since both files are
replaced atomically.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
from pathlib import Path
from typing import Any

from edgepilot.telemetry.seq import LAST_SEQ_FILE, SEQ_FILE

SPOOL_FILE = "mqtt-spool.jsonl"


def spool_info(state_dir: Path) -> dict[str, Any]:
    """Describe ``<state_dir>/mqtt-spool.jsonl`` and ``<state_dir>/telemetry.seq``.

    Keys: ``spool_path``, ``spool_exists``, ``size_bytes``, ``messages`` (readable lines),
    ``telemetry_messages`` (those whose payload carries a ``seq``), ``unreadable_lines``,
    ``first_seq``/``last_seq`` (of the spooled telemetry, None when there is none),
    ``seq_path``, ``seq_recorded`` (the number in the seq file: the exact last seq after a clean
    stop, an upper bound reserved in blocks while a daemon runs or after a crash; None when
    absent or unreadable), ``seq_published`` (the last seq telemetry handed out, from
    ``telemetry.seq.last``; None when absent) and ``errors`` (why a file could not be read;
    empty when all were fine).
    """
    state_dir = Path(state_dir)
    spool, seq_path = state_dir / SPOOL_FILE, state_dir / SEQ_FILE
    info: dict[str, Any] = {
        "spool_path": str(spool), "spool_exists": spool.is_file(), "size_bytes": 0,
        "messages": 0, "telemetry_messages": 0, "unreadable_lines": 0,
        "first_seq": None, "last_seq": None,
        "seq_path": str(seq_path), "seq_recorded": None, "seq_published": None,
        "errors": []}
    if info["spool_exists"]:
        try:
            info["size_bytes"] = spool.stat().st_size
            with open(spool, encoding="ascii") as fh:
                for line in fh:
                    _count_line(info, line)
        except (OSError, UnicodeDecodeError) as exc:
            info["errors"].append(f"cannot read {spool}: {exc}")
    try:
        info["seq_recorded"] = int(seq_path.read_text(encoding="ascii").strip())
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        info["errors"].append(f"cannot read {seq_path}: {exc}")
    # absent (no telemetry yet, an older daemon) or torn: seq_recorded still says
    with contextlib.suppress(OSError, UnicodeDecodeError, ValueError):
        info["seq_published"] = int((state_dir / LAST_SEQ_FILE).read_text(encoding="ascii"))
    return info


def _count_line(info: dict[str, Any], line: str) -> None:
    try:
        payload = base64.b64decode(json.loads(line)["payload"], validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error):
        info["unreadable_lines"] += 1  # e.g. a torn last line after a crash
        return
    info["messages"] += 1
    try:
        seq = json.loads(payload).get("seq")
    except (ValueError, AttributeError):
        return  # not a JSON object: an event or foreign payload, not telemetry
    if isinstance(seq, int) and not isinstance(seq, bool):
        info["telemetry_messages"] += 1
        if info["first_seq"] is None:
            info["first_seq"] = seq
        info["last_seq"] = seq
