"""Choose a target per layer: dynamic programming over the layer chain.

Cost of an assignment ``a``::

    sum_i layer_ms[i][a_i]
  + sum over segment starts i (i == 0 or a_i != a_{i-1}) of enter_ms[a_i] + hop(i, a_{i-1}, a_i)

``enter_ms`` is the per-call overhead of a target (paid once per compiled segment, which is why
merging consecutive layers matters) and ``hop(i, s, t)`` the cost of handing the tensors
crossing cut ``i`` from target ``s`` to target ``t``: ``max(0, hop_ms[i] + pair_ms[s][t])``,
the copy of the bytes crossing plus what that kind of hop was measured to cost beyond it
(``measuring/hops.py``; 0 at the first layer). Memory budgets per device are
exact: labels at each DP state keep the Pareto front of (cost, memory used per budgeted device),
so the result equals the brute-force optimum (property-tested).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from edgepilot.errors import PlanError

INF = float("inf")


@dataclass
class CostTable:
    """Everything the planner needs; indices are layers ``i`` and target positions ``t``."""

    targets: list[str]
    layer_ms: list[list[float | None]]          # None: not eligible (unsupported / too lossy)
    enter_ms: list[float]
    hop_ms: list[float]
    memory: list[list[float]] | None = None     # bytes of layer i on target t
    devices: list[str] | None = None            # physical device of each target
    budgets: dict[str, float] = field(default_factory=dict)
    pair_ms: list[list[float]] | None = None    # measured fixed cost of a hop from s to t

    @property
    def n_layers(self) -> int:
        return len(self.layer_ms)

    def hop(self, i: int, s: int, t: int) -> float:
        """What handing cut ``i``'s tensors from target ``s`` to target ``t`` costs."""
        if i == 0 or s == t:
            return 0.0
        fixed = self.pair_ms[s][t] if self.pair_ms is not None else 0.0
        return max(0.0, self.hop_ms[i] + fixed)


def plan_cost(table: CostTable, assign: list[int]) -> float:
    """Predicted total ms of ``assign`` (inf when a layer is not eligible on its target)."""
    total = 0.0
    for i, t in enumerate(assign):
        c = table.layer_ms[i][t]
        if c is None:
            return INF
        total += c
        if i == 0 or assign[i - 1] != t:
            total += table.enter_ms[t] + (table.hop(i, assign[i - 1], t) if i else 0.0)
    return total


def memory_use(table: CostTable, assign: list[int]) -> dict[str, float]:
    use: dict[str, float] = {}
    if table.memory is None or table.devices is None:
        return use
    for i, t in enumerate(assign):
        dev = table.devices[t]
        use[dev] = use.get(dev, 0.0) + table.memory[i][t]
    return use


def feasible(table: CostTable, assign: list[int]) -> bool:
    use = memory_use(table, assign)
    return all(use.get(d, 0.0) <= b for d, b in table.budgets.items())


@dataclass
class _Label:
    cost: float
    mem: tuple[float, ...]
    t: int
    parent: _Label | None


def _dominated(a: _Label, b: _Label) -> bool:
    """True when ``b`` is at least as good as ``a`` in cost and every memory coordinate."""
    return b.cost <= a.cost and all(y <= x for x, y in zip(a.mem, b.mem, strict=True))


