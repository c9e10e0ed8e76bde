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

from edgepilot.dispatch.planning.shared import PlanExchange

log = logging.getLogger(__name__)

FORMAT = 1


def cache_key(parts: dict[str, Any]) -> str:
    blob = json.dumps({"format": FORMAT, **parts}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


class PlanCache:
    """JSON documents under ``<state_dir>/plans/<model>-<key>.json``; ``shared``: where plans
    of identical boards are looked up on a miss, and where measured ones are published."""

    def __init__(self, directory: Path, shared: PlanExchange | None = None) -> None:
        self.directory = Path(directory)
        self.shared = shared

    def path(self, model: str, key: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in model)[:64]
        return self.directory / f"{safe}-{key}.json"

    def _files(self, model: str) -> list[Path]:
        prefix = self.path(model, "").name.removesuffix(".json")  # "<model>-"
        try:
            return [p for p in self.directory.iterdir()
                    if p.name.startswith(prefix) and p.suffix == ".json"]
        except OSError:
            return []

    def has(self, model: str) -> bool:
        """Whether any plan of ``model`` is cached (no key needed: computing one may mean
        hashing a large model file, which a model that was never planned should not pay)."""
        return bool(self._files(model))

    def documents(self, model: str) -> list[dict[str, Any]]:
        """Every readable cached document of ``model``, whatever its key."""
        docs = []
        for path in self._files(model):
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict):
                docs.append(doc)
        return docs

    def load(self, model: str, key: str) -> dict[str, Any] | None:
        return read_keyed(self.path(model, key), key, FORMAT, "plan cache")

    def store(self, model: str, key: str, data: dict[str, Any]) -> Path:
        path = self.path(model, key)
        write_atomic(path, {"format": FORMAT, "key": key, **data})
        return path


def read_keyed(path: Path, key: str, fmt: int, what: str) -> dict[str, Any] | None:
    """A cached JSON document when it exists, parses and carries this ``key`` and ``fmt``;
    anything else is a miss (an unreadable file is logged, never fatal: it is re-measured)."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s %s: %s", what, path, exc)
        return None
    if not isinstance(data, dict) or data.get("key") != key or data.get("format") != fmt:
        return None
    return data


def write_atomic(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` so that a reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
    tmp.replace(path)
