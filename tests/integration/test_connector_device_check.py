"""The connector's block copies, both paths, every KV layout, through a real tierd: the
device check run with the engine's python (torch), as a session lent a GPU would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.engines import engine_python_or_skip

ROOT = Path(__file__).resolve().parents[2]


def test_device_check_round_trips_every_layout() -> None:
    python = engine_python_or_skip()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [str(python), "-m", "tierd.connector.device_check", "--tierd-python", sys.executable],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["ok"]
    seen = {(c["layout"], c["copies"]) for c in report["checks"]}
    assert {layout for layout, _ in seen} == {"cpu", "flash_attn", "flashinfer"}
    assert {"torch"} <= {copies for _, copies in seen}
    for c in report["checks"]:
        assert c["counters"]["saved_blocks"] == 4
        assert c["counters"]["loaded_blocks"] == 4
