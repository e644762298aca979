"""The operator page and the runtime fleet in front of two real vLLM engines (the session's
default fleet, shared with the other real-vLLM modules): the page shows each engine's own
KV use and queue from vLLM's /metrics, a drain through `warmgate admin` empties and removes
an engine, and adding it back is validated against the real engine (block size and hash
from its cache_config_info, its hash seed from its KV events) before it shows up again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.launch.vllm_fleet import VllmFleet
from sim.players.text import TextSource
from tests.support.procs import free_port
from tests.support.vllm import SERVED_MODEL, Gateway, VllmFleets, gateway_config

pytestmark = [pytest.mark.slow, pytest.mark.fleet("vllm")]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def fleet(vllm_fleets: VllmFleets) -> VllmFleet:
    return vllm_fleets.get()


@pytest.fixture(scope="module")
def gateway(fleet: VllmFleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    config = gateway_config(fleet, free_port())
    config["ui"] = {"sample_interval_s": 1.0}
    config["engine_metrics"] = {"interval_s": 0.5}
    config["fleet"] = {"poll_interval_s": 0.2, "drain_grace_s": 0.5}
    gw = Gateway(tmp_path_factory.mktemp("gw-ui"), config)
    try:
        yield gw.wait_ready()
    finally:
        gw.stop()


def admin(base: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMGATE_")}
    argv = [sys.executable, "-m", "gateway.cli", "admin", "--url", base, *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_page_drain_and_validated_add_against_real_vllm(
    fleet: VllmFleet, gateway: Gateway, tmp_path: Path
) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if sync_playwright is None or CHROMIUM is None:
        why = (
            "playwright and chromium are needed (pip install -e '.[dev]'; apt-get install chromium)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    shots = Path(os.environ.get("WARMGATE_UI_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    base = gateway.base
    for k in range(3):
        prompt = f"[ui-{uuid.uuid4().hex[:8]}] " + TextSource(k).prose(200)
        body = {
            "model": SERVED_MODEL,
            "user": f"player-{k}",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 4,
            "ignore_eos": True,
        }
        assert httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120).is_success
    victim = fleet.engines[1]
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1440, "height": 1100})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
        page.goto(f"{base}/ui")
        page.wait_for_function(
            "document.querySelectorAll(\"#fleet tbody tr[data-health='healthy']\").length === 2"
            " && [...document.querySelectorAll('#fleet tbody tr td:nth-child(7)')]"
            ".every(td => td.textContent.includes('%'))"
            " && document.querySelectorAll('#sessions tbody tr').length === 3"
            " && document.querySelectorAll('#prefixes tbody tr').length === 3",
            timeout=30_000,
        )
        # tokens believed held, in the engines' 128-token blocks, on whoever served them
        believed = page.locator("#fleet tbody tr td:nth-child(9)").all_inner_texts()
        assert any(not text.startswith("0 ") for text in believed), believed
        page.screenshot(path=str(shots / "ui-vllm-1-fleet.png"), full_page=True)

        r = admin(base, "drain", victim.id, "--wait", "--wait-timeout", "60")
        assert r.returncode == 0, r.stderr
        page.wait_for_function(
            f"!document.querySelector(\"#fleet tbody tr[data-instance='{victim.id}']\")",
            timeout=10_000,
        )
        add = admin(
            base, "--json", "add", victim.id, victim.url,
            "--model", SERVED_MODEL, "--kv-events-endpoint", str(victim.kv_events_endpoint),
        )  # fmt: skip
        assert add.returncode == 0, (add.stdout, add.stderr)
        checks = {c["name"]: c for c in json.loads(add.stdout)["checks"]}
        assert list(checks) == [
            "reachable", "models", "block_size", "hash_algo", "prefix_caching", "hash_seed",
        ], checks  # fmt: skip
        assert all(c["ok"] for c in checks.values()), checks
        page.wait_for_selector(
            f"#fleet tbody tr[data-instance='{victim.id}'][data-health='healthy']",
            timeout=15_000,
        )
        page.screenshot(path=str(shots / "ui-vllm-2-back.png"), full_page=True)
        browser.close()
    assert not errors, errors
