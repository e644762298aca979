"""`warmgate bench fuzz --json OUT`: the gateway and tierd fuzzed through the OpenAPI
schemas they serve (schemathesis: examples, coverage, fuzzing and stateful phases, check
`not_a_server_error`), then the gateway with `bench.hostile`'s bodies (what schema fuzzers
never write). A simulated engine behind them; an admin key so the admin API is reached.
Fleet-changing admin calls (add, drain, remove) are left out: they would fuzz the fleet
away from under the run. Every 5xx is a finding, listed in the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.hostile import send
from bench.sim_fleet import MODEL, SimFleet

ADMIN_KEY = "fuzz-admin-key"


def schemathesis_cmd() -> list[str]:
    exe = shutil.which("st") or str(Path(sys.executable).with_name("st"))
    if not Path(exe).exists():
        raise RuntimeError("schemathesis is not installed: pip install -e '.[dev]'")
    return [exe]


def run_schemathesis(
    schema_url: str, max_examples: int, report: Path, seed: int, headers: Sequence[str] = ()
) -> dict[str, Any]:
    cmd = [
        *schemathesis_cmd(), "run", schema_url, "--checks", "not_a_server_error",
        "--max-examples", str(max_examples), "--seed", str(seed), "--no-color",
        "--exclude-method", "DELETE", "--exclude-path-regex", "drain|^/admin/instances$",
        "--report-json-path", str(report),
    ]  # fmt: skip
    for h in headers:
        cmd += ["-H", h]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    data = json.loads(report.read_text())
    return {
        "schema": schema_url,
        "exit_code": proc.returncode,
        "cases": data["test_cases"]["generated"],
        "with_failures": data["test_cases"]["with_failures"],
        "errored": data["test_cases"]["errored"],
        "operations_tested": data["operations"]["tested"],
        "failures": data["failures"][:20],
        "errors": data["errors"][:20],
        "output_tail": proc.stdout[-2000:] if proc.returncode else "",
    }


async def fuzz(args: argparse.Namespace, fleet: SimFleet, out_dir: Path) -> dict[str, Any]:
    gw, td = fleet.gateway_urls[0], fleet.tierd_urls[0]
    auth = [f"Authorization: Bearer {ADMIN_KEY}"]
    gateway = await asyncio.to_thread(
        run_schemathesis, f"{gw}/openapi.json", args.max_examples, out_dir / "st-gw.json",
        args.seed, auth,
    )  # fmt: skip
    tierd = await asyncio.to_thread(
        run_schemathesis, f"{td}/openapi.json", args.max_examples, out_dir / "st-tierd.json",
        args.seed,
    )  # fmt: skip
    tally = await send(gw, args.hostile, MODEL, ADMIN_KEY, seed=args.seed)
    total = gateway["cases"] + tierd["cases"] + tally.cases
    server_errors = gateway["with_failures"] + tierd["with_failures"] + len(tally.server_errors)
    return {
        "cases": total,
        "responses_5xx": server_errors,
        "schemathesis_gateway": gateway,
        "schemathesis_tierd": tierd,
        "hostile": {
            "cases": tally.cases,
            "by_status": dict(tally.by_status),
            "by_kind": dict(tally.by_kind),
            "server_errors": tally.server_errors[:20],
        },
    }


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="warmgate bench fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--max-examples", type=int, default=250, help="per operation and phase")
    p.add_argument("--hostile", type=int, default=4000, help="hostile bodies sent")
    p.add_argument("--seed", type=int, default=13)
    return p.parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    out = Path(args.json)
    run_dir = out.with_name(out.stem + "-run")
    fleet = SimFleet(
        run_dir,
        instances=1,
        tierd=True,
        time_scale=0.001,
        gateway_settings={"auth": {"admin_keys": [ADMIN_KEY]}},
    ).start()
    try:
        result = asyncio.run(fuzz(args, fleet, run_dir))
    finally:
        fleet.stop()
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"fuzz: {result['cases']} cases, {result['responses_5xx']} responses 5xx")
    return 1 if result["responses_5xx"] else 0
