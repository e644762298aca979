"""A client that goes away cancels the upstream request: the engine stops generating (its
`vllm:num_requests_running` falls back to 0) and the gateway's load view forgets it. Engines
run in real time here so a request is long enough to be cut off."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.fleet import MODEL, Fleet, wait_until


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(tmp_path_factory.mktemp("gw-cancel"), 1, time_scale=1.0).start()
    yield f
    f.stop()


def running(fleet: Fleet) -> float:
    text = httpx.get(f"{fleet.engines[0].url}/metrics", timeout=10).text
    match = re.search(r"^vllm:num_requests_running(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M)
    assert match, "the engine exports vllm:num_requests_running"
    return float(match.group(1))


def gateway_in_flight(fleet: Fleet) -> int:
    return int(fleet.admin("instances")["instances"][0]["in_flight"])


LONG = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me everything."}],
    "max_tokens": 4000,
}


def test_stream_disconnect_cancels_upstream(fleet: Fleet) -> None:
    c = httpx.Client(base_url=fleet.base, timeout=30)
    with c.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # kept: a closed line iterator closes the connection
        for line in lines:
            if '"content":"' in line.replace(" ", "") and '"content":""' not in line:
                break
        assert running(fleet) == 1
        assert gateway_in_flight(fleet) == 1
    c.close()  # closes the connection mid-stream
    wait_until(lambda: running(fleet) == 0, what="engine stopped generating")
    wait_until(lambda: gateway_in_flight(fleet) == 0, what="gateway load released")
    assert 'warmgate_requests_total{outcome="cancelled"}' in httpx.get(f"{fleet.base}/metrics").text


async def test_non_stream_disconnect_cancels_upstream(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.base, timeout=30) as c:
        task = asyncio.create_task(c.post("/v1/chat/completions", json=LONG))
        await asyncio.to_thread(wait_until, lambda: running(fleet) == 1, 30.0, "request running")
        task.cancel()  # closes the connection while the gateway waits for the whole answer
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.to_thread(wait_until, lambda: running(fleet) == 0, 30.0, "engine stopped")
    await asyncio.to_thread(
        wait_until, lambda: gateway_in_flight(fleet) == 0, 30.0, "load released"
    )
