"""Plans made in the background while requests are served whole: their tasks, progress and
failures, per (model, input-shape signature).

Profiling takes seconds to minutes and must never stall a request, so the dispatcher hands it
to an asyncio task here. At most one plan per model is in the making at a time: a model whose
requests come in many shapes (text lines of every width) would otherwise queue a profiling run
per shape; a shape that keeps coming is planned once the current one is done. And one plan
is timed at a time, daemon-wide, the others queued: fourteen models planning at once took
every inference thread (requests waited 4-16 s) and each one's timings were the others' load,
unseen by the contention meter, which counts this process's work as its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from edgepilot.dispatch.measuring.measure import Progress
from edgepilot.errors import EdgepilotError

log = logging.getLogger(__name__)

Key = tuple[str, str]   # (model, signature)


class BackgroundPlans:
    """Background planning state; all methods run on the event loop except ``reporter``'s
    callbacks, which profiling calls from a worker thread (plain dict writes)."""

    def __init__(self) -> None:
        self.tasks: dict[Key, asyncio.Task[None]] = {}
        self.failures: dict[Key, str] = {}
        # (model, signature) -> (done, total, what) of its latest profiling step
        self.progress: dict[Key, tuple[int, int, str]] = {}
        self._one = asyncio.Lock()  # held by the plan being made

    def reporter(self, key: Key, then: Progress) -> Progress:
        """A progress callback recording ``key``'s progress, then passing it on."""
        def report(done: int, total: int, what: str) -> None:
            self.progress[key] = (done, total, what)
            then(done, total, what)

        return report

    def busy(self, name: str) -> bool:
        return any(k[0] == name for k in self.tasks)

    def in_making(self, name: str) -> list[Key]:
        return [k for k in self.tasks if k[0] == name]

    def start(self, key: Key, work: Callable[[], Awaitable[Any]]) -> None:
        """Run ``work`` as the plan of ``key``; a failure is kept (and logged once) so that
        requests go on whole until an operator asks for a replan."""
        self.progress[key] = (0, 0, "starting")
        self.tasks[key] = asyncio.get_running_loop().create_task(
            self._run(key, work), name=f"plan-{key[0]}")

    async def _run(self, key: Key, work: Callable[[], Awaitable[Any]]) -> None:
        name, sig = key
        if self._one.locked():
            self.progress[key] = (0, 0, "queued: one plan is made at a time")
        try:
            async with self._one:
                log.info("planning %s in the background for shapes %s; requests with these "
                         "shapes run it whole until the plan is ready", name, sig or "(fixed)")
                await work()
        except Exception as exc:  # any failure: serve whole, say why once
            reason = (exc.message if isinstance(exc, EdgepilotError)
                      else f"{type(exc).__name__}: {exc}")
            self.failures[key] = reason
            log.warning("no plan for %s %s (%s); serving it whole on its default target", name,
                        sig, reason)
        finally:
            self.tasks.pop(key, None)
            self.progress.pop(key, None)

    def state(self, key: Key) -> dict[str, Any]:
        """``{"state": "planning", "model", "signature", "done", "total", "what"}``."""
        done, total, what = self.progress.get(key, (0, 0, "starting"))
        return {"state": "planning", "model": key[0], "signature": key[1] or None,
                "done": done, "total": total, "what": what}

    def summary(self) -> dict[str, list[dict[str, Any]]]:
        """What is in the making (with progress) and what failed (with the reason)."""
        return {
            "planning": [{k: v for k, v in self.state(key).items() if k != "state"}
                         for key in list(self.tasks)],
            "failed": [{"model": n, "signature": sig or None, "reason": why}
                       for (n, sig), why in list(self.failures.items())],
        }

    async def wait(self) -> None:
        """Wait for background planning in progress (tests, orderly stop)."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks.values()), return_exceptions=True)
