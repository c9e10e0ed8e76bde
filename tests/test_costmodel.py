"""Roofline cost model: fitting, frequency scaling, leave-one-out accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from edgepilot.dispatch.costmodel import Roofline, Sample, fit, leave_one_out


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
