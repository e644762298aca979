"""The faults of `warmgate bench chaos` (bench/chaos.py): for each, how it is injected and
recovered on a simulated fleet, and the probes that say when it became visible where it
should (`detected`) and when that cleared (`cleared`)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.procs import Proc
from bench.sim_fleet import SimFleet


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
