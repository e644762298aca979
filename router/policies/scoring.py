"""Helpers shared by the policies: turning an `InstanceView` into the explanation a
`Decision` carries (cached tokens by tier label, `CandidateScore`) and ranking by load."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from contracts.tiers import Tier
from router.policies.base import InstanceView
from router.types import CandidateScore, Decision, RouteRequest, ordered_fallbacks

_LABELS = tuple(t.label for t in sorted(Tier))  # by tier value


def cached_tokens_by_tier(
    request: RouteRequest, matched_blocks: Mapping[Tier, int]
) -> dict[str, int]:
    """Matched blocks turned into tokens, keyed by `Tier.label`, capped at the whole blocks
    before the prompt's last token: an engine always computes that token, so a prompt of
    exactly k blocks can hit at most k - 1 (vLLM's and sim.engine's
    `(prompt_len - 1) // block_size`)."""
    out: dict[str, int] = {}
    if not matched_blocks:
        return out
    bt = request.block_tokens
    left = max(0, (request.prompt_tokens - 1) // bt * bt) if bt > 0 else 0
    # per candidate per decision: a sort and enum lookups only when tiers mix
    ordered = sorted(matched_blocks) if len(matched_blocks) > 1 else matched_blocks
    for tier in ordered:
        tokens = min(left, matched_blocks[tier] * request.block_tokens)
        if tokens > 0:
            out[_LABELS[tier]] = tokens
            left -= tokens
    return out


def candidate_score(request: RouteRequest, view: InstanceView) -> CandidateScore:
    matched = view.matched_blocks
    return CandidateScore(
        view.id, cached_tokens_by_tier(request, matched) if matched else {}, view.in_flight
    )


def load_key(view: InstanceView) -> tuple[int, int]:
    """Least loaded first: fewest in flight, then fewest queued prefill tokens."""
    return view.in_flight, view.queued_prefill_tokens


def rank_by_load(candidates: Sequence[InstanceView]) -> list[InstanceView]:
    """Candidates least loaded first; ties keep the given order (sorted is stable)."""
    return sorted(candidates, key=load_key)


def make_decision(
    request: RouteRequest,
    policy: str,
    reason: str,
    ranked: Iterable[InstanceView],
    candidates: Sequence[InstanceView],
) -> Decision:
    """The decision for the first of `ranked`, the rest as fallbacks, every candidate scored."""
    order = list(ranked)
    chosen = order[0]
    scores = tuple(candidate_score(request, v) for v in candidates)
    by_tier = next(s.cached_tokens_by_tier for s in scores if s.instance == chosen.id)
    return Decision(
        instance=chosen.id,
        policy=policy,
        reason=reason,
        cached_tokens=sum(by_tier.values()),
        cached_tokens_by_tier=by_tier,
        fallbacks=ordered_fallbacks(chosen.id, [v.id for v in order]),
        candidates=scores,
    )
