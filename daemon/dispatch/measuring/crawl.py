"""Targets too slow to time on the whole model: once a target has crawled through its first
layers, the rest of its cells are a one-line reason instead of minutes of runs."""

from __future__ import annotations

from collections.abc import Mapping

# a target this many times slower than a layer's fastest on each of the first CRAWL_LAYERS
# layers it ran, those runs together over CRAWL_MS (or on one layer, over CRAWL_MS a call), is
# timed on no further layer nor as a whole model: Arm NN's reference kernels take over a
# second a layer (65 of DeepLabV3's 75 s of planning). Both conditions, so a target whose
# per-call cost swamps small layers but not big ones (an NPU delegate) is still timed on the
# big ones. (``bench.py`` has a crawl rule of its own, against the plan's whole time: a bench
# times variants, planning times layers.)
CRAWL_FACTOR = 9.0  # measure.py's COLD_FACTOR x EARLY_FACTOR: where a cell's first run ends it
CRAWL_LAYERS = 3
CRAWL_MS = 2000.0


class Crawlers:
    """Which targets are too slow to be worth timing on the rest of the model (see
    :data:`CRAWL_FACTOR`); a target faster than that on any layer is never one."""

    def __init__(self, keep: str) -> None:
        self.keep = keep  # the reference: every layer's reference value comes from it
        self.slow: dict[str, list[float]] = {}
        self.fine: set[str] = set()

    def saw(self, row: Mapping[str, float | None]) -> None:
        """A layer's ms by target, every target measured (None: it did not run)."""
        timed = [ms for ms in row.values() if ms is not None]
        if not timed:
            return
        best = min(timed)
        for target, ms in row.items():
            if ms is None or target in self.fine or target == self.keep:
                continue
            if ms > CRAWL_FACTOR * best:
                self.slow.setdefault(target, []).append(ms)
            else:
                self.fine.add(target)

    def reason(self, target: str) -> str:
        """Why ``target`` is no longer timed ("" while it is)."""
        slow = self.slow.get(target, [])
        if target in self.fine or not slow:
            return ""
        if max(slow) >= CRAWL_MS:
            # one layer a call of seconds is evidence enough: a 32 KB face detector's 1280x960
            # input held Arm NN's reference kernels 2.9-4.1 s a layer, and three layers of
            # two of its precisions were 21 s of a 44 s plan
            return (f"not timed: over {CRAWL_FACTOR:.0f}x the fastest target, "
                    f"{max(slow) / 1e3:.1f} s a call on a layer it ran first")
        if len(slow) < CRAWL_LAYERS or sum(slow) < CRAWL_MS:
            return ""
        return (f"not timed: over {CRAWL_FACTOR:.0f}x the fastest target on each of the "
                f"{len(slow)} layers it ran first ({sum(slow) / 1e3:.1f} s for those)")
