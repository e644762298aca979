"""`warmgate bench chaos --engines vllm`: the chaos rows of `bench.chaos` on real vLLM
engines. One fleet for every row (starting two CPU engines costs a minute or more): two
engines of `bench.real_fleet.RealFleet` (one core each, the tiny local model), each with a
tierd and the KV connector (one shared array), and a Redis the tierds publish into and the
gateways share; per row, fresh gateway replicas (warmgate `ttft` in precise mode, health and
deadlines of `bench.chaos.GATEWAY` scaled for engines that take seconds a request).

The rows are the faults that exist on such a fleet: engine SIGKILL (API server, EngineCore
and Worker at once; restarted), engine SIGSTOP and the slow engine (every process of the
engine stopped), tierd SIGKILL, Redis SIGKILL and SIGSTOP, a gateway replica SIGKILL. The
full array disk needs a tmpfs mounted under the array before the fleet starts and stays a
simulated row. Answers are verified as in the simulated mode: greedy decoding
(`temperature` 0, `ignore_eos`), so a prompt has one text, re-asked of the healthy engine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import yaml

from bench.chaos_faults import faults
from bench.chaos_rows import markdown, run_row
from bench.procs import Proc
from bench.real_fleet import VLLM_BODY_EXTRA, RealFleet, RealFleetSpec
from bench.sim_fleet import wait_http, wait_redis
from gateway.launch.ports import free_port
from gateway.launch.tiered import TierdProcess
from gateway.launch.vllm_fleet import VllmEngine

REAL_FAULTS = (
    "engine SIGKILL",
    "engine SIGSTOP 20 s",
    "slow engine (4x)",
    "tierd SIGKILL",
    "Redis SIGKILL",
    "Redis SIGSTOP",
    "gateway replica SIGKILL",
)
# tierd's DRAM tier: 16 slices of the tiny model's 1.5 MiB blocks, so slices demote to the
# array during a row (what a tierd SIGKILL must not lose)
L1_BYTES = 24 * 1024 * 1024
# CPU engines answer in 0.3-8 s: a first byte may take seconds under load, /health too
REAL_GATEWAY: dict[str, Any] = {
    "health": {"interval_s": 0.5, "timeout_s": 2.0, "failure_threshold": 2},
    "timeouts": {"first_byte_s": 20.0, "stall_s": 5.0},
}


def _signal_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class EngineProc:
    """A vLLM engine as `bench.chaos` drives a process: signal, kill, start (not waiting)."""

    def __init__(self, engine: VllmEngine) -> None:
        self.engine = engine

    def signal(self, sig: int) -> None:
        _signal_pids(self.engine.pids(), sig)  # API server, EngineCore, Worker

    def kill(self) -> None:
        self.engine.kill_all()

    def start(self) -> None:
        self.engine.start()  # in the caller's thread (PDEATHSIG: see TierdProc.start)
        # wait_ready also records EngineCore and Worker so a later stop reaches them
        threading.Thread(target=self.engine.wait_ready, daemon=True).start()


class TierdProc:
    def __init__(self, tierd: TierdProcess) -> None:
        self.tierd = tierd

    def signal(self, sig: int) -> None:
        tree = self.tierd.tree
        if tree is not None and tree.alive():
            _signal_pids([tree.pid, *tree.descendants()], sig)

    def kill(self) -> None:
        self.tierd.kill()

    def start(self) -> None:
        # here, not in a thread of its own: the child's PDEATHSIG follows the thread that
        # started it (a thread that ends takes its tierd along); ready in well under 1 s,
        # and counted in the time to recover
        self.tierd.start()


class RealChaosFleet:
    """What `bench.chaos.run_row` reads of a fleet, over real engines started once:
    `start()`/`stop()` start and stop one row's gateway replicas only."""

    def __init__(self, real: RealFleet, redis: Proc, redis_port: int, run_dir: Path) -> None:
        self.real = real
        self.run_dir = run_dir
        self.model = real.model
        self.body_extra = {**VLLM_BODY_EXTRA, "temperature": 0.0}
        fleet = real.fleet
        self.engines = [EngineProc(e) for e in fleet.engines]
        self.engine_urls = [e.url for e in fleet.engines]
        instances = getattr(fleet, "instances", [])
        self.tierds = [TierdProc(inst.tierd) for inst in instances]
        self.tierd_urls = [inst.tierd.url for inst in instances]
        self.array_dir: Path | None = getattr(fleet, "array_dir", None)
        self.redis_proc = redis
        self.redis_port = redis_port
        self.replicas = 1
        self.gateways: list[Proc] = []
        self.gateway_urls: list[str] = []

    def for_row(self, run_dir: Path, replicas: int) -> RealChaosFleet:
        self.run_dir = run_dir
        self.replicas = replicas
        return self

    def start(self) -> None:
        """Every engine and tierd answering (a previous row may have restarted one), then
        this row's gateways."""
        for url in self.engine_urls:
            wait_http(f"{url}/health", timeout_s=300)
        for url in self.tierd_urls:
            wait_http(f"{url}/readyz", timeout_s=60)
        wait_redis(self.redis_port)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.gateways, self.gateway_urls = [], []
        for r in range(self.replicas):
            port = free_port()
            config = self.real.warmgate_config("ttft", port)
            config.update(REAL_GATEWAY)
            config["log_level"] = "info"  # each continuation's line: tokens sent, by what
            config["state"] = {
                "backend": "redis",
                "redis_url": f"redis://127.0.0.1:{self.redis_port}/0",
                "replica_id": f"replica-{r}",
            }
            path = self.run_dir / f"gateway-{r}.yaml"
            path.write_text(yaml.safe_dump(config))
            args = [sys.executable, "-m", "gateway.launch.serve", "--config", str(path)]
            self.gateways.append(Proc(f"gateway-{r}", args, self.run_dir / f"gateway-{r}.log"))
            self.gateway_urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(self.gateways, self.gateway_urls, strict=True):
            wait_http(f"{url}/readyz", timeout_s=60, proc=proc)

    def stop(self) -> None:
        for proc in self.gateways:
            proc.stop()
        for e in self.engines:
            e.signal(signal.SIGCONT)  # nothing left stopped for the next row
        for t in self.tierds:
            t.signal(signal.SIGCONT)
        self.redis_proc.signal(signal.SIGCONT)


