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
event, plus KV slices tierd held before the fault and lost or corrupt after it). The faults
themselves, their injection, recovery and probes: bench/chaos_faults.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.chaos_faults import DiskFull, faults
from bench.chaos_real import main as real_main
from bench.chaos_rows import GATEWAY, markdown, run_row


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
    p.add_argument("--engines", choices=("sim", "vllm"), default="sim", help="bench.chaos_real")
    p.add_argument("--recover-window", type=float, default=60.0, help="s to wait for recovery")
    return p.parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    out = Path(args.json)
    base = Path(args.run_dir) if args.run_dir else out.with_name(out.stem + "-run")
    if args.engines == "vllm":
        return real_main(args, out, base)
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
