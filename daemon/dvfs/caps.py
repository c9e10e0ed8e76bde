"""Caps on max frequencies, laid over whatever the active profile (or the board) sets.

The power cap (:mod:`edgepilot.dvfs.powercap`) lowers a device's max frequency below what the
profile asked for; a profile applied later (a thermal fallback, an SLO pick, an operator) must
not lift it, and lifting the cap must give back exactly what the profile asked for. So for every
capped device this remembers the limits it would have *without* the cap (``uncapped``: what
was there when the cap came, or what a profile or tool wrote since) and keeps
``max = min(uncapped max, cap)`` and ``min = min(uncapped min, that max)`` (a profile that pins
min = max is capped as a pin at the cap).

Only the ProfileManager calls this, inside its transactions (journal first, so stop and a crash
restore the board as found); restore forgets every cap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgepilot.board import Board
from edgepilot.dvfs.write_plan import limit_order

Limits = tuple[int | None, int | None]   # (min, max) in the device's unit (kHz or Hz)


def limit_files(directory: Path) -> tuple[str, str, str]:
    """(min file, max file, unit) of a cpufreq policy or devfreq device directory."""
    if (directory / "scaling_max_freq").exists():
        return "scaling_min_freq", "scaling_max_freq", "kHz"
    return "min_freq", "max_freq", "Hz"


class LimitCaps:
    """The caps in force on one board (keys: device directories relative to the root)."""

    def __init__(self, board: Board) -> None:
        self.board = board
        self.caps: dict[str, int] = {}
        self._uncapped: dict[str, Limits] = {}
        self._written: dict[str, Limits] = {}

    def _read(self, directory: Path) -> Limits:
        lo, hi, _ = limit_files(directory)
        return self.board.fs.read_int(directory / lo), self.board.fs.read_int(directory / hi)

    def _write(self, directory: Path, new_min: int | None, new_max: int | None
               ) -> list[dict[str, str]]:
        lo, hi, _ = limit_files(directory)
        cur_min, cur_max = self._read(directory)
        written = []
        for which in limit_order(cur_min, cur_max, new_min, new_max):
            name, value = (lo, new_min) if which == "min" else (hi, new_max)
            if value is None or value == (cur_min if which == "min" else cur_max):
                continue
            self.board.write_value(directory / name, f"{value}\n")
            written.append({"path": self.board.fs.rel(directory / name), "value": str(value)})
        return written

    def _impose(self, rel: str, directory: Path) -> list[dict[str, str]]:
        cap = self.caps[rel]
        umin, umax = self._uncapped[rel]
        new_max = cap if umax is None else min(umax, cap)
        new_min = None if umin is None else min(umin, new_max)
        written = self._write(directory, new_min, new_max)
        self._written[rel] = self._read(directory)
        return written

    def set(self, directory: Path, cap: int | None) -> list[dict[str, str]]:
        """Cap ``directory``'s max frequency at ``cap`` (None: lift the cap, putting back the
        uncapped limits). Blocking sysfs writes; raises BoardError on a refused write."""
        rel = self.board.fs.rel(directory)
        kept = self.memento()
        try:
            if cap is None:
                if rel not in self.caps:
                    return []
                umin, umax = self._uncapped[rel]
                del self.caps[rel], self._uncapped[rel], self._written[rel]
                return self._write(directory, umin, umax)
            self._uncapped.setdefault(rel, self._read(directory))
            self.caps[rel] = cap
            return self._impose(rel, directory)
        except Exception:
            # the caller puts the files back; the caps go back to what they were with them
            self.put_back(kept)
            raise

    def memento(self) -> tuple[dict[str, Any], ...]:
        """A copy of the caps' state, for :meth:`put_back` when a transaction is rolled back."""
        return dict(self.caps), dict(self._uncapped), dict(self._written)

    def put_back(self, memento: tuple[dict[str, Any], ...]) -> None:
        """The state :meth:`memento` copied (the board's files are the caller's to put back)."""
        self.caps, self._uncapped, self._written = (dict(m) for m in memento)

    def enforce(self) -> list[dict[str, str]]:
        """After a profile was written: what it (or a vendor tool) set on a capped device is the
        new uncapped value, and the cap goes back on top."""
        written: list[dict[str, str]] = []
        for rel in list(self.caps):
            directory = self.board.fs.path(rel)
            now = self._read(directory)
            if now != self._written.get(rel):
                self._uncapped[rel] = now
            written += self._impose(rel, directory)
        return written

    def uncapped_max(self, directory: Path) -> int | None:
        """The max a capped device would have without its cap (None when it is not capped)."""
        limits = self._uncapped.get(self.board.fs.rel(directory))
        return limits[1] if limits is not None else None

    def clear(self) -> None:
        """Forget every cap (the board was restored as found)."""
        self.caps.clear()
        self._uncapped.clear()
        self._written.clear()

    def state(self) -> dict[str, Any]:
        """Per capped device: the cap, the max it would have without it, and the unit."""
        out = {}
        for rel, cap in sorted(self.caps.items()):
            directory = self.board.fs.path(rel)
            out[directory.name] = {"path": rel, "cap": cap, "uncapped_max":
                                   self._uncapped[rel][1], "unit": limit_files(directory)[2]}
        return out
