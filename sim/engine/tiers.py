"""The engine's slower KV tiers, kept in its tierd (`--tierd-url`): load what a prompt reuses,
store what it computed.

How it works. tierd slices are named by the router's approximate block chain (the gateway's
`router.blocks.hash_blocks` over the canonical prompt text, `block_chars` characters a
block), so the prefetch hints the gateway sends for a routed request name exactly the
slices this engine stores. Block j of that chain covers the prompt tokens
`[j*t, (j+1)*t)`, `t = block_chars * prompt_tokens / len(text)`.

- Before a request is queued: its HBM hit (the engine's own prefix cache) is known; unless
  that covers the whole chain (then tierd is not asked at all), tierd is asked how long a
  leading run of the chain it holds (`lookup`), and the slices past the HBM hit are fetched
  (`get_slice`: real bytes, verified against the pattern they were stored with). The
  transfer time of the real model's KV (profile `kv_bytes_per_token` over the tier's
  bandwidth, `profile.bandwidths[tier]`, the tier of the level tierd names,
  `contracts.tiers.TIERD_LEVEL_BY_NAME`: its arena `GPU` is `Tier.HOST`) is slept, scaled,
  in the request's own coroutine, like vLLM's asynchronous
  KV loads: the batch goes on meanwhile. When tierd itself emulates link time
  (`tierd serve --emulate`), only its arena hits are charged here, the rest was its sleep.
  The loaded tokens then count as cached (engine blocks, the last prompt token excluded).
- After prefill: every chain block fully inside the prompt that tierd did not hold is
  stored (`put_slice`: `payload_bytes_per_token` bytes a token, tokens and parent given so
  tierd can charge and index the real size), in the background, a few at a time, in slots
  of their own (fetches never wait behind stores).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from contracts.tiers import TIERD_ARENA, TIERD_LEVEL_BY_NAME, Tier
from router.blocks import chain_seed, hash_blocks
from sim.profiles import Profile
from tierd.client import TierdClient, TierdError

log = logging.getLogger("sim.engine.tiers")

# the `tier` label of `warmgate_sim_tier_loaded_tokens` for the tier a load came from (tierd's
# answer names its level, `contracts.tiers.TIERD_LEVEL_BY_NAME`): the simulated engine's own
# names, from the engine's view (its HBM the first level), kept because bench reads them
LOADED_LABEL: dict[Tier, str] = {Tier.HOST: "l2", Tier.ARRAY: "array", Tier.SNAPSHOT: "l3"}


def payload_for(block_hash: int, nbytes: int) -> bytes:
    """The deterministic bytes of a slice: its hash repeated (so a wrong slice shows)."""
    unit = block_hash.to_bytes(8, "little")
    return (unit * (nbytes // 8 + 1))[:nbytes]


@dataclass
class TierPlan:
    """One request's view of its tiers."""

    chain: list[int]
    tokens_per_block: float
    prompt_tokens: int
    session: str | None = None
    held_blocks: int = 0  # leading run tierd held at lookup
    loaded_until: int = 0  # prompt tokens [0, loaded_until) are in HBM or were loaded
    loaded_tokens: int = 0  # of which loaded from tierd
    loaded_by_tier: dict[str, int] = field(default_factory=dict)
    load_seconds: float = 0.0

    def block_end(self, j: int) -> int:
        """Token index where chain block j ends (exclusive)."""
        return min(int((j + 1) * self.tokens_per_block), self.prompt_tokens)


@dataclass
class TierCounters:
    lookups: int = 0
    skipped_lookups: int = 0  # HBM already held the whole chain
    loaded_tokens: dict[str, int] = field(default_factory=dict)
    stored_slices: int = 0
    store_failures: int = 0
    fetch_failures: int = 0
    corrupt: int = 0


