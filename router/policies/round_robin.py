"""round_robin: the plainest baseline. A cursor advances by one on every decision and picks
`candidates[cursor % n]`; the fallbacks are the instances after it in the same rotation.
It ignores cache and load on purpose."""

from __future__ import annotations

from collections.abc import Sequence

from router.policies.base import InstanceView, Policy
from router.policies.scoring import make_decision
from router.types import Decision, RouteRequest


class RoundRobinPolicy(Policy):
    name = "round_robin"
    session_affine = False  # a session-blind baseline

    def __init__(self) -> None:
        self._cursor = 0

    def choose(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> Decision:
        decision = self.preview(request, candidates)
        self._cursor += 1
        return decision

    def preview(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> Decision:
        """The next decision, without advancing the cursor (explain's dry run)."""
        n = len(candidates)
        start = self._cursor % n
        ranked = [candidates[(start + k) % n] for k in range(n)]
        return make_decision(
            request, self.name, f"rotation slot {start} of {n}", ranked, candidates
        )
