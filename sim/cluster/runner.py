"""Run one policy over a trace in the cluster simulator, with the policy built from the
router's registry and given what a deployment would give it: the instances' KV capacity (for
`ttft`) and the simulated clock (for policies that keep time).

The `ttft` cost model starts from its generic prior (`router.cost.CostParams()`, which
states its source), as in a deployment, and calibrates online; `prior="oracle"` hands it
the simulated profile itself instead (the physics the simulator charges), an upper bound
on what a prior can give, and what the figures in bench/results/ before issue 14 used.

`probe=True` (the default, as the gateway's `calibration.probe` is) measures every instance
with the gateway's join probe before the trace starts (`sim.cluster.probe`) and hands the
samples to the policy's `calibrate` hook, so `ttft` starts from its generic prior *and* the
probe, as a deployment now does; `probe=False` is the prior alone (the figures before the
probe existed).

`hints` (sim.cluster.hints) runs the simulated gateway acting on the game server's hints the
trace carries, and adds their figures (sim.cluster.hint_metrics) under `hints`; None (the
default) is the plain run, unchanged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from router.cost import CostParams
from router.policies.registry import default_registry
from sim.cluster.hint_metrics import hint_figures
from sim.cluster.hints import HintedSimulator, HintSettings
from sim.cluster.metrics import summarise
from sim.cluster.probe import probe_samples
from sim.cluster.simulator import ClusterConfig, ClusterSimulator, SimClock
from sim.profiles import Profile, get_profile
from sim.traces import TraceRequest

Prior = Literal["generic", "oracle"]  # where ttft's cost model starts


def cost_params(profile: Profile) -> CostParams:
    """The `ttft` cost model's starting point, taken from a timing profile."""
    return CostParams(
        prefill_overhead_s=profile.prefill_overhead_s,
        prefill_per_token_s=profile.prefill_per_token_s,
        prefill_attention_s=profile.prefill_attention_s,
        step_base_s=profile.step_base_s,
        step_per_seq_s=profile.step_per_seq_s,
        step_per_kv_token_s=profile.step_per_kv_token_s,
        max_batch_tokens=profile.max_batch_tokens,
        kv_bytes_per_token=profile.kv_bytes_per_token,
        bandwidths={tier.label: bps for tier, bps in profile.bandwidths.items()},
    )


def run_policy(
    trace: Sequence[TraceRequest],
    config: ClusterConfig,
    policy: str,
    policy_params: dict[str, Any] | None = None,
    *,
    prior: Prior = "generic",
    probe: bool = True,
    hints: HintSettings | None = None,
    bumps_s: Sequence[float] = (),
    bump_window_s: float = 0.0,
) -> dict[str, Any]:
    """Simulate `trace` under `policy`; returns the figures of `metrics.summarise`."""
    clock = SimClock()
    params: dict[str, Any] = dict(policy_params or {})
    if policy == "ttft":
        if prior == "oracle":
            params.setdefault("params", cost_params(get_profile(config.profile)))
        params.setdefault("clock", clock)
        # what a deployment reads from its engines' cache_config_info: HBM KV per instance
        params.setdefault("kv_capacity_tokens", config.l1_tokens)
        # and its engines' running-sequence cap (vLLM's --max-num-seqs, its launch flag)
        params.setdefault("max_num_seqs", get_profile(config.profile).max_num_seqs)
    registry = default_registry()
    built = registry.create(policy, **params)
    hinted = HintedSimulator(config, built, clock, hints=hints) if hints and hints.any else None
    sim = hinted or ClusterSimulator(config, built, clock)
    if probe:  # the join probe, before any request (policies without the hook ignore it)
        samples = probe_samples(sim.profile)
        for name in sim.names:
            built.calibrate(name, samples)
    record = sim.run(trace)
    summary = summarise(policy, record)
    # policies that explain their own state (ttft: calibration, prices) do so in the router's
    policy_stats = record.router_stats.get("policy_stats")
    if policy_stats is not None:
        summary["policy_stats"] = policy_stats
    if hints is not None:
        scale = 1.0 / config.rate_scale
        summary["hints"] = hint_figures(
            trace,
            record.requests,
            hinted,
            block_tokens=config.block_tokens,
            bumps_s=[b * scale for b in bumps_s],
            bump_window_s=bump_window_s * scale,
        )
    return summary
