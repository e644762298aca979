"""sim.engine.scheduler: batching logic and the simulated time it charges (time_scale=0, so
the checks are on simulated seconds, never on wall time)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Sequence

import pytest

from sim.engine.block_hash import BlockHasher
from sim.engine.kv_events import BlockRemoved, BlockStored, KVEvent
from sim.engine.output import OutputText
from sim.engine.prefix_cache import PrefixCache
from sim.engine.scheduler import Scheduler
from sim.engine.sequence import Sequence as Seq
from sim.engine.sequence import StepOutput
from sim.engine.textgen import TextGenerator
from sim.profiles import get_profile

PROFILE = get_profile("qwen2.5-32b-h200")
BS = 16


def tokens(n: int, start: int = 1000) -> list[int]:
    return list(range(start, start + n))


def make_seq(
    hasher: BlockHasher,
    ids: list[int],
    max_tokens: int,
    *,
    ignore_eos: bool = True,
    stop: Sequence[str] = (),
) -> Seq:
    return Seq(
        request_id=f"r{len(ids)}",
        prompt_ids=ids,
        prompt_hashes=hasher.chain(ids),
        max_tokens=max_tokens,
        generator=TextGenerator(ids),
        output=OutputText(stop),
        ignore_eos=ignore_eos,
    )


class Harness:
    def __init__(self, capacity: int = 100_000, max_num_seqs: int | None = None):
        self.hasher = BlockHasher(BS, seed="0")
        self.cache = PrefixCache(capacity, BS)
        self.events: list[KVEvent] = []
        self.sched = Scheduler(
            PROFILE,
            self.cache,
            self.hasher,
            time_scale=0.0,
            publish=self._publish,
            max_num_seqs=max_num_seqs,
        )

    async def _publish(self, events: list[KVEvent]) -> None:
        self.events.extend(events)

    def seq(self, ids: list[int], max_tokens: int, **kwargs: object) -> Seq:
        return make_seq(self.hasher, ids, max_tokens, **kwargs)  # type: ignore[arg-type]


async def drain(seq: Seq) -> list[StepOutput]:
    outs: list[StepOutput] = []
    async with asyncio.timeout(30):  # a hang guard, not a timing assertion
        while True:
            out = await seq.queue.get()
            outs.append(out)
            if out.finish_reason is not None:
                return outs


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    h = Harness()
    task = asyncio.create_task(h.sched.run())
    yield h
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_single_request_time_is_prefill_then_decode_steps(harness: Harness) -> None:
    n, out_tokens = 1000, 5
    seq = harness.seq(tokens(n), out_tokens)
    harness.sched.submit(seq)
    outs = await drain(seq)
    assert len(outs) == out_tokens and outs[-1].finish_reason == "length"
    assert seq.first_token_sim_s == pytest.approx(PROFILE.prefill_seconds(n, 0))
    decode = sum(PROFILE.decode_step_seconds(1, n + k) for k in range(1, out_tokens))
    assert harness.sched.sim_clock == pytest.approx(PROFILE.prefill_seconds(n, 0) + decode)
    assert harness.sched.steps == out_tokens


async def test_long_prompt_is_prefilled_in_budget_sized_chunks(harness: Harness) -> None:
    n = 20_000
    seq = harness.seq(tokens(n), 1)
    harness.sched.submit(seq)
    await drain(seq)
    budget = PROFILE.max_batch_tokens
    chunks = [(budget, 0), (budget, budget), (n - 2 * budget, 2 * budget)]
    assert harness.sched.steps == 3
    assert seq.first_token_sim_s == pytest.approx(
        sum(PROFILE.prefill_seconds(u, c) for u, c in chunks)
    )


async def test_repeated_prompt_hits_leading_blocks_and_is_faster(harness: Harness) -> None:
    n = 1000  # 62 full blocks and 8 tokens
    first = harness.seq(tokens(n), 3)
    harness.sched.submit(first)
    await drain(first)
    assert first.num_cached == 0
    again = harness.seq(tokens(n), 3)
    harness.sched.submit(again)
    await drain(again)
    assert again.num_cached == (n // BS) * BS == 992
    assert again.first_token_sim_s == pytest.approx(PROFILE.prefill_seconds(n - 992, 992))
    assert again.first_token_sim_s is not None and first.first_token_sim_s is not None
    assert again.first_token_sim_s < first.first_token_sim_s / 5


async def test_fully_cached_prompt_still_computes_its_last_block(harness: Harness) -> None:
    n = 64  # exactly four blocks: the last must be recomputed, as in vLLM
    for expected in (0, 48):
        seq = harness.seq(tokens(n), 2)
        harness.sched.submit(seq)
        await drain(seq)
        assert seq.num_cached == expected


async def test_events_name_the_chain_and_output_blocks_are_cached(harness: Harness) -> None:
    ids = tokens(40)  # two full prompt blocks; output fills a third
    seq = harness.seq(ids, 30)
    harness.sched.submit(seq)
    await drain(seq)
    stored = [e for e in harness.events if isinstance(e, BlockStored)]
    hashes = [h for e in stored for h in e.block_hashes]
    assert stored[0].parent_block_hash is None
    for prev, nxt in itertools.pairwise(stored):
        assert nxt.parent_block_hash == prev.block_hashes[-1]
    all_ids = ids + seq.output_ids
    assert [t for e in stored for t in e.token_ids] == all_ids[: 16 * len(hashes)]
    # 40 prompt + 29 fed output tokens = 69 tokens of KV -> 4 full blocks
    assert hashes == harness.hasher.chain(all_ids)[:4]
    assert hashes[:2] == seq.prompt_hashes


async def test_batch_limit_queues_and_finishing_admits_the_next() -> None:
    h = Harness(max_num_seqs=2)
    task = asyncio.create_task(h.sched.run())
    try:
        seqs = [h.seq(tokens(100, start=i * 1000), 4 + 4 * i) for i in range(3)]
        for s in seqs:
            h.sched.submit(s)
        await asyncio.sleep(0)  # let the loop run its first step
        assert len(h.sched.running) <= 2
        outs = [await drain(s) for s in seqs]
        assert [len(o) for o in outs] == [4, 8, 12]
        third = seqs[2]
        assert third.admitted_sim_s is not None and third.admitted_sim_s > 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_kv_pressure_evicts_and_a_request_too_big_is_refused() -> None:
    h = Harness(capacity=BS * 10)
    task = asyncio.create_task(h.sched.run())
    try:
        with pytest.raises(ValueError):
            h.sched.submit(h.seq(tokens(200), 1))
        for start in (0, 5000, 9000):
            seq = h.seq(tokens(100, start=start), 2)
            h.sched.submit(seq)
            await drain(seq)
        assert any(isinstance(e, BlockRemoved) for e in h.events)
        assert h.cache.used_blocks == 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_abort_frees_slot_and_blocks(harness: Harness) -> None:
    seq = harness.seq(tokens(500), 100_000 - 500)  # far more decode steps than the test runs
    harness.sched.submit(seq)
    await seq.queue.get()
    assert harness.cache.used_blocks > 0 and harness.sched.running == [seq]
    harness.sched.abort(seq)
    assert harness.sched.running == [] and harness.cache.used_blocks == 0
    nxt = harness.seq(tokens(50, start=1), 2)
    harness.sched.submit(nxt)
    assert [o.finish_reason for o in await drain(nxt)][-1] == "length"


async def test_natural_end_and_stop_strings(harness: Harness) -> None:
    ids = tokens(30)
    natural = TextGenerator(ids).natural_tokens
    seq = harness.seq(ids, 10_000, ignore_eos=False)
    harness.sched.submit(seq)
    outs = await drain(seq)
    assert len(outs) == natural and outs[-1].finish_reason == "stop"
    text = "".join(o.text for o in outs)
    cut = text.index(" ", 3)
    stop = text[cut : cut + 3]
    stopped = harness.seq(ids, 10_000, ignore_eos=False, stop=[stop])
    harness.sched.submit(stopped)
    outs = await drain(stopped)
    assert outs[-1].finish_reason == "stop"
    assert "".join(o.text for o in outs) == text[: text.index(stop)]
