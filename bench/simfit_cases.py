"""Which simulated configuration stands for each real gateway of a `bench compare --engines
vllm --scale cpu-overflow --tiers` run, and the simulation of them all (`bench simfit`).

- `warmgate-ttft`: the `ttft` policy, with tierd beside each engine: a host tier of tierd's
  512 MiB (`gateway.launch.tiered.TieredConfig.l1_bytes`) in KV tokens per engine, the shared
  array every save is written to (tierd's connector saves each computed block; the array is
  on disk, unbounded here), loaded by the connector when vLLM admits a request
  (`tier_loads="admission"`, sim.cluster.connector).
- `warmgate-ttft-bare`: `ttft` on the bare engines.
- `smg`, `sglang-router` (both at defaults): `prefix`, the SGLang cache-aware policy
  (router/policies/prefix.py) at its defaults (balance thresholds 64 / 1.5, cache 0.3).
  They differ where both workers hold the matched prefix: smg 1.13 takes the less loaded,
  sglang-router 0.3.2 the same worker every time (`tie_break="order"`; in the real runs it
  sent 77 of 125 and 94 of 109 requests to one engine, repeat after repeat).
- `smg-tuned`, `sglang-router-tuned`: the same with `--balance-abs-threshold 2
  --balance-rel-threshold 1.5`, the tuned peers' flags (bench.peers).
- `round-robin` (engines alone, the measurement's replay): `round_robin` on bare engines.

Both peers route by a tree of what they sent where: no engine tells them what it evicted
(their trees are trimmed by size every 120 s, not within a run). They are simulated with
predict-on-route alone (`routed_tree`: no residency events), so a prefix once sent to a
worker matches there for the rest of the run. What is not modelled: they match characters
of the request's text, not blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sim.cluster.runner import run_policy
from sim.cluster.simulator import ClusterConfig
from sim.traces import TraceRequest

TIERD_HOST_BYTES = 512 * 1024 * 1024  # gateway.launch.tiered.TieredConfig.l1_bytes
ARRAY_TOKENS = 100_000_000  # the array is a directory on disk: nothing is evicted in a run
TUNED = {"balance_abs_threshold": 2, "balance_rel_threshold": 1.5}  # bench.peers' tuned flags
ORDER = {"tie_break": "order"}  # sglang-router 0.3.2: a shared prefix's first tenant


@dataclass(frozen=True, slots=True)
class SimCase:
    policy: str
    tiers: bool = False
    params: dict[str, Any] = field(default_factory=dict)
    routed_tree: bool = False  # the index knows only what was routed, never evictions

    def describe(self) -> str:
        extra = ", ".join(f"{k} {v}" for k, v in self.params.items())
        tiers = " + host tier and array (connector loads)" if self.tiers else ", bare"
        tree = ", routed tree" if self.routed_tree else ""
        return f"`{self.policy}`{tiers}{tree}" + (f" ({extra})" if extra else "")


CASES: dict[str, SimCase] = {
    "warmgate-ttft": SimCase("ttft", tiers=True),
    "warmgate-ttft-bare": SimCase("ttft"),
    "smg": SimCase("prefix", routed_tree=True),
    "sglang-router": SimCase("prefix", params=dict(ORDER), routed_tree=True),
    "smg-tuned": SimCase("prefix", params=dict(TUNED), routed_tree=True),
    "sglang-router-tuned": SimCase("prefix", params={**TUNED, **ORDER}, routed_tree=True),
    "round-robin": SimCase("round_robin"),
}


def fleet_config(
    profile: str,
    kv_capacity_tokens: int,
    kv_bytes_per_token: int,
    block_tokens: int,
    tiers: bool,
    routed_tree: bool = False,
) -> ClusterConfig:
    """Two engines as bench compare starts them, with or without tierd; `routed_tree`: the
    gateway's index is fed by its own routing alone (the peers' trees)."""
    bare = ClusterConfig(
        instances=2,
        block_tokens=block_tokens,
        l1_tokens=kv_capacity_tokens,
        profile=profile,
        residency_events=not routed_tree,
    )
    if not tiers:
        return bare
    return replace(
        bare,
        l2_tokens=TIERD_HOST_BYTES // kv_bytes_per_token,
        array_tokens=ARRAY_TOKENS,
        array_write_through=True,
        tier_loads="admission",
    )


def simulate(
    trace: Sequence[TraceRequest],
    gateways: Sequence[str],
    *,
    profile: str,
    kv_capacity_tokens: int,
    kv_bytes_per_token: int,
    block_tokens: int,
) -> dict[str, dict[str, Any]]:
    """Each gateway's simulated figures (sim.cluster.metrics), its case's run shared."""
    runs: list[tuple[SimCase, dict[str, Any]]] = []  # the simulator is deterministic
    out: dict[str, dict[str, Any]] = {}
    for name in gateways:
        case = CASES.get(name)
        if case is None:
            continue
        figures = next((f for c, f in runs if c == case), None)
        if figures is None:
            config = fleet_config(
                profile,
                kv_capacity_tokens,
                kv_bytes_per_token,
                block_tokens,
                case.tiers,
                case.routed_tree,
            )
            figures = run_policy(trace, config, case.policy, dict(case.params) or None)
            runs.append((case, figures))
        out[name] = {
            "p50": figures["ttft_p50_s"],
            "p90": figures["ttft_p90_s"],
            "p99": figures["ttft_p99_s"],
            "token_hit_rate": figures["token_hit_rate"],
            "requests_by_instance": figures["requests_by_instance"],
            "hit_rate_by_tier": figures["hit_rate_by_tier"],
            "simulated_as": case.describe(),
        }
    return out
