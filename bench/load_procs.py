"""The game load of `bench.loadgen` from several processes, for runs whose rate one Python
process cannot hold (the soak: one process, busy reading streams through a pool of hundreds
of connections, fell to half the rate it was asked for). Each process drives its own players
at its share of the rate, with its own connection pool, and hands its results back; start
times are `time.monotonic()`, one clock for every process on the machine."""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.loadgen import Load, Result


@dataclass(frozen=True, slots=True)
class Phase:
    """One process's part of a phase: open loop at `rate`, or closed loop with `concurrency`."""

    urls: tuple[str, ...]
    duration_s: float
    players: int
    first_player: int
    seed: int
    max_tokens: int
    rate: float = 0.0
    concurrency: int = 0


@dataclass(slots=True)
class PhaseResult:
    results: list[Result]
    lag: list[float]  # how late each arrival started, s
    shed: int
    gc_pauses: list[tuple[float, float, int]]  # every load process's, by start time
    client_cpu: list[list[tuple[float, float]]]  # per load process: (monotonic, process_time)


class _ClientWatch:
    """What a load process costs itself over a phase: its CPU, sampled, and each garbage
    collection's pause, so a soak can tell a slower gateway from a slower client."""

    def __init__(self) -> None:
        self.cpu: list[tuple[float, float]] = []  # (monotonic, process_time)
        self.gc: list[tuple[float, float, int]] = []  # (monotonic at start, pause s, generation)
        self._began: tuple[float, float] | None = None

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = (time.monotonic(), time.perf_counter())
        elif self._began is not None:
            at, t = self._began
            self.gc.append((at, time.perf_counter() - t, info["generation"]))
            self._began = None

    async def sample_cpu(self, every_s: float) -> None:
        while True:
            self.cpu.append((time.monotonic(), time.process_time()))
            await asyncio.sleep(every_s)


def _run_phase(phase: Phase) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        load = Load(
            phase.urls,
            players=phase.players,
            first_player=phase.first_player,
            max_tokens=phase.max_tokens,
            seed=phase.seed,
            keep=False,
        )
        try:
            if phase.concurrency:
                return {"rate": await load.closed_loop(phase.concurrency, phase.duration_s)}
            # what exists now (modules, the client, its pool) lives through the phase: no full
            # collection walks it again, so the client pauses its streams less
            gc.freeze()
            watch = _ClientWatch()
            gc.callbacks.append(watch.on_gc)
            sampler = asyncio.create_task(watch.sample_cpu(5.0))
            try:
                await load.run(phase.rate, phase.duration_s)
            finally:
                gc.callbacks.remove(watch.on_gc)
                sampler.cancel()
            watch.cpu.append((time.monotonic(), time.process_time()))
            return {
                "rows": load.rows, "lag": load.lag, "shed": load.shed, "gc": watch.gc,
                "cpu": watch.cpu,
            }  # fmt: skip
        finally:
            await load.aclose()

    return asyncio.run(go())


def _handover(
    loop: asyncio.AbstractEventLoop, fut: asyncio.Future[dict[str, Any]]
) -> tuple[Callable[[dict[str, Any]], None], Callable[[BaseException], None]]:
    """The pool's callbacks, run on its result thread, settling `fut` on the loop's."""

    def settle(result: dict[str, Any] | None, exc: BaseException | None) -> None:
        if fut.done():  # cancelled: the soak is being interrupted
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result or {})

    def ok(result: dict[str, Any]) -> None:
        loop.call_soon_threadsafe(settle, result, None)

    def failed(exc: BaseException) -> None:
        loop.call_soon_threadsafe(settle, None, exc)

    return ok, failed


class LoadProcesses:
    """`processes` load generators splitting `players` and the rate between them."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        processes: int,
        players: int,
        max_tokens: int = 24,
        seed: int = 7,
    ) -> None:
        if processes < 1 or players < processes:
            raise ValueError("need at least one process and one player per process")
        self.urls = tuple(urls)
        self.processes = processes
        self.players = players
        self.max_tokens = max_tokens
        self.seed = seed
        # a Pool, not a ProcessPoolExecutor: `close()` can terminate workers still running a
        # phase (an interrupted soak must not leave them loading the gateway for 30 minutes)
        self._pool = multiprocessing.get_context("spawn").Pool(processes)
        self._phases = 0

    def _parts(self, duration_s: float, **kw: Any) -> list[Phase]:
        self._phases += 1
        per, extra = divmod(self.players, self.processes)
        parts, first = [], 0
        for i in range(self.processes):
            n = per + (i < extra)
            seed = self.seed * 1000 + self._phases * 100 + i  # distinct per process and phase
            parts.append(Phase(self.urls, duration_s, n, first, seed, self.max_tokens, **kw))
            first += n
        return parts

    async def _gather(self, parts: list[Phase]) -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[dict[str, Any]]] = []
        for part in parts:
            fut: asyncio.Future[dict[str, Any]] = loop.create_future()
            ok, failed = _handover(loop, fut)
            self._pool.apply_async(_run_phase, (part,), callback=ok, error_callback=failed)
            futures.append(fut)
        return list(await asyncio.gather(*futures))

    async def closed_loop(self, concurrency: int, duration_s: float) -> float:
        """Completed requests per second, `concurrency` clients split between the processes."""
        per = max(1, concurrency // self.processes)
        outs = await self._gather(self._parts(duration_s, concurrency=per))
        return float(sum(o["rate"] for o in outs))

    async def run(self, rate: float, duration_s: float) -> PhaseResult:
        """Poisson arrivals at `rate` in all, each process its share, for `duration_s`."""
        outs = await self._gather(self._parts(duration_s, rate=rate / self.processes))
        results = [r for o in outs for r in o["rows"].results()]
        results.sort(key=lambda r: r.started)
        return PhaseResult(
            results,
            [x for o in outs for x in o["lag"]],
            sum(int(o["shed"]) for o in outs),
            sorted((float(t), float(d), int(g)) for o in outs for t, d, g in o["gc"]),
            [[(t, c) for t, c in o["cpu"]] for o in outs],
        )

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()
