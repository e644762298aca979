"""`Inflight`'s count of attempts still prefilling (sent, no first token): what a warm that
gave way to real requests waits on before it goes on (gateway/pipeline/warm.py)."""

from __future__ import annotations

import asyncio

from gateway.upstream.inflight import Inflight


def test_an_attempt_prefills_until_its_first_token_or_its_end() -> None:
    async def scenario() -> None:
        inflight = Inflight()
        a, b = inflight.begin("e0"), inflight.begin("e0")
        done = asyncio.ensure_future(inflight.prefills_done("e0", 30.0))
        other = inflight.begin("e1")
        assert (inflight.prefilling("e0"), inflight.prefilling("e1")) == (2, 1)
        inflight.prefilled(a)
        inflight.prefilled(a)  # said twice: counted once
        assert inflight.prefilling("e0") == 1 and inflight.count("e0") == 2
        inflight.end(a)  # past its prefill already
        await asyncio.sleep(0)
        assert not done.done()  # b still prefills
        inflight.end(b)  # ended before any token: its prefill is over too
        inflight.end(b)
        assert inflight.prefilling("e0") == 0 and inflight.count("e0") == 0
        assert await done
        assert inflight.prefilling("e1") == 1 and other.prefilling
        assert not await inflight.prefills_done("e1", 0.01)  # still prefilling: times out

    asyncio.run(scenario())
