"""The Endpoint Picker's decision time at a steady rate, and a player's affinity through it.

    python -m bench.epp_bench --rate 100 --seconds 20 --repeats 2 \
        --json bench/results/epp-bench.json --md bench/results/epp-bench.md

One gateway process with its picker (gateway/epp/, `epp.port`) in front of three simulated
engines. Picks arrive open-loop at `--rate` per second, as Envoy's ext_proc filter sends them
(a new stream per request: request headers, then the buffered body): the decision time is
from the headers' write to the pick's arrival at the client, gRPC and all. Each picked
request is then carried to its endpoint over HTTP and its response fed back through the
stream, as Envoy does, so the router's load and the accounting move as in production.
Players (`--players`) take turns in a growing conversation, each turn its own pick.

Baselines in the same run, same rate and players, with the arms' order rotated each repeat:
`explain` (POST /admin/route/explain: the same pipeline's dry-run decision over HTTP) for the
decision time, and `proxy` (the players' turns through POST /v1/chat/completions) for
affinity, whose latency is the whole request's and shown only for scale. Affinity: the
share of players whose turns all went to one instance."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue, Metadata
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from google.protobuf.struct_pb2 import Struct

from bench.report import pct
from bench.sim_fleet import MODEL, SimFleet
from gateway.launch.ports import free_port

ARMS = ("epp", "explain", "proxy")
DESTINATION = "x-gateway-destination-endpoint"


def turn_body(player: str, n: int) -> dict[str, Any]:
    lore = f"You are the blacksmith of {player}'s town; you remember every deal. " * 12
    messages: list[dict[str, str]] = [{"role": "system", "content": lore}]
    for k in range(n):
        messages += [
            {"role": "user", "content": f"{player}: line {k}, what do you sell?"},
            {"role": "assistant", "content": f"Blades and nails, {k}."},
        ]
    messages.append({"role": "user", "content": f"{player}: line {n}, what do you sell?"})
    return {"model": MODEL, "messages": messages, "max_tokens": 4, "stream": True}


def _headers(pairs: dict[str, str]) -> HeaderMap:
    return HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()])


class Arms:
    """One way of sending each pick, and what it measured."""

    def __init__(self, fleet: SimFleet, epp_port: int, client: httpx.AsyncClient) -> None:
        self.fleet = fleet
        self.client = client
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{epp_port}")
        self.stub = ep_grpc.ExternalProcessorStub(self.channel)
        self.by_endpoint = {
            u.removeprefix("http://"): f"sim-{i}" for i, u in enumerate(fleet.engine_urls)
        }

    async def epp(self, player: str, body: dict[str, Any]) -> tuple[float, str]:
        call = self.stub.Process()
        raw = json.dumps(body).encode()
        head = {":method": "POST", ":path": "/v1/chat/completions", "x-session-id": player}
        started = time.perf_counter()
        await call.write(
            ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=_headers(head)))
        )
        await call.read()
        await call.write(
            ep.ProcessingRequest(request_body=ep.HttpBody(body=raw, end_of_stream=True))
        )
        reply = await call.read()
        decided = time.perf_counter() - started
        common = reply.request_body.response
        (endpoint,) = [
            o.header.raw_value.decode().split(",")[0]
            for o in common.header_mutation.set_headers
            if o.header.key == DESTINATION
        ]
        if common.HasField("body_mutation"):
            raw = common.body_mutation.body
        served = Struct()
        served.update({"x-gateway-destination-endpoint-served": endpoint})
        async with self.client.stream(
            "POST", f"http://{endpoint}/v1/chat/completions", content=raw
        ) as r:
            head = {":status": str(r.status_code), "content-type": r.headers["content-type"]}
            await call.write(
                ep.ProcessingRequest(
                    response_headers=ep.HttpHeaders(headers=_headers(head)),
                    metadata_context=Metadata(filter_metadata={"envoy.lb": served}),
                )
            )
            await call.read()
            async for chunk in r.aiter_raw():
                await call.write(ep.ProcessingRequest(response_body=ep.HttpBody(body=chunk)))
                await call.read()
        await call.write(ep.ProcessingRequest(response_body=ep.HttpBody(end_of_stream=True)))
        await call.read()
        await call.done_writing()
        return decided, self.by_endpoint[endpoint]

    async def explain(self, player: str, body: dict[str, Any]) -> tuple[float, str]:
        started = time.perf_counter()
        r = await self.client.post(
            f"{self.fleet.gateway_urls[0]}/admin/route/explain",
            json={**body, "prompt_cache_key": player},
        )
        took = time.perf_counter() - started
        r.raise_for_status()
        return took, str(r.json()["decision"]["instance"])

    async def proxy(self, player: str, body: dict[str, Any]) -> tuple[float, str]:
        started = time.perf_counter()
        url = f"{self.fleet.gateway_urls[0]}/v1/chat/completions"
        async with self.client.stream(
            "POST", url, json=body, headers={"x-session-id": player}
        ) as r:
            await r.aread()
            r.raise_for_status()
            return time.perf_counter() - started, r.headers["x-warmgate-instance"]


async def run_arm(
    send: Callable[[str, dict[str, Any]], Awaitable[tuple[float, str]]],
    tag: str,
    rate: float,
    seconds: float,
    players: int,
) -> dict[str, Any]:
    """Open-loop arrivals at `rate`; pick k is player k % players' turn k // players."""
    times: list[float] = []
    where: dict[str, set[str]] = {}
    errors = 0
    turns: dict[str, int] = {}

    async def one(player: str) -> None:
        nonlocal errors
        n = turns.get(player, 0)
        turns[player] = n + 1
        try:
            took, instance = await send(player, turn_body(player, n))
        except Exception:
            errors += 1
            return
        times.append(took)
        where.setdefault(player, set()).add(instance)

    total = int(rate * seconds)
    start = time.perf_counter()
    tasks = []
    for k in range(total):
        delay = start + k / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(f"{tag}-p{k % players}")))
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    affine = sum(1 for s in where.values() if len(s) == 1)
    return {
        "picks": len(times),
        "errors": errors,
        "achieved_rate": round(total / wall, 1),
        "p50_ms": round((pct(times, 50) or 0) * 1e3, 3),
        "p99_ms": round((pct(times, 99) or 0) * 1e3, 3),
        "mean_ms": round(statistics.fmean(times) * 1e3, 3) if times else None,
        "players": len(where),
        "players_on_one_instance": affine,
    }


