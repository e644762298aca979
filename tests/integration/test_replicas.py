"""Two gateway replicas (real processes) sharing one real Redis, in front of real simulated
engines: a player's turns land on the same instance whichever replica they hit, and each
replica sees the other's in-flight load."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from gateway.config.settings import RoutingSettings, StateSettings
from gateway.pipeline.router_build import build_router
from gateway.pipeline.session_bindings import SessionBindings
from gateway.pipeline.state_metrics import StateMetrics
from router.state.redis import RedisState
from router.state.sync import StateSync, SyncConfig
from router.types import Decision, RouteRequest
from tests.support.procs import ManagedProcess, free_port, python_module

MODEL = "sim-qwen2.5-32b"


@dataclass
class Fleet:
    engines: dict[str, str]  # id -> base URL
    gateways: dict[str, str]  # replica id -> base URL
    procs: dict[str, ManagedProcess]

    def tails(self) -> str:
        return "\n".join(f"--- {n}\n{p.tail(15)}" for n, p in self.procs.items())


def start_fleet(
    workdir: Path, redis_url: str, *, engines: int, replicas: int, time_scale: float
) -> Fleet:
    """Engines and gateway replicas on loopback; the caller stops them (`stop_fleet`)."""
    procs: dict[str, ManagedProcess] = {}
    engine_urls: dict[str, str] = {}
    try:
        for n in range(engines):
            port = free_port()
            eid = f"e{n}"
            procs[eid] = ManagedProcess(
                python_module(
                    "sim.engine",
                    *("--host", "127.0.0.1", "--port", str(port), "--instance-id", eid),
                    *("--time-scale", str(time_scale), "--seed", str(n)),
                ),
                workdir / f"{eid}.log",
            )
            engine_urls[eid] = f"http://127.0.0.1:{port}"
        instances = [{"id": i, "url": u} for i, u in engine_urls.items()]
        pool = f"replicas-{uuid.uuid4().hex[:10]}"
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("WARMGATE_")}
        gateway_urls: dict[str, str] = {}
        for n in range(replicas):
            port = free_port()
            rid = f"gw-{chr(ord('a') + n)}"
            env = {
                **base_env,
                "WARMGATE_INSTANCES": json.dumps(instances),
                "WARMGATE_STATE__BACKEND": os.environ.get("TEST_STATE_BACKEND", "redis"),
                "WARMGATE_STATE__REDIS_URL": redis_url,
                "WARMGATE_STATE__POOL": pool,
                "WARMGATE_STATE__REPLICA_ID": rid,
                "WARMGATE_STATE__INFLIGHT_TTL_S": "3",
                "WARMGATE_TIERS__PREFETCH": "false",
                "WARMGATE_HEALTH__INTERVAL_S": "0.5",
                # The original sgl-router fallback: an unmatched request goes to the instance
                # whose tree is smallest, which differs between replicas (each has routed
                # different requests), so only the shared binding keeps a player in place.
                "WARMGATE_ROUTING__POLICY": "prefix",  # its params below; the default is ttft
                "WARMGATE_ROUTING__PARAMS": json.dumps({"fallback": "smallest_tree"}),
            }
            procs[rid] = ManagedProcess(
                python_module(
                    "uvicorn",
                    "gateway.app:create_app",
                    "--factory",
                    *("--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"),
                ),
                workdir / f"{rid}.log",
                env=env,
            )
            gateway_urls[rid] = f"http://127.0.0.1:{port}"
        for eid, url in engine_urls.items():
            procs[eid].wait_http(f"{url}/health", timeout_s=60)
        for rid, url in gateway_urls.items():
            procs[rid].wait_http(f"{url}/readyz", timeout_s=60)
        return Fleet(engine_urls, gateway_urls, procs)
    except BaseException:
        for p in procs.values():
            p.stop()
        raise


def stop_fleet(fleet: Fleet) -> None:
    for p in fleet.procs.values():
        p.stop()


def chat(player: str, turns: int) -> dict[str, Any]:
    """A player's request after `turns` earlier exchanges (the prompt grows each turn). Its
    prompt is mostly the player's own, so a replica that has not routed this player before
    has no cached prefix to follow: only the shared binding keeps the player in place."""
    messages: list[dict[str, str]] = [
        {"role": "system", "content": "You are the blacksmith."},
        {"role": "user", "content": f"I am {player}. " * 60},
    ]
    for t in range(turns):
        messages.append({"role": "assistant", "content": f"Reply {t} to {player}. " * 10})
        messages.append({"role": "user", "content": f"Turn {t + 1} of {player}. " * 10})
    return {"model": MODEL, "messages": messages, "max_tokens": 4, "user": player}


@pytest.fixture(scope="module")
def fleet(redis_url: str) -> Iterator[Fleet]:
    with tempfile.TemporaryDirectory(prefix="replicas-") as d:
        f = start_fleet(Path(d), redis_url, engines=3, replicas=2, time_scale=0.05)
        try:
            yield f
        finally:
            stop_fleet(f)


async def test_a_players_turns_land_on_one_instance_whichever_replica(fleet: Fleet) -> None:
    replicas = list(fleet.gateways.values())
    players = [f"player-{uuid.uuid4().hex[:6]}-{n}" for n in range(8)]
    served: dict[str, list[str]] = {p: [] for p in players}
    async with httpx.AsyncClient(timeout=30) as client:

        async def play(n: int, player: str) -> None:
            for turn in range(4):
                base = replicas[(n + turn) % 2]  # alternate replicas turn by turn
                r = await client.post(f"{base}/v1/chat/completions", json=chat(player, turn))
                assert r.status_code == 200, r.text
                assert r.headers["x-warmgate-instance"] == r.headers["x-engine-instance"]
                served[player].append(r.headers["x-engine-instance"])

        await asyncio.gather(*(play(n, p) for n, p in enumerate(players)))
    for player, instances in served.items():
        assert len(set(instances)) == 1, f"{player} moved: {instances}\n{fleet.tails()}"
    # The players spread over the instances rather than all landing on one.
    assert len({i[0] for i in served.values()}) >= 2, f"{served}\n{fleet.tails()}"


async def test_explain_on_another_replica_names_the_bound_instance(fleet: Fleet) -> None:
    """Explain runs the proxy's own pipeline (dry run): on replica B it shows the binding
    replica A made, and names the instance B then sends the player's next turn to."""
    a_url, b_url = fleet.gateways.values()
    player = f"player-{uuid.uuid4().hex[:6]}"
    async with httpx.AsyncClient(timeout=30) as client:
        first = await client.post(f"{a_url}/v1/chat/completions", json=chat(player, 0))
        assert first.status_code == 200, first.text
        bound = first.headers["x-engine-instance"]
        for _ in range(100):  # the binding is written in the background
            r = await client.get(f"{b_url}/admin/sessions/{player}")
            if r.json().get("binding", {}).get("bound_instance") == bound:
                break
            await asyncio.sleep(0.05)
        explained = await client.post(f"{b_url}/admin/route/explain", json=chat(player, 1))
        assert explained.status_code == 200, explained.text
        body = explained.json()
        assert body["binding"]["bound_instance"] == bound, body
        assert body["binding"]["outcome"] in {"kept", "redirected"}
        assert body["decision"]["instance"] == bound
        nxt = await client.post(f"{b_url}/v1/chat/completions", json=chat(player, 1))
        assert nxt.headers["x-engine-instance"] == body["decision"]["instance"]


