"""`warmgate admin` against `warmgate up` (the simulated default), as an operator runs it:
every command as a subprocess, human tables and `--json`, the admin key from the
environment or the flag, and a drain that waits until the instance has left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.fleet import MODEL
from tests.support.procs import ManagedProcess, free_port, python_module

KEY = "sk-operator-test"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("admin-cli")
    port = free_port()
    run_dir = tmp / "run"
    # the key is the gateway's only key: the admin key once roles exist, the API key before
    keys = json.dumps([KEY])
    proc = ManagedProcess(
        python_module(
            "gateway.cli", "up", "--instances", "3", "--port", str(port),
            "--time-scale", "0.001", "--run-dir", str(run_dir),
        ),
        tmp / "up.log",
        env={"WARMGATE_API_KEYS": keys, "WARMGATE_AUTH__ADMIN_KEYS": keys},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(f"{base}/readyz", timeout_s=120)
        yield base, run_dir
    finally:
        proc.stop(timeout_s=30)


def admin(base: str, *args: str, key: str | None = KEY, flag: bool = False) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMGATE_")}
    argv = [sys.executable, "-m", "gateway.cli", "admin", "--url", base]
    if key is not None and flag:
        argv += ["--admin-key", key]
    elif key is not None:
        env["WARMGATE_ADMIN_KEY"] = key
    return subprocess.run(
        [*argv, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_instances_table_and_json_need_the_key(up: tuple[str, Path]) -> None:
    base, _ = up
    r = admin(base, "instances")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["id", "health", "fleet"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"sim-0", "sim-1", "sim-2"}
    assert all(row[1] == "healthy" and row[2] == "active" for row in rows.values())
    r = admin(base, "--json", "instances", flag=True)
    assert r.returncode == 0, r.stderr
    assert sorted(i["id"] for i in json.loads(r.stdout)["instances"]) == sorted(rows)
    r = admin(base, "instances", key=None)
    assert r.returncode == 1 and "401" in r.stderr, (r.stdout, r.stderr)
    r = admin(base, "instances", key="sk-wrong")
    assert r.returncode == 1 and "401" in r.stderr


def test_explain_file_stats_and_sessions(up: tuple[str, Path], tmp_path: Path) -> None:
    base, _ = up
    body = {
        "model": MODEL,
        "user": "player-cli",
        "messages": [{"role": "user", "content": "Where is the northern pass? " * 30}],
        "max_tokens": 4,
    }
    served = httpx.post(
        f"{base}/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    assert served.status_code == 200, served.text
    path = tmp_path / "request.json"
    path.write_text(json.dumps(body))
    r = admin(base, "explain", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"request: {MODEL} session=player-cli")
    table = r.stdout.split("\n\n")[1].splitlines()
    assert {"ttft_s", "prefill_s", "score"} <= set(table[0].split())
    chosen = [line for line in table[2:] if line.startswith("* ")]
    assert len(chosen) == 1 and len(table) == 2 + 3
    r = admin(base, "--json", "explain", str(path))
    decision = json.loads(r.stdout)["decision"]
    assert chosen[0].split()[1] == decision["instance"]
    r = admin(base, "stats")
    assert r.returncode == 0 and "requests.ok" in r.stdout, r.stderr
    r = admin(base, "--json", "sessions", "player-cli")
    assert json.loads(r.stdout)["last_instance"] == served.headers["x-warmgate-instance"]
    r = admin(base, "sessions", "nobody-at-all")
    assert r.returncode == 1 and "404" in r.stderr


def test_drain_waits_until_gone_then_add_and_remove(up: tuple[str, Path]) -> None:
    base, run_dir = up
    config = yaml.safe_load((run_dir / "gateway.yaml").read_text())
    sim1 = next(i for i in config["instances"] if i["id"] == "sim-1")
    r = admin(base, "drain", "sim-1", "--wait", "--wait-timeout", "30")
    assert r.returncode == 0, r.stderr
    assert any(line.split() == ["drained", "True"] for line in r.stdout.splitlines())
    r = admin(base, "--json", "instances")
    assert "sim-1" not in {i["id"] for i in json.loads(r.stdout)["instances"]}
    r = admin(base, "drain", "sim-1")
    assert r.returncode == 1 and "404" in r.stderr
    r = admin(base, "add", "sim-1", sim1["url"], "--tierd-url", sim1["tierd_url"])
    assert r.returncode == 0, r.stderr
    assert "checks" in r.stdout and "reachable" in r.stdout
    r = admin(base, "add", "ghost", f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 1 and "FAIL reachable" in r.stderr, r.stderr
    r = admin(base, "fleet")
    assert r.returncode == 0 and "sim-1" in r.stdout and "active" in r.stdout
    r = admin(base, "remove", "sim-1")
    assert r.returncode == 0, r.stderr
    r = admin(base, "--json", "fleet")
    assert json.loads(r.stdout)["records"]["sim-1"]["status"] == "removed"
