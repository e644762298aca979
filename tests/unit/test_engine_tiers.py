"""sim.engine.tiers: the chain it names slices by, block spans, and what it charges."""

from __future__ import annotations

import asyncio

import pytest

from contracts.tiers import Tier
from router.blocks import chain_seed, hash_blocks
from sim.engine.tiers import TierBackend, TierPlan, payload_for
from sim.profiles import get_profile
from tests.support.procs import free_port

PROFILE = get_profile("qwen2.5-32b-h200")


def test_payload_is_deterministic_and_names_its_slice() -> None:
    a = payload_for(12345, 100)
    assert len(a) == 100 and a == payload_for(12345, 100)
    assert a != payload_for(12346, 100)


def test_block_spans_cover_the_prompt_in_order() -> None:
    plan = TierPlan(chain=[1, 2, 3], tokens_per_block=63.5, prompt_tokens=200)
    ends = [plan.block_end(j) for j in range(3)]
    assert ends == [63, 127, 190]
    assert TierPlan([1], 80.0, 50).block_end(0) == 50  # never past the prompt


async def test_chain_is_the_gateways_approximate_chain() -> None:
    backend = TierBackend(
        "http://127.0.0.1:1", PROFILE, "m", time_scale=1.0, block_tokens=16, block_chars=256
    )
    try:
        text = "x" * 1000
        plan = backend.plan(text, prompt_tokens=250, cache_salt="s", session="p1")
        assert plan.chain == hash_blocks(text, seed=chain_seed("m", "s"), block_chars=256)
        assert len(plan.chain) == 3 and plan.tokens_per_block == pytest.approx(64.0)
        assert plan.session == "p1"
    finally:
        await backend.close()


async def test_bandwidths_charged_with_and_without_tierd_emulation() -> None:
    backend = TierBackend("http://127.0.0.1:1", PROFILE, "m", time_scale=1.0, block_tokens=16)
    try:
        bw = PROFILE.bandwidths
        assert backend.bandwidth(Tier.HOST) == bw[Tier.HOST]  # tierd's arena, its `GPU`
        assert backend.bandwidth(Tier.ARRAY) == bw[Tier.ARRAY]
        assert backend.bandwidth(Tier.SNAPSHOT) == bw[Tier.SNAPSHOT]
        backend.tierd_emulates = True  # tierd sleeps array and snapshot links itself
        assert backend.bandwidth(Tier.HOST) == bw[Tier.HOST]
        assert backend.bandwidth(Tier.ARRAY) is None and backend.bandwidth(Tier.SNAPSHOT) is None
    finally:
        await backend.close()


async def test_unreachable_tierd_loads_nothing() -> None:
    backend = TierBackend("http://127.0.0.1:1", PROFILE, "m", time_scale=1.0, block_tokens=16)
    try:
        await backend.start()  # only warns
        plan = backend.plan("y" * 2000, prompt_tokens=500, cache_salt=None, session=None)
        await backend.fetch(plan, hbm_tokens=0)
        assert plan.loaded_tokens == 0 and plan.loaded_until == 0
        assert backend.counters.fetch_failures == 1
    finally:
        await backend.close()


async def test_a_fetch_does_not_wait_behind_background_stores() -> None:
    """A loopback tierd stand-in holds every store until a fetch has reached it: with one
    slot shared by both, the fetch would queue behind the stores and neither would end."""
    fetched = asyncio.Event()
    storing = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                if head.startswith(b"PUT "):
                    storing.set()
                    await fetched.wait()
                    body = b'{"stored": true}'
                    ctype = b"application/json"
                else:
                    fetched.set()
                    body = payload_for(7, 64)
                    ctype = b"application/octet-stream"
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                    % (ctype, len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    port = free_port()
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    backend = TierBackend(
        f"http://127.0.0.1:{port}",
        PROFILE,
        "m",
        time_scale=1.0,
        block_tokens=16,
        max_concurrency=1,
    )
    try:
        plan = TierPlan(chain=[1, 2, 3, 4], tokens_per_block=64.0, prompt_tokens=256)
        backend.store_in_background(plan)
        await asyncio.wait_for(storing.wait(), timeout=10.0)  # a store holds the only slot
        assert await asyncio.wait_for(backend._get(7), timeout=10.0)
        await asyncio.wait_for(asyncio.gather(*backend._background), timeout=10.0)
        assert backend.counters.stored_slices == 4
    finally:
        await backend.close()
        server.close()