async def test_each_replica_sees_the_others_in_flight_load(fleet: Fleet) -> None:
    (a_url, b_url) = fleet.gateways.values()
    long = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell the whole saga. " * 20}],
        # vLLM sampling extension: run to max_tokens (about 16 s here; closed at the end, so
        # it costs nothing but outlasts the checks on a loaded machine: at 5,000 tokens the
        # streams once ended before replica B's view had synced them all)
        "max_tokens": 20_000,
        "ignore_eos": True,
        "stream": True,
    }
    async with httpx.AsyncClient(timeout=60) as client:

        async def view(base: str) -> dict[str, dict[str, Any]]:
            r = await client.get(f"{base}/admin/instances")
            return {i["id"]: i for i in r.json()["instances"]}

        async def totals(base: str) -> tuple[int, int]:
            v = await view(base)
            return sum(i["in_flight"] for i in v.values()), sum(
                i["local_in_flight"] for i in v.values()
            )

        streams = []
        lines = []  # keep each line iterator alive: a collected one closes its response
        try:
            for _ in range(3):  # three long streams held open through replica A
                req = client.build_request("POST", f"{a_url}/v1/chat/completions", json=long)
                resp = await client.send(req, stream=True)
                assert resp.status_code == 200
                streams.append(resp)
                lines.append(resp.aiter_lines())
                await lines[-1].__anext__()  # the first chunk: it is in flight
            for _ in range(300):  # B's counts from the previous test drain within a few ticks
                if await totals(a_url) == (3, 3):
                    break
                await asyncio.sleep(0.05)
            assert await totals(a_url) == (3, 3), fleet.tails()
            for _ in range(300):  # B learns A's load through Redis within a few sync ticks
                if await totals(b_url) == (3, 0):
                    break
                await asyncio.sleep(0.05)
            assert await totals(b_url) == (3, 0), fleet.tails()
            ready = (await client.get(f"{b_url}/readyz")).json()["checks"]["shared_state"]
            assert ready["ok"] and ready["remote_replicas"] == ["gw-a"]
        finally:
            for resp in streams:
                await resp.aclose()  # the client leaves: the gateway cancels upstream
        for _ in range(300):
            if await totals(b_url) == (0, 0) and await totals(a_url) == (0, 0):
                break
            await asyncio.sleep(0.05)
        assert await totals(b_url) == (0, 0)


