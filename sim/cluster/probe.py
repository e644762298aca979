"""The gateway's join probe in the cluster simulator (gateway/fleet/calibration_probe.py):
before the trace starts, each instance is measured on cold prompts of `PROBE_TOKENS`
sizes, as the gateway measures an instance that joins, and the samples go to the policy's
`calibrate` hook. The probe runs on an idle instance with nothing cached, so its TTFT is
what the instance's scheduler charges a lone cold prompt: chunked prefill of
`max_batch_tokens` a step, each step `prefill_seconds(chunk, context so far)` (no decode
batch to share steps with). It costs the trace nothing: the fleet is probed before traffic
arrives. Unlike a real probe it has no network time or noise in it."""

from __future__ import annotations

from collections.abc import Sequence

from router.policies.base import CalibrationSample
from sim.profiles import Profile

PROBE_TOKENS = (256, 1024, 4096)  # the gateway's default `calibration.probe_tokens`


def probe_ttft(profile: Profile, tokens: int) -> float:
    """Seconds to the first token of a lone cold prompt of `tokens` on an idle instance."""
    done = 0
    ttft = 0.0
    budget = max(1, profile.max_batch_tokens)
    while done < tokens:
        chunk = min(budget, tokens - done)
        ttft += profile.prefill_seconds(chunk, done)
        done += chunk
    return ttft


def probe_samples(profile: Profile, sizes: Sequence[int] = PROBE_TOKENS) -> list[CalibrationSample]:
    return [CalibrationSample(n, probe_ttft(profile, n)) for n in sizes if n > 0]