async def run(args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    epp_port = free_port()
    settings = {
        "epp": {"port": epp_port, "host": "127.0.0.1"},
        "calibration": {"probe": False},
    }
    fleet = SimFleet(run_dir, instances=3, time_scale=args.time_scale, gateway_settings=settings)
    fleet.start()
    rows: list[dict[str, Any]] = []
    try:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(timeout=30, limits=limits, trust_env=False) as client:
            arms = Arms(fleet, epp_port, client)
            sends = {"epp": arms.epp, "explain": arms.explain, "proxy": arms.proxy}
            await run_arm(arms.epp, "warmup", args.rate, 2, args.players)
            for rep in range(args.repeats):
                order = ARMS[rep % 3 :] + ARMS[: rep % 3]
                for arm in order:
                    tag = f"r{rep}-{arm}"
                    row = await run_arm(sends[arm], tag, args.rate, args.seconds, args.players)
                    rows.append({"repeat": rep, "arm": arm, **row})
                    print(json.dumps(rows[-1]), file=sys.stderr)
            await arms.channel.close()
    finally:
        fleet.stop()
    return {
        "rate": args.rate,
        "seconds": args.seconds,
        "players": args.players,
        "time_scale": args.time_scale,
        "instances": 3,
        "rows": rows,
    }


def render(res: dict[str, Any]) -> str:
    lines = [
        f"# Endpoint picker: decision time at {res['rate']:g} picks/s",
        "",
        f"{res['seconds']:g} s per arm, {res['players']} players, 3 simulated engines "
        f"(time scale {res['time_scale']:g}); arms rotated each repeat.",
        "",
        "| repeat | arm | picks | errors | achieved /s | p50 ms | p99 ms | players on one |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['repeat']} | {r['arm']} | {r['picks']} | {r['errors']} | "
            f"{r['achieved_rate']} | {r['p50_ms']} | {r['p99_ms']} | "
            f"{r['players_on_one_instance']}/{r['players']} |"
        )
    lines += [
        "",
        "`epp`: ext_proc headers+body to the pick, gRPC included. `explain`: the same pipeline's",
        "dry-run over HTTP. `proxy`: the whole request through the HTTP proxy (for affinity; its",
        "latency includes the engine's answer).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.epp_bench", description=__doc__)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--players", type=int, default=40)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--time-scale", type=float, default=0.01)
    p.add_argument("--json", dest="json_out")
    p.add_argument("--md", dest="md_out")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="epp-bench-") as tmp:
        res = asyncio.run(run(args, Path(tmp)))
    md = render(res)
    print(md)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(res, indent=1) + "\n")
    if args.md_out:
        Path(args.md_out).write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
