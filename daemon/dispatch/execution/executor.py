"""Run a plan: its compiled segments in order, tensors handed over as they are.

Every tensor a segment produces stays in one per-request dict until the request ends, so a
tensor that skips a segment (a residual) is not copied through it; numpy arrays go from one
runtime to the next without conversion (CPU runtimes read them in place).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

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

    def run(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[float]]:
        """Outputs by name and per-segment wall ms; SegmentFault names a failing target."""
        if len(self.segments) == 1:
            return self._run_whole(inputs)
        env: dict[str, np.ndarray] = dict(inputs)
        times: list[float] = []
        for k, seg in enumerate(self.segments):
            t0 = time.perf_counter()
            try:
                env.update(seg.exe.run(env))
            except EdgepilotError as exc:
                raise SegmentFault(f"segment {k} on {seg.target} failed: {exc.message}",
                                   target=seg.target, segment=k) from exc
            except Exception as exc:  # a runtime's own exception types; never lose the target
                raise SegmentFault(f"segment {k} on {seg.target} failed: "
                                   f"{type(exc).__name__}: {exc}",
                                   target=seg.target, segment=k) from exc
            times.append((time.perf_counter() - t0) * 1e3)
        missing = [o for o in self.outputs if o not in env]
        if missing:
            raise BackendError(f"plan produced no {', '.join(missing)}; replan the model")
        return {o: env[o] for o in self.outputs}, times

    def _run_whole(self, inputs: Mapping[str, np.ndarray]
                   ) -> tuple[dict[str, np.ndarray], list[float]]:
        # one segment is the whole model on one runtime: hand the request straight to it, so
        # an all-one-target plan costs what that target costs (no env dict, no copies)
        seg = self.segments[0]
        feed = inputs if isinstance(inputs, dict) else dict(inputs)
        t0 = time.perf_counter()
        try:
            out = seg.exe.run(feed)
        except EdgepilotError as exc:
            raise SegmentFault(f"segment 0 on {seg.target} failed: {exc.message}",
                               target=seg.target, segment=0) from exc
        except Exception as exc:  # a runtime's own exception types; never lose the target
            raise SegmentFault(f"segment 0 on {seg.target} failed: {type(exc).__name__}: {exc}",
                               target=seg.target, segment=0) from exc
        times = [(time.perf_counter() - t0) * 1e3]
        if len(out) != len(self.outputs):
            missing = [o for o in self.outputs if o not in out]
            if missing:
                raise BackendError(f"plan produced no {', '.join(missing)}; replan the model")
            out = {o: out[o] for o in self.outputs}
        return out, times

    def step(self, k: int, env: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        """Run segment ``k`` alone on the tensors produced so far: (its outputs, wall ms).

        The serving layer runs a plan one segment at a time, holding each segment's device only
        while that segment runs; SegmentFault names the failing target."""
        seg = self.segments[k]
        feed = env if isinstance(env, dict) else dict(env)
        t0 = time.perf_counter()
        try:
            out = seg.exe.run(feed)
        except EdgepilotError as exc:
            raise SegmentFault(f"segment {k} on {seg.target} failed: {exc.message}",
                               target=seg.target, segment=k) from exc
        except Exception as exc:  # a runtime's own exception types; never lose the target
            raise SegmentFault(f"segment {k} on {seg.target} failed: {type(exc).__name__}: {exc}",
                               target=seg.target, segment=k) from exc
        return out, (time.perf_counter() - t0) * 1e3

    def collect(self, env: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The plan's outputs out of everything its segments produced."""
        missing = [o for o in self.outputs if o not in env]
        if missing:
            raise BackendError(f"plan produced no {', '.join(missing)}; replan the model")
        return {o: env[o] for o in self.outputs}

    @property
    def memory_bytes(self) -> int:
        return sum(s.exe.memory_bytes for s in self.segments)

    def close(self) -> None:
        for seg in self.segments:
            seg.exe.close()
