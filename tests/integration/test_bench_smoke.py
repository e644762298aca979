"""`warmgate bench compare` end to end, tiny: 2 engines, seconds of traffic, warmgate and
round robin, a missing peer reported as skipped, small overhead and claims runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _trace(path: Path, n: int = 12) -> None:
    """A small Mooncake-format trace: three players' sessions on one shared system prefix."""
    lines = []
    for i in range(n):
        player = i % 3
        turn = i // 3
        ids = [0, 100 + player] + [1000 * player + t for t in range(turn + 1)]
        lines.append(
            json.dumps(
                {
                    "timestamp": 400 * i,
                    "input_length": 64 * len(ids) - 10,
                    "output_length": 12,
                    "hash_ids": ids,
                    "session": f"player-{player}",
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_compare_writes_every_artefact(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    _trace(trace)
    out_json = tmp_path / "out.json"
    args = [
        sys.executable, "-m", "gateway.cli", "bench", "compare",
        "--workload", f"trace:{trace}", "--trace-block-tokens", "64", "--minutes", "1",
        "--instances", "2", "--gateways", "warmgate-ttft,round-robin", "--peers", "smg",
        "--time-scale", "0.05", "--json", str(out_json), "--name", "smoke",
        "--results-dir", str(tmp_path / "results"),
        "--overhead-gateways", "warmgate-ttft", "--overhead-rates", "20",
        "--overhead-streams", "4", "--overhead-step-s", "0.5", "--overhead-min-requests", "10",
        "--claims-levels", "1", "--claims-requests", "6",
    ]  # fmt: skip
    env = {**os.environ, "WARMGATE_PEERS_VENV": str(tmp_path / "no-peers-here")}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]

    dirs = list((tmp_path / "results").glob("*-smoke"))
    assert len(dirs) == 1
    out = dirs[0]
    results = json.loads((out / "results.json").read_text())
    assert json.loads(out_json.read_text()) == results

    gateways = results["gateways"]
    assert "bash scripts/install-peers.sh" in gateways["smg"]["skipped"]
    for name in ("warmgate-ttft", "round-robin"):
        g = gateways[name]
        assert g["requests"] == 12 and g["errors"] == 0, g
        assert 0 < g["ttft_p50_s"] <= g["ttft_p90_s"] <= g["ttft_p99_s"]
        assert g["e2e_p50_s"] >= g["ttft_p50_s"]
        assert g["tpot_p50_s"] > 0
        assert 0 < g["engine_ttft_mean_s"] <= g["ttft_mean_s"] * 1.01  # the engine's share
        assert g["outside_engine_ttft_mean_s"] is not None
        assert sum(g["requests_by_instance"].values()) == 12
        assert g["instance_source"] == "engine counters"
        assert g["load_imbalance"] >= 1.0
        assert 0 < g["cached_token_ratio"] < 1  # the shared prefix and turns are reused
    # round robin alternates between the two engines
    assert gateways["round-robin"]["requests_by_instance"] == {"e0": 6, "e1": 6}

    cases = results["overhead"]["gateways"]["warmgate-ttft"]["cases"]
    assert {(c["mode"], c["streams"]) for c in cases} == {("non-stream", 4), ("stream", 4)}
    assert all(c["steps"] and c["added_p50_ms"] is not None for c in cases)
    claims = results["claims"]
    assert claims["seed_claim"] and len(claims["cases"]) == 1
    case = claims["cases"][0]
    assert case["errors"] == 0 and case["ttft_p50_tiers_s"] > 0 and case["ttft_p50_no_array_s"] > 0

    report = (out / "report.md").read_text()
    assert "| warmgate-ttft |" in report and "| round-robin |" in report
    assert "skipped" in report and "warmgate bench compare" in report
    for png in ("ttft_cdf.png", "cached_by_tier.png", "requests_per_instance.png"):
        data = (out / png).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000


@pytest.mark.slow
def test_overhead_runs_every_transport_and_writes_both_files(tmp_path: Path) -> None:
    """`warmgate bench overhead`, one tiny round: every transport measured in both modes,
    CPU per request read from the gateway's process, no request failed."""
    out = tmp_path / "overhead"
    args = [
        sys.executable, "-m", "gateway.cli", "bench", "overhead", "--repeats", "1",
        "--sequential", "60", "--requests", "10", "--rate", "50", "--out", str(out), "--floor",
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.with_suffix(".json").read_text())
    assert set(result["summary"]) == {"h1pool", "aiohttp", "httpx", "floor", "floor-raw"}
    for modes in result["rounds"][0].values():
        assert set(modes) == {"non-stream", "stream"}
        for figures in modes.values():
            assert figures["errors"] == 0
            # 60 requests of the gateway take several 10 ms ticks of its own process
            assert figures["cpu_ms_per_request"] > 0
            assert figures["added_p50_ms"] is not None
    assert "| h1pool | stream |" in out.with_suffix(".md").read_text()


def test_idle_reads_each_gateways_cpu_over_the_same_windows(tmp_path: Path) -> None:
    """`warmgate bench idle` on simulated engines: every window has a figure for every
    gateway, a live gateway's is above zero (its loops run), and both files are written."""
    out = tmp_path / "idle"
    args = [
        sys.executable, "-m", "gateway.cli", "bench", "idle", "--engines", "sim",
        "--repeats", "2", "--seconds", "1", "--settle", "1", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.with_suffix(".json").read_text())
    assert len(result["windows"]) == 2
    assert all(w["warmgate-ttft"] > 0 for w in result["windows"])
    summary = result["summary"]["warmgate-ttft"]
    assert summary["min"] <= summary["median"] <= summary["max"]
    assert "| warmgate-ttft |" in out.with_suffix(".md").read_text()
