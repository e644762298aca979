"""The workload's TTFT floor (issue 24, item 4): what no router can beat.

A request's floor is its time to first token were it alone on an idle instance that holds
every block any earlier request computed: the prefill of what the reusable maximum
(`sim.cluster.reuse`) leaves uncached, in chunks of the step's token budget, each step
`prefill_seconds(chunk, context so far)` as the instance charges it. Under any policy, any
number of instances and any memory, a request's TTFT is at least its floor: queues, tier
loads, decode batches sharing its steps, evictions and shared cores only add. So each
percentile of the floors is a lower bound on that percentile of any policy's TTFTs (the
k-th smallest of values each at least its floor is at least the k-th smallest floor).

Beside a ratio to `prefix`, `floor / prefix` at a percentile is the best ratio any router
could reach there: a target under it is out of reach of routing on that workload.
"""

from __future__ import annotations

from collections.abc import Iterable

from sim.cluster.reuse import reusable_by_request
from sim.profiles import Profile
from sim.traces import TraceRequest


def lone_ttft_s(profile: Profile, prompt_tokens: int, cached_tokens: int = 0) -> float:
    """Seconds to the first token of a prompt alone on an idle instance holding its first
    `cached_tokens` (an engine computes at least the last prompt token)."""
    left = max(1, prompt_tokens - cached_tokens)
    done = prompt_tokens - left
    budget = max(1, profile.max_batch_tokens)
    ttft = 0.0
    while left > 0:
        chunk = min(budget, left)
        ttft += profile.prefill_seconds(chunk, done)
        done += chunk
        left -= chunk
    return ttft


def ttft_floors(trace: Iterable[TraceRequest], block_tokens: int, profile: Profile) -> list[float]:
    """Each request's floor, in arrival order."""
    ordered = sorted(trace, key=lambda t: t.timestamp_ms)
    hits = reusable_by_request(((t.hash_ids, t.input_length) for t in ordered), block_tokens)
    return [lone_ttft_s(profile, t.input_length, hit) for t, hit in zip(ordered, hits, strict=True)]
