"""`warmgate bench overhead`: what the gateway costs per request, the same gateway over
each upstream transport (gateway/upstream/transport.py: `h1pool`, `aiohttp`, `httpx`) in one run.

One `zero`-profile simulated engine (no compute: what is left is HTTP, parsing and
routing) and one warmgate (`ttft`) per transport in front of it, all started at once. Each
round measures every transport in turn (the order rotated each round, so no transport
always goes first), and for each mode (non-streaming; streaming, latency = time to the first
text chunk):

- CPU per request: `--sequential` requests one after another through the gateway, its
  process's user + system CPU (`/proc/<pid>/stat`, clock ticks) over them divided by their
  count;
- added latency under light load: `--rate` requests/s offered (at least `--requests` of
  them) straight to the engine, then the same through the gateway (bench.overhead.run_step:
  evenly spaced arrivals, at most 64 in flight, latency from scheduled arrival);
  `added_p50 = p50(gateway) - p50(direct)`, the same for p99.

`--peers smg` puts peers (bench.peers: smg, sglang-router, ...) in the same rounds, measured
the same way (CPU of the peer's process, all its threads), for the added p50 against smg's.
`--tree NAME=DIR` adds warmgate from another source tree (an earlier commit) as NAME, for a
before/after in the same rounds. `--floor` adds bench.proxy_floor, the Python edge alone
(uvicorn and the h1pool relaying the body, nothing else: `floor`), and the same relay on a
bare asyncio protocol with no uvicorn (`floor-raw`). `--py-spy S` records the first
warmgate with py-spy (`--native`, 250 samples/s) over S seconds of sequential requests after
the rounds, written beside `--out` (`<out>-py-spy.txt`, collapsed stacks), the rounds'
figures unaffected.

The load generator, the gateways and the engine share the machine's cores; the rounds show
how far the figures move between repeats, which is the noise any difference must beat.
Writes `<out>.json` and `<out>.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import proxy_floor
from bench.overhead import MODES, _body, _one, run_step
from bench.peers import (
    REPO,
    SMG_POLICIES,
    EngineFleet,
    Fleet,
    FleetSpec,
    Gateway,
    peer_missing,
    start_gateway,
)
from bench.procs import Proc, sched_s
from bench.report import machine, write_json_md
from gateway.launch.ports import free_port

TRANSPORTS = ("h1pool", "aiohttp", "httpx")
STREAMS = 64
METRICS = ("cpu_ms_per_request", "added_p50_ms", "added_p99_ms")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU seconds of process `pid`: its live threads' time on CPU in nanoseconds
    (`/proc/<pid>/task/*/schedstat`), so a light proxy's few milliseconds over a round are
    not rounded to whole ticks (a 10 ms tick counted 0 for the floor proxy once). Where the
    kernel keeps no schedstat, `/proc/<pid>/stat`'s utime + stime in ticks, exited threads
    included."""
    try:
        times = sched_s(pid)
    except ValueError:
        times = None
    if times is not None:
        return times[0]
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime (fields 14, 15)


async def start_warmgate(
    fleet: EngineFleet, transport: str, workdir: Path, *, name: str | None = None, tree: str = ""
) -> Gateway:
    """warmgate `ttft` in front of `fleet`, talking to it over `transport`; from the source
    tree `tree` (its gateway, router and contracts packages first on PYTHONPATH) if given."""
    name = name or transport
    port = free_port()
    cfg = fleet.warmgate_config("ttft", port) | {"upstream": {"transport": transport}}
    path = workdir / f"warmgate-{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    # -P: the working directory (this checkout) does not go ahead of `tree` on sys.path
    args = [sys.executable, *(["-P"] if tree else []), "-m", "gateway.cli", "serve"]
    env = {"WARMGATE_CONFIG": str(path), "WARMGATE_PORT": str(port)}
    if tree:
        env["PYTHONPATH"] = tree
    proc = await Proc.spawn(f"warmgate-{name}", args, workdir / f"gw-{name}.log", env)
    await proc.wait_http(f"http://127.0.0.1:{port}/readyz", timeout_s=60)
    return Gateway(name, f"http://127.0.0.1:{port}/v1", proc, {})


async def start_floor(fleet: Fleet, workdir: Path, server: str = "uvicorn") -> Gateway:
    """bench.proxy_floor in front of `fleet`'s one engine: the Python edge alone, on
    uvicorn (`floor`) or on a bare asyncio protocol (`floor-raw`)."""
    name = "floor" if server == "uvicorn" else f"floor-{server}"
    port = free_port()
    args = proxy_floor.command(port, [fleet.engines["e0"]], server)
    proc = await Proc.spawn(name, args, workdir / f"{name}.log", {})
    await proc.wait_http(f"http://127.0.0.1:{port}/", timeout_s=60)
    return Gateway(name, f"http://127.0.0.1:{port}/v1", proc, {})


async def _cpu_per_request(
    client: httpx.AsyncClient, url: str, pid: int, *, model: str, stream: bool, n: int
) -> tuple[float, int]:
    """(CPU ms of process `pid` per request over `n` sequential requests, failures)."""
    before = cpu_s(pid)
    failed = 0
    for i in range(n):
        if await _one(client, url, _body(i, model, stream), stream) is None:
            failed += 1
    return (cpu_s(pid) - before) * 1000.0 / n, failed


