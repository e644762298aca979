"""`warmgate bench chaos` end to end on one short row (engine SIGKILL): the row is written
with its columns, every request is accounted for, none is a wrong answer and none lost;
the streams continued are counted by how they went on."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.cli import main


def test_chaos_engine_sigkill_row(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    argv = [
        "bench", "chaos", "--json", str(out), "--only", "engine SIGKILL", "--fault-at", "2",
        "--recover-at", "5", "--tail", "2", "--rate", "6", "--verify", "10",
        "--time-scale", "0.2", "--max-tokens", "32",
    ]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["fault"] for r in rows] == ["engine SIGKILL"]
    row = rows[0]
    assert row["requests"] > 20
    assert row["answers_verified"] == 10
    assert row["wrong_answers"] == 0 and row["data_lost"] == 0
    assert row["time_to_detect_s"] is not None  # the killed engine was marked unhealthy
    # simulated engines report token ids: a stream cut there goes on by them, never by text
    assert set(row["continued_by"]) <= {"token_ids"}
    assert sum(row["continued_by"].values()) == row["continued"]
    assert out.with_suffix(".md").read_text().count("engine SIGKILL") == 1
