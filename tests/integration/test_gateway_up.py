"""`warmgate up` as a user runs it: engines, tierds and the gateway come up and answer; a
routed request sends its prefetch hint to the chosen instance's tierd; SIGTERM stops every
process it started."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import yaml

from tests.e2e.fleet import MODEL, wait_until
from tests.support.procs import ManagedProcess, free_port, python_module


def refuses(url: str) -> bool:
    try:
        httpx.get(url, timeout=1.0)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False
    return False


def test_up_serves_hints_tierd_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    run_dir = tmp_path / "run"
    up = ManagedProcess(
        python_module(
            "gateway.cli", "up", "--instances", "2", "--port", str(port),
            "--time-scale", "0.001", "--run-dir", str(run_dir),
        ),
        tmp_path / "up.log",
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        up.wait_http(f"{base}/readyz", timeout_s=120)
        wait_until(lambda: f"{base}/v1" in up.tail(), what="the banner names the base URL")
        config = yaml.safe_load((run_dir / "gateway.yaml").read_text())
        instances = {i["id"]: i for i in config["instances"]}
        assert len(instances) == 2 and all(i["tierd_url"] for i in instances.values())
        assert all(i["engine"] == "sim" for i in instances.values())  # its engine kind
        prompt = "The zone's world state: the northern pass is snowed in. " * 20
        r = httpx.post(
            f"{base}/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 4,
            },
            timeout=30,
        )
        assert r.status_code == 200, r.text
        chosen = instances[r.headers["x-warmgate-instance"]]

        def tierd_prefetches() -> int:
            stats = httpx.get(f"{chosen['tierd_url']}/v1/stats", timeout=5).json()
            return int(stats["prefetch"]["requests"])

        wait_until(lambda: tierd_prefetches() >= 1, what="tierd received the prefetch hint")
        wait_until(
            lambda: (
                'warmgate_prefetch_hints_total{result="sent"} 1.0'
                in httpx.get(f"{base}/metrics").text
            ),
            what="hint counted as sent",
        )
    finally:
        up.stop(timeout_s=30)
    assert up.proc.returncode == 0, up.tail()
    urls = [base + "/livez"]
    for inst in instances.values():
        urls += [inst["url"] + "/health", inst["tierd_url"] + "/livez"]
    for url in urls:
        wait_until(lambda url=url: refuses(url), what=f"{url} stopped")
    assert signal.SIGTERM  # stopped by SIGTERM (ManagedProcess.stop), as systemd or Ctrl-C would
