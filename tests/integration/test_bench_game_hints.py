"""`warmgate bench compare` with the game server's hints (issue 22, item 5), end to end on
simulated engines: the same generated lines (first lines with a warm lead, ambient barks,
a world bump) replayed through warmgate-ttft and warmgate-ttft-game, only the latter sending
POST /v1/warm ahead of each first line and x-warmgate-priority; results.json and report.md
carry the first-line, per-class and after-bump figures of each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_compare_sends_the_game_servers_hints_in_the_game_run_only(tmp_path: Path) -> None:
    args = [
        sys.executable, "-m", "gateway.cli", "bench", "compare", "--workload", "game",
        "--scale", "cpu", "--players", "6", "--minutes", "0.5", "--instances", "2",
        "--gateways", "warmgate-ttft,warmgate-ttft-game", "--peers", "",
        "--time-scale", "0.05", "--warm-lead-s", "5", "--bump-at-s", "10",
        "--barks", "0.3", "--priority-classes", "--no-overhead", "--no-claims",
        "--name", "hints", "--results-dir", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "WARMGATE_PEERS_VENV": str(tmp_path / "no-peers-here")}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (out,) = tmp_path.glob("*-hints")
    results = json.loads((out / "results.json").read_text())
    plain = results["gateways"]["warmgate-ttft"]["game"]
    game = results["gateways"]["warmgate-ttft-game"]["game"]
    for g in (plain, game):
        assert g["first_lines"]["n"] >= 3 and g["first_lines"]["failed"] == 0
        assert set(g["classes"]) == {"interactive", "background"}  # barks are background
        assert g["classes"]["background"]["n"] >= 1 and g["after_bumps"]["n"] >= 1
    assert plain["first_lines"]["n"] == game["first_lines"]["n"]  # the same lines
    assert plain["first_lines"]["warmed"] == 0 and plain["first_lines"]["warm_sources"] == {}
    lines = game["first_lines"]
    assert lines["warmed"] + lines["warms_refused"] == lines["n"]  # one warm per first line
    assert lines["warmed"] >= 1 and set(lines["warm_sources"]) <= {"held", "tierd", "engine"}
    assert lines["cached_over_warmed_blocks"] is not None
    # the lines found what their warms made resident (1.0 and 0.986 in longer runs); with the
    # memory backend nothing binds the session, so one line of the few here may be routed to
    # the other instance (0.67 with 3 lines): that much is allowed, not less
    assert lines["cached_over_warmed_blocks"] > 0.6
    assert "What the game server's hints did" in (out / "report.md").read_text()


def test_a_bad_bump_time_is_a_usage_error() -> None:
    argv = [sys.executable, "-m", "gateway.cli", "bench", "compare", "--bump-at-s", "ten"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--bump-at-s" in proc.stderr, proc.stderr
