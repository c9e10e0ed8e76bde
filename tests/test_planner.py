"""Planner: the DP's plan equals the brute-force optimum on random small cost tables."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgepilot.dispatch.planning.planner import (
    INF,
    CostTable,
    feasible,
    merge,
    plan_cost,
    prefer_reference,
    prefer_single,
    runner_up,
    solve,
)
from edgepilot.errors import PlanError


def brute_force(table: CostTable) -> tuple[list[int], float]:
    """Exhaustive reference (``len(targets) ** n_layers`` assignments)."""
    best: tuple[list[int], float] = ([], INF)
    for combo in itertools.product(range(len(table.targets)), repeat=table.n_layers):
        assign = list(combo)
        if not feasible(table, assign):
            continue
        cost = plan_cost(table, assign)
        if cost < best[1]:
            best = (assign, cost)
    if best[1] == INF:
        raise PlanError("no feasible plan", field="budgets")
    return best


@st.composite
def tables(draw: st.DrawFn) -> CostTable:
    n = draw(st.integers(1, 6))
    m = draw(st.integers(1, 3))
    cost = st.one_of(st.none(), st.floats(0.0, 10.0, allow_nan=False))
    layer_ms = [[draw(cost) for _ in range(m)] for _ in range(n)]
    enter = [draw(st.floats(0.0, 3.0)) for _ in range(m)]
    hop = [0.0, *[draw(st.floats(0.0, 3.0)) for _ in range(n - 1)]]
    with_memory = draw(st.booleans())
    memory = devices = None
    budgets: dict[str, float] = {}
    if with_memory:
        memory = [[float(draw(st.integers(0, 5))) for _ in range(m)] for _ in range(n)]
        devices = [draw(st.sampled_from(["cpu", "gpu"])) for _ in range(m)]
        budgets = {"cpu": float(draw(st.integers(0, 15)))}
        if draw(st.booleans()):
            budgets["gpu"] = float(draw(st.integers(0, 15)))
    # a measured hop kind may cost less than the copy it replaces (a runtime reading the
    # array in place): negative fixed costs too, clamped at 0 per hop
    pair = [[draw(st.floats(-2.0, 3.0)) for _ in range(m)] for _ in range(m)] \
        if draw(st.booleans()) else None
    return CostTable([f"t{j}" for j in range(m)], layer_ms, enter, hop, memory, devices, budgets,
                     pair)


@settings(max_examples=300, deadline=None)
@given(tables())
def test_dp_equals_brute_force(table: CostTable) -> None:
    try:
        expected = brute_force(table)
    except PlanError:
        with pytest.raises(PlanError):
            solve(table)
        return
    assign, cost = solve(table)
    assert feasible(table, assign)
    assert cost == pytest.approx(expected[1], abs=1e-9)
    assert plan_cost(table, assign) == pytest.approx(cost, abs=1e-9)


def test_transfer_cost_keeps_layers_together() -> None:
    # layer 1 is slightly faster on t1, but the hop there and back costs more than it saves
    table = CostTable(["a", "b"], [[1.0, 2.0], [1.0, 0.9], [1.0, 2.0]],
                      enter_ms=[0.1, 0.1], hop_ms=[0.0, 0.5, 0.5])
    assign, cost = solve(table)
    assert assign == [0, 0, 0]
    assert cost == pytest.approx(3.1)
    assert merge(assign) == [(0, 0, 3)]
    # with free hops the faster target wins layer 1: three segments
    table.hop_ms = [0.0, 0.0, 0.0]
    table.enter_ms = [0.0, 0.0]
    assign, _ = solve(table)
    assert assign == [0, 1, 0]
    assert merge(assign) == [(0, 0, 1), (1, 1, 2), (0, 2, 3)]
    assert runner_up(table, 1, 1) == (0, 1.0)


def test_memory_budget_moves_layers_and_infeasible_is_an_error() -> None:
    table = CostTable(["npu", "cpu"], [[1.0, 5.0], [1.0, 5.0]], [0.0, 0.0], [0.0, 0.0],
                      memory=[[10.0, 10.0], [10.0, 10.0]], devices=["npu", "cpu"],
                      budgets={"npu": 15.0})
    assign, cost = solve(table)
    assert sorted(assign) == [0, 1] and cost == pytest.approx(6.0)
    table.budgets["cpu"] = 5.0
    with pytest.raises(PlanError) as err:
        solve(table)
    assert err.value.field == "budgets"


def test_a_split_must_beat_the_best_single_target_by_the_margin() -> None:
    # two targets that are nearly equal per layer: the DP may alternate, gaining less than the
    # margin, which the noise of a busy board would eat; the whole model on one runtime is kept
    close = CostTable(["a", "b"], [[1.0, 1.02], [1.0, 0.97], [1.0, 1.01]],
                      [0.0, 0.0], [0.0, 0.01, 0.01])
    assign, cost = solve(close)
    assert len(merge(assign)) > 1
    assert prefer_single(close, assign, 0.05) == [0, 0, 0]
    # a split that wins big is kept
    wide = CostTable(["a", "b"], [[1.0, 3.0], [3.0, 1.0], [1.0, 3.0]],
                     [0.0, 0.0], [0.0, 0.01, 0.01])
    assign, cost = solve(wide)
    assert prefer_single(wide, assign, 0.05) == assign == [0, 1, 0]
    assert cost < plan_cost(wide, [0, 0, 0]) * 0.95


def test_a_variant_must_beat_the_reference_alone_by_the_margin() -> None:
    # "b" (a quantized variant) 2% faster than the reference "a" on every layer: the same speed
    # within the noise, so the reference runs it; 20% faster, the variant does
    near = CostTable(["a", "b"], [[1.0, 0.98]] * 3, [0.0, 0.0], [0.0, 0.0, 0.0])
    assert solve(near)[0] == [1, 1, 1]
    assert prefer_reference(near, [1, 1, 1], "a", 0.05) == [0, 0, 0]
    assert prefer_reference(near, [1, 1, 1], "c", 0.05) == [1, 1, 1]  # no such reference here
    far = CostTable(["a", "b"], [[1.0, 0.8]] * 3, [0.0, 0.0], [0.0, 0.0, 0.0])
    assert prefer_reference(far, [1, 1, 1], "a", 0.05) == [1, 1, 1]
    # a split is the split's own decision (prefer_single), not replaced here
    assert prefer_reference(near, [0, 1, 1], "a", 0.05) == [0, 1, 1]


def test_a_twin_of_the_choice_is_no_runner_up() -> None:
    """int4 on a CNN's convolution is the fp32 segment byte for byte (``Cell.same_as``): the
    plan named it as each layer's runner-up at the chosen figure, an alternative it is not."""
    table = CostTable(["fp32", "int4", "one-thread"], [[2.0, 2.0, 3.0]], [0.0], [0.0])
    assert runner_up(table, 0, 0) == (1, 2.0)
    assert runner_up(table, 0, 0, same=[1]) == (2, 3.0)
    assert runner_up(table, 0, 0, same=[1, 2]) is None
