"""bench.simfit_seeds: the overflow workload of a seed in the simulator on the fitted CPU
profile. Seed 103 is the one where two real engines with tierd got 106 and 23 requests: the
simulator shows the same starvation under `ttft` at its default and none with the guard's
prior band (router/policies/ttft_guard.py, `unearned_band`)."""

from __future__ import annotations

import pytest

from bench.simfit_seeds import parse_runs, simulate


def test_runs_parse_with_their_variants_and_refuse_unknown_ones() -> None:
    runs = parse_runs("ttft, ttft:prior,prefix")
    assert [(label, policy) for label, policy, _ in runs] == [
        ("ttft", "ttft"),
        ("ttft:prior", "ttft"),
        ("prefix", "prefix"),
    ]
    assert runs[1][2] == {"unearned_band": "prior"}
    with pytest.raises(ValueError, match="unknown variant 'prefix:prior'"):
        parse_runs("prefix:prior")
    with pytest.raises(ValueError, match="no runs"):
        parse_runs(" , ")


def test_seed_103_starves_an_engine_unless_unearned_instances_get_a_band() -> None:
    out = simulate([103], "ttft,ttft:prior", tiers=True)["103"]
    starved = min(out["ttft"]["requests_by_instance"])
    shared = min(out["ttft:prior"]["requests_by_instance"])
    assert starved < 0.2 * sum(out["ttft"]["requests_by_instance"])
    assert shared > 0.4 * sum(out["ttft:prior"]["requests_by_instance"])
    assert out["ttft:prior"]["p50"] < out["ttft"]["p50"]
