"""One simulated inference instance: continuous batching with chunked prefill, charged with
the timing profile `sim.engine` uses, over an L1 block store.

Scheduling follows vLLM's V1 scheduler in outline. Each step takes every decoding request
(one token each), then prefill chunks, oldest admission first, within a token budget of
`max_batch_tokens`; new requests are admitted from the waiting queue (first come, first
served among those whose tier loads have landed) while the budget, `max_num_seqs` and L1
room allow. A step costs the profile's decode step (when anything decodes) plus the
prefill compute of its chunks, `prefill_seconds(chunk, context_before) - overhead`, with
the overhead paid once per step.

Steps that only decode are coalesced: with B sequences holding K tokens of KV, step k
costs a + b(k-1) (a = decode_step(B, K), b = B x per-KV-token cost), so n steps take
n a + b n(n-1)/2 and the instance jumps straight to the first finishing sequence. An
arrival during such a run cuts it at the end of the step in progress (solved from the
same sum), which keeps the event count near a handful per request. An idle instance wakes
at the end of the instant a request reaches it, so simultaneous arrivals share a step.

Requests wait in order of their `level` (vLLM's priority scheduling: lower first, first
come first served within a level; every level is 0 unless the simulator sets them). An
instance with nothing real to do runs its `idle_work` (warms, sim.cluster.warms), one step
at a time; real work arriving cuts such a step at that instant, so it never waits for one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Protocol

from contracts.tiers import Tier
from sim.cluster.connector import ConnectorHits
from sim.cluster.cores import SharedCores
from sim.cluster.kvcache import L1Store
from sim.cluster.request import SimRequest
from sim.profiles import Profile

_HBM = Tier.HBM.label


class InstanceHooks(Protocol):
    """What an instance tells the simulator around it."""

    def schedule_step_end(self, instance: int, at_s: float, version: int) -> None: ...

    def on_blocks_stored(self, instance: int, blocks: list[int]) -> None: ...

    def on_first_token(self, req: SimRequest, at_s: float) -> None: ...

    def on_finish(self, req: SimRequest, at_s: float) -> None: ...


class IdleWork(Protocol):
    """Work an instance does only while it has nothing real to do (sim.cluster.warms)."""

    def begin(self, now: float) -> float | None:
        """Start a step at `now`; its end, or None when there is nothing to do."""
        ...

    def end(self, now: float) -> None:
        """The step ran to its end."""
        ...

    def cut(self, now: float) -> None:
        """Real work arrived: the step stops at `now`."""
        ...


def queue_by_level(waiting: deque[SimRequest], req: SimRequest) -> None:
    """Behind every request of its level or a lower one, ahead of any of a higher one."""
    i = len(waiting)
    while i > 0 and waiting[i - 1].level > req.level:
        i -= 1
    if i == len(waiting):
        waiting.append(req)
    else:
        waiting.insert(i, req)


class Instance:
    def __init__(
        self,
        idx: int,
        profile: Profile,
        *,
        l1_blocks: int,
        block_tokens: int,
        hooks: InstanceHooks,
        demote: Callable[[int], None],
    ) -> None:
        self.idx = idx
        self.profile = profile
        self.block_tokens = block_tokens
        self.l1 = L1Store(l1_blocks, demote)
        self.hooks = hooks
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []  # admission order
        self.busy = False
        self.version = 0
        self.busy_s = 0.0
        self.prefill_busy_s = 0.0  # the prefill compute part of busy_s
        self.requests = 0
        # the step in flight
        self._step_start = 0.0
        self._step_chunks: list[tuple[SimRequest, int]] = []
        self._step_decode: list[SimRequest] = []
        self._step_n = 0  # decode steps in this (possibly coalesced) step
        self._step_a = 0.0
        self._step_b = 0.0
        self._step_end = 0.0
        p = profile
        self._overhead = p.prefill_seconds(0, 0)
        self.idle_work: IdleWork | None = None
        # physics the simulator sets when it models them (sim.cluster.connector, .cores)
        self.connector: ConnectorHits | None = None
        self.cores: SharedCores | None = None
        self._pending_load_s: dict[int, float] = {}  # sync connector loads, by request
        self._idle_step = False  # the step in flight is idle work's

    # -- arrivals ---------------------------------------------------------------------------

    def enqueue(self, req: SimRequest, now: float) -> None:
        self.requests += 1
        queue_by_level(self.waiting, req)
        self.poke(now)

    def offer_idle_work(self, now: float) -> None:
        """Idle work appeared: an idle instance starts it (a busy one finds it when idle)."""
        if not self.busy:
            self.poke(now)

    def poke(self, now: float) -> None:
        """Something schedulable appeared: start a step, or cut a coalesced decode run."""
        if self._idle_step and self.idle_work is not None:
            self._idle_step = False  # real work first: idle work stops where it is
            self.busy = False
            self.idle_work.cut(now)
        if not self.busy:
            # wake at the end of this instant, so simultaneous arrivals share the first step
            self.busy = True
            self._step_chunks, self._step_decode = [], []
            self._step_n, self._step_a, self._step_b, self._step_prefill = 0, 0.0, 0.0, 0.0
            self._step_start = self._step_end = now
            self.version += 1
            self.hooks.schedule_step_end(self.idx, now, self.version)
        elif self._step_n > 1 and not self._step_chunks:
            k = self._steps_done_by(now - self._step_start)
            if k + 1 < self._step_n:
                self._step_n = k + 1
                self._step_end = self._step_start + self._run_time(self._step_n)
                self.version += 1
                self.hooks.schedule_step_end(self.idx, self._step_end, self.version)

    def _run_time(self, n: int) -> float:
        return n * self._step_a + self._step_b * n * (n - 1) / 2.0

    def _steps_done_by(self, elapsed: float) -> int:
        a, b = self._step_a, self._step_b
        if a <= 0.0:
            return self._step_n
        if b <= 0.0:
            k = int(elapsed / a)
        else:  # largest k with b/2 k^2 + (a - b/2) k <= elapsed
            lin = a - b / 2.0
            k = int((-lin + math.sqrt(lin * lin + 2.0 * b * elapsed)) / b)
        k = max(0, min(k, self._step_n))
        while k > 0 and self._run_time(k) > elapsed:
            k -= 1
        while k < self._step_n and self._run_time(k + 1) <= elapsed:
            k += 1
        return k

    # -- admission ---------------------------------------------------------------------------

    def _try_admit(self, req: SimRequest) -> bool:
        bt = self.block_tokens
        chain = req.chain
        matched = self.l1.leading_match(chain)
        new_blocks = len(chain) - matched
        total_blocks = -(-(req.prompt_tokens + req.output_tokens) // bt)
        private = max(0, total_blocks - len(chain))
        need = new_blocks + private
        alone = not self.running
        if not self.l1.admit(chain[:matched], need, force=alone):
            return False
        self.l1.reserved += need
        req.matched_blocks = matched
        req.new_blocks = new_blocks
        req.private_blocks = private
        hit = min(matched * bt, req.prompt_tokens)
        req.cached_tokens = hit
        by_tier: dict[str, int] = {}
        for i in range(matched):
            tier = req.loaded_from.get(chain[i], _HBM)
            by_tier[tier] = by_tier.get(tier, 0) + min(bt, req.prompt_tokens - i * bt)
        hit += self._connector_hit(req, matched, by_tier)
        req.cached_by_tier = by_tier
        # an engine always computes at least the last prompt token
        req.prefill_left = max(1, req.prompt_tokens - hit)
        req.context_done = req.prompt_tokens - req.prefill_left
        req.output_left = req.output_tokens
        req.admitted = True
        self.running.append(req)
        return True

    def _connector_hit(self, req: SimRequest, matched: int, by_tier: dict[str, int]) -> int:
        """Tokens the KV connector loads for a request admitted with `matched` blocks in
        HBM (sim.cluster.connector); they are computed no more, and their load is charged
        to the step that computes the request's first chunk."""
        if self.connector is None:
            return 0
        _, tokens, load_s = self.connector.find(req.chain, matched, req.prompt_tokens)
        for tier, n in tokens.items():
            by_tier[tier] = by_tier.get(tier, 0) + n
        if load_s > 0:
            self._pending_load_s[req.idx] = load_s
        found = sum(tokens.values())
        req.cached_tokens += found
        return found

    def _scale_for_shared_cores(self) -> None:
        """Stretch the step about to start when another instance computes on the machine's
        cores too (sim.cluster.cores)."""
        if self.cores is not None:
            scale = self.cores.step_scale(self.idx)
            self._step_a *= scale
            self._step_b *= scale

    # -- steps ---------------------------------------------------------------------------------

    def _start_step(self, now: float) -> None:
        p = self.profile
        decode = [r for r in self.running if r.prefill_left == 0]
        budget = p.max_batch_tokens - len(decode)
        chunks: list[tuple[SimRequest, int]] = []
        for r in self.running:
            if budget <= 0:
                break
            if r.prefill_left > 0:
                c = min(r.prefill_left, budget)
                chunks.append((r, c))
                budget -= c
        if budget > 0 and self.waiting:
            keep: deque[SimRequest] = deque()
            blocked = False
            while self.waiting:
                r = self.waiting.popleft()
                if (
                    blocked
                    or budget <= 0
                    or r.ready_s > now
                    or len(self.running) >= p.max_num_seqs
                    or not self._try_admit(r)
                ):
                    if r.ready_s <= now:
                        blocked = True  # first come, first served among ready requests
                    keep.append(r)
                    continue
                c = min(r.prefill_left, budget)
                chunks.append((r, c))
                budget -= c
            self.waiting = keep
        if not chunks and not decode:
            self._step_n = 0
            if self.cores is not None:
                self.cores.idle(self.idx)
            idle_end = self.idle_work.begin(now) if self.idle_work is not None else None
            self.busy = idle_end is not None
            if idle_end is not None:
                self._idle_step = True
                self._step_start, self._step_end = now, idle_end
                self.version += 1
                self.hooks.schedule_step_end(self.idx, idle_end, self.version)
            return
        kv = sum(r.prompt_tokens + r.generated for r in decode)
        self._step_a = p.decode_step_seconds(len(decode), kv) if decode else 0.0
        self._step_b = p.step_per_kv_token_s * len(decode)
        compute = 0.0
        for r, c in chunks:
            compute += p.prefill_seconds(c, r.context_done) - self._overhead
            compute += self._pending_load_s.pop(r.idx, 0.0)  # a sync load holds the step
        self._step_prefill = compute + self._overhead if chunks else 0.0
        if chunks:
            self._step_a += compute + self._overhead
            self._step_b = 0.0
            n = 1
        else:
            n = min(r.output_left for r in decode)
        self._scale_for_shared_cores()
        self._step_chunks = chunks
        self._step_decode = decode
        self._step_n = n
        self._step_start = now
        self._step_end = now + self._run_time(n)
        self.busy = True
        self.version += 1
        self.hooks.schedule_step_end(self.idx, self._step_end, self.version)

    def step_end(self, version: int, now: float) -> None:
        if version != self.version or not self.busy:
            return  # superseded by a cut
        if self._idle_step and self.idle_work is not None:
            self._idle_step = False
            self.idle_work.end(now)
            self._start_step(now)
            return
        n = self._step_n
        self.busy_s += now - self._step_start
        self.prefill_busy_s += self._step_prefill
        finished: list[SimRequest] = []
        for r in self._step_decode:
            r.output_left -= n
            r.generated += n
            if r.output_left <= 0:
                finished.append(r)
        for r, c in self._step_chunks:
            r.prefill_left -= c
            r.context_done += c
            if r.prefill_left == 0:
                self._prefill_complete(r, now)
                if r.output_left <= 0:
                    finished.append(r)
        for r in finished:
            self._finish(r, now)
        self._step_chunks = []
        self._step_decode = []
        self._start_step(now)

    def _prefill_complete(self, req: SimRequest, now: float) -> None:
        new = self.l1.insert_pinned(req.chain[req.matched_blocks :])
        self.l1.reserved -= req.new_blocks
        req.new_blocks = 0
        if new:
            self.hooks.on_blocks_stored(self.idx, new)
        req.first_token_s = now
        req.output_left -= 1
        req.generated = 1
        self.hooks.on_first_token(req, now)

    def _finish(self, req: SimRequest, now: float) -> None:
        self.running.remove(req)
        self.l1.reserved -= req.private_blocks
        req.private_blocks = 0
        req.finish_s = now
        self.l1.unpin(req.chain)
        self.hooks.on_finish(req, now)
