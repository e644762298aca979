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

from gateway.config.settings import CalibrationSettings
from gateway.fleet import probe_plan
from router.policies.base import CalibrationSample
from sim.cluster.floor import lone_ttft_s
from sim.profiles import Profile

_DEFAULTS = CalibrationSettings()
PROBE_TOKENS = tuple(_DEFAULTS.probe_tokens)  # the gateway's default `calibration.probe_tokens`
PROBE_BUDGET_S = _DEFAULTS.probe_timeout_s  # and `calibration.probe_timeout_s`


def probe_ttft(profile: Profile, tokens: int) -> float:
    """Seconds to the first token of a lone cold prompt of `tokens` on an idle instance."""
    return lone_ttft_s(profile, tokens)


def probe_samples(
    profile: Profile, sizes: Sequence[int] = PROBE_TOKENS, budget_s: float = PROBE_BUDGET_S
) -> list[CalibrationSample]:
    """The probe's samples, sent as the gateway sends them: a prompt predicted to run past
    the budget is skipped (gateway.fleet.probe_plan)."""
    samples: list[CalibrationSample] = []
    elapsed = 0.0
    for n in (n for n in sizes if n > 0):
        if not probe_plan.fits(samples, n, elapsed, budget_s):
            continue
        ttft = probe_ttft(profile, n)
        elapsed += ttft
        if elapsed > budget_s:  # the gateway's timeout: this one is lost, and the rest
            break
        samples.append(CalibrationSample(n, ttft))
    return samples
