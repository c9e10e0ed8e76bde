"""One loop shape for the DVFS policies that act on telemetry: each new sample, once.

The thermal guard and the power cap read the telemetry sampler's samples (one sampler on the
board: theirs) rather than the board itself; this hands every new sample (a new ``ts``) to a
blocking decision in a worker thread until the service stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from edgepilot.blocking import RunBlocking
from edgepilot.telemetry.sampler import TelemetrySampler

log = logging.getLogger(__name__)


async def each_sample(sampler: TelemetrySampler | None, period_s: Callable[[], float],
                      run_blocking: RunBlocking, stopping: asyncio.Event,
                      decide: Callable[[dict[str, Any]], object], what: str,
                      on_sampler: Callable[[bool], None] | None = None) -> None:
    """Call ``decide(sample)`` off the loop for each new telemetry sample until ``stopping``.

    ``period_s()`` is how often to look (the sampler's interval, re-read: SIGHUP may change
    it). ``on_sampler(running)`` says on every period whether there is a sampler; ``decide``
    must outlive one bad sample (an exception is logged as ``what`` failing and the loop goes
    on).
    """
    last_ts: object = None
    while not stopping.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), period_s())
        if stopping.is_set():
            return
        if on_sampler is not None:
            on_sampler(sampler is not None)
        if sampler is None:
            continue
        sample = sampler.latest()
        ts = sample.get("ts")
        if ts is None or ts == last_ts:
            continue
        last_ts = ts
        try:
            await run_blocking(decide, sample)
        except RuntimeError:  # the executor is shutting down with the daemon
            return
        except Exception:
            log.exception("%s failed; continuing", what)
