"""`tierd bench` end to end on a small data set, as a real subprocess: every figure is there,
positive, and the data read back matches what was written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

KEYS = (
    "host_copy_gbps",
    "memcpy_baseline_gbps",
    "file_read_gbps",
    "file_read_baseline_gbps",
    "parallel_read_speedup",
    "checksum_gbps",
)


def test_bench_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    args = ["--slices", "16", "--slice-bytes", "12288", "--repeat", "1", "--chain-slices", "8"]
    args += ["--dir", str(tmp_path), "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "tierd.cli", "bench", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    for key in KEYS:
        assert report[key] > 0, key
    assert report["total_bytes"] == 16 * 12288
    assert report["read_back_intact"] is True
    assert report["implementation"] in {"c", "python"}
    assert isinstance(report["o_direct"], bool)
    assert report["backends"][report["backend"]]["selected"]
    assert report["chain_slices"] == 8 and report["chain_corrupt_slices"] == 0
    assert isinstance(report["device"], dict)
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # its temp dir is gone