def _added(g: float | None, d: float | None) -> float | None:
    return None if g is None or d is None else round((g - d) * 1000.0, 3)


async def measure_round(
    gateways: dict[str, Gateway],
    engine_url: str,
    order: Sequence[str],
    *,
    model: str,
    sequential: int,
    rate: float,
    requests: int,
) -> dict[str, dict[str, dict[str, Any]]]:
    """One round: every gateway in `order`, both modes; {gateway: {mode: figures}}."""
    limits = httpx.Limits(max_connections=STREAMS, max_keepalive_connections=STREAMS)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    async with (
        httpx.AsyncClient(limits=limits, timeout=30.0) as gw_client,
        httpx.AsyncClient(limits=limits, timeout=30.0) as direct,
    ):
        for transport in order:
            gw = gateways[transport]
            url = gw.base_url + "/chat/completions"
            pid = gw.proc.pid
            out[transport] = {}
            for mode in MODES:
                stream = mode == "stream"
                for i in range(20):  # warm connections and first-request paths
                    await _one(gw_client, url, _body(i, model, stream), stream)
                    await _one(direct, engine_url, _body(i, model, stream), stream)
                cpu_ms, failed = await _cpu_per_request(
                    gw_client, url, pid, model=model, stream=stream, n=sequential
                )
                kw: dict[str, Any] = {
                    "model": model, "rate": rate, "streams": STREAMS, "stream": stream,
                    "step_s": requests / rate, "min_requests": requests,
                }  # fmt: skip
                d = await run_step(direct, engine_url, **kw)
                g = await run_step(gw_client, url, **kw)
                out[transport][mode] = {
                    "cpu_ms_per_request": round(cpu_ms, 3),
                    "added_p50_ms": _added(g.p50, d.p50),
                    "added_p99_ms": _added(g.p99, d.p99),
                    "direct_p50_ms": None if d.p50 is None else round(d.p50 * 1000.0, 3),
                    "errors": g.errors + failed,
                }
    return out


def summarize(rounds: list[dict[str, dict[str, dict[str, Any]]]]) -> dict[str, Any]:
    """Per transport and mode: each metric's median and range over the rounds."""
    summary: dict[str, Any] = {}
    for transport in rounds[0]:
        summary[transport] = {}
        for mode in MODES:
            per: dict[str, Any] = {}
            for metric in METRICS:
                values = [r[transport][mode][metric] for r in rounds]
                values = [v for v in values if v is not None]
                per[metric] = {
                    "median": round(statistics.median(values), 3) if values else None,
                    "min": min(values, default=None),
                    "max": max(values, default=None),
                }
            per["errors"] = sum(r[transport][mode]["errors"] for r in rounds)
            summary[transport][mode] = per
    return summary


