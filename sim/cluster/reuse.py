"""The workload's reusable maximum (issue 24, item 4d): the share of prompt tokens that some
earlier request had already computed, as a prefix cache could reuse them. It is the token
hit rate of one infinite cache that has seen every earlier request: the most any cache (any
policy, any number of instances, unlimited memory) can reach on that workload, and what
each policy's cached share is measured against.

A request's reusable tokens are the leading blocks of its chain that an earlier request's
chain held (a prefix cache reuses only a leading run), capped at its prompt length. Requests
are taken in arrival order; requests arriving at the same moment are taken in the order
given (the first of two identical prompts computes, the second reuses).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from router.errors import BlockSizeError


def reusable_by_request(
    requests: Iterable[tuple[Sequence[int], int]], block_tokens: int
) -> list[int]:
    """Each request's reusable prompt tokens, over `(block chain, prompt tokens)` pairs in
    arrival order."""
    if block_tokens <= 0:
        raise BlockSizeError("block_tokens must be positive")
    seen: set[int] = set()
    out: list[int] = []
    for chain, prompt_tokens in requests:
        m = 0
        for h in chain:
            if h not in seen:
                break
            m += 1
        out.append(min(m * block_tokens, prompt_tokens))
        seen.update(chain)
    return out


def reusable_tokens(
    requests: Iterable[tuple[Sequence[int], int]], block_tokens: int
) -> tuple[int, int]:
    """(reusable, total) prompt tokens over `(block chain, prompt tokens)` pairs in arrival
    order."""
    pairs = list(requests)
    return sum(reusable_by_request(pairs, block_tokens)), sum(n for _, n in pairs)


def reusable_share(requests: Iterable[tuple[Sequence[int], int]], block_tokens: int) -> float:
    """The reusable maximum as a share of all prompt tokens (0 for no tokens)."""
    reusable, total = reusable_tokens(requests, block_tokens)
    return reusable / total if total else 0.0


def share_of_reusable(cached_share: float, reusable: float) -> float | None:
    """How close a cached share gets to the reusable maximum (None: nothing was reusable)."""
    return cached_share / reusable if reusable > 0 else None
