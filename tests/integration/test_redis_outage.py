"""Killing Redis under two gateway replicas loses no request; the outage shows in /readyz and
metrics; when Redis returns, in-flight sharing and the event stream reconverge. Uses a
private redis-server (never the shared one) so it can be killed and restarted."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from contracts.kv_events import BlockStored, EventBatch, encode_batch
from tests.integration.test_replicas import Fleet, chat, start_fleet, stop_fleet
from tests.support.redis_server import RedisServer


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def kill(server: RedisServer) -> None:
    assert server.proc is not None
    server.proc.kill()  # SIGKILL: no goodbye to the clients
    server.proc.wait(timeout=10)
    server.proc = None


async def shared_state(client: httpx.AsyncClient, base: str) -> dict[str, Any]:
    r = await client.get(f"{base}/readyz")
    assert r.status_code == 200, r.text  # an outage degrades routing, it does not stop serving
    check: dict[str, Any] = r.json()["checks"]["shared_state"]
    return check


async def redis_up_gauge(client: httpx.AsyncClient, base: str) -> float:
    text = (await client.get(f"{base}/metrics")).text
    line = next(x for x in text.splitlines() if x.startswith("warmgate_state_redis_up "))
    return float(line.split()[1])


async def until(check: Callable[[], Any], what: str, tries: int = 400) -> None:
    for _ in range(tries):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


async def test_killing_redis_loses_no_request_and_state_reconverges(
    private_redis: RedisServer,
) -> None:
    with tempfile.TemporaryDirectory(prefix="outage-") as d:
        fleet: Fleet = start_fleet(
            Path(d), private_redis.url, engines=2, replicas=2, time_scale=0.05
        )
        try:
            await _scenario(fleet, private_redis)
        finally:
            stop_fleet(fleet)


async def _scenario(fleet: Fleet, server: RedisServer) -> None:
    gateways = list(fleet.gateways.values())
    statuses: list[int] = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(timeout=30) as client:

        async def player(n: int) -> None:
            turn = 0
            while not stop.is_set():
                base = gateways[(n + turn) % len(gateways)]
                try:
                    r = await client.post(
                        f"{base}/v1/chat/completions", json=chat(f"outage-p{n}", turn % 6)
                    )
                    statuses.append(r.status_code)
                except httpx.HTTPError:
                    statuses.append(-1)
                turn += 1

        async def served_at_least(n: int) -> bool:
            return len(statuses) >= n

        load = [asyncio.create_task(player(n)) for n in range(4)]
        try:
            await until(lambda: served_at_least(20), "20 requests before the outage")
            for base in gateways:
                assert (await shared_state(client, base))["ok"]

            kill(server)
            before = len(statuses)

            async def everyone_sees_the_outage() -> bool:
                states = [await shared_state(client, b) for b in gateways]
                return not any(s["ok"] for s in states)

            await until(everyone_sees_the_outage, "both replicas report Redis down")
            for base in gateways:
                assert await redis_up_gauge(client, base) == 0.0
                assert (await shared_state(client, base))["last_error"]
            await until(lambda: served_at_least(before + 20), "20 requests during the outage")

            server.start()  # same port, empty: nothing persisted

            async def everyone_reconnected() -> bool:
                states = [await shared_state(client, b) for b in gateways]
                return all(s["ok"] and s["remote_replicas"] for s in states)

            await until(everyone_reconnected, "both replicas reconnect and see each other")
            for base in gateways:
                assert await redis_up_gauge(client, base) == 1.0

            # The event stream works again: a tierd-style XADD reaches both replicas.
            r = aioredis.Redis.from_url(server.url)
            pool = (await shared_state(client, gateways[0]))["pool"]
            batch = encode_batch(EventBatch(1.0, (BlockStored((11, 12, 13), medium="ARRAY"),)))
            await r.xadd(
                f"warmgate:{{{pool}}}:events", {"instance": "e0", "seq": "0", "batch": batch}
            )
            await r.aclose()

            async def everyone_indexed_it() -> bool:
                states = [await shared_state(client, b) for b in gateways]
                return all(s["stream_blocks"] == 3 for s in states)

            await until(everyone_indexed_it, "both replicas read the stream after the outage")
            after = len(statuses)
            await until(lambda: served_at_least(after + 10), "10 requests after recovery")
        finally:
            stop.set()
            await asyncio.gather(*load)
    assert len(statuses) >= 50
    assert set(statuses) == {200}, f"{statuses}\n{fleet.tails()}"
