"""The scheduler side's bookkeeping, free of vLLM types: which blocks of a request to load
from tierd and which newly computed full blocks to save, step by step.

Block i of a request covers tokens [i*B, (i+1)*B). Its key is vLLM's own block hash
(`request.block_hashes[i]`) as the unsigned 64-bit int vLLM's KV events carry (the low 64
bits, big-endian), so tierd's slices, the engine's events and the router's index share one
key space. Only full blocks travel; the hit leaves at least one prompt token to compute.

- Lookup: from the first block vLLM's own prefix cache lacks, up to the cap, tierd says
  how long a run it holds; that run is loaded.
- A request that waits (its blocks do not fit yet) is asked about again on each scheduler
  step; tierd's answer for the same window is reused for a short while instead of another
  round trip on the scheduler loop (`LookupMemo`).
- Saves: a block is saved in the step that completes it (prefill chunks and decode
  alike), unless it was already computed before this request (a local or external hit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from contracts.errors import ConfigurationError
from contracts.slices import normalize as block_key  # the slice-key rule's one owner
from contracts.tiers import TIERD_ARENA

__all__ = ["block_key"]


class LookupReuseError(ConfigurationError, ValueError):
    """The connector's `lookup_reuse_ms` is negative."""


@dataclass
class ReqPlan:
    """One request's state on the scheduler side."""

    req_id: str
    local_blocks: int = 0  # leading blocks vLLM's own prefix cache had
    ext_blocks: int = 0  # blocks tierd supplies after them
    tiers: dict[str, int] = field(default_factory=dict)  # where tierd holds them
    block_ids: list[int] = field(default_factory=list)
    saved_upto: int = 0  # blocks before this index are in the engine or tierd already
    loading: bool = False


def lookup_window(num_tokens: int, num_computed: int, block_size: int) -> tuple[int, int]:
    """Blocks [start, stop) worth asking tierd for: past the local hit, full blocks only,
    at least one token left to compute."""
    stop = max(0, (num_tokens - 1) // block_size)
    start = num_computed // block_size
    return start, max(start, stop)


@dataclass(frozen=True, slots=True)
class LookupAnswer:
    """tierd's answer for one request's lookup window."""

    window: tuple[int, int]
    blocks: int  # the leading run of the window tierd holds
    tiers: dict[str, int]
    asked_at_s: float


class LookupMemo:
    """The last answer per request, reused for the same window within `reuse_s`.

    Why a short reuse is safe: an answer goes stale only when tierd gains blocks of the
    window meanwhile (another engine saved them: those are computed instead, as they would
    have been a moment earlier) or loses some (the load reports them failed and vLLM
    recomputes them). `reuse_s` = 0 asks every time."""

    def __init__(self, reuse_s: float) -> None:
        if reuse_s < 0:
            raise LookupReuseError(f"lookup reuse must be >= 0 s, got {reuse_s}")
        self.reuse_s = reuse_s
        self._answers: dict[str, LookupAnswer] = {}

    def get(self, req_id: str, window: tuple[int, int], now_s: float) -> LookupAnswer | None:
        answer = self._answers.get(req_id)
        if answer is None or answer.window != window or now_s - answer.asked_at_s >= self.reuse_s:
            return None
        return answer

    def put(self, req_id: str, answer: LookupAnswer) -> None:
        if self.reuse_s > 0:
            self._answers[req_id] = answer

    def drop(self, req_id: str) -> None:
        self._answers.pop(req_id, None)

    def __len__(self) -> int:
        return len(self._answers)


def load_pairs(
    plan: ReqPlan, keys: Sequence[int], block_ids: Sequence[int], n_blocks: int
) -> list[tuple[int, int]]:
    """(key, engine block id) of the blocks to load, right after the local hit."""
    lo = plan.local_blocks
    return [(keys[lo + i], block_ids[lo + i]) for i in range(n_blocks)]


def due_saves(
    plan: ReqPlan, keys: Sequence[int], computed_after_step: int, block_size: int
) -> list[tuple[int, int, int | None]]:
    """(key, block id, parent key) of the blocks this step completes; advances the plan."""
    end = min(computed_after_step // block_size, len(keys), len(plan.block_ids))
    out = [
        (keys[i], plan.block_ids[i], keys[i - 1] if i > 0 else None)
        for i in range(plan.saved_upto, end)
    ]
    plan.saved_upto = max(plan.saved_upto, end)
    return out


def hit_sources(plan: ReqPlan, num_external_tokens: int, block_size: int) -> dict[str, int]:
    """Split an external hit by medium: tierd's host memory (L1) first, the rest from the
    array or snapshots (disk). Sums to `num_external_tokens`."""
    host = min(num_external_tokens, plan.tiers.get(TIERD_ARENA.name, 0) * block_size)
    out = {"host": host, "disk": num_external_tokens - host}
    return {k: v for k, v in out.items() if v > 0}
