"""The values that cross the router's boundary: what a request looks like to a policy and
what a policy decides. Plain dataclasses so the gateway, the cluster simulator and tests
build them the same way."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

from contracts.errors import RoutingError


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """One request as the router sees it."""

    model: str
    block_hashes: Sequence[int]  # chained hashes, one per full block, in prompt order
    block_tokens: int  # tokens per block (approximate mode: an estimate)
    prompt_tokens: int  # the prompt's length in tokens (estimate in approximate mode)
    session_key: str | None = None  # prompt_cache_key, user or X-Session-Id
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class CandidateScore:
    """How one instance looked to the policy: for explanations and tests."""

    instance: str
    cached_tokens_by_tier: dict[str, int]
    in_flight: int
    predicted_ttft_s: float | None = None
    parts: dict[str, float] = field(default_factory=dict)  # e.g. queue_wait_s, load_s, prefill_s
    # what the policy minimised, term by term (lower wins), when it scores more than TTFT
    score_terms: dict[str, float] = field(default_factory=dict)


class LazyCandidates(Sequence[CandidateScore]):
    """A decision's candidate explanations, built on first read. Only explain, failover and
    replica redirects read them, so the hot path of routing never builds them."""

    __slots__ = ("_build", "_items")

    def __init__(self, build: Callable[[], tuple[CandidateScore, ...]]) -> None:
        self._build: Callable[[], tuple[CandidateScore, ...]] | None = build
        self._items: tuple[CandidateScore, ...] = ()

    def _all(self) -> tuple[CandidateScore, ...]:
        if self._build is not None:
            self._items = self._build()
            self._build = None  # drops what the builder held
        return self._items

    @overload
    def __getitem__(self, i: int) -> CandidateScore: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[CandidateScore, ...]: ...
    def __getitem__(self, i: int | slice) -> CandidateScore | tuple[CandidateScore, ...]:
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[CandidateScore]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyCandidates):
            other = other._all()
        return self._all() == other if isinstance(other, tuple) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._all())


@dataclass(frozen=True, slots=True)
class Decision:
    """What a policy chose and why. `fallbacks` are the next instances to try, in order."""

    instance: str
    policy: str
    reason: str
    cached_tokens: int = 0  # predicted cached tokens on the chosen instance, all tiers
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    predicted_ttft_s: float | None = None
    fallbacks: tuple[str, ...] = ()
    candidates: Sequence[CandidateScore] = ()  # a tuple, or `LazyCandidates`
    # what the policy will commit when the request is dispatched, for the instance actually
    # used (its own record; None for a policy that commits nothing, and for explain's dry run)
    pending: object = field(default=None, compare=False, repr=False)


class NoCandidateError(RoutingError):
    """Raised by the router when no instance can take the request."""


def ordered_fallbacks(chosen: str, ranked: Sequence[str]) -> tuple[str, ...]:
    """Every other instance in the order of preference given, the chosen one left out."""
    return tuple(i for i in ranked if i != chosen)
