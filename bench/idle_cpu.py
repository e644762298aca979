"""`warmgate bench idle`: what each gateway burns with no traffic at all, in front of the same
engines: the CPU its background loops take (health checks, the engines' metrics scrapes,
shared-state sync, the operator page's sampling). On a fleet that serves a request a second,
every millisecond a second of idle CPU is a millisecond of every request's CPU, and on a
machine whose cores the engines share, CPU taken from them.

All gateways run at once in front of one fleet (`--engines vllm`: two real vLLM engines,
pinned where the machine allows; `sim`: simulated ones), each started and left `--settle`
seconds; then `--repeats` windows of `--seconds` each, every gateway's CPU read over the
same window (its threads' `/proc/<pid>/task/*/schedstat`). `--tree NAME=DIR` adds warmgate
from another source tree (an earlier commit, with its C extensions built) for a before/after
in the same windows. Writes `<out>.json` and `<out>.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.overhead_ab import _commit, start_warmgate
from bench.peers import REPO, EngineFleet, Fleet, FleetSpec, Gateway, peer_missing, start_gateway
from bench.procs import sched_s
from bench.real_fleet import RealFleet, RealFleetSpec
from bench.report import machine, write_json_md


def _cpu_s(pid: int) -> float:
    times = sched_s(pid)
    if times is None:
        raise RuntimeError(f"no schedstat for pid {pid} (exited, or a kernel without it)")
    return times[0]


async def measure(gateways: dict[str, Gateway], seconds: float) -> dict[str, float]:
    """CPU ms per second of each gateway over one window of `seconds`."""
    before = {name: _cpu_s(g.proc.pid) for name, g in gateways.items()}
    started = time.monotonic()
    await asyncio.sleep(seconds)
    wall = time.monotonic() - started
    return {
        name: round((_cpu_s(g.proc.pid) - before[name]) * 1000.0 / wall, 3)
        for name, g in gateways.items()
    }


def _fleet(engines: str, workdir: Path) -> EngineFleet:
    if engines == "vllm":
        return RealFleet(RealFleetSpec(pin_engines=None), workdir)
    return Fleet(FleetSpec(instances=2, model="sim-idle", tierd=False), workdir)


async def run(args: argparse.Namespace, command: str) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="wg-idle-"))
    fleet = _fleet(args.engines, workdir)
    gateways: dict[str, Gateway] = {}
    windows: list[dict[str, float]] = []
    started = datetime.now(UTC)
    try:
        await fleet.start()
        for name in (g for g in args.gateways.split(",") if g):
            gateways[name] = await start_gateway(name, fleet, workdir)
        for spec in args.tree:
            name, _, tree = spec.partition("=")
            gateways[name] = await start_warmgate(fleet, "h1pool", workdir, name=name, tree=tree)
        for name in (p for p in args.peers.split(",") if p):
            if missing := peer_missing(name):
                raise RuntimeError(f"peer {name}: {missing}")
            gateways[name] = await start_gateway(name, fleet, workdir)
        await asyncio.sleep(args.settle)
        for r in range(args.repeats):
            windows.append(await measure(gateways, args.seconds))
            print(f"[idle] window {r + 1}: {windows[-1]}", file=sys.stderr)
    finally:
        await asyncio.gather(*(g.stop() for g in gateways.values()), return_exceptions=True)
        await fleet.stop()
    return {
        "command": command,
        "commit": await asyncio.to_thread(_commit) or "unknown",
        "started": f"{started:%Y-%m-%d %H:%M} UTC",
        "machine": machine(),
        "engines": args.engines,
        "method": (
            f"every gateway up at once in front of the same engines, no traffic; after "
            f"{args.settle:g} s, {args.repeats} windows of {args.seconds:g} s, each gateway's "
            "CPU over the same window (its threads' schedstat), in ms per second"
        ),
        "windows": windows,
        "summary": {
            name: {
                "median": round(statistics.median(w[name] for w in windows), 3),
                "min": min(w[name] for w in windows),
                "max": max(w[name] for w in windows),
            }
            for name in gateways
        },
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        "# Idle CPU of each gateway",
        "",
        f"Run {result['started']} at {result['commit']}; engines: {result['engines']}. "
        f"Method: {result['method']}.",
        "",
        "| gateway | CPU ms/s, median | min | max | each window |",
        "|---|---:|---:|---:|---|",
    ]
    for name, s in result["summary"].items():
        each = ", ".join(f"{w[name]:.2f}" for w in result["windows"])
        lines.append(f"| {name} | {s['median']:.2f} | {s['min']:.2f} | {s['max']:.2f} | {each} |")
    lines += ["", "```", result["command"], "```", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="warmgate bench idle", description=__doc__)
    p.add_argument("--engines", choices=("vllm", "sim"), default="sim")
    p.add_argument("--gateways", default="warmgate-ttft", help="comma-separated, ours")
    p.add_argument("--peers", default="", help="comma-separated peers (smg, sglang-router, ...)")
    p.add_argument(
        "--tree", action="append", default=[], metavar="NAME=DIR",
        help="also warmgate as NAME from the source tree DIR (an earlier commit)",
    )  # fmt: skip
    p.add_argument("--settle", type=float, default=10.0, help="seconds after start-up")
    p.add_argument("--seconds", type=float, default=20.0, help="each window")
    p.add_argument("--repeats", type=int, default=3, help="windows")
    p.add_argument(
        "--out", default=str(REPO / "bench" / "results" / "idle-cpu"),
        help="writes <out>.json and <out>.md",
    )  # fmt: skip
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    result = asyncio.run(run(args, f"warmgate bench idle {argv_text}".strip()))
    write_json_md(Path(args.out), result, render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
