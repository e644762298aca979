"""The connector's block copies, every path this machine has, every KV layout, on torch-made
tensors: the device check run with the engine's python (torch), as a session lent a GPU
runs it (there through the CUDA/HIP backend; here through the native host backend, the same
argument checks and span arithmetic, and torch's copies)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.engines import engine_python_or_skip

pytestmark = pytest.mark.engines  # its engine python runs in the real engines' worker

ROOT = Path(__file__).resolve().parents[2]
LAYOUTS = {"cpu", "flash_attn", "flashinfer", "nhd_view"}


def test_device_check_round_trips_every_layout(tmp_path: Path) -> None:
    python = engine_python_or_skip()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "connector.json"
    r = subprocess.run(
        [
            str(python), "-m", "tierd.connector.device_check", "--tierd-python", sys.executable,
            "--quick", "--json", str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert report == json.loads(r.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["tierd_error"] is None
    native = "native-cuda" if report["device"] == "cuda" else "native-host"
    seen = {(c["layout"], c["copies"]) for c in report["checks"]}
    assert seen == {(layout, path) for layout in LAYOUTS for path in (native, "torch")}
    for c in report["checks"]:
        assert c["equal"] and not c["failed_blocks"]
        assert c["counters"]["saved_blocks"] == 4
        assert c["counters"]["loaded_blocks"] == 4
        assert c["block_size"] == (128 if c["layout"] == "cpu" else 16)
        if c["copies"] != "torch":
            assert c["counters"]["native_copies"] > 0
            assert "torch_copy_calls" not in c["counters"]  # native all the way
    assert {b["layout"] for b in report["bench"]} == LAYOUTS
    for b in report["bench"]:
        assert b["path"] == native and b["ok"]
        assert b["gather_equal"] and b["scatter_equal"]
        assert b["refusals"] == {
            "block_out_of_range": "IndexError",
            "slice_past_host": "IndexError",
            "run_past_buffer": "IndexError",
            "negative_block": "ValueError",
        }
        assert b["gbps"]["native_gather"] > 0 and b["gbps"]["torch_runs_gather"] > 0
