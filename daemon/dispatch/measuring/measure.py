"""Measure every supported (layer, target) on this board: latency and error vs fp32.

For each calibration input the fp32 reference target runs the layers in order, which gives
every boundary tensor's reference value. Each (layer, target) is then compiled, fed the
reference inputs of that layer, warmed up, timed (median of N) and its outputs compared with the
reference outputs in the tolerance metric. Hops are measured too: per target, the per-call
overhead is what splitting two adjacent layers into two calls costs over one merged call, and
the bandwidth is that of handing a boundary-sized tensor over in host memory.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

import numpy as np

from edgepilot.backends.base import Backend, Executable, Segment, Target
from edgepilot.dispatch.execution.executor import CompiledPlan, CompiledSegment
from edgepilot.dispatch.graph.partition import Partition
from edgepilot.dispatch.measuring.budget import WHOLE_RUNS, out_of_budget
from edgepilot.dispatch.measuring.cells import Cell, LatencyTable, exclusions, non_finite, row_bound
from edgepilot.dispatch.measuring.contention import OtherLoad
from edgepilot.dispatch.measuring.crawl import Crawlers
from edgepilot.dispatch.measuring.hops import measure_hop
from edgepilot.dispatch.measuring.runnable import owned
from edgepilot.dispatch.measuring.timing import (
    MIN_TIMED_MS,
    SETTLE_MS,
    copy_bandwidth,
    median_ms,
    time_plan,
)
from edgepilot.dispatch.measuring.tolerance import output_error, unchecked
from edgepilot.errors import EdgepilotError, PlanError

log = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]


# a first run this many times over the bound ends a cell before its warm-up and timed runs
# (a cold first run may be a few times slower than a warm one, not this much: 9x the best)
COLD_FACTOR = 6.0
# a whole model whose calibration run took this long is timed no further once over the bound
HEAVY_MS = 50.0
# a heavy run (its cold start a small part of it) this many times over the bound (3x the
# layer's best) ends a cell after it: an int8 conv on a CPU without dot-product instructions
# ran 3-5x fp32, 0.7-1.3 s a run, and was timed 6 runs a cell
LOSER_FACTOR = 2.0
SLOW_INPUT_FACTOR = 3.0  # see Measurer.error_envs


class Measurer:
    """Times a partition's layers on targets; see the module docstring for the method."""

    def __init__(self, part: Partition, backends: Mapping[str, Backend], targets: list[Target],
                 reference: Target, calibration: list[dict[str, np.ndarray]], *,
                 runs: int = 7, warmup: int = 2, metric: str = "rel_l2",
                 progress: Progress | None = None, passes: int = 2,
                 ref_outputs: list[dict[str, np.ndarray]] | None = None,
                 ref_ms: list[float] | None = None, opened: Executable | None = None,
                 tolerance: float | None = None, budget_end: float | None = None) -> None:
        """``ref_outputs``/``ref_ms``: the reference's whole-model outputs and run times on
        ``calibration`` (a one-layer model's reference pass, not run again); ``opened``: its
        whole-model executable, open (timed, not built again); ``tolerance``: the fastest
        whole model within it stays open for the plan (:meth:`take_spare`);
        ``budget_end``: a model planned whole within the planning budget (``budget.py``), which
        ends then (``time.monotonic()``): whole models' errors on the first calibration input
        only (the plan's check runs them all), none timed once it is out of tolerance, and no
        target begun that the budget has no room left for."""
        if not calibration:
            raise PlanError("profiling needs at least one calibration input", field="calibration")
        self.part, self.backends, self.targets = part, backends, targets
        self.reference, self.calibration = reference, calibration
        self.runs, self.warmup, self.metric, self.progress = runs, warmup, metric, progress
        self.passes = max(1, passes)
        self._ref_envs: list[dict[str, np.ndarray]] | None = None
        self._env_ms: list[float] = []  # each calibration input's reference run
        # (target, start, end) -> digest of the compiled segment (for Cell.same_as)
        self._digests: dict[tuple[str, int, int], str] = {}
        self.whole_cpu_ms: dict[str, float] = {}  # CPU ms a whole-model run took (plan_ms)
        self._ref_outputs, self._ref_ms = ref_outputs, list(ref_ms or [])
        self._opened, self.tolerance, self.budget_end = opened, tolerance, budget_end
        self.budgeted = budget_end is not None
        self._spare: tuple[Executable, float] | None = None  # (executable, its ms)

    def compile(self, start: int, end: int, target: Target) -> Executable:
        backend = self.backends.get(target.backend)
        if backend is None:
            raise PlanError(f"backend {target.backend!r} is not loaded", field="targets")
        return backend.compile(self.part.segment(start, end), target)

    def reference_envs(self) -> list[dict[str, np.ndarray]]:
        """Every tensor of the fp32 reference run, per calibration input."""
        if self._ref_envs is None and self._ref_outputs is not None and \
                len(self.part.layers) == 1:
            self._ref_envs = [{**feed, **out} for feed, out in
                              zip(self.calibration, self._ref_outputs, strict=True)]
            self._env_ms = self._ref_ms or [0.0] * len(self._ref_envs)
        if self._ref_envs is None:
            # one layer's session alive at a time, its outputs copied out of its arena
            envs = [dict(feed) for feed in self.calibration]
            self._env_ms = [0.0] * len(envs)
            for i in range(len(self.part.layers)):
                exe = self.compile(i, i + 1, self.reference)
                try:
                    for k, env in enumerate(envs):
                        t0 = time.perf_counter()
                        env.update(owned(exe.run(env)))
                        self._env_ms[k] += (time.perf_counter() - t0) * 1e3
                finally:
                    exe.close()
            self._ref_envs = envs
        return self._ref_envs

    def error_envs(self) -> list[dict[str, np.ndarray]]:
        """The reference runs of the calibration inputs within SLOW_INPUT_FACTOR x the
        cheapest: each cell's error is measured on these, the whole plan's on all (a TTS
        model's input that ran 9x the other made a 5-minute plan 15 minutes)."""
        envs = self.reference_envs()
        cheapest = min(self._env_ms, default=0.0)
        # (a light model's first pass is its sessions' cold start, no measure of its input)
        keep = [env for env, ms in zip(envs, self._env_ms, strict=True)
                if ms <= SLOW_INPUT_FACTOR * cheapest or cheapest < HEAVY_MS]
        if self.budgeted:
            keep = keep[:1]
        if len(keep) < len(envs):
            log.debug("calibration inputs ran %s ms: cells checked on %d", self._env_ms,
                      len(keep))
        return keep or envs

    def measure(self, start: int, end: int, target: Target,
                bound_ms: float | None = None, as_plan: bool = False,
                row: Mapping[str, Cell] | None = None) -> Cell:
        """Compile layers ``[start, end)`` on ``target``, time it and measure its error
        (timing stops early once it is over ``bound_ms``: see :func:`median_ms`). ``as_plan``:
        timed as a plan of that one segment is checked (``timing.py``), not as a layer.
        ``row``: the cells of the same layers on other targets, one of which may already be
        this very computation (:attr:`Cell.same_as`)."""
        backend = self.backends[target.backend]
        seg = self.part.segment(start, end)
        support = backend.supports(seg, target)
        if not support:
            return Cell(None, reason=support.reason or "not supported")
        whole = (start, end) == (0, len(self.part.layers))
        opened, self._opened = (self._opened, None) if as_plan and whole and \
            self._opened is not None and self._opened.target == target else (None, self._opened)
        try:
            exe = opened or backend.compile(seg, target)
        except EdgepilotError as exc:
            return Cell(None, reason=exc.message)
        digest = getattr(exe, "model_sha256", "")
        twin = next((name for name, c in (row or {}).items() if c.ms is not None and digest
                     and self._digests.get((name, start, end)) == digest
                     and Target.parse(name).device == target.device
                     and Target.parse(name).backend == target.backend), None)
        if twin is not None:
            exe.close()
            cell = (row or {})[twin]
            return Cell(cell.ms, cell.error, cell.memory, same_as=twin)
        self._digests[(str(target), start, end)] = digest
        cell = Cell(None)
        try:
            if opened is not None:  # the reference's own: its outputs are the reference's
                cell = Cell(self.plan_ms(start, end, target, seg, exe), 0.0, exe.memory_bytes)
            else:
                cell = self._run(exe, seg, target, bound_ms, as_plan)
            return cell
        except EdgepilotError as exc:
            return Cell(None, reason=exc.message)
        finally:
            if not (as_plan and whole and self._hold(exe, cell)):
                exe.close()

    def _run(self, exe: Executable, seg: Segment, target: Target, bound_ms: float | None,
             as_plan: bool) -> Cell:
        """:meth:`measure` of a compiled segment: its error, then its timing."""
        envs = self.error_envs()
        names = seg.outputs
        blind = None if target.precision == self.reference.precision else next(
            (n for env in envs if (n := unchecked(env, names)) is not None), None)
        if blind is not None:
            return Cell(None, reason=f"the reference's output {blind!r} is not finite anywhere "
                        f"on the calibration inputs: {target.precision} cannot be checked "
                        "against it (real samples: [dispatch] calibration_dir)")
        err, first_ms = 0.0, float("inf")
        for env in envs:
            t0 = time.perf_counter()
            out = exe.run(env)
            first_ms = min(first_ms, (time.perf_counter() - t0) * 1e3)
            bad = non_finite(out, env)
            if bad:
                return Cell(None, reason=f"non-finite values in output {bad!r} where the "
                                         "reference's are finite")
            err = max(err, output_error(out, {k: env[k] for k in names}, self.metric))
            if bound_ms is not None and (
                    first_ms > COLD_FACTOR * bound_ms
                    or (first_ms > LOSER_FACTOR * bound_ms and first_ms >= HEAVY_MS)):
                # one run COLD_FACTOR x over the bound (a cold first run may be a few times
                # slower than a warm one, not this much), or LOSER_FACTOR x where it was
                # heavy (a light one's calibration runs are no figure: Silero VAD on one
                # thread ran them 3x its warm runs): a reference-kernel target or a slow int8
                # is not run on the other inputs, warmed up and timed; its error is this
                # input's
                return Cell(first_ms, err, exe.memory_bytes)
        if as_plan and self.budgeted and self.tolerance is not None and err > self.tolerance:
            return Cell(first_ms, err, exe.memory_bytes)  # it cannot be the plan: one layer
        if as_plan and bound_ms is not None and first_ms > max(bound_ms, HEAVY_MS):
            # a heavy whole model over the bound is no best single target: its warm
            # calibration run is figure enough to calibrate its segments. A light one's
            # first runs are no figure (Silero VAD on one thread: 0.38 ms, 0.11 ms warm).
            return Cell(first_ms, err, exe.memory_bytes)
        if as_plan:
            start, end = seg.layers or (0, len(self.part.layers))
            return Cell(self.plan_ms(start, end, target, seg, exe), err, exe.memory_bytes)
        feed = self.reference_envs()[0]
        # the calibration runs above warmed it up (a light one's first is no warm-up)
        warm = max(0, self.warmup - len(envs) + (first_ms < HEAVY_MS))
        return Cell(median_ms(lambda: exe.run(feed), self.runs, warm, MIN_TIMED_MS, bound_ms),
                    err, exe.memory_bytes)

    def _hold(self, exe: Executable, cell: Cell) -> bool:
        """Keep ``exe`` (a whole model) open as the plan's when it is the fastest within
        tolerance so far; False: it is not (the caller closes it)."""
        if self.tolerance is None or self.part.stateful or cell.ms is None or cell.error is None \
                or cell.error > self.tolerance or cell.same_as is not None:
            return False
        if self._spare is not None:
            if self._spare[1] <= cell.ms:
                return False
            self._spare[0].close()
        self._spare = (exe, cell.ms)
        return True

    def take_spare(self) -> Executable | None:
        """The fastest whole model within tolerance, open (see ``__init__``), now the
        caller's; the reference's executable, if it was never timed, is closed."""
        if self._opened is not None:
            self._opened.close()
            self._opened = None
        spare, self._spare = self._spare, None
        return spare[0] if spare is not None else None

    def plan_ms(self, start: int, end: int, target: Target, seg: Segment,
                exe: Executable) -> float:
        """``exe`` timed as the plan of that one segment is checked after compiling (the same
        executor, the first calibration feed, the same warm-up and median: ``timing.py``); a
        single-target plan is predicted by this figure and compared with that check."""
        plan = CompiledPlan([CompiledSegment(str(target), start, end, seg, exe, 0.0)],
                            self.part.outputs)
        cpu: list[float] = []
        # no warm-up run: its calibration runs just ran it; fewer planned whole in the budget
        ms = time_plan(plan, self.calibration[0], WHOLE_RUNS if self.budgeted else self.runs,
                       0, SETTLE_MS, cpu=cpu)[0]
        self.whole_cpu_ms[str(target)] = cpu[0]
        return ms

    def retime(self, start: int, end: int, target: Target, cell: Cell) -> None:
        """Time ``[start, end)`` again (fresh session) and keep the faster of the two medians.

        Load from other processes only ever adds time, and on a shared board it comes and goes
        in spells of seconds: the lower of two medians taken seconds apart is the layer's cost
        with one spell fewer in it.
        """
        if cell.ms is None:
            return
        try:
            exe = self.compile(start, end, target)
        except EdgepilotError:
            return  # compiled once already: keep the first pass's timing
        try:
            feed = self.reference_envs()[0]
            cell.ms = min(cell.ms, median_ms(lambda: exe.run(feed), self.runs, self.warmup,
                                             MIN_TIMED_MS))
        except EdgepilotError:
            pass
        finally:
            exe.close()

    def table(self) -> LatencyTable:
        """Measure every (layer, target), the per-target overheads and the hop bandwidth.

        Layers are timed in ``passes`` passes over all cells (the first one also measures the
        errors); each cell keeps its lowest median (see :meth:`retime`). Each target's whole
        model is timed once, as a plan is checked (:meth:`plan_ms`).
        """
        n = len(self.part.layers)
        names = [str(t) for t in self.targets]
        # one layer is the whole model: timed once, as a plan, and its row is the whole's
        one = n == 1
        total = (0 if one else n * len(self.targets) * self.passes) + 2 * len(self.targets)
        done = 0
        self.reference_envs()
        cells: list[dict[str, Cell]] = []
        crawlers = Crawlers(str(self.reference))
        for i, layer in enumerate(self.part.layers if not one else []):
            row: dict[str, Cell] = {}
            for target in self.targets:
                skip = crawlers.reason(str(target))
                row[str(target)] = Cell(None, reason=skip) if skip else \
                    self.measure(i, i + 1, target, row_bound(row), row=row)
                done += 1
                if self.progress:
                    self.progress(done, total, f"{layer.name} on {target}")
            crawlers.saw({t: c.ms for t, c in row.items()})
            cells.append(row)
        for _ in range(1, self.passes if not one else 1):
            for i, row in enumerate(cells):
                bound = row_bound(row)
                for target in self.targets:
                    cell = row[str(target)]
                    if cell.same_as is not None:
                        twin = row[cell.same_as]
                        cell.ms, cell.error = twin.ms, twin.error  # timed again just before
                    elif (bound is None or (cell.ms or 0.0) <= bound) \
                            and (cell.ms or 0.0) < HEAVY_MS:
                        # a cell EARLY_FACTOR x slower than the layer's best cannot win it;
                        # a heavy one's median spans enough (TTS layers: a 5-minute plan x2)
                        self.retime(i, i + 1, target, cell)
                    done += 1
                    if self.progress:
                        self.progress(done, total, f"{self.part.layers[i].name} on {target} "
                                      "(again)")
        meter = OtherLoad()  # other work while the whole models were timed: see versus.py
        whole_cells = self._whole_cells(crawlers, done, total)
        contention = meter.share()
        done += len(self.targets)
        if one:
            cells = [{t: replace(c) for t, c in whole_cells.items()}]
        overhead: dict[str, float] = {}
        for target in self.targets:
            # a target over the early bound on every layer wins none: its per-call cost
            # (two merged pairs, timed) cannot change the plan
            timed = [(ms, row_bound(row)) for row in cells
                     if (ms := row[str(target)].ms) is not None]
            losing = bool(timed) and all(ms > (bound or float("inf")) for ms, bound in timed)
            twins = [same for row in cells if (same := row[str(target)].same_as) in overhead]
            overhead[str(target)] = 0.0 if losing or one else overhead[twins[0]] if twins \
                else self.measure_overhead(target, cells)
            done += 1
            if self.progress:
                self.progress(done, total, f"hop overhead of {target}")
        for t, c in whole_cells.items():
            if c.same_as in self.whole_cpu_ms:
                self.whole_cpu_ms[t] = self.whole_cpu_ms[c.same_as]
        whole = {t: c.ms for t, c in whole_cells.items() if c.ms is not None}
        whole_error = {t: c.error for t, c in whole_cells.items() if c.error is not None}
        return LatencyTable(names, str(self.reference), cells, overhead, copy_bandwidth(),
                            metric=self.metric,
                            extra={"whole_ms": whole, "whole_error": whole_error,
                                   "whole_cpu_ms": dict(self.whole_cpu_ms),
                                   "whole_contention": contention,
                                   "whole_twins": {t: c.same_as for t, c in whole_cells.items()
                                                   if c.same_as},
                                   "excluded": exclusions(cells, whole_cells)})

    def _whole_cells(self, crawlers: Crawlers, done: int, total: int) -> dict[str, Cell]:
        """Each target's whole model, timed end to end as its plan's check times it (one
        median over SETTLE_MS, not the lower of several short ones: see timing.py); how a
        compiled segment compares with the sum of its layers (fusion, cache) is calibrated
        from these (see calibration.py), and a single-target plan is predicted by them. The
        reference first when its executable is open: the others are bounded by its figure."""
        n = len(self.part.layers)
        whole_cells: dict[str, Cell] = {}
        first = self._opened.target if self._opened is not None else None
        for target in sorted(self.targets, key=lambda t: t != first):
            skip = crawlers.reason(str(target)) or (
                target != first and out_of_budget(self._ref_ms, self.budget_end))
            whole_cells[str(target)] = Cell(None, reason=skip) if skip else \
                self.measure(0, n, target, row_bound(whole_cells), as_plan=True, row=whole_cells)
            done += 1
            if self.progress:
                self.progress(done, total, f"whole model on {target}")
        return {str(t): whole_cells[str(t)] for t in self.targets}

    def hop(self, src: str, dst: str, cut: int) -> float | None:
        """What a hop from ``src`` to ``dst`` before layer ``cut`` costs (``hops.py``)."""
        return measure_hop(self.part, self.backends, Target.parse(src), Target.parse(dst), cut,
                           self.reference_envs()[0])

    def measure_overhead(self, target: Target, cells: list[dict[str, Cell]]) -> float:
        """Per-call cost: t(i) + t(i+1) - t(i..i+1 merged), on the cheapest adjacent pairs."""
        key = str(target)
        pairs = []
        for i in range(len(cells) - 1):
            a, b = cells[i][key].ms, cells[i + 1][key].ms
            if a is not None and b is not None:
                pairs.append((a + b, i))
        estimates = []
        for _, i in sorted(pairs)[:2]:
            merged = self.measure(i, i + 2, target)
            a, b = cells[i][key].ms, cells[i + 1][key].ms
            if merged.ms is not None and a is not None and b is not None:
                estimates.append(min(max(a + b - merged.ms, 0.0), min(a, b)))
        return statistics.median(estimates) if estimates else 0.0
