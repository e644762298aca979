"""least_load: the instance with the fewest requests in flight (all gateway replicas);
a tie goes to the fewest queued prefill tokens, then to the earlier candidate. Fallbacks
are the others in the same order. It ignores the cache on purpose."""

from __future__ import annotations

from collections.abc import Sequence

from router.policies.base import InstanceView, Policy
from router.policies.scoring import make_decision, rank_by_load
from router.types import Decision, RouteRequest


class LeastLoadPolicy(Policy):
    name = "least_load"
    session_affine = False  # a session-blind baseline

    def choose(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> Decision:
        ranked = rank_by_load(candidates)
        best = ranked[0]
        reason = (
            f"least loaded: {best.in_flight} in flight, "
            f"{best.queued_prefill_tokens} queued prefill tokens"
        )
        return make_decision(request, self.name, reason, ranked, candidates)
