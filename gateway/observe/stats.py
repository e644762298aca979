"""Cluster totals for `/admin/stats`: requests by outcome, predicted vs reported cached
tokens, and TTFT percentiles over a sliding window."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gateway.observe.window import SlidingWindow


class GatewayStats:
    """Counters the admin API reports (Prometheus has its own, cumulative, copies)."""

    def __init__(self, window_s: float, max_samples: int) -> None:
        self.outcomes: Counter[str] = Counter()
        self.predicted_cached_tokens = 0
        self.reported_cached_tokens = 0
        self.reported_prompt_tokens = 0
        self.requests_with_report = 0  # requests whose engine reported cached tokens
        self.predicted_on_reported = 0  # prediction summed over those requests only
        self.failovers = 0
        self.ttft = SlidingWindow(window_s, max_samples)
        self.duration = SlidingWindow(window_s, max_samples)
        self.window_s = window_s

    def record(
        self,
        outcome: str,
        *,
        duration_s: float,
        ttft_s: float | None,
        predicted_cached: int,
        reported_cached: int | None,
        reported_prompt: int | None,
    ) -> None:
        self.outcomes[outcome] += 1
        self.duration.add(duration_s)
        if ttft_s is not None:
            self.ttft.add(ttft_s)
        self.predicted_cached_tokens += predicted_cached
        if reported_cached is not None:
            self.requests_with_report += 1
            self.reported_cached_tokens += reported_cached
            self.predicted_on_reported += predicted_cached
        if reported_prompt is not None:
            self.reported_prompt_tokens += reported_prompt

    def to_dict(self) -> dict[str, Any]:
        def pct(w: SlidingWindow, q: float) -> float | None:
            return w.percentile(q)

        return {
            "requests": {"total": sum(self.outcomes.values()), **dict(self.outcomes)},
            "failovers": self.failovers,
            "cached_tokens": {
                "predicted": self.predicted_cached_tokens,
                "reported": self.reported_cached_tokens,
                "predicted_on_reported_requests": self.predicted_on_reported,
                "requests_with_report": self.requests_with_report,
                "prompt_tokens_reported": self.reported_prompt_tokens,
                "reported_hit_ratio": (
                    self.reported_cached_tokens / self.reported_prompt_tokens
                    if self.reported_prompt_tokens
                    else None
                ),
            },
            "window_s": self.window_s,
            "ttft_s": {
                "samples": len(self.ttft),
                "p50": pct(self.ttft, 0.5),
                "p99": pct(self.ttft, 0.99),
            },
            "duration_s": {
                "samples": len(self.duration),
                "p50": pct(self.duration, 0.5),
                "p99": pct(self.duration, 0.99),
            },
        }
