"""Roofline cost model: fitting, frequency scaling, leave-one-out accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from edgepilot.dispatch.planning.costmodel import (
    Roofline,
    Sample,
    fit,
    fit_linear,
    leave_one_out,
    leave_one_out_linear,
    op_class,
)


def synthetic(truth: Roofline, n: int = 24, noise: float = 0.0, seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        flops = float(10 ** rng.uniform(5, 9))
        nbytes = float(10 ** rng.uniform(4, 7))
        ms = truth.predict(flops, nbytes) * (1 + noise * rng.standard_normal())
        out.append(Sample(flops, nbytes, ms))
    return out


def test_fit_recovers_a_roofline() -> None:
    truth = Roofline(compute=2e7, bandwidth=5e6, overhead=0.01)
    model = fit(synthetic(truth))
    for s in synthetic(truth, seed=1):
        assert model.predict(s.flops, s.bytes) == pytest.approx(s.ms, rel=0.05)


def test_leave_one_out_on_noisy_measurements() -> None:
    truth = Roofline(compute=1e7, bandwidth=1e7, overhead=0.02)
    hits, count, errors = leave_one_out(synthetic(truth, noise=0.03))
    assert count == 24 and len(errors) == 24
    assert hits / count >= 0.9
    assert leave_one_out(synthetic(truth, n=2)) == (0, 0, [])


def test_frequency_scales_only_the_compute_roof() -> None:
    model = Roofline(compute=1e7, bandwidth=1e7, overhead=0.0, fit_freq_khz=2_000_000)
    # compute bound: half the clock, twice the time
    assert model.predict(1e8, 1e3, freq_khz=1_000_000) == pytest.approx(
        2 * model.predict(1e8, 1e3))
    # memory bound: clocks do not matter
    assert model.predict(1e3, 1e8, freq_khz=1_000_000) == pytest.approx(model.predict(1e3, 1e8))
    assert Roofline.from_dict(model.as_dict()) == model


def test_fit_needs_samples() -> None:
    with pytest.raises(ValueError):
        fit([])


def linear_samples(n: int = 16, noise: float = 0.0, seed: int = 0) -> list[Sample]:
    """Layers whose time is overhead + FLOPs + activation bytes (no node term)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        flops, act = float(10 ** rng.uniform(6, 8)), float(10 ** rng.uniform(4, 6))
        ms = (0.01 + flops / 2e8 + act / 5e7) * (1 + noise * rng.standard_normal())
        out.append(Sample(flops, act, ms, act_bytes=act, nodes=float(rng.integers(1, 9))))
    return out


def test_linear_fit_recovers_activation_term_and_predicts_new_layers() -> None:
    model = fit_linear(linear_samples())
    assert "act_bytes" in model.terms
    for s in linear_samples(seed=1):
        assert model.predict(s) == pytest.approx(s.ms, rel=0.02)
    assert all(c >= 0 for c in model.coef)


def test_linear_leave_one_out_never_sees_the_held_out_layer() -> None:
    hits, count, _ = leave_one_out_linear(linear_samples(noise=0.02))
    assert count == 16 and hits / count >= 0.9
    # an outlier layer cannot predict itself: its own error stays large
    odd = [*linear_samples(n=8), Sample(1e7, 1e5, 50.0, act_bytes=1e5, nodes=1.0)]
    _, _, errs = leave_one_out_linear(odd)
    assert abs(errs[-1]) > 0.9


def test_op_class() -> None:
    assert op_class(["Conv", "Relu"]) == "conv"
    assert op_class(["MatMulInteger", "Add"]) == "gemm"
    assert op_class(["Softmax"]) == "other"
