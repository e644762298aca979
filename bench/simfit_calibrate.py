"""The busy engines' speed, from the engines alone under a real workload (`bench simfit`).

Lone prompts (the join probe's, `bench.simfit_measure`'s `cold` and `cached`) price an idle
engine. Two engines computing at once, with their API servers, the gateway and tierd on the
same two cores, are slower by a factor (`Profile.shared_core_slowdown`, sim.cluster.cores);
six paired prompts (`paired`) measure it too noisily on a shared machine (1.18 and 1.50 in
two measurements ten minutes apart). The measurement's `replay` sends a game workload of
another seed than the one compared (126 requests over 90 s) straight to the two engines in
turn: the factor is the one with which the simulator's `round_robin` on bare engines gives
that replay's mean TTFT. It is fitted on that replay alone, never on a gateway's run.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

from router.policies.registry import default_registry
from sim.cluster.simulator import ClusterConfig, ClusterSimulator
from sim.fit import FitInputError
from sim.profiles import Profile
from sim.traces import TraceRequest

SLOWDOWN_RANGE = (1.0, 4.0)


def bisect_increasing(
    f: Callable[[float], float], target: float, lo: float, hi: float, iters: int = 24
) -> float:
    """x in [lo, hi] with f(x) = target, for an f that does not fall; an end when the
    target lies beyond it."""
    if not lo < hi:
        raise FitInputError(f"want lo < hi, got {lo}, {hi}")
    if f(lo) >= target:
        return lo
    if f(hi) <= target:
        return hi
    for _ in range(iters):
        mid = (lo + hi) / 2.0
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def replay_mean_ttft(profile: Profile, trace: Sequence[TraceRequest], block_tokens: int) -> float:
    """The simulated mean TTFT of the replay: round robin over two bare engines."""
    config = ClusterConfig(
        instances=2, block_tokens=block_tokens, l1_tokens=profile.kv_capacity_tokens
    )
    policy = default_registry().create("round_robin")
    record = ClusterSimulator(config, policy, profile=profile).run(trace)
    return statistics.mean(r.ttft_s or 0.0 for r in record.requests)


def busy_slowdown(
    profile: Profile, trace: Sequence[TraceRequest], real_mean_ttft_s: float, block_tokens: int
) -> float:
    """The shared-core slowdown with which the simulated replay's mean TTFT is the real one."""

    def mean_at(x: float) -> float:
        return replay_mean_ttft(replace(profile, shared_core_slowdown=x), trace, block_tokens)

    return bisect_increasing(mean_at, real_mean_ttft_s, *SLOWDOWN_RANGE)
