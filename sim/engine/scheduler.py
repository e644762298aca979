"""Continuous batching with chunked prefill, charged in time from a profile.

How it works, one step at a time (an asyncio task; it sleeps, never blocks):
1. Budget `max_batch_tokens`. Every running sequence whose prefill is done decodes one
   token (1 from the budget); sequences still prefilling get the next chunk of their
   prompt from what is left; then waiting sequences are admitted in arrival order while
   there is budget, a free slot (`max_num_seqs`) and KV blocks: admission looks the prompt
   up in the prefix cache (leading full blocks, never the whole prompt: the last token is
   always computed, as in vLLM), pins the hits and reserves the rest of its blocks.
2. The step costs simulated time from the profile: prefill of each chunk of U new tokens
   after C computed ones, `prefill_seconds(U, C)` less the fixed overhead, plus the overhead
   once; plus `decode_step_seconds(batch, kv_tokens)` for the decoding sequences (less the
   weight-read base when the step also prefills: one forward pass reads the weights once);
   KV loaded from slower tiers was charged before the sequence was queued, outside the
   batch, like vLLM's asynchronous KV connector loads. The task sleeps that time
   multiplied by `time_scale`.
3. Then the step's effects land: chunks advance, full blocks are committed to the prefix
   cache (KV events), sequences that finished prefill emit their first token, decoding ones
   their next; a finished sequence (end of text, `max_tokens`, stop string) releases its
   blocks. An aborted sequence (client gone) is dropped wherever it is.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from contracts.errors import InputError
from sim.engine.block_hash import BlockHasher
from sim.engine.kv_events import KVEvent
from sim.engine.metrics import EngineMetrics
from sim.engine.prefix_cache import PrefixCache
from sim.engine.sequence import Sequence, StepOutput
from sim.profiles import Profile


class RequestExceedsCacheError(InputError, ValueError):
    """A request whose prompt and output could never fit in the engine's KV cache (the
    engine answers it 400, as vLLM does)."""


Publish = Callable[[list[KVEvent]], Awaitable[None]]
OnPrefillDone = Callable[[Sequence], None]


@dataclass
class StepPlan:
    decode: list[Sequence] = field(default_factory=list)
    chunks: list[tuple[Sequence, int]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.chunks


class Scheduler:
    def __init__(
        self,
        profile: Profile,
        cache: PrefixCache,
        hasher: BlockHasher,
        *,
        time_scale: float = 1.0,
        metrics: EngineMetrics | None = None,
        publish: Publish | None = None,
        max_batch_tokens: int | None = None,
        max_num_seqs: int | None = None,
        on_prefill_done: OnPrefillDone | None = None,
    ):
        self.profile = profile
        self.cache = cache
        self.hasher = hasher
        self.time_scale = time_scale
        self.metrics = metrics
        self.publish = publish
        self.max_batch_tokens = max_batch_tokens or profile.max_batch_tokens
        self.max_num_seqs = max_num_seqs or profile.max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.on_prefill_done = on_prefill_done
        self.sim_clock = 0.0  # simulated seconds spent in steps
        self.steps = 0
        self._wake = asyncio.Event()

    # -- API used by the HTTP layer ---------------------------------------------------
    def blocks_needed(self, seq: Sequence) -> int:
        return math.ceil((seq.prompt_len + seq.target_output_tokens) / self.cache.block_tokens)

    def submit(self, seq: Sequence) -> None:
        """Queue a sequence; RequestExceedsCacheError (a ValueError) if it could never fit in
        the KV cache."""
        if self.blocks_needed(seq) > self.cache.num_blocks:
            raise RequestExceedsCacheError(
                f"request needs {seq.prompt_len + seq.target_output_tokens} tokens of KV; "
                f"the cache holds {self.cache.num_blocks * self.cache.block_tokens}"
            )
        if not seq.arrival:
            seq.arrival = asyncio.get_running_loop().time()
        self.waiting.append(seq)
        self._wake.set()

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence (its client went away): frees its slot and blocks."""
        if seq.finished:
            return
        seq.finished = True
        seq.finish_reason = "abort"
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        if seq.alloc is not None:
            self.cache.release(seq.alloc)
        self._wake.set()

    def gauges(self) -> tuple[int, int, float]:
        return len(self.running), len(self.waiting), self.cache.usage()

    async def run(self) -> None:
        """The engine loop; runs until cancelled."""
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            plan = self.plan()
            await self._flush_events()
            if plan.empty:  # waiting for blocks that only an abort can free
                self._wake.clear()
                await self._wake.wait()
                continue
            seconds = self.step_seconds(plan)
            await asyncio.sleep(seconds * self.time_scale)
            self.sim_clock += seconds
            self.steps += 1
            self.apply(plan)
            await self._flush_events()

    # -- one step ----------------------------------------------------------------------
    def plan(self) -> StepPlan:
        plan = StepPlan()
        budget = self.max_batch_tokens
        for seq in self.running:
            if seq.prefill_done:
                plan.decode.append(seq)
                budget -= 1
        for seq in self.running:
            if not seq.prefill_done and budget > 0:
                n = min(seq.prompt_len - seq.num_computed, budget)
                plan.chunks.append((seq, n))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self._admit(seq):
                break
            self.waiting.popleft()
            self.running.append(seq)
            n = min(seq.prompt_len - seq.num_computed, budget)
            plan.chunks.append((seq, n))
            budget -= n
        return plan

    def step_seconds(self, plan: StepPlan) -> float:
        p = self.profile
        seconds = 0.0
        if plan.chunks:
            seconds += p.prefill_overhead_s + sum(
                p.prefill_seconds(n, seq.num_computed) - p.prefill_overhead_s
                for seq, n in plan.chunks
            )
        if plan.decode:
            kv = sum(seq.context_len for seq in plan.decode)
            seconds += p.decode_step_seconds(len(plan.decode), kv)
            if plan.chunks:
                seconds -= p.step_base_s
        return seconds

    def apply(self, plan: StepPlan) -> None:
        for seq, n in plan.chunks:
            if seq.finished:
                continue
            seq.num_computed += n
            self._commit_full_blocks(seq)
            if seq.prefill_done:
                seq.first_token_at = asyncio.get_running_loop().time()
                seq.first_token_sim_s = self.sim_clock - (seq.admitted_sim_s or 0.0)
                if self.metrics is not None:
                    self.metrics.on_first_token(seq.first_token_at - seq.arrival)
                if self.on_prefill_done is not None:
                    self.on_prefill_done(seq)
                self._emit_token(seq)
        for seq in plan.decode:
            if not seq.finished:
                self._emit_token(seq)

    # -- internals ---------------------------------------------------------------------
    def _admit(self, seq: Sequence) -> bool:
        bs = self.cache.block_tokens
        max_hit_blocks = (seq.prompt_len - 1) // bs
        hit = self.cache.longest_hit(seq.prompt_hashes[:max_hit_blocks])
        hits = seq.prompt_hashes[:hit]
        private = self.blocks_needed(seq) - hit
        if not self.cache.can_allocate(hits, private):
            return False
        seq.alloc = self.cache.allocate(hits, private)
        seq.committed_blocks = hit
        seq.last_hash = hits[-1] if hits else None
        loaded = min(seq.preloaded_until // bs, max_hit_blocks)
        seq.num_cached = max(hit, loaded) * bs
        seq.num_external = seq.num_cached - hit * bs
        seq.num_computed = seq.num_cached
        self._commit_full_blocks(seq)  # blocks loaded from slower tiers are in HBM now
        seq.admitted_sim_s = self.sim_clock
        if self.metrics is not None:
            self.metrics.on_admit(seq.prompt_len, hit * bs, seq.num_external)
            self.metrics.on_queued(asyncio.get_running_loop().time() - seq.arrival)
        return True

    def _commit_full_blocks(self, seq: Sequence) -> None:
        assert seq.alloc is not None
        bs = self.cache.block_tokens
        while (seq.committed_blocks + 1) * bs <= seq.num_computed and seq.alloc.private > 0:
            i = seq.committed_blocks
            if (i + 1) * bs <= seq.prompt_len:
                tokens = seq.prompt_ids[i * bs : (i + 1) * bs]
            else:
                tokens = [seq.token_at(j) for j in range(i * bs, (i + 1) * bs)]
            if i < len(seq.prompt_hashes):
                h = seq.prompt_hashes[i]
            else:
                h = self.hasher.block(seq.last_hash, tokens)
            self.cache.commit(seq.alloc, h, seq.last_hash, tokens)
            seq.last_hash = h
            seq.committed_blocks += 1

    def _emit_token(self, seq: Sequence) -> None:
        piece, tid = seq.generator.next_piece()
        seq.output_ids.append(tid)
        stopped = seq.output.append(piece)
        n_out = len(seq.output_ids)
        seq.num_computed = seq.prompt_len + n_out - 1  # the newest token is fed next step
        self._commit_full_blocks(seq)
        reason: str | None = None
        if stopped or (not seq.ignore_eos and n_out >= seq.generator.natural_tokens):
            reason = "stop"
        elif n_out >= seq.max_tokens:
            reason = "length"
        if self.metrics is not None:
            now = asyncio.get_running_loop().time()
            self.metrics.on_tokens(1)
            if seq.last_token_at is not None:
                self.metrics.on_inter_token(now - seq.last_token_at)
            seq.last_token_at = now
        seq.queue.put_nowait(StepOutput(seq.output.delta(reason is not None), 1, reason, (tid,)))
        if reason is not None:
            self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finished = True
        seq.finish_reason = reason
        self.running.remove(seq)
        if seq.alloc is not None:
            self.cache.release(seq.alloc)
        if self.metrics is not None:
            now = asyncio.get_running_loop().time()
            self.metrics.on_finish(reason, now - seq.arrival)
        self._wake.set()

    async def _flush_events(self) -> None:
        events = self.cache.drain_events()
        if events and self.publish is not None:
            await self.publish(events)
