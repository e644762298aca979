"""prefix: the cache_aware policy of the SGLang model gateway (sgl-router / smg), faithfully.

Algorithm (PROTOCOLS §3), load = requests in flight at the router:
1. If the load is imbalanced, i.e. `max_load - min_load > balance_abs_threshold` AND
   `max_load > min_load * balance_rel_threshold`, pick the least loaded instance.
2. Else, with `match_rate = matched blocks / request blocks` per instance, if the best
   `match_rate > cache_threshold`, pick the best-matching instance.
3. Else pick the least loaded instance (later SMG), or with `fallback="smallest_tree"` the
   instance that holds the fewest blocks (the original sgl-router).

SMG's tree per worker is what it routed there (our predict-on-route HBM entries); blocks the
instance itself holds in host memory or snapshots (known from events) count as matched
too, while the shared array does not, as it is equally reachable from everyone
(`count_tiers` changes that).
Ties among the best-matching instances (`tie_break`): "load", the least loaded first (then
fewer queued prefill tokens), then candidate order, as smg 1.13 splits a prefix both hold;
"order", candidate order alone, as sglang-router 0.3.2 does: its tree answers with one
tenant of the deepest matched node, the first in its map's order, the same one every time,
so a prefix every worker holds (a game's world state) keeps going to one worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from contracts.tiers import Tier
from router.errors import PolicyConfigError
from router.policies.base import InstanceView, Policy
from router.policies.scoring import load_key, make_decision, rank_by_load
from router.types import Decision, RouteRequest

DEFAULT_COUNT_TIERS = (Tier.HBM, Tier.HOST, Tier.SNAPSHOT)


class PrefixPolicy(Policy):
    name = "prefix"

    def __init__(
        self,
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        fallback: str = "least_load",
        count_tiers: Iterable[Tier] = DEFAULT_COUNT_TIERS,
        tie_break: str = "load",
    ) -> None:
        if fallback not in ("least_load", "smallest_tree"):
            raise PolicyConfigError("fallback must be 'least_load' or 'smallest_tree'")
        if tie_break not in ("load", "order"):
            raise PolicyConfigError("tie_break must be 'load' or 'order'")
        self.tie_break = tie_break
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.fallback = fallback
        self.count_tiers = frozenset(count_tiers)

    def _matched(self, view: InstanceView) -> int:
        if not view.matched_blocks:
            return 0
        return sum(n for t, n in view.matched_blocks.items() if t in self.count_tiers)

    def choose(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> Decision:
        ranked, reason = self.rank(request, candidates)
        return make_decision(request, self.name, reason, ranked, candidates)

    def target(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> str:
        """The instance `choose` would pick, without building its decision (ttft's guard)."""
        return self.rank(request, candidates)[0][0].id

    def rank(
        self, request: RouteRequest, candidates: Sequence[InstanceView]
    ) -> tuple[list[InstanceView], str]:
        """The candidates in the order `choose` ranks them (its choice first), and why."""
        loads = [v.in_flight for v in candidates]
        max_load, min_load = max(loads), min(loads)
        if (
            max_load - min_load > self.balance_abs_threshold
            and max_load > min_load * self.balance_rel_threshold
        ):
            reason = f"imbalanced load (max {max_load}, min {min_load}): least loaded"
            return rank_by_load(candidates), reason

        total = len(request.block_hashes)
        matched = {v.id: self._matched(v) for v in candidates}
        if self.tie_break == "order":  # a stable sort keeps candidate order among equals
            ranked = sorted(candidates, key=lambda v: -matched[v.id])
        else:
            ranked = sorted(candidates, key=lambda v: (-matched[v.id], load_key(v)))
        best = ranked[0]
        rate = matched[best.id] / total if total else 0.0
        if rate > self.cache_threshold:
            return ranked, f"match rate {rate:.3f} > {self.cache_threshold}: best match"

        if self.fallback == "smallest_tree":
            ranked = sorted(candidates, key=lambda v: (v.cached_blocks_total, load_key(v)))
            return ranked, f"match rate {rate:.3f} <= {self.cache_threshold}: smallest tree"
        reason = f"match rate {rate:.3f} <= {self.cache_threshold}: least loaded"
        return rank_by_load(candidates), reason
