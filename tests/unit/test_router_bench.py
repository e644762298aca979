"""`warmgate bench router` on a small index: it runs end to end through the CLI dispatch,
fills exactly the entries asked for, and writes every figure the issue names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main as warmgate


def test_bench_router_writes_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "router.json"
    argv = ["bench", "router", "--instances", "4", "--index-entries", "30000"]
    argv += ["--prompt-tokens", "4096", "--iterations", "40", "--warmup", "5"]
    argv += ["--policy", "session", "--json", str(out)]
    assert warmgate(argv) == 0
    result = json.loads(out.read_text())
    assert result["index_entries"] == 30000
    assert result["policy"] == "session"
    assert result["iterations"] == 40
    assert result["prompt_blocks"] == 4096 // 64 - 1  # the chat framing leaves a partial block
    assert 0 < result["decision_us_p50"] <= result["decision_us_p99"]
    # memory is a property of the data structure, not of the machine's speed
    assert 40 < result["bytes_per_entry"] < 200
    assert "bytes per entry" in capsys.readouterr().out


def test_bench_router_rejects_bad_flags() -> None:
    with pytest.raises(SystemExit):
        warmgate(["bench", "router", "--instances", "0"])
    with pytest.raises(SystemExit):
        warmgate(["bench", "router", "--policy", "nope"])