def render(result: dict[str, Any]) -> str:
    lines = [
        "# Gateway overhead by upstream transport",
        "",
        f"`{result['command']}` at {result['commit']}, {result['started']}, "
        f"{result['machine']['cpus']} CPUs. {result['method']}",
        "",
        "Median over the rounds, [min – max] in brackets:",
        "",
        "| gateway | mode | CPU ms/request | added p50 ms | added p99 ms | errors |",
        "|---|---|---:|---:|---:|---:|",
    ]

    def cell(m: dict[str, Any]) -> str:
        if m["median"] is None:
            return "–"
        return f"{m['median']:.2f} [{m['min']:.2f} – {m['max']:.2f}]"

    for transport, modes in result["summary"].items():
        for mode, per in modes.items():
            row = " | ".join(cell(per[k]) for k in METRICS)
            lines.append(f"| {transport} | {mode} | {row} | {per['errors']} |")
    lines += ["", "Each round (order as run):", ""]
    lines += ["| round | gateway | mode | CPU ms/request | added p50 ms | added p99 ms |"]
    lines += ["|---:|---|---|---:|---:|---:|"]
    for n, rnd in enumerate(result["rounds"], 1):
        for transport, modes in rnd.items():
            for mode, f in modes.items():
                lines.append(
                    f"| {n} | {transport} | {mode} | {f['cpu_ms_per_request']} | "
                    f"{f['added_p50_ms']} | {f['added_p99_ms']} |"
                )
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace, command: str) -> dict[str, Any]:
    transports = [t for t in args.transports.split(",") if t]
    peers = [p for p in args.peers.split(",") if p]
    workdir = Path(tempfile.mkdtemp(prefix="warmgate-overhead-"))
    model = "sim-overhead"
    spec = FleetSpec(instances=1, model=model, profile="zero", time_scale=1.0, tierd=False)
    fleet = Fleet(spec, workdir)
    gateways: dict[str, Gateway] = {}
    rounds = []
    started = datetime.now(UTC)
    try:
        await fleet.start()
        for t in transports:
            gateways[t] = await start_warmgate(fleet, t, workdir)
        for spec_ in (t for t in args.tree if t):
            name, _, tree = spec_.partition("=")
            gateways[name] = await start_warmgate(fleet, "h1pool", workdir, name=name, tree=tree)
        if args.floor:
            gateways["floor"] = await start_floor(fleet, workdir)
            gateways["floor-raw"] = await start_floor(fleet, workdir, "raw")
        for name in peers:
            missing = peer_missing(name)
            if missing:
                raise RuntimeError(f"peer {name}: {missing}")
            gateways[name] = await start_gateway(name, fleet, workdir)
        engine_url = fleet.engines["e0"] + "/v1/chat/completions"
        names = list(gateways)
        for r in range(args.repeats):
            order = names[r % len(names) :] + names[: r % len(names)]
            t0 = time.monotonic()
            kw = {"sequential": args.sequential, "rate": args.rate, "requests": args.requests}
            rounds.append(await measure_round(gateways, engine_url, order, model=model, **kw))
            print(f"[overhead] round {r + 1}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
        if args.py_spy and transports:
            await profile(gateways[transports[0]], model, args.py_spy, Path(args.out))
    finally:
        await asyncio.gather(*(g.stop() for g in gateways.values()), return_exceptions=True)
        await fleet.stop()
    commit = await asyncio.to_thread(_commit)
    return {
        "command": command,
        "commit": commit or "unknown",
        "started": f"{started:%Y-%m-%d %H:%M} UTC",
        "machine": machine(),
        "method": (
            f"{args.repeats} rounds; per round, transport and mode: CPU per request over "
            f"{args.sequential} sequential requests (the gateway's threads' "
            "`/proc/<pid>/task/*/schedstat`, nanoseconds), "
            f"then {args.requests} requests at {args.rate:g} "
            f"req/s (at most {STREAMS} in flight) straight to the engine and then through "
            "the gateway: added = gateway percentile - direct percentile."
        ),
        "rounds": rounds,
        "summary": summarize(rounds),
    }


async def profile(gw: Gateway, model: str, seconds: float, out: Path) -> None:
    """py-spy over `seconds` of sequential requests through `gw`, streamed and whole by
    turns: `<out>-py-spy.txt`, collapsed stacks (`--format raw`: one line a stack, its
    sample count last; flamegraph.pl or speedscope read it)."""
    spy = Path(sys.executable).with_name("py-spy")
    path = out.with_name(out.name + "-py-spy.txt")
    args = ["record", "--pid", str(gw.proc.pid), "--native", "--rate", "250"]
    args += ["--duration", f"{seconds:g}", "--format", "raw", "-o", str(path)]
    quiet = asyncio.subprocess.DEVNULL
    proc = await asyncio.create_subprocess_exec(str(spy), *args, stdout=quiet, stderr=quiet)
    url = gw.base_url + "/chat/completions"
    deadline = time.monotonic() + seconds + 1.0
    async with httpx.AsyncClient(timeout=30.0) as client:
        i = 0
        while time.monotonic() < deadline:
            await _one(client, url, _body(i, model, i % 2 == 1), i % 2 == 1)
            i += 1
    await proc.wait()


def _commit() -> str:
    git = ["git", "rev-parse", "--short", "HEAD"]
    return subprocess.run(git, cwd=REPO, capture_output=True, text=True).stdout.strip()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="warmgate bench overhead", description=__doc__)
    p.add_argument("--transports", default=",".join(TRANSPORTS), help="comma-separated")
    p.add_argument(
        "--peers",
        default="",
        help=f"comma-separated peers in the same rounds ({', '.join(SMG_POLICIES)}, ...)",
    )
    p.add_argument(
        "--tree", action="append", default=[], metavar="NAME=DIR",
        help="also warmgate (h1pool) as NAME from the source tree DIR (e.g. `git archive` of "
        "an earlier commit): a before/after in the same rounds",
    )  # fmt: skip
    p.add_argument(
        "--py-spy", type=float, default=0.0, metavar="S",
        help="after the rounds, py-spy the first warmgate over S s of sequential requests",
    )  # fmt: skip
    p.add_argument(
        "--floor", action="store_true",
        help="also bench.proxy_floor (uvicorn + h1pool relaying the body, nothing else) and "
        "its raw-asyncio server: the Python edge's own cost, in the same rounds",
    )  # fmt: skip
    p.add_argument("--repeats", type=int, default=3, help="rounds over every transport")
    p.add_argument("--sequential", type=int, default=400, help="requests for CPU per request")
    p.add_argument("--rate", type=float, default=25.0, help="req/s of the latency step")
    p.add_argument("--requests", type=int, default=200, help="requests per latency step")
    p.add_argument(
        "--out", default=str(REPO / "bench" / "results" / "overhead-transports"),
        help="writes <out>.json and <out>.md",
    )  # fmt: skip
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    unknown = set(args.transports.split(",")) - set(TRANSPORTS)
    if unknown:
        p.error(f"unknown transport(s) {sorted(unknown)}; known: {', '.join(TRANSPORTS)}")
    command = "warmgate bench overhead " + " ".join(sys.argv[1:] if argv is None else argv)
    result = asyncio.run(run(args, command.strip()))
    write_json_md(Path(args.out), result, render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
