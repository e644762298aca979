"""The records the `ttft` policy decides with (router/policies/ttft.py): one candidate as
scored, what a decision commits at dispatch, the near-tie order and a candidate's
explanation."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import xxhash

from router.cost import Prediction
from router.policies.base import InstanceView
from router.types import CandidateScore


@dataclasses.dataclass(slots=True)
class Pending:
    """What a decision commits at dispatch (`Decision.pending`): the arrival's time, the
    most any candidate under the cap had cached (the reuse given up is measured against
    it), each candidate's cached tokens and prediction, and whether the fleet was saturated."""

    now: float
    most: int
    saturated: bool
    cached: dict[str, int]
    predictions: dict[str, Prediction]
    committed: bool = False


@dataclasses.dataclass(slots=True)
class Scored:
    view: InstanceView
    tiers: dict[str, int]
    pred: Prediction
    cached: int
    score: float = 0.0
    imposed_s: float = 0.0
    stall_s: float = 0.0
    reuse_s: float = 0.0
    pushed_out_s: float = 0.0
    arrivals_per_s: float = 0.0  # later arrivals a second at its instance, as imposed_s counts
    recompute_s: float = 0.0  # seconds its instance takes to recompute a token (calibrated)


def tie_key(session: str | None) -> Callable[[Scored], tuple[int, int, int]]:
    """Near-ties: the instance holding more of the prompt, then the one the session key ranks
    highest by rendezvous hashing, then the less loaded."""

    def key(s: Scored) -> tuple[int, int, int]:
        v = s.view
        affinity = xxhash.xxh3_64_intdigest(f"{session}\x00{v.id}".encode()) if session else 0
        return (-v.matched_total(), -affinity, v.in_flight)

    return key


def explain(s: Scored) -> CandidateScore:
    return CandidateScore(
        instance=s.view.id,
        cached_tokens_by_tier=s.tiers,
        in_flight=s.view.in_flight,
        predicted_ttft_s=s.pred.ttft_s,
        parts=s.pred.parts(),
        score_terms={
            "predicted_ttft_s": s.pred.ttft_s,
            "imposed_delay_s": s.imposed_s,
            "streams_stalled_s": s.stall_s,
            "reuse_price_s": s.reuse_s,
            "kv_pushed_out_s": s.pushed_out_s,
            "score": s.score,
        },
    )