def solve(table: CostTable) -> tuple[list[int], float]:
    """The cheapest feasible assignment and its cost; PlanError when none exists."""
    n, m = table.n_layers, len(table.targets)
    if n == 0:
        raise PlanError("nothing to plan: the model has no layers", field="model")
    budgeted = sorted(table.budgets) if table.memory is not None and table.devices else []

    def mem_after(mem: tuple[float, ...], i: int, t: int) -> tuple[float, ...] | None:
        if not budgeted:
            return ()
        assert table.memory is not None and table.devices is not None
        dev = table.devices[t]
        out = list(mem)
        if dev in budgeted:
            k = budgeted.index(dev)
            out[k] += table.memory[i][t]
            if out[k] > table.budgets[dev]:
                return None
        return tuple(out)

    zero = tuple(0.0 for _ in budgeted)
    front: list[list[_Label]] = [[] for _ in range(m)]
    for t in range(m):
        c = table.layer_ms[0][t]
        mem = mem_after(zero, 0, t)
        if c is not None and mem is not None:
            front[t] = [_Label(c + table.enter_ms[t], mem, t, None)]
    for i in range(1, n):
        nxt: list[list[_Label]] = [[] for _ in range(m)]
        for t in range(m):
            c = table.layer_ms[i][t]
            if c is None:
                continue
            cands: list[_Label] = []
            for s in range(m):
                step = c if s == t else c + table.enter_ms[t] + table.hop(i, s, t)
                for lab in front[s]:
                    mem = mem_after(lab.mem, i, t)
                    if mem is not None:
                        cands.append(_Label(lab.cost + step, mem, t, lab))
            nxt[t] = _pareto(cands)
        front = nxt
    finals = [lab for labs in front for lab in labs]
    if not finals:
        raise PlanError("no plan fits: every assignment breaks a memory budget or uses a "
                        "target not eligible for some layer; raise the budget or the tolerance",
                        field="budgets")
    best = min(finals, key=lambda lab: lab.cost)
    assign: list[int] = []
    node: _Label | None = best
    while node is not None:
        assign.append(node.t)
        node = node.parent
    assign.reverse()
    return assign, best.cost


def _pareto(labels: list[_Label]) -> list[_Label]:
    labels.sort(key=lambda lab: (lab.cost, lab.mem))
    kept: list[_Label] = []
    for lab in labels:
        if not any(_dominated(lab, k) for k in kept):
            kept.append(lab)
    return kept


def merge(assign: list[int]) -> list[tuple[int, int, int]]:
    """Runs of one target: ``[(target, start, end)]`` with ``end`` exclusive."""
    runs: list[tuple[int, int, int]] = []
    for i, t in enumerate(assign):
        if runs and runs[-1][0] == t:
            runs[-1] = (t, runs[-1][1], i + 1)
        else:
            runs.append((t, i, i + 1))
    return runs


def runner_up(table: CostTable, i: int, chosen: int, same: Collection[int] = ()
              ) -> tuple[int, float] | None:
    """The cheapest other eligible target for layer ``i`` and its layer cost (``same``: the
    targets that run the chosen one's very computation, its twins: no alternative)."""
    options = [(c, t) for t, c in enumerate(table.layer_ms[i])
               if c is not None and t != chosen and t not in same]
    if not options:
        return None
    c, t = min(options)
    return t, c


def prefer_single(table: CostTable, assign: list[int], margin: float) -> list[int]:
    """Keep a multi-target ``assign`` only when it is predicted to beat the best single-target
    plan by more than ``margin`` (a fraction); otherwise return that single-target plan.

    A split pays hops whose cost is measured on a noisy board, while an all-one-target plan is
    exactly the whole model on that runtime: a split predicted to win by less than the noise is
    more likely to lose than to win.
    """
    if len(merge(assign)) <= 1:
        return assign
    n = table.n_layers
    singles = [[t] * n for t in range(len(table.targets))]
    singles = [s for s in singles if feasible(table, s) and plan_cost(table, s) < INF]
    if not singles:
        return assign
    best = min(singles, key=lambda s: plan_cost(table, s))
    if plan_cost(table, assign) < plan_cost(table, best) * (1.0 - margin):
        return assign
    return best


def prefer_reference(table: CostTable, assign: list[int], reference: str,
                     margin: float) -> list[int]:
    """The reference target alone instead of another single target predicted to beat it by no
    more than ``margin``: the same speed within the noise, without a variant's error (and
    without its quantization on every board of the kind that adopts the plan). A split, or a
    variant faster beyond the margin, is kept."""
    if reference not in table.targets or len(merge(assign)) != 1:
        return assign
    ref = [table.targets.index(reference)] * table.n_layers
    if ref == assign or not feasible(table, ref):
        return assign
    ref_cost = plan_cost(table, ref)
    return ref if ref_cost < INF and ref_cost <= plan_cost(table, assign) * (1.0 + margin) \
        else assign
