"""`warmgate bench chaos --json OUT`: each fault injected under a bounded game load on a
fresh simulated fleet, then recovered; one row per fault.

Timeline of a row: load starts; the fault at `--fault-at` s; recovery at `--recover-at` s
(so SIGSTOP lasts 20 s by default); load ends `--tail` s later. Faults: engine SIGKILL
(restarted), engine SIGSTOP (SIGCONT), a slow engine (stopped 75% of the time), tierd
SIGKILL (restarted), Redis SIGKILL (restarted), Redis SIGSTOP, the array disk full (a
tmpfs filled, then emptied; root only), a gateway replica SIGKILL with a second replica
behind a client that retries on it (restarted).

Per row: requests; failed before the first byte and mid-stream (as the client saw them,
after its retry where it has one); streams continued; time to detect (the fault visible
where it should be: the instance unhealthy in the gateway, its `/readyz` shared state down,
tierd `/readyz` degraded, the gateway's prefetch hints to tierd failing, the gateway
replica refusing connections); time to recover (after
the recovery action, until that clears); wrong answers (`bench.loadgen`: malformed, or a
text the engine does not give to the same prompt); data lost (answers cut without an error
event, plus KV slices tierd held before the fault and lost or corrupt after it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.loadgen import Load
from bench.sim_fleet import Proc, SimFleet

GATEWAY = {
    "health": {"interval_s": 0.5, "timeout_s": 0.5, "failure_threshold": 2},
    "timeouts": {"first_byte_s": 5.0, "stall_s": 2.0},
    "routing": {"policy": "ttft"},
}


@dataclass
class Fault:
    name: str
    needs: dict[str, Any]
    inject: Callable[[SimFleet], Awaitable[None]]
    recover: Callable[[SimFleet], Awaitable[None]]
    detected: Callable[[SimFleet, httpx.AsyncClient], Awaitable[bool]]  # fault visible
    cleared: Callable[[SimFleet, httpx.AsyncClient], Awaitable[bool]]


async def _instance_state(fleet: SimFleet, client: httpx.AsyncClient, i: int = 0) -> str:
    r = await client.get(f"{fleet.gateway_urls[-1]}/admin/instances")
    return str(r.json()["instances"][i]["health"]["state"])


async def engine_unhealthy(fleet: SimFleet, client: httpx.AsyncClient) -> bool:
    return await _instance_state(fleet, client) == "unhealthy"


async def engine_healthy(fleet: SimFleet, client: httpx.AsyncClient) -> bool:
    return await _instance_state(fleet, client) == "healthy"


async def shared_down(fleet: SimFleet, client: httpx.AsyncClient) -> bool:
    r = await client.get(f"{fleet.gateway_urls[0]}/readyz")
    return not r.json()["checks"]["shared_state"]["ok"]


async def shared_up(fleet: SimFleet, client: httpx.AsyncClient) -> bool:
    return not await shared_down(fleet, client)


async def _prefetch_failed(fleet: SimFleet, client: httpx.AsyncClient) -> float:
    text = (await client.get(f"{fleet.gateway_urls[0]}/metrics")).text
    for line in text.splitlines():
        if line.startswith('warmgate_prefetch_hints_total{result="failed"}'):
            return float(line.split()[1])
    return 0.0


class TierdSeen:
    """The gateway noticed the dead tierd: a prefetch hint to it failed."""

    def __init__(self) -> None:
        self.mark: float | None = None

    async def failing(self, fleet: SimFleet, client: httpx.AsyncClient) -> bool:
        now = await _prefetch_failed(fleet, client)
        if self.mark is None:
            self.mark = now  # the first look, right after the kill
            return False
        return now > self.mark


async def tierd_alive(fleet: SimFleet, client: httpx.AsyncClient) -> bool:
    try:
        r = await client.get(f"{fleet.tierd_urls[0]}/readyz", timeout=0.5)
    except httpx.HTTPError:
        return False
    return r.status_code == 200


async def array_degraded(fleet: SimFleet, client: httpx.AsyncClient) -> bool:
    r = await client.get(f"{fleet.tierd_urls[0]}/readyz", timeout=1.0)
    return bool(r.json().get("degraded"))


async def _demotions(fleet: SimFleet, client: httpx.AsyncClient) -> int:
    r = await client.get(f"{fleet.tierd_urls[0]}/v1/stats", timeout=1.0)
    return int(sum(r.json().get("demotions", {}).values()))


async def replica_down(fleet: SimFleet, client: httpx.AsyncClient) -> bool:
    try:
        await client.get(f"{fleet.gateway_urls[0]}/livez", timeout=0.5)
    except httpx.HTTPError:
        return True
    return False


async def replica_up(fleet: SimFleet, client: httpx.AsyncClient) -> bool:
    try:
        r = await client.get(f"{fleet.gateway_urls[0]}/readyz", timeout=0.5)
    except httpx.HTTPError:
        return False
    return r.status_code == 200


Pick = Callable[[SimFleet], Proc | None]
Action = Callable[[SimFleet], Awaitable[None]]


def _sig(pick: Pick, sig: int) -> Action:
    async def act(fleet: SimFleet) -> None:
        proc = pick(fleet)
        assert proc is not None
        if sig == signal.SIGKILL:
            await asyncio.to_thread(proc.kill)
        else:
            proc.signal(sig)

    return act


def _restart(pick: Pick) -> Action:
    async def act(fleet: SimFleet) -> None:
        proc = pick(fleet)
        assert proc is not None
        await asyncio.to_thread(proc.start)

    return act


class SlowEngine:
    """Stops the engine 75% of the time (0.15 s stopped, 0.05 s running) until recovered."""

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None

    async def inject(self, fleet: SimFleet) -> None:
        proc = fleet.engines[0]

        async def cycle() -> None:
            try:
                while True:
                    proc.signal(signal.SIGSTOP)
                    await asyncio.sleep(0.15)
                    proc.signal(signal.SIGCONT)
                    await asyncio.sleep(0.05)
            finally:
                proc.signal(signal.SIGCONT)

        self.task = asyncio.create_task(cycle())

    async def recover(self, fleet: SimFleet) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


class DiskFull:
    """The array directory on a small tmpfs; a filler file takes all of it."""

    def __init__(self) -> None:
        self.filler: Path | None = None
        self.mark = 0

    def prepare(self, fleet: SimFleet) -> None:
        array = fleet.run_dir / "array"
        array.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(array)], check=True)

    async def inject(self, fleet: SimFleet) -> None:
        assert fleet.array_dir is not None
        self.filler = fleet.array_dir / "filler"
        await asyncio.to_thread(_fill, self.filler)

    async def recover(self, fleet: SimFleet) -> None:
        if self.filler is not None:
            self.filler.unlink(missing_ok=True)
        async with httpx.AsyncClient() as c:
            self.mark = await _demotions(fleet, c)

    async def writes_again(self, fleet: SimFleet, client: httpx.AsyncClient) -> bool:
        return await _demotions(fleet, client) > self.mark

    def cleanup(self, fleet: SimFleet) -> None:
        subprocess.run(["umount", "-l", str(fleet.run_dir / "array")], check=False)


def _fill(path: Path) -> None:
    with contextlib.suppress(OSError), open(path, "wb") as f:
        while True:
            f.write(b"\0" * (1 << 20))
            f.flush()


def faults() -> list[tuple[Fault, Any]]:
    e0: Callable[[SimFleet], Proc | None] = lambda f: f.engines[0]  # noqa: E731
    t0: Callable[[SimFleet], Proc | None] = lambda f: f.tierds[0]  # noqa: E731
    rd: Callable[[SimFleet], Proc | None] = lambda f: f.redis_proc  # noqa: E731
    g0: Callable[[SimFleet], Proc | None] = lambda f: f.gateways[0]  # noqa: E731
    slow, disk, seen = SlowEngine(), DiskFull(), TierdSeen()
    tierd = {"tierd": True}
    return [
        (Fault("engine SIGKILL", {}, _sig(e0, signal.SIGKILL), _restart(e0),
               engine_unhealthy, engine_healthy), None),
        (Fault("engine SIGSTOP 20 s", {}, _sig(e0, signal.SIGSTOP), _sig(e0, signal.SIGCONT),
               engine_unhealthy, engine_healthy), None),
        (Fault("slow engine (4x)", {}, slow.inject, slow.recover,
               engine_unhealthy, engine_healthy), None),
        (Fault("tierd SIGKILL", tierd, _sig(t0, signal.SIGKILL), _restart(t0),
               seen.failing, tierd_alive), None),
        (Fault("Redis SIGKILL", {"redis": True}, _sig(rd, signal.SIGKILL), _restart(rd),
               shared_down, shared_up), None),
        (Fault("Redis SIGSTOP", {"redis": True}, _sig(rd, signal.SIGSTOP),
               _sig(rd, signal.SIGCONT), shared_down, shared_up), None),
        (Fault("array disk full", tierd, disk.inject, disk.recover,
               array_degraded, disk.writes_again), disk),
        (Fault("gateway replica SIGKILL", {"replicas": 2, "redis": True},
               _sig(g0, signal.SIGKILL), _restart(g0), replica_down, replica_up), None),
    ]  # fmt: skip


async def _first_true(
    check: Callable[[], Awaitable[bool]], since: float, until: float
) -> float | None:
    while time.monotonic() < until:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            if await check():
                return round(time.monotonic() - since, 3)
        await asyncio.sleep(0.1)
    return None


async def _tierd_slices(fleet: SimFleet, client: httpx.AsyncClient) -> dict[str, int]:
    s = (await client.get(f"{fleet.tierd_urls[0]}/v1/stats", timeout=2)).json()
    return {
        "array": int(s["tiers"]["array"]["slices"]),
        "recovered": int(s.get("recovered", {}).get("array", 0)),
        "corrupt": int(sum(s.get("corrupt", {}).values())),
    }


async def run_row(
    fault: Fault, extra: Any, args: argparse.Namespace, run_dir: Path
) -> dict[str, Any]:
    needs = dict(fault.needs)
    fleet = SimFleet(
        run_dir,
        instances=args.instances,
        time_scale=args.time_scale,
        tierd=bool(needs.get("tierd")),
        redis=bool(needs.get("redis")),
        replicas=int(needs.get("replicas", 1)),
        gateway_settings=GATEWAY,
        engine_args=("--kv-capacity-tokens", "20000"),
    )
    if needs.get("tierd"):
        fleet.tierd_args = ("--l1-bytes", str(4 * 262144))
    if isinstance(extra, DiskFull):
        extra.prepare(fleet)
    try:
        await asyncio.to_thread(fleet.start)
        load = Load(
            fleet.gateway_urls,
            players=args.players,
            max_tokens=args.max_tokens,
            retry_other=len(fleet.gateway_urls) > 1,
        )
        async with httpx.AsyncClient(timeout=2.0) as client:
            t_start = time.monotonic()
            run = asyncio.create_task(load.run(args.rate, args.recover_at + args.tail))
            await asyncio.sleep(args.fault_at)
            before = await _tierd_slices(fleet, client) if fleet.tierds else None
            fault_t = time.monotonic()
            await fault.inject(fleet)
            recover_t = t_start + args.recover_at
            detect = await _first_true(lambda: fault.detected(fleet, client), fault_t, recover_t)
            await asyncio.sleep(max(0.0, recover_t - time.monotonic()))
            recover_t = time.monotonic()
            await fault.recover(fleet)
            recover = await _first_true(
                lambda: fault.cleared(fleet, client), recover_t, recover_t + 60
            )
            results = await run
            after = await _tierd_slices(fleet, client) if fleet.tierds else None
        healthy = fleet.engine_urls[-1]
        verified = await load.verify(healthy, sample=args.verify)
        await load.aclose()
    finally:
        await asyncio.to_thread(fleet.stop)
        if isinstance(extra, DiskFull):
            extra.cleanup(fleet)
    failed_before = [r for r in results if r.failed_before_first_byte]
    failed_mid = [r for r in results if r.failed_mid_stream]
    silent = [r for r in results if r.error == "no [DONE]"]
    lost_slices = 0
    if before is not None and after is not None and fault.name == "tierd SIGKILL":
        lost_slices = max(0, before["array"] - after["recovered"]) + after["corrupt"]
    errors = Counter(r.error for r in results if r.error)
    return {
        "fault": fault.name,
        "requests": len(results),
        "failed_before_first_byte": len(failed_before),
        "failed_mid_stream": len(failed_mid),
        "continued": sum(r.continued for r in results),
        "time_to_detect_s": detect,
        "time_to_recover_s": recover,
        "wrong_answers": sum(r.wrong is not None for r in results),
        "answers_verified": verified,
        "data_lost": len(silent) + lost_slices,
        "tierd_slices": {"before": before, "after": after} if before else None,
        "client_shed": load.shed,
        "errors": dict(errors.most_common(5)),
    }


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="warmgate bench chaos", description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--instances", type=int, default=3)
    p.add_argument("--time-scale", type=float, default=0.3)
    p.add_argument("--rate", type=float, default=10.0, help="requests per second")
    p.add_argument("--players", type=int, default=60)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--fault-at", type=float, default=8.0)
    p.add_argument("--recover-at", type=float, default=28.0)
    p.add_argument("--tail", type=float, default=8.0)
    p.add_argument("--verify", type=int, default=150, help="answers re-asked of an engine")
    p.add_argument("--only", action="append", help="run only faults whose name has this")
    p.add_argument("--run-dir", default=None)
    return p.parse_args(list(argv))


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| fault | requests | failed before first byte | failed mid-stream | continued | "
        "detect s | recover s | wrong answers | data lost |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['fault']} | skipped: {r['skipped']} ||||||||")
            continue
        lines.append(
            f"| {r['fault']} | {r['requests']} | {r['failed_before_first_byte']} | "
            f"{r['failed_mid_stream']} | {r['continued']} | {r['time_to_detect_s']} | "
            f"{r['time_to_recover_s']} | {r['wrong_answers']} | {r['data_lost']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    out = Path(args.json)
    base = Path(args.run_dir) if args.run_dir else out.with_name(out.stem + "-run")
    rows: list[dict[str, Any]] = []
    for i, (fault, extra) in enumerate(faults()):
        if args.only and not any(o.lower() in fault.name.lower() for o in args.only):
            continue
        if isinstance(extra, DiskFull) and os.geteuid() != 0:
            rows.append({"fault": fault.name, "skipped": "needs root to mount a tmpfs"})
            continue
        if fault.needs.get("redis") and shutil.which("redis-server") is None:
            rows.append({"fault": fault.name, "skipped": "redis-server not installed"})
            continue
        row_dir = base / f"{i}-{fault.name.split()[0].lower()}-{fault.name.split()[1].lower()}"
        print(f"chaos: {fault.name} ...", flush=True)
        row = asyncio.run(run_row(fault, extra, args, row_dir))
        print(json.dumps({k: v for k, v in row.items() if k != "errors"}), flush=True)
        rows.append(row)
    result = {"settings": vars(args), "gateway": GATEWAY, "rows": rows}
    out.write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(rows))
    print(markdown(rows))
    return 0