class TierBackend:
    def __init__(
        self,
        url: str,
        profile: Profile,
        model: str,
        *,
        time_scale: float,
        block_tokens: int,
        block_chars: int = 256,
        payload_bytes_per_token: int = 64,
        max_concurrency: int = 16,
    ):
        self.url = url
        self.profile = profile
        self.model = model
        self.time_scale = time_scale
        self.block_tokens = block_tokens
        self.block_chars = block_chars
        self.payload_bytes_per_token = payload_bytes_per_token
        self.client = TierdClient(url)
        self.tierd_emulates = False
        self.probed = False  # tierd's emulation settings are known
        self.counters = TierCounters()
        # fetches are on a request's path to its first token, stores are background work:
        # each has its own slots, so a burst of stores never queues a fetch behind it
        self._fetch_slots = asyncio.Semaphore(max_concurrency)
        self._store_slots = asyncio.Semaphore(max_concurrency)
        self._background: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Learn whether tierd charges link time itself (never fails: tierd may start late,
        then the first request that needs it asks again)."""
        try:
            stats = await self.client.stats()
        except (httpx.HTTPError, TierdError) as exc:
            log.warning("tierd %s not reachable at start: %r", self.url, exc)
            return
        self.probed = True
        emulation = stats.get("emulation") or {}
        self.tierd_emulates = bool(emulation.get("profile") or emulation.get("array_bytes_per_s"))
        tierd_scale = float(emulation.get("time_scale") or 1.0)
        if self.tierd_emulates and abs(tierd_scale - self.time_scale) > 1e-12:
            log.warning(
                "tierd emulates link time at time scale %g while this engine runs at %g: "
                "array and snapshot loads weigh %gx what they should against compute",
                tierd_scale,
                self.time_scale,
                tierd_scale / self.time_scale if self.time_scale else float("inf"),
            )

    async def close(self) -> None:
        for t in list(self._background):
            t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.client.aclose()

    def plan(
        self, text: str, prompt_tokens: int, cache_salt: str | None, session: str | None
    ) -> TierPlan:
        """The request's chain (pure CPU: call it off the event loop for long prompts)."""
        seed = chain_seed(self.model, cache_salt)
        chain = hash_blocks(text, seed=seed, block_chars=self.block_chars)
        per_block = self.block_chars * prompt_tokens / max(len(text), 1)
        return TierPlan(chain, per_block, prompt_tokens, session)

    def bandwidth(self, tier: Tier) -> float | None:
        """Bytes/s this engine charges for a load from `tier`; None: tierd charged it (an
        emulating tierd sleeps its array and snapshot links, never its arena)."""
        if self.tierd_emulates and tier is not TIERD_ARENA.tier:
            return None
        return self.profile.bandwidths[tier]

    async def fetch(self, plan: TierPlan, hbm_tokens: int) -> None:
        """Load the slices past the HBM hit from tierd and sleep their transfer time."""
        if not plan.chain:
            return
        if hbm_tokens >= min(plan.block_end(len(plan.chain) - 1), plan.prompt_tokens - 1):
            # HBM holds the whole chain: nothing to load, and it was stored when computed
            plan.held_blocks = len(plan.chain)
            plan.loaded_until = hbm_tokens
            self.counters.skipped_lookups += 1
            return
        if not self.probed:
            await self.start()
        self.counters.lookups += 1
        try:
            where = await self.client.lookup(plan.chain)
        except (httpx.HTTPError, TierdError) as exc:
            self.counters.fetch_failures += 1
            log.debug("tierd lookup failed: %r", exc)
            return
        tiers: list[str] = list(where.get("tiers", []))
        plan.held_blocks = len(tiers)
        limit = plan.prompt_tokens - 1  # the last prompt token is always computed
        first = int(hbm_tokens // plan.tokens_per_block) if plan.tokens_per_block > 0 else 0
        wanted = [j for j in range(first, len(tiers)) if plan.block_end(j) > hbm_tokens]
        if not wanted:
            return
        got = await asyncio.gather(*(self._get(plan.chain[j]) for j in wanted))
        loaded_end = hbm_tokens
        for j, ok in zip(wanted, got, strict=True):
            if not ok:
                break
            start, end = max(loaded_end, int(j * plan.tokens_per_block)), plan.block_end(j)
            end = min(end, limit)
            if end <= start:
                break
            level = TIERD_LEVEL_BY_NAME.get(tiers[j], TIERD_ARENA)
            label = LOADED_LABEL[level.tier]
            plan.loaded_by_tier[label] = plan.loaded_by_tier.get(label, 0) + end - start
            bw = self.bandwidth(level.tier)
            if bw is not None:
                plan.load_seconds += self.profile.load_seconds(end - start, bw)
            loaded_end = end
        # whole engine blocks only: a partial block is recomputed
        plan.loaded_until = (loaded_end // self.block_tokens) * self.block_tokens
        plan.loaded_tokens = max(plan.loaded_until - hbm_tokens, 0)
        for tier, n in plan.loaded_by_tier.items():
            self.counters.loaded_tokens[tier] = self.counters.loaded_tokens.get(tier, 0) + n
        if plan.load_seconds > 0 and self.time_scale > 0:
            await asyncio.sleep(plan.load_seconds * self.time_scale)

    async def _get(self, h: int) -> bool:
        async with self._fetch_slots:
            try:
                data = await self.client.get_slice(h)
            except (httpx.HTTPError, TierdError) as exc:
                self.counters.fetch_failures += 1
                log.debug("tierd get %d failed: %r", h, exc)
                return False
        if data is None:
            return False
        if data != payload_for(h, len(data)):
            self.counters.corrupt += 1
            log.warning("tierd served slice %d with the wrong bytes", h)
            return False
        return True

    def store_in_background(self, plan: TierPlan) -> None:
        """Store the prompt's full chain blocks that tierd did not hold."""
        todo = list(range(plan.held_blocks, len(plan.chain)))
        if not todo:
            return
        task = asyncio.create_task(self._store(plan, todo))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _store(self, plan: TierPlan, blocks: Sequence[int]) -> None:
        async def put(j: int) -> None:
            h = plan.chain[j]
            tokens = plan.block_end(j) - int(j * plan.tokens_per_block)
            parent = plan.chain[j - 1] if j > 0 else None
            data = payload_for(h, max(tokens, 1) * self.payload_bytes_per_token)
            async with self._store_slots:
                try:
                    await self.client.put_slice(h, data, parent, tokens, plan.session)
                except (httpx.HTTPError, TierdError) as exc:
                    self.counters.store_failures += 1
                    log.debug("tierd put %d failed: %r", h, exc)
                    return
            self.counters.stored_slices += 1

        await asyncio.gather(*(put(j) for j in blocks))

    def stats(self) -> dict[str, Any]:
        c = self.counters
        return {
            "url": self.url,
            "tierd_emulates": self.tierd_emulates,
            "lookups": c.lookups,
            "skipped_lookups": c.skipped_lookups,
            "loaded_tokens": dict(c.loaded_tokens),
            "stored_slices": c.stored_slices,
            "store_failures": c.store_failures,
            "fetch_failures": c.fetch_failures,
            "corrupt": c.corrupt,
        }
