"""A request's life inside the cluster simulator (mutable: the instance model advances it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from router.types import Decision, RouteRequest


@dataclass(slots=True, eq=False)
class SimRequest:
    idx: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    chain: tuple[int, ...]  # block ids of the prompt, in order
    route: RouteRequest
    level: int = 0  # priority: lower is scheduled first (vLLM's priority scheduling)
    decision: Decision | None = None
    instance: int = -1
    ready_s: float = 0.0  # when its tier loads have landed in L1
    loaded_from: dict[int, str] = field(
        default_factory=dict
    )  # block -> "host" | "array" (a `Tier.label`)
    # set on admission
    cached_tokens: int = 0
    cached_by_tier: dict[str, int] = field(default_factory=dict)
    prefill_left: int = 0
    context_done: int = 0  # tokens of KV in place (cached + computed so far)
    matched_blocks: int = 0  # leading chain blocks resident in L1 at admission
    private_blocks: int = 0
    new_blocks: int = 0  # chain blocks reserved for prefill
    admitted: bool = False
    # decode
    output_left: int = 0
    generated: int = 0
    first_token_s: float | None = None
    finish_s: float | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s
