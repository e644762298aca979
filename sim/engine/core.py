"""The engine proper: tokenizer, block hasher, prefix cache, scheduler, metrics, KV event
publisher and (with a tierd) slower KV tiers of one simulated instance, built, started and
stopped together.

A request goes `prepare` (tokenise and hash the prompt, off the event loop unless it is
short; check lengths; build the `Sequence`), then `load_from_tiers` (with a tierd: fetch the
KV it reuses past the HBM hit), then `submit` (to the scheduler, whose outputs arrive on the
sequence's queue); `abort` drops it if the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router.blocks import render_chat as router_render_chat
from router.blocks import render_prompt
from sim.engine.block_hash import BlockHasher
from sim.engine.config import EngineConfig
from sim.engine.kv_events import EnginePublisher, KVEvent
from sim.engine.metrics import EngineMetrics
from sim.engine.openai_api import APIError, GenerationParams, bad, new_id
from sim.engine.output import OutputText
from sim.engine.prefix_cache import PrefixCache
from sim.engine.scheduler import Scheduler
from sim.engine.sequence import Sequence as Seq
from sim.engine.textgen import TextGenerator
from sim.engine.tiers import TierBackend, TierPlan
from sim.profiles import get_profile
from sim.tokenizer import Tokenizer


@dataclass(frozen=True)
class ChatPrompt:
    messages: Sequence[Mapping[str, Any]]
    tools: list[Any] | None = None


Prompt = str | list[int] | ChatPrompt
INLINE_PROMPT_CHARS = 2048  # shorter prompts are tokenised and hashed on the loop (< 0.2 ms)


def _prompt_chars(prompt: Prompt) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, ChatPrompt):
        total = 0
        for m in prompt.messages:
            content = m.get("content")
            total += len(content) if isinstance(content, str) else INLINE_PROMPT_CHARS
        return total + (INLINE_PROMPT_CHARS if prompt.tools else 0)
    return len(prompt) * 4


class Engine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.profile = get_profile(config.profile)
        capacity = config.kv_capacity_tokens or self.profile.kv_capacity_tokens
        self.tokenizer = Tokenizer()
        self.hasher = BlockHasher(config.block_tokens, config.block_hash, config.hash_seed)
        self.cache = PrefixCache(capacity, config.block_tokens)
        self.max_model_len = min(config.max_model_len, self.cache.num_blocks * config.block_tokens)
        self.publisher: EnginePublisher | None = None
        if config.kv_events_endpoint:
            self.publisher = EnginePublisher(
                config.kv_events_endpoint, config.kv_events_topic, config.kv_events_encoding
            )
        self.scheduler = Scheduler(
            self.profile,
            self.cache,
            self.hasher,
            time_scale=config.time_scale,
            publish=self._publish if self.publisher else None,
            max_batch_tokens=config.max_batch_tokens,
            max_num_seqs=config.max_num_seqs,
            on_prefill_done=self._on_prefill_done,
        )
        self.tiers: TierBackend | None = None
        if config.tierd_url:
            self.tiers = TierBackend(
                config.tierd_url,
                self.profile,
                config.model,
                time_scale=config.time_scale,
                block_tokens=config.block_tokens,
                block_chars=config.tier_block_chars,
                payload_bytes_per_token=config.tier_payload_bytes_per_token,
            )
        self.loading = 0  # requests fetching their KV from tierd, not yet queued
        cache_config = {
            "block_size": str(config.block_tokens),
            "num_gpu_blocks": str(self.cache.num_blocks),
            "enable_prefix_caching": "True",
            "prefix_caching_hash_algo": config.block_hash,
        }
        self.metrics = EngineMetrics(config.model, self.gauges, cache_config)
        self.scheduler.metrics = self.metrics
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.tiers is not None:
            await self.tiers.start()
        self._task = asyncio.create_task(self.scheduler.run(), name="sim-engine-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.tiers is not None:
            await self.tiers.close()
        if self.publisher is not None:
            self.publisher.close()

    def gauges(self) -> tuple[int, int, float]:
        """Running, waiting (queued or loading KV, as vLLM counts WAITING_FOR_REMOTE_KVS),
        KV usage."""
        running, waiting, usage = self.scheduler.gauges()
        return running, waiting + self.loading, usage

    def stats(self) -> dict[str, Any]:
        """What this engine has done and holds (not a vLLM route; for benchmarks)."""
        s, c = self.scheduler, self.cache
        return {
            "instance_id": self.config.instance_id,
            "model": self.config.model,
            "profile": self.profile.name,
            "time_scale": self.config.time_scale,
            "simulated_seconds": s.sim_clock,
            "steps": s.steps,
            "running": len(s.running),
            "waiting": len(s.waiting),
            "loading": self.loading,
            "kv": {
                "block_tokens": c.block_tokens,
                "blocks": c.num_blocks,
                "cached_blocks": c.cached_blocks,
                "used_blocks": c.used_blocks,
                "usage": c.usage(),
                "block_hash": self.hasher.algorithm,
                "hash_seeded": self.hasher.seeded,
            },
            "kv_events": None
            if self.publisher is None
            else {"endpoint": self.config.kv_events_endpoint, "next_seq": self.publisher.seq},
            "tiers": None if self.tiers is None else self.tiers.stats(),
        }

    @property
    def healthy(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _publish(self, events: list[KVEvent]) -> None:
        assert self.publisher is not None
        await self.publisher.publish(events)

    # -- requests ------------------------------------------------------------------------
    def check_model(self, model: str) -> None:
        if model != self.config.model:
            raise APIError(
                404,
                f"The model `{model}` does not exist.",
                param="model",
                code="model_not_found",
            )

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: list[Any] | None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        return self.tokenizer.encode_chat(messages, tools, add_generation_prompt)

    def _prepare_sync(
        self, prompt: Prompt, params: GenerationParams
    ) -> tuple[list[int], list[bytes], TierPlan | None]:
        if isinstance(prompt, ChatPrompt):
            ids = self.tokenizer.encode_chat(prompt.messages, prompt.tools)
        elif isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
        hashes = self.hasher.chain(ids, cache_salt=params.cache_salt)
        plan = None
        if self.tiers is not None and ids:
            if isinstance(prompt, ChatPrompt):
                text = router_render_chat(prompt.messages, prompt.tools)
            else:
                text = render_prompt(prompt)
            plan = self.tiers.plan(text, len(ids), params.cache_salt, params.session)
        return ids, hashes, plan

    async def prepare(self, params: GenerationParams, prompt: Prompt) -> Seq:
        """Tokenise and hash the prompt (in a thread), check lengths, build the sequence."""
        arrival = asyncio.get_running_loop().time()
        if _prompt_chars(prompt) <= INLINE_PROMPT_CHARS:  # a thread hop costs more than this
            ids, hashes, plan = self._prepare_sync(prompt, params)
        else:
            ids, hashes, plan = await asyncio.to_thread(self._prepare_sync, prompt, params)
        if not ids:
            raise bad(
                "the prompt is empty", "messages" if isinstance(prompt, ChatPrompt) else "prompt"
            )
        n = len(ids)
        max_tokens = params.max_tokens
        if max_tokens is None:
            max_tokens = self.max_model_len - n
        if max_tokens < 1 or n + max_tokens > self.max_model_len:
            raise bad(
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, you requested {n + max(max_tokens, 1)} tokens ({n} in the messages, "
                f"{max(max_tokens, 1)} in the completion). Please reduce the length of the "
                "messages or completion.",
                "max_tokens" if params.max_tokens is not None else "messages",
            )
        generator = TextGenerator(ids, seed=self.config.seed, request_seed=params.seed)
        return Seq(
            request_id=new_id("req"),
            prompt_ids=ids,
            prompt_hashes=hashes,
            max_tokens=max_tokens,
            generator=generator,
            output=OutputText(params.stop),
            ignore_eos=params.ignore_eos,
            arrival=arrival,
            tier_plan=plan,
        )

    async def load_from_tiers(self, seq: Seq) -> None:
        """Bring the KV this prompt reuses from tierd (past what HBM holds), charging its
        transfer time; the tokens loaded then count as cached at admission."""
        plan = seq.tier_plan
        if self.tiers is None or plan is None:
            return
        bs = self.config.block_tokens
        max_hit = (seq.prompt_len - 1) // bs
        hbm_tokens = self.cache.longest_hit(seq.prompt_hashes[:max_hit]) * bs
        self.loading += 1
        try:
            await self.tiers.fetch(plan, hbm_tokens)
        finally:
            self.loading -= 1
        seq.preloaded_until = plan.loaded_until
        for tier, n in plan.loaded_by_tier.items():
            self.metrics.on_tier_load(tier, n)

    def _on_prefill_done(self, seq: Seq) -> None:
        if self.tiers is not None and seq.tier_plan is not None:
            self.tiers.store_in_background(seq.tier_plan)

    def submit(self, seq: Seq) -> None:
        try:
            self.scheduler.submit(seq)
        except ValueError as exc:
            raise bad(str(exc), "max_tokens") from None

    def abort(self, seq: Seq) -> None:
        self.scheduler.abort(seq)
