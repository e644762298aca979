"""Scratch: warmgate-ttft before 2 real vLLM engines, one game replay, py-spy on it.

python prof_real.py SEED OUT_DIR [KEY=VALUE (the gateway's environment) ...]
"""

import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
from bench.procs import sched_s
from bench.real_fleet import VLLM_BODY_EXTRA, RealFleetSpec, real_fleet_with_gateway
from bench.replay import replay
from bench.workloads import game_items
from gateway.launch.vllm_fleet import pinned


async def main(seed: int, out: str, env: dict[str, str]) -> None:
    items = game_items(16, 1.5, seed, "cpu")
    spec = RealFleetSpec(instances=2, pin_engines=pinned(True, 2, os.cpu_count() or 1))
    async with real_fleet_with_gateway(
        spec, "warmgate-ttft", keep_logs=Path(out) / "logs", warmgate_env=env
    ) as (fleet, gw):
        pid = gw.proc.pid
        os.makedirs(out, exist_ok=True)
        spy = (
            None
            if os.environ.get("NOSPY")
            else await asyncio.create_subprocess_exec(
                *[
                    ".venv/bin/py-spy",
                    "record",
                    "--native",
                    "-d",
                    "80",
                    "-r",
                    "100",
                    "-f",
                    "raw",
                    "-o",
                    f"{out}/spy.txt",
                    "-p",
                    str(pid),
                ]
            )
        )
        s0 = sched_s(pid)
        t0 = time.perf_counter()
        recs = await replay(
            gw.base_url,
            items,
            model=fleet.model,
            compress=1.0,
            concurrency=64,
            instance_by_url=gw.instance_by_url,
            api_key=gw.api_key,
            progress_label="p",
            body_extra=VLLM_BODY_EXTRA,
        )
        s1 = sched_s(pid)
        dt = time.perf_counter() - t0
        if spy:
            await spy.wait()
        print("requests", len(recs), "dur", round(dt, 1), "sched0", s0, "sched1", s1)
        ok = [r for r in recs if r.ok]
        print("ok", len(ok))


asyncio.run(main(int(sys.argv[1]), sys.argv[2], dict(a.split("=", 1) for a in sys.argv[3:])))