# -- the binding rules, with two replicas' runtimes in-process on the same Redis -------------


def runtime(redis_url: str, pool: str, replica: str) -> SessionBindings:
    settings = StateSettings(backend="redis", redis_url=redis_url, pool=pool, replica_id=replica)
    router = build_router(RoutingSettings(policy="prefix"))
    store = RedisState(redis_url, pool)
    sync = StateSync(store, router.index, router.load, ["e0", "e1", "e2"], SyncConfig(replica))
    return SessionBindings(sync, router, settings, StateMetrics(CollectorRegistry()))


async def route(rt: SessionBindings, rr: RouteRequest, candidates: list[str]) -> Decision:
    """What gateway.pipeline.decide does around routing, then wait for the background write."""
    bound = await rt.lookup(rr)
    decision, _ = rt.bind(rr, rt.router.route(rr, candidates), candidates, bound)
    await asyncio.gather(*rt._pending)
    return decision


async def test_binding_redirects_moves_when_unhealthy_or_overloaded(redis_url: str) -> None:
    pool = f"bind-{uuid.uuid4().hex[:8]}"
    a, b = runtime(redis_url, pool, "a"), runtime(redis_url, pool, "b")
    every = ["e0", "e1", "e2"]
    hashes = [101, 102, 103, 104]
    rr = RouteRequest(MODEL, hashes, 64, 256, session_key="p1")
    a.router.index.insert("e0", hashes)  # each replica believes the prefix is elsewhere
    b.router.index.insert("e2", hashes)
    try:
        first = await route(a, rr, every)
        assert first.instance == "e0" and "session binding" not in first.reason
        assert await b.binding_of("p1") == {"bound_instance": "e0", "source": "store"}
        second = await route(b, rr, every)  # B's own policy would pick e2
        assert second.instance == "e0"
        assert second.reason.startswith("session binding (policy chose e2")
        assert second.fallbacks[0] == "e2"
        # e0 is unhealthy at B: the player moves to B's choice, compare-and-set.
        third = await route(b, rr, ["e1", "e2"])
        assert third.instance == "e2"
        assert await b.store.get_session("p1", 60) == "e2"
        a._cache.clear()  # (A's cache would expire within binding_cache_s)
        fourth = await route(a, rr, every)
        assert fourth.instance == "e2"  # A follows the move
        # e2 gets overloaded: the binding yields to the policy's choice.
        a.router.load.set_remote("e2", 50)
        fifth = await route(a, rr, every)
        assert fifth.instance == "e0" and "session binding" not in fifth.reason
        assert await a.store.get_session("p1", 60) == "e0"
        # Session-blind requests and baselines are left alone.
        anon = RouteRequest(MODEL, hashes, 64, 256)
        assert (await route(b, anon, every)).instance == "e2"
    finally:
        await a.close()
        await b.close()
