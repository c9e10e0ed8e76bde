"""One model under the dispatcher: measure, plan, check, watch and replan (synchronous).

:meth:`ModelDispatch.prepare` partitions the file, loads the profile from the plan cache or
measures it, plans, compiles the segments, checks the whole plan's output error (repairing the
worst layers back to the fp32 reference until it is within tolerance) and times it end to end.
The serving layer runs requests on :meth:`current`; a failing segment (:meth:`fault`) excludes
its target and replans, and the request is retried. Drift (:meth:`observe`, read against other
work on the CPUs: drift.py) and clock changes replan too, when predicted to win by the hysteresis.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgepilot.backends.base import Backend, Executable, ModelKind, Target
from edgepilot.dispatch.execution.executor import CompiledPlan, SegmentFault
from edgepilot.dispatch.execution.monitor import Monitor, worth_switching
from edgepilot.dispatch.execution.recovery import Recovery
from edgepilot.dispatch.graph.partition import LayerMismatch, Partition
from edgepilot.dispatch.graph.samples import Feed, Samples, pick, rules_for
from edgepilot.dispatch.graph.signature import Shapes, failure_hint, file_shapes, signature_of
from edgepilot.dispatch.measuring.budget import timed_whole
from edgepilot.dispatch.measuring.cells import LatencyTable
from edgepilot.dispatch.measuring.contention import RecentLoad
from edgepilot.dispatch.measuring.measure import Measurer, Progress
from edgepilot.dispatch.measuring.output_check import OutputCheck
from edgepilot.dispatch.measuring.timing import plan_timing
from edgepilot.dispatch.measuring.tolerance import PLAN_MARGIN
from edgepilot.dispatch.options import DispatchOptions
from edgepilot.dispatch.planning.adoption import begin
from edgepilot.dispatch.planning.cache import PlanCache, cache_key
from edgepilot.dispatch.planning.choice import compiled_choice, measure_hops
from edgepilot.dispatch.planning.drift import apply_drift
from edgepilot.dispatch.planning.kernels import CorpusProvider, corpus_fits
from edgepilot.dispatch.planning.plan import CostBuilder, Plan
from edgepilot.dispatch.planning.planner import CostTable, plan_cost
from edgepilot.dispatch.planning.record import plan_document
from edgepilot.dispatch.planning.segment_timing import time_new_segments
from edgepilot.dispatch.planning.shared import published_segments
from edgepilot.dispatch.planning.versus import lost_before, single_instead
from edgepilot.errors import EdgepilotError, PlanError, UnrunnableModel
from edgepilot.formats.io import tensor_specs

log = logging.getLogger(__name__)
Emit = Callable[..., Any]


class ModelDispatch:
    """Plans and serves one ONNX/TFLite model; every public method is thread-safe."""

    def __init__(self, name: str, path: Path, backends: Mapping[str, Backend],
                 targets: list[Target], opts: DispatchOptions, *,
                 cache: PlanCache | None = None, key_parts: dict[str, Any] | None = None,
                 freqs: dict[str, float] | None = None, budgets: dict[str, float] | None = None,
                 progress: Progress | None = None, emit: Emit | None = None,
                 corpus: CorpusProvider | None = None, shapes: Shapes | None = None,
                 graph_dir: Path | None = None,
                 recent: Callable[[], Sequence[Feed]] | None = None) -> None:
        self.name, self.path, self.backends, self.targets = name, Path(path), backends, targets
        # the input shapes this plan is for (None: the file's own fixed dims)
        self.shapes: Shapes | None = dict(shapes) if shapes is not None else None
        self.graph_dir, self.corpus, self.opts, self.cache = graph_dir, corpus, opts, cache
        self.recent = recent or (lambda: ())
        self.samples: Samples | None = None
        self.key_parts = dict(key_parts or {})
        self.freqs, self.budgets, self.progress = dict(freqs or {}), dict(budgets or {}), progress
        self.emit = emit or (lambda kind, **fields: None)
        self.monitor, self.from_cache, self._lock = Monitor(opts.drift_threshold), False, \
            threading.RLock()
        self.part: Partition | None = None
        self.builder: CostBuilder | None = None
        self.plan: Plan | None = None
        self.compiled: CompiledPlan | None = None
        self.reference: Target | None = None
        self.calibration: list[dict[str, np.ndarray]] = []
        self.check = OutputCheck([], opts.metric)
        # each segment of the last plan made, timed; its fastest run, end to end then per segment
        self.segment_ms: list[float] = []
        self.fastest: list[float] = []
        self.published: dict[str, Any] | None = None  # a plan adopted on a shell partition
        self.spare: Executable | None = None  # an open whole model the plan may run on
        self.budget_end: float | None = None  # a model planned whole: its budget's end
        self.recovery, self.load = Recovery(self._readmit, opts.reprobe_s), RecentLoad()

    def prepare(self, reprofile: bool = False) -> Plan:
        """Partition, profile (or load the cached profile), plan, check and time.
        ``reprofile`` measures again even when the cache holds a profile (and replaces it)."""
        with self._lock:
            try:
                return self._prepare(reprofile)
            except LayerMismatch as exc:  # a published plan's layers, once cut: refused
                self._refuse(exc)
                return self._prepare(reprofile)

    def _prepare(self, reprofile: bool) -> Plan:
        started = time.monotonic()
        kind: ModelKind = "tflite" if self.path.suffix.lower() == ".tflite" else "onnx"
        specs = tensor_specs(self.path, kind)[0]
        if self.shapes is None:
            self.shapes = file_shapes(self.name, self.path, specs)
        self.samples = samples = pick(
            specs, self.shapes, rules_for(self.path, kind, specs), self.opts.calibration_inputs,
            self.name, self.opts.calibration_dir, list(self.recent()))
        self.calibration = samples.feeds
        shared = self.cache.shared if self.cache is not None else None
        # a plan an identical board published (dispatch/planning/adoption.py), else the
        # reference found here
        try:
            got = begin(shared if not reprofile else None, self.key_parts, self.path, kind,
                        self.shapes, self.backends, self.targets, self.calibration,
                        cache_dir=self.graph_dir, max_layers=self.opts.max_layers,
                        budget_s=self.opts.planning_budget_s)
        except UnrunnableModel as exc:  # at shapes or values no one chose: say which, and how
            hint = failure_hint(exc, self.path, specs, self.shapes,
                                lambda: samples.generated_hint(specs, self.name))
            if not hint:
                raise
            raise exc.with_hint(hint) from None
        part, ref, adopted, self.spare = got.part, got.ref, got.adopted, got.spare
        self.budget_end = started + self.opts.planning_budget_s if got.budgeted else None
        self.part, self.targets, self.reference, self.published = part, got.targets, ref, \
            got.shell_of
        self.check = got.output_check(self.calibration, self.opts.metric)
        layers, targets = [lay.name for lay in part.layers], [str(t) for t in self.targets]
        key = cache_key({**self.key_parts, "model_sha256": part.model_hash,
                         "signature": signature_of(self.shapes),
                         "inputs": samples.describe(), "targets": targets,
                         "tolerance": self.opts.tolerance, "metric": self.opts.metric,
                         "runs": self.opts.runs, "passes": self.opts.passes,
                         "layers": layers})
        cached = self.cache.load(self.name, key) if self.cache and not reprofile else None
        adopted, cached = (None, cached) if cached else (adopted, adopted)  # own cache first
        self.from_cache = cached is not None
        forced = {int(k): str(v) for k, v in (cached or {}).get("forced", {}).items()}
        if cached is not None:
            profile = LatencyTable.from_dict(cached["profile"])
        else:
            o = self.opts  # the spare is the measurer's now: it hands the fastest back
            feeds, outs, ms = got.profile_inputs(self.calibration)
            measurer, self.spare = Measurer(
                part, self.backends, self.targets, ref, feeds, runs=o.runs, warmup=o.warmup,
                metric=o.metric, progress=self.progress, passes=o.passes, ref_outputs=outs,
                ref_ms=ms, opened=self.spare, tolerance=o.tolerance,
                budget_end=self.budget_end), None
            try:
                profile = measurer.table()
            finally:  # the fastest whole model within tolerance, open
                self.spare = measurer.take_spare()
            profile.freqs = dict(self.freqs)
            profile.extra["merged"] = got.merges
        self.builder = CostBuilder(
            part, profile, self.opts.tolerance, forced=forced, freqs=dict(self.freqs),
            budgets=dict(self.budgets), split_margin=self.opts.hysteresis,
            kernels=corpus_fits(self.corpus, self.targets, self.progress))
        if cached is None:  # the kinds of hop its choice makes, measured where it makes them
            measure_hops(self.builder, measurer.hop, self.progress)
        plan, compiled = self._build(
            "fleet" if adopted else "cache" if self.from_cache else "reprofile" if reprofile
            else "initial", *((published_segments(adopted), adopted["plan"]["layers"])
                              if adopted else (None, None)))
        spent = plan.planning_s = round(time.monotonic() - started, 3)
        if adopted and shared and not shared.adopt(
                adopted, self.name, plan.segments, plan.measured_ms, self.segment_ms,
                spent, lambda: self._time(compiled, settle=True), self.fastest):
            return self.prepare(reprofile=True)  # it does not hold here: measure
        doc = plan_document(self.name, self.key_parts, self.builder, profile, plan,
                            signature=self.signature, targets=targets,
                            segment_ms=self.segment_ms, fastest=self.fastest,
                            calibration=self.calibration,
                            outputs_sha256=self.check.digest_of(compiled))
        if self.cache is not None:
            self.cache.store(self.name, key, doc)
            if shared is not None and not self.from_cache:
                shared.publish(self.key_parts, doc)
        self._install(plan, compiled)
        part.release_graph()
        return plan

    @property
    def signature(self) -> str:
        return signature_of(self.shapes) if self.shapes is not None else ""

    @property
    def ref_outputs(self) -> list[dict[str, np.ndarray]]:
        return self.check.ref_outputs  # on the calibration inputs (see :class:`OutputCheck`)

    def check_error(self, compiled: CompiledPlan) -> float:
        """Whole-plan output error against the fp32 reference on the calibration inputs."""
        return self.check.error(compiled)

    def _build(self, reason: str, keep: list[tuple[str, int, int]] | None = None,
               figures: Sequence[Any] | None = None) -> tuple[Plan, CompiledPlan]:
        """Plan (``keep``: these segments, a published plan's, ``figures`` its layers'),
        compile, check; repair (worst layer back to fp32) until within tolerance."""
        assert self.builder is not None and self.reference is not None and self.part is not None
        ref = str(self.reference)
        while True:
            plan, compiled = compiled_choice(self.name, self.builder, self.part, self.backends,
                                             reason, ref, keep, figures, self.spare)
            self.spare = None
            err = self.check_error(compiled)
            movable = [(self.builder.profile.cells[i][t].error or 0.0, i)
                       for i, t in enumerate(plan.targets) if t != ref]
            if err <= PLAN_MARGIN * self.opts.tolerance or not movable:
                break
            what = (f"error {err:.4f} over {PLAN_MARGIN} x tolerance {self.opts.tolerance}: "
                    f"layer {max(movable)[1]}")
            log.info("plan for %s: %s moves to %s", self.name, what, ref)
            if self.progress:  # a stopping daemon cancels here too
                self.progress(0, 0, f"{what} back to the reference")
            self.builder.forced[max(movable)[1]] = ref
            keep = None  # the published plan's error does not hold here: repaired as usual
        plan.error = err
        if keep is None:  # a published plan's segments were timed where it was made
            time_new_segments(self.builder, self.part, plan, compiled, self.calibration[0],
                              self.opts.runs, self.opts.warmup, self.opts.passes)
        # predicted above from earlier observations only; this measurement joins them after
        plan.measured_ms, per_segment, self.fastest = self._time(compiled, settle=keep is None)
        self.builder.record(plan.segments, per_segment)
        self.segment_ms = list(per_segment)
        # a published plan was checked side by side where it was made (``given``)
        single = None if keep else single_instead(
            self.name, self.builder, self.part, plan, compiled, self.backends,
            self.calibration[0], self.opts.hysteresis, self.check_error, self.progress,
            self.budget_end)
        if single:  # timed side by side above; alone for the fastest run it publishes
            self.segment_ms = [single[0].measured_ms or 0.0]
            self.fastest = self._time(single[1], settle=True)[2]
        return single or (plan, compiled)

    def _refuse(self, exc: LayerMismatch) -> None:
        """A plan adopted on a shell partition this board cuts otherwise: one event, dropped."""
        if self.cache is not None and self.cache.shared is not None and self.published:
            self.cache.shared.drop(self.published, exc.message, model=self.name)
        self.published = None

    def _time(self, compiled: CompiledPlan, settle: bool = False
              ) -> tuple[float, list[float], list[float]]:
        """The plan's median end to end and per segment, and its fastest run (both)."""
        known = timed_whole([(s.target, s.start, s.end) for s in compiled.segments], len(
            self.part.layers), self.builder.profile.extra.get("whole_ms", {})) \
            if self.budget_end and self.part and self.builder else None
        return known or plan_timing(compiled, self.calibration[0], self.opts.runs, settle)

    def _install(self, plan: Plan, compiled: CompiledPlan) -> None:
        old = self.plan
        compiled.reset_state()  # a streaming model's first request: no planning runs' state
        # old executables are dropped, not closed: a request may still be running on them
        self.plan, self.compiled = plan, compiled
        self.monitor.install(self._predictions(), self.segment_ms)
        if old is not None and old.hash != plan.hash:
            self.emit("plan.changed", model=self.name, hash=plan.hash, previous=old.hash,
                      reason=plan.reason, predicted_ms=round(plan.predicted_ms, 4),
                      measured_ms=plan.measured_ms)

    def replan(self, reason: str, force: bool = False) -> tuple[bool, Plan]:
        """Replan on the current costs; apply when forced or predicted to gain > hysteresis."""
        with self._lock:
            if self.builder is None or self.plan is None or self.compiled is None:
                return True, self.prepare()
            try:
                self.builder.part.real()  # a shell adopted as published: cut the model now
            except LayerMismatch as exc:
                self._refuse(exc)
                return True, self.prepare()
            # decide on layer costs (like the DP); calibration only sharpens the predictions
            assign, _, table = self.builder.best()
            current = [table.targets.index(t) for t in self.plan.targets]
            current_cost, new_cost = plan_cost(table, current), plan_cost(table, assign)
            lost = lost_before(self.builder, [table.targets[a] for a in assign], self.plan.targets)
            gain = current_cost == float("inf") or worth_switching(current_cost, new_cost,
                                                                   self.opts.hysteresis)
            if assign == current or (not force and (lost or not gain)):
                # keep the plan, but expect what the new costs say so drift does not re-fire
                self.monitor.expect(self._predictions(table))
                log.info("replan of %s (%s): keeping %s (%.3f ms vs %.3f ms)", self.name,
                         reason, self.plan.hash, current_cost, new_cost)
                return False, self.plan
            plan, compiled = self._build(reason)
            self._install(plan, compiled)
            return True, plan

    def _predictions(self, table: CostTable | None = None) -> list[float]:
        assert self.compiled is not None and self.builder is not None
        return self.builder.segment_predictions(table or self.builder.table(), [
            (s.target, s.start, s.end) for s in self.compiled.segments])

    def set_clocks(self, freqs: dict[str, float], reason: str) -> tuple[bool, Plan]:
        """A DVFS profile or thermal change: re-predict at the new clocks and replan."""
        with self._lock:
            self.freqs = dict(freqs)
            if self.builder is not None:  # its own copy
                self.builder.freqs = dict(freqs)
            return self.replan(reason)

    # ---- serving ------------------------------------------------------------------------------
    def current(self) -> tuple[CompiledPlan, Plan] | None:
        """The plan to serve on now and its executables; None before the first plan. Lock-free:
        called per request while a replan may hold the lock for seconds (``_install`` swaps the
        two together; a request that sees the old pair finishes on it)."""
        compiled, plan = self.compiled, self.plan
        return None if compiled is None or plan is None else (compiled, plan)

    def attempts(self) -> int:
        """How many times a request is tried: once per target that may be excluded, plus one."""
        return len(self.targets) + 1

    def fault(self, fault: SegmentFault, plan_hash: str) -> None:
        """A segment failed: report it, exclude its target and replan (blocking)."""
        log.warning("model %s: %s; excluding %s and replanning", self.name, fault.message,
                    fault.target)
        self.emit("backend.fault", model=self.name, target=fault.target, message=fault.message,
                  plan=plan_hash)
        self._exclude(fault.target, plan_hash)

    def observe(self, compiled: CompiledPlan, times: list[float]) -> None:
        """Feed one request's per-segment times to the monitor; replans on drift (blocking)."""
        if not self._lock.acquire(blocking=False):
            return  # a replan holds it (seconds): this request's times would not be its plan's
        try:
            self.load.tick()
            if drifted := (self.monitor.observe(times) if compiled is self.compiled else []):
                assert self.builder is not None
                seen = [(compiled.segments[k].target, self.monitor.ratio(k)) for k in drifted]
                for line in apply_drift(self.builder, seen, self.load.share()):  # whose slowing?
                    log.info("model %s: %s", self.name, line)
                self.replan("drift")
        finally:
            self._lock.release()

    def run(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str]:
        """Serve one request in this thread, no device queues (the CLI, tests): the same
        steps the serving layer takes per segment — a failing target is excluded and the
        request retried, observed times feed the monitor."""
        if self.current() is None:
            self.prepare()
        for _ in range(self.attempts()):
            current = self.current()
            assert current is not None
            compiled, plan = current
            try:
                outputs, times = compiled.run(inputs)
            except SegmentFault as fault:
                self.fault(fault, plan.hash)
                continue
            self.observe(compiled, times)
            return outputs, plan.hash
        raise PlanError(f"model {self.name}: every target failed for this request; "
                        "see the backend.fault events", field="model")

    def _exclude(self, target: str, seen_hash: str) -> None:
        with self._lock:
            assert self.builder is not None and self.plan is not None
            if self.plan.hash != seen_hash and target not in self.plan.targets:
                return  # another request already replanned around it
            self.builder.excluded.add(target)
            self.recovery.watch(target)
            try:
                self.replan(f"fault:{target}", force=True)
            except EdgepilotError as exc:
                log.error("model %s: no plan without %s: %s", self.name, target, exc.message)
                raise

    def _readmit(self, target: str) -> bool:
        """Allow ``target`` again (a recovery timer): the replan checks the plan that may use
        it on the calibration inputs, so a target still failing stays out."""
        with self._lock:
            if self.builder is None or target not in self.builder.excluded:
                return True
            self.builder.excluded.discard(target)
            try:
                self.replan(f"recovered:{target}", force=True)
            except (SegmentFault, EdgepilotError) as exc:
                self.builder.excluded.add(target)
                log.info("model %s: %s still fails its probe: %s", self.name, target, exc)
                return False
        log.info("model %s: %s passed its probe; back in its plans", self.name, target)
        self.emit("backend.recovered", model=self.name, target=target)
        return True

    # ---- explain ------------------------------------------------------------------------------
    def explain(self) -> dict[str, Any]:
        """The plan JSON (what `edgepilot plan --json` and GET /v1/plan show) plus monitor state."""
        with self._lock:
            if self.plan is None:
                self.prepare()
            assert self.plan is not None and self.builder is not None and self.part is not None
            return {**self.plan.as_dict(), "tolerance": self.opts.tolerance,
                    "input_shapes": {n: list(d) for n, d in (self.shapes or {}).items()},
                    "inputs_used": self.samples.describe() if self.samples else None,
                    "from_cache": self.from_cache, "excluded": sorted(self.builder.excluded),
                    "signatures": self.part.signatures, "monitor": self.monitor.snapshot()}

