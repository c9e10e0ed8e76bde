"""Plans survive restarts: profiles cached in the state dir, keyed by what they depend on.

The key hashes the model file's sha256, the board, the DVFS profile, every runtime's version,
the candidate targets and the planning knobs (tolerance, metric, runs). Any change - a new model
file, an upgraded onnxruntime, another board - is a different key, so a stale profile is never
reused; files are written atomically (temp file + rename).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FORMAT = 1


def cache_key(parts: dict[str, Any]) -> str:
    blob = json.dumps({"format": FORMAT, **parts}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


class PlanCache:
    """JSON documents under ``<state_dir>/plans/<model>-<key>.json``."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def path(self, model: str, key: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in model)[:64]
        return self.directory / f"{safe}-{key}.json"

    def load(self, model: str, key: str) -> dict[str, Any] | None:
        path = self.path(model, key)
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable plan cache %s: %s", path, exc)
            return None
        if data.get("key") != key or data.get("format") != FORMAT:
            return None
        return data

    def store(self, model: str, key: str, data: dict[str, Any]) -> Path:
        path = self.path(model, key)
        self.directory.mkdir(parents=True, exist_ok=True)
        doc = {"format": FORMAT, "key": key, **data}
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
        tmp.replace(path)
        return path
