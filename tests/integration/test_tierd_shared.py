"""Two `tierd serve` processes sharing one array directory reuse each other's slices, and
both publish residency events in the agreed format: vLLM KV-event batches on ZMQ PUB and
in the router's Redis Stream `warmgate:{pool}:events` (real Redis)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis.asyncio as aioredis
import zmq
import zmq.asyncio

from contracts.kv_events import decode_batch
from tests.support.procs import ManagedProcess, free_port, python_module
from tierd.client import TierdClient, TierdError

SLICE = 4096


def data_of(h: int) -> bytes:
    return random.Random(h).randbytes(2000)


class Fleet:
    def __init__(self, tmp: Path, redis_url: str) -> None:
        self.tmp = tmp
        self.redis_url = redis_url
        self.pool = f"tierd-test-{uuid.uuid4().hex[:8]}"
        self.procs: list[ManagedProcess] = []

    def start(self, name: str, *extra: str) -> tuple[str, str]:
        port, ev_port = free_port(), free_port()
        endpoint = f"tcp://127.0.0.1:{ev_port}"
        proc = ManagedProcess(
            python_module(
                "tierd.cli",
                "serve",
                "--port",
                str(port),
                "--instance-id",
                name,
                "--l1-bytes",
                str(8 * SLICE),
                "--slice-bytes",
                str(SLICE),
                "--array-dir",
                str(self.tmp / "shared-array"),
                "--snapshot-dir",
                str(self.tmp / f"snap-{name}"),
                "--events-endpoint",
                endpoint,
                "--redis-url",
                self.redis_url,
                "--pool",
                self.pool,
                *extra,
            ),
            self.tmp / f"{name}.log",
        )
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(f"{url}/readyz", timeout_s=30)
        return url, endpoint

    def stop(self) -> None:
        for p in self.procs:
            p.stop()


@pytest.fixture
def fleet(tmp_path: Path, redis_url: str) -> Iterator[Fleet]:
    f = Fleet(tmp_path, redis_url)
    try:
        yield f
    finally:
        f.stop()


async def put_and_demote(client: TierdClient, chain: list[int], session: str) -> None:
    parent = None
    for h in chain:
        assert await client.put_slice(h, data_of(h), parent=parent, tokens=16, session=session)
        parent = h
    assert await client.evict(chain, tier="GPU") == len(chain)


def decode(payload: bytes) -> list[list[Any]]:
    # the router's own decoder takes every batch whole (the contract between the two)
    parsed = decode_batch(payload)
    assert parsed.skipped == 0 and parsed.events
    batch = msgpack.unpackb(payload, raw=False)
    assert isinstance(batch, list) and isinstance(batch[0], float)
    events: list[list[Any]] = batch[1]
    for e in events:
        if e[0] == "BlockStored":
            assert len(e) == 8 and e[6] in {"CPU", "ARRAY", "SNAPSHOT"}  # arena: host memory
            assert all(isinstance(h, int) for h in e[1])
        elif e[0] == "BlockRemoved":
            assert len(e) == 3 and e[2] in {"CPU", "ARRAY", "SNAPSHOT"}
        else:
            assert e == ["AllBlocksCleared"]
    return events


async def test_two_tierds_share_one_array_and_publish_events(fleet: Fleet) -> None:
    url_a, _ = fleet.start("inst-a")
    url_b, endpoint_b = fleet.start("inst-b")
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(endpoint_b)
    await asyncio.sleep(0.3)  # ZMQ slow joiner: let the subscription reach the publisher
    chain_a = [7001, 7002, 7003, 7004]
    chain_b = [8001, 8002, 8003]
    try:
        async with TierdClient(url_a) as a, TierdClient(url_b) as b:
            await put_and_demote(a, chain_a, "player-1")
            where = await b.lookup([*chain_a, 9999])
            assert where["available"] == 4 and where["leading"]["ARRAY"] == 4
            for h in chain_a:
                assert await b.get_slice(h) == data_of(h)
            assert (await b.lookup(chain_a))["leading"]["GPU"] == 4
            await put_and_demote(b, chain_b, "player-2")
            out = await a.prefetch(chain_b, deadline_s=5.0, session="player-2", wait=True)
            assert out["on_time"] == 3
            assert [await a.get_slice(h) for h in chain_b] == [data_of(h) for h in chain_b]
            stats_b = await b.stats()
            assert stats_b["hits"]["array"] == 4
            with pytest.raises(TierdError) as bad:
                await b.put_slice(1, b"x" * (SLICE + 1))
            assert bad.value.status == 413
            await asyncio.sleep(0.1)  # one flush interval: the last batches go out

        # ZMQ: 3 frames, 8-byte big-endian seq increasing by one, vLLM array encoding
        zmq_events: list[list[Any]] = []
        seqs: list[int] = []
        while await sub.poll(timeout=200):
            topic, seq, payload = await sub.recv_multipart()
            assert topic == b"kv-events" and len(seq) == 8
            seqs.append(int.from_bytes(seq, "big"))
            zmq_events += decode(payload)
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        stored = {(h, e[6]) for e in zmq_events if e[0] == "BlockStored" for h in e[1]}
        assert {(h, "CPU") for h in chain_a + chain_b} <= stored
        assert {(h, "ARRAY") for h in chain_b} <= stored
    finally:
        sub.close()
        ctx.term()

    # Redis Stream: fields instance, seq, batch; seq from 0 per instance, +1 per batch
    r = aioredis.Redis.from_url(fleet.redis_url)
    key = f"warmgate:{{{fleet.pool}}}:events"
    try:
        entries = await r.xrange(key)
        await r.delete(key)
    finally:
        await r.aclose()
    by_inst: dict[str, list[int]] = {}
    events_a: list[list[Any]] = []
    for _, fields in entries:
        inst = fields[b"instance"].decode()
        by_inst.setdefault(inst, []).append(int(fields[b"seq"]))
        evs = decode(fields[b"batch"])
        if inst == "inst-a":
            events_a += evs
    assert set(by_inst) == {"inst-a", "inst-b"}
    for seqs_i in by_inst.values():
        assert seqs_i == list(range(len(seqs_i)))
    assert events_a[0] == ["AllBlocksCleared"]
    stored_a = [e for e in events_a if e[0] == "BlockStored" and e[6] == "ARRAY"]
    assert sorted(h for e in stored_a for h in e[1]) == chain_a
    first = next(e for e in stored_a if e[1] == [7002])
    assert first[2] == 7001 and first[4] == 16  # parent hash and token count
    removed_arena = [h for e in events_a if e[0] == "BlockRemoved" and e[2] == "CPU" for h in e[1]]
    assert set(chain_a) <= set(removed_arena)