async def run(args: argparse.Namespace, base: Path) -> list[dict[str, Any]]:

    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    redis_port = free_port()
    redis = Proc(
        "redis",
        ["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no"],
        base / "redis.log",
    )
    real: RealFleet | None = None
    rows: list[dict[str, Any]] = []
    try:
        wait_redis(redis_port)
        spec = RealFleetSpec(instances=2, tiers=True)
        url = f"redis://127.0.0.1:{redis_port}/0"
        # short path: ipc:// socket paths must fit in 107 bytes
        workdir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="wg-chaos-"))
        real = await asyncio.to_thread(
            lambda: RealFleet(spec, workdir, tiered=True, redis_url=url, l1_bytes=L1_BYTES)
        )
        print("chaos --engines vllm: starting 2 engines with tierds ...", flush=True)
        await real.start()
        fleet = RealChaosFleet(real, redis, redis_port, base)
        for i, (fault, _extra) in enumerate(faults()):
            if args.only and not any(o.lower() in fault.name.lower() for o in args.only):
                continue
            if fault.name not in REAL_FAULTS:
                rows.append({"fault": fault.name, "skipped": "simulated fleet only"})
                continue
            row_dir = base / f"{i}-{'-'.join(fault.name.split()[:2]).lower()}"
            print(f"chaos: {fault.name} ...", flush=True)
            await asyncio.to_thread(fleet.stop)  # clean slate (no-op on the first row)
            row_fleet = fleet.for_row(row_dir, int(fault.needs.get("replicas", 1)))
            row = await run_row(fault, None, args, row_dir, fleet=row_fleet)
            print(json.dumps({k: v for k, v in row.items() if k != "errors"}), flush=True)
            rows.append(row)
    finally:
        if real is not None:
            await real.stop()
            _keep_logs(real, base)
        redis.stop()
    return rows


def _keep_logs(real: RealFleet, base: Path) -> None:
    run_dir = real.cfg.run_dir
    if run_dir is None:
        return
    for log in Path(run_dir).glob("*.log"):
        with contextlib.suppress(OSError):
            shutil.copy2(log, base / log.name)
    shutil.rmtree(run_dir, ignore_errors=True)


def main(args: argparse.Namespace, out: Path, base: Path) -> int:

    base.mkdir(parents=True, exist_ok=True)
    rows = asyncio.run(run(args, base))
    result = {"settings": vars(args), "gateway": REAL_GATEWAY, "rows": rows}
    out.write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(rows))
    print(markdown(rows))
    return 0
