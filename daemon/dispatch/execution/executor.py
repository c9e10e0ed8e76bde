"""Run a plan: its compiled segments in order, tensors handed over as they are.

Every tensor a segment produces stays in one per-request dict until the request ends, so a
tensor that skips a segment (a residual) is not copied through it; numpy arrays go from one
runtime to the next without conversion (CPU runtimes read them in place).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from time import perf_counter

import numpy as np

from edgepilot.backends.base import Executable, Segment
from edgepilot.errors import BackendError, EdgepilotError


class SegmentFault(BackendError):
    """A segment's runtime raised; ``target`` names the target to exclude before retrying."""

    code = "backend_fault"

    def __init__(self, message: str, *, target: str, segment: int) -> None:
        super().__init__(message, field="target")
        self.target = target
        self.segment = segment


@dataclass
class CompiledSegment:
    target: str
    start: int
    end: int
    segment: Segment
    exe: Executable
    predicted_ms: float


class CompiledPlan:
    """The executables of one plan; ``run`` is safe to call from several threads."""

    def __init__(self, segments: list[CompiledSegment], outputs: tuple[str, ...]) -> None:
        self.segments = segments
        self.outputs = outputs
        # one segment is the whole model on one runtime: ``run`` hands the request straight
        # to it, so an all-one-target plan costs what that target costs (no env dict, no
        # copies, one clock read each side: on a 10 µs streaming model the wrapper was 7%)
        self._whole = segments[0].exe if len(segments) == 1 else None

    def run(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[float]]:
        """Outputs by name and per-segment wall ms; SegmentFault names a failing target."""
        whole = self._whole
        if whole is not None:
            t0 = perf_counter()
            try:
                out = whole.run(inputs if type(inputs) is dict else dict(inputs))
            except Exception as exc:
                raise self._fault(0, exc) from exc
            ms = (perf_counter() - t0) * 1e3
            if len(out) != len(self.outputs):
                out = self.collect(out)
            return out, [ms]
        env: dict[str, np.ndarray] = dict(inputs)
        times: list[float] = []
        for k, seg in enumerate(self.segments):
            t0 = perf_counter()
            try:
                env.update(seg.exe.run(env))
            except Exception as exc:
                raise self._fault(k, exc) from exc
            times.append((perf_counter() - t0) * 1e3)
        return self.collect(env), times

    def _fault(self, k: int, exc: Exception) -> SegmentFault:
        # a runtime's own exception types too: never lose which target failed
        seg = self.segments[k]
        why = exc.message if isinstance(exc, EdgepilotError) else f"{type(exc).__name__}: {exc}"
        return SegmentFault(f"segment {k} on {seg.target} failed: {why}",
                            target=seg.target, segment=k)

    def step(self, k: int, env: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        """Run segment ``k`` alone on the tensors produced so far: (its outputs, wall ms).

        The serving layer runs a plan one segment at a time, holding each segment's device only
        while that segment runs; SegmentFault names the failing target."""
        seg = self.segments[k]
        feed = env if isinstance(env, dict) else dict(env)
        t0 = perf_counter()
        try:
            out = seg.exe.run(feed)
        except Exception as exc:
            raise self._fault(k, exc) from exc
        return out, (perf_counter() - t0) * 1e3

    def collect(self, env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The plan's outputs out of everything its segments produced."""
        missing = [o for o in self.outputs if o not in env]
        if missing:
            raise BackendError(f"plan produced no {', '.join(missing)}; replan the model")
        return {o: env[o] for o in self.outputs}

    def reset_state(self) -> None:
        """Every segment as freshly built (see :meth:`Executable.reset_state`)."""
        for seg in self.segments:
            seg.exe.reset_state()

    @property
    def memory_bytes(self) -> int:
        return sum(s.exe.memory_bytes for s in self.segments)

    def close(self) -> None:
        for seg in self.segments:
            seg.exe.close()
