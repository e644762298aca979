"""Scratch (2026-12-07): where a whole answer's time goes inside the gateway.

`bash instrument.sh DIR` makes an instrumented copy of the gateway at HEAD; then

    .venv/bin/python bench/results/2026-12-07c-overhead-phases/phases.py DIR [N]

starts one `zero`-profile engine and that gateway (`ttft`), sends N whole requests back to
back and N paced 20 ms apart (each also straight to the engine), and prints the added p50
and each phase's p50 (ms between the marks of gateway/_phase.py)."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench.overhead import _body, _one
from bench.overhead_ab import start_warmgate
from bench.peers import Fleet, FleetSpec

MODEL = "sim-overhead"
PHASES: tuple[str, ...] = ("body_read", "parsed", "decided", "posting", "head")
PHASES += ("first_token", "read_all", "response_built", "sent")
OUT = Path("/tmp/phases.json")


async def _pairs(c: httpx.AsyncClient, gw: str, engine: str, n: int, gap_s: float) -> float:
    direct: list[float] = []
    through: list[float] = []
    for i in range(n):
        for url, into in ((engine, direct), (gw, through)):
            got = await _one(c, url, _body(i, MODEL, False), False)
            if got is not None:
                into.append(got)
            if gap_s:
                await asyncio.sleep(gap_s)
    return float(statistics.median(through) - statistics.median(direct)) * 1000.0


async def measure(tree: str, n: int) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="phases-"))
    spec = FleetSpec(instances=1, model=MODEL, profile="zero", time_scale=1.0, tierd=False)
    fleet = Fleet(spec, workdir)
    await fleet.start()
    gw = await start_warmgate(fleet, "h1pool", workdir, name="phases", tree=tree)
    url, engine = gw.base_url + "/chat/completions", fleet.engines["e0"] + "/v1/chat/completions"
    try:
        async with httpx.AsyncClient() as c:
            for i in range(30):  # warm the paths (these rows are dropped below)
                await _one(c, url, _body(i, MODEL, False), False)
            added = {"b2b": await _pairs(c, url, engine, n, 0.0)}
            added["paced"] = await _pairs(c, url, engine, n, 0.02)
    finally:
        await gw.stop()
        await fleet.stop()
    return added


def report(added: dict[str, float], n: int) -> None:
    rows = [r for r in json.loads(OUT.read_text()) if "sent" in r][30:]
    for label, part in (("b2b", rows[:n]), ("paced", rows[n:])):
        print(f"{label}: added p50 {added[label]:.2f} ms; {len(part)} rows")
        prev = "start"
        for name in PHASES:
            gaps = [r[name] - r[prev] for r in part if name in r and prev in r]
            if gaps:
                print(f"  {prev} -> {name}: {statistics.median(gaps):.3f} ms")
            prev = name


if __name__ == "__main__":
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    report(asyncio.run(measure(sys.argv[1], count)), count)
