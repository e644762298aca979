"""Which of the join probe's prompts to send (gateway/fleet/calibration_probe.py; the cluster
simulator's probe, sim/cluster/probe.py, follows the same rule).

A prompt is sent only when it is predicted to finish within what is left of the probe's
budget (`calibration.probe_timeout_s`). A prompt cut off by the timeout is worse than one not
sent: its measurement is lost, and the engine goes on with the prompt's prefill after the
gateway gave up on it (a step in progress is not interrupted), so the first routed requests
wait behind it. Seen on CPU vLLM: a 4,096-token probe prompt at 450 tokens/s outlived the
10 s budget and the first requests of the replay waited 5 s for it.

The prediction is the largest prompt measured so far, scaled linearly to the new size,
times `MARGIN` (attention makes a longer prompt slower than linear). Before any
measurement every prompt is sent: the first is the smallest.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.policies.base import CalibrationSample

MARGIN = 1.5


def predicted_s(samples: Sequence[CalibrationSample], tokens: int) -> float | None:
    """Seconds a cold prompt of `tokens` is predicted to take; None before any sample."""
    measured = [s for s in samples if s.prompt_tokens > 0]
    if not measured:
        return None
    largest = max(measured, key=lambda s: s.prompt_tokens)
    return largest.ttft_s * tokens / largest.prompt_tokens * MARGIN


def fits(
    samples: Sequence[CalibrationSample], tokens: int, elapsed_s: float, budget_s: float
) -> bool:
    """Whether to send a prompt of `tokens`, `elapsed_s` into a probe of `budget_s`."""
    predicted = predicted_s(samples, tokens)
    return predicted is None or elapsed_s + predicted <= budget_s
