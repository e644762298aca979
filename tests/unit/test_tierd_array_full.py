"""A full array disk loses the slices L1 evicts; that must be seen: a metric
(`tierd_dropped_slices_total`), a warning in the log and `/readyz` saying degraded (it still
serves: ready). A real full filesystem (a 256 KiB tmpfs) when root may mount one, else an
array directory that refuses writes."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tierd.api import create_app
from tierd.settings import TierdSettings

SLOT = 4096


@contextlib.contextmanager
def unwritable_dir(path: Path) -> Iterator[str]:
    path.mkdir()
    mounted = False
    if os.geteuid() == 0:
        mounted = (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(path)],
                capture_output=True,
            ).returncode
            == 0
        )
    if mounted:
        filler = path / "filler"
        with contextlib.suppress(OSError), open(filler, "wb") as f:
            f.write(b"\0" * (1 << 20))  # fills the tmpfs: the array has no room at all
        try:
            yield "full tmpfs"
        finally:
            subprocess.run(["umount", "-l", str(path)], check=False)
    else:
        path.chmod(0o500)
        try:
            yield "read-only directory"
        finally:
            path.chmod(0o700)


async def test_dropped_slices_are_a_metric_a_log_line_and_readyz_degraded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with unwritable_dir(tmp_path / "array") as how:
        settings = TierdSettings(
            array_dir=tmp_path / "array",
            snapshot_dir=tmp_path / "snap",
            l1_bytes=4 * SLOT,
            slice_bytes=SLOT,
            instance_id="full",
            temp_grace_s=0.0,
        )
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            daemon = app.state.daemon
            await daemon.wait_ready()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                before = (await http.get("/readyz")).json()
                assert before["degraded"] is False
                with caplog.at_level(logging.WARNING, logger="tierd.store"):
                    for h in range(1, 17):  # session slices: written down when evicted
                        await daemon.store.put(
                            h, random.Random(h).randbytes(1000), tokens=16, session="p"
                        )
                assert daemon.store.counters.write_failures > 0, how
                metrics = (await http.get("/metrics")).text
                line = next(
                    x for x in metrics.splitlines() if x.startswith("tierd_dropped_slices_total{")
                )
                assert float(line.rsplit(" ", 1)[1]) == daemon.store.counters.write_failures
                ready = await http.get("/readyz")
                assert ready.status_code == 200
                body = ready.json()
                assert body["degraded"] is True
                assert body["array_writes"]["dropped_slices"] > 0
                assert any("dropped" in r.getMessage() for r in caplog.records)
