"""One request as the scheduler sees it: prompt, blocks, progress and its output queue."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from sim.engine.output import OutputText
from sim.engine.prefix_cache import Allocation
from sim.engine.textgen import TextGenerator
from sim.engine.tiers import TierPlan


@dataclass(frozen=True, slots=True)
class StepOutput:
    """What one scheduler step produced for a sequence: new text, the token ids generated
    (the text may lag them: stop strings hold text back) and maybe its end."""

    text: str
    num_tokens: int
    finish_reason: str | None = None
    token_ids: tuple[int, ...] = ()


@dataclass
class Sequence:
    request_id: str
    prompt_ids: list[int]
    prompt_hashes: list[bytes]  # chained hashes of the prompt's full blocks
    max_tokens: int
    generator: TextGenerator
    output: OutputText
    ignore_eos: bool = False
    arrival: float = 0.0  # loop time
    preloaded_until: int = 0  # prompt tokens [0, n) brought into HBM from slower tiers
    tier_plan: TierPlan | None = None
    queue: asyncio.Queue[StepOutput] = field(default_factory=asyncio.Queue)
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose KV exists
    num_cached: int = 0  # prompt tokens not computed: prefix cache hits plus tier loads
    num_external: int = 0  # of which loaded from slower tiers
    alloc: Allocation | None = None
    committed_blocks: int = 0
    last_hash: bytes | None = None
    first_token_at: float | None = None  # loop time
    last_token_at: float | None = None  # loop time
    first_token_sim_s: float | None = None  # simulated seconds since admission
    admitted_sim_s: float | None = None
    finished: bool = False
    finish_reason: str | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= self.prompt_len

    @property
    def target_output_tokens(self) -> int:
        """Tokens it will generate unless a stop string ends it sooner."""
        if self.ignore_eos:
            return self.max_tokens
        return min(self.max_tokens, self.generator.natural_tokens)

    @property
    def context_len(self) -> int:
        return self.prompt_len + len(self.output_ids)

    def token_at(self, i: int) -> int:
        n = self.prompt_len
        return self.prompt_ids[i] if i < n else self.output_ids[i - n]
