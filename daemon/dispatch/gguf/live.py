"""GGUF plans checked against live serving: the pure part (no llama.cpp, no clocks).

A GGUF plan picks a thread count from a short, quiet measurement. Serving is not that
measurement: the daemon's own HTTP work and the other models share the cores, and a choice
that was close, or measured in noisy rounds, can be wrong on real traffic. So after a plan is
made, :func:`trial_reason` says whether the runner-up deserves a trial; :class:`LiveTrial`
then alternates the next requests between the chosen and the runner-up thread count, compares
the decode speed each observed (median ms per token), and names the one that serves faster.
:class:`LiveStats` keeps what serving observed per thread count for the plan JSON, and says
when the chosen count drifts from its prediction (which starts a trial too).

Only thread counts are tried live: switching them is one llama.cpp call between requests,
while another ``n_gpu_layers`` would mean reloading the model.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from edgepilot.dispatch.gguf.select import Measurement

# the runner-up's reference request within this fraction of the chosen one's: "close"
CLOSE_MARGIN = 0.15
# rounds whose decode times spread (IQR / median) more than this: "noisy"
NOISY_SPREAD = 0.10
# observed requests per candidate before a trial decides
TRIAL_REQUESTS = 3
# a request that decoded fewer tokens says too little about decode speed to count
MIN_TOKENS = 8
# the runner-up replaces the choice only when it serves faster by more than this
KEEP_MARGIN = 0.02
# live decode slower than predicted by more than this (after MIN_OBSERVED requests): drift.
# Serving always decodes a little slower than the measurement (sampling, detokenizing and
# streaming ride on each token: 10-25% here), so only a larger gap says the choice is off.
DRIFT = 0.5
MIN_OBSERVED = 3


def trial_reason(chosen: Measurement, runner_up: Measurement | None, prompt_tokens: int,
                 decode_tokens: int) -> str | None:
    """Why the runner-up should be tried on live traffic (None: the choice is clear).

    Only a runner-up with the same ``n_gpu_layers`` qualifies (threads switch without a
    reload). It is tried when its reference request was within :data:`CLOSE_MARGIN` of the
    chosen one, or when either measurement's rounds spread more than :data:`NOISY_SPREAD`.
    """
    if runner_up is None or runner_up.n_gpu_layers != chosen.n_gpu_layers \
            or runner_up.n_threads == chosen.n_threads:
        return None
    a = chosen.request_ms(prompt_tokens, decode_tokens)
    b = runner_up.request_ms(prompt_tokens, decode_tokens)
    if a is None or b is None:
        return None
    if b <= a * (1 + CLOSE_MARGIN):
        return (f"runner-up {runner_up.n_threads} threads within {CLOSE_MARGIN:.0%} of the "
                f"choice ({b:.1f} vs {a:.1f} ms per reference request)")
    noisy = [m for m in (chosen, runner_up) if (m.decode_spread or 0.0) > NOISY_SPREAD]
    if noisy:
        worst = max(noisy, key=lambda m: m.decode_spread or 0.0)
        return (f"noisy measurement ({worst.n_threads} threads: decode spread "
                f"{worst.decode_spread:.0%} over {worst.rounds} rounds)")
    return None


@dataclass
class LiveTrial:
    """Alternate requests between two thread counts; decide by observed decode speed."""

    chosen: int
    runner_up: int
    reason: str
    requests: int = TRIAL_REQUESTS
    min_tokens: int = MIN_TOKENS
    keep_margin: float = KEEP_MARGIN
    samples: dict[int, list[float]] = field(default_factory=dict)
    winner: int | None = None

    def __post_init__(self) -> None:
        self.samples = {self.chosen: [], self.runner_up: []}

    @property
    def done(self) -> bool:
        return self.winner is not None

    def next_threads(self) -> int:
        """The thread count the next request runs with: the one with fewer counted requests
        (the chosen one first), so the two alternate and share the same conditions."""
        if self.winner is not None:
            return self.winner
        a, b = len(self.samples[self.chosen]), len(self.samples[self.runner_up])
        return self.runner_up if b < a else self.chosen

    def observe(self, n_threads: int, decode_ms_per_token: float, tokens: int) -> int | None:
        """Count one request; returns the winner once both have :attr:`requests` requests.

        Requests with other thread counts, fewer than :attr:`min_tokens` decoded tokens or no
        time are ignored (they would be noise, not evidence)."""
        if (self.winner is not None or n_threads not in self.samples
                or tokens < self.min_tokens or decode_ms_per_token <= 0):
            return None
        self.samples[n_threads].append(decode_ms_per_token)
        if min(len(v) for v in self.samples.values()) < self.requests:
            return None
        chosen_ms = statistics.median(self.samples[self.chosen])
        runner_ms = statistics.median(self.samples[self.runner_up])
        faster = runner_ms < chosen_ms * (1 - self.keep_margin)
        self.winner = self.runner_up if faster else self.chosen
        return self.winner

    def as_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "runner_up": self.runner_up, "reason": self.reason,
                "requests_each": self.requests, "winner": self.winner,
                "observed_ms": {str(t): [round(x, 4) for x in v]
                                for t, v in self.samples.items()}}


@dataclass
class LiveStats:
    """Decode speed serving observed, per thread count (the last ``keep`` requests)."""

    keep: int = 16
    min_tokens: int = MIN_TOKENS
    seen: dict[int, deque[float]] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)

    def observe(self, n_threads: int, decode_ms_per_token: float, tokens: int) -> None:
        if tokens < self.min_tokens or decode_ms_per_token <= 0:
            return
        self.seen.setdefault(n_threads, deque(maxlen=self.keep)).append(decode_ms_per_token)
        self.counts[n_threads] = self.counts.get(n_threads, 0) + 1

    def median_ms(self, n_threads: int) -> float | None:
        values = self.seen.get(n_threads)
        return statistics.median(values) if values else None

    def drifted(self, n_threads: int, predicted_ms: float) -> float | None:
        """Observed / predicted when serving decodes slower than :data:`DRIFT` beyond the
        prediction after :data:`MIN_OBSERVED` requests; else None."""
        values = self.seen.get(n_threads)
        if not values or len(values) < MIN_OBSERVED or predicted_ms <= 0:
            return None
        ratio = statistics.median(values) / predicted_ms
        return ratio if ratio > 1 + DRIFT else None

    def as_dict(self) -> dict[str, Any]:
        return {str(t): {"decode_ms_per_token": round(statistics.median(v), 4),
                         "decode_tokens_per_s": round(1e3 / statistics.median(v), 1),
                         "requests": self.counts.get(t, 0)}
                for t, v in sorted(self.seen.items())}
