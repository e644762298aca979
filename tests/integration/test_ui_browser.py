"""The operator page in headless Chromium (Debian's `chromium`, driven by Playwright's Python
client; Playwright's own browser download is not used) against a real gateway in front of
real simulated engines under traffic: the page loads with no console errors, shows the
fleet with the engines' KV use, charts and hot tables, reflects an instance dying and
coming back, and runs route explain from its form. Screenshots go to
`$WARMGATE_UI_SCREENSHOTS` (default: the test's temporary directory)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.fleet import MODEL, Fleet

KEY = "sk-ui-operator"
PERSONA = "You are Brannoc the blacksmith of the northern pass. " * 20
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _need_browser() -> Any:
    why = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        why = "playwright is not installed (pip install -e '.[dev]')"
    if CHROMIUM is None:
        why = "chromium is not installed (apt-get install chromium)"
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return sync_playwright


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    keys = [KEY]
    f = Fleet(
        tmp_path_factory.mktemp("ui"),
        3,
        time_scale=0.05,
        settings={
            "api_keys": keys,
            "auth": {"admin_keys": keys},  # the admin key once roles exist (ignored before)
            "health": {"interval_s": 0.3, "failure_threshold": 2},
            "ui": {"sample_interval_s": 1.0},
            "engine_metrics": {"interval_s": 0.5},
            "tiers": {"prefetch": False},
        },
    ).start()
    yield f
    f.stop()


def _traffic(base: str, stop: threading.Event) -> None:
    with httpx.Client(timeout=30, headers={"authorization": f"Bearer {KEY}"}) as client:
        turn = 0
        while not stop.is_set():
            for player in ("ayla", "borin", "cass", "dax"):
                body = {
                    "model": MODEL,
                    "user": player,
                    "max_tokens": 8,
                    "messages": [
                        {"role": "system", "content": PERSONA},
                        {"role": "user", "content": f"{player} asks about turn {turn}. " * 5},
                    ],
                }
                # an instance being killed: the test watches the page, not these answers
                with contextlib.suppress(httpx.HTTPError):
                    client.post(f"{base}/v1/chat/completions", json=body)
            turn += 1


def test_operator_page_in_headless_chromium(fleet: Fleet, tmp_path: Path) -> None:
    sync_playwright = _need_browser()
    shots = Path(os.environ.get("WARMGATE_UI_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    assert httpx.get(f"{fleet.base}/admin/ui/state", timeout=10).status_code == 401
    stop = threading.Event()
    traffic = threading.Thread(target=_traffic, args=(fleet.base, stop), daemon=True)
    traffic.start()
    errors: list[str] = []
    victim = fleet.engines[1]
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1440, "height": 1100})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.add_init_script(f"sessionStorage.setItem('warmgate-admin-key', '{KEY}')")
            page.goto(f"{fleet.base}/ui")

            def rows(health: str) -> str:
                return f"#fleet tbody tr[data-health='{health}']"

            page.wait_for_function(
                f'document.querySelectorAll("{rows("healthy")}").length === 3', timeout=20_000
            )
            # the engines' own KV use, scraped from their /metrics
            page.wait_for_function(
                "[...document.querySelectorAll('#fleet tbody tr td:nth-child(7)')]"
                ".every(td => td.textContent.includes('%'))",
                timeout=10_000,
            )
            # history: at least two intervals drawn, hot sessions and prefixes listed
            page.wait_for_function(
                "document.querySelector('#hitchart path[data-series^=\"reported\"]') !== null"
                " && document.querySelectorAll('#sessions tbody tr').length === 4"
                " && document.querySelectorAll('#prefixes tbody tr').length >= 1",
                timeout=20_000,
            )
            page.screenshot(path=str(shots / "ui-1-healthy.png"), full_page=True)
            assert page.inner_text("#status") == "live"

            victim.kill()
            page.wait_for_selector(
                f"#fleet tbody tr[data-instance='{victim.id}'][data-health='unhealthy']",
                timeout=15_000,
            )
            why = page.inner_text(f"#fleet tbody tr[data-instance='{victim.id}'] td.why")
            assert "consecutive failures" in why, why
            assert page.locator(rows("healthy")).count() == 2
            page.wait_for_function(  # its engine figures are not shown as current any more
                f"document.querySelector(\"#fleet tbody tr[data-instance='{victim.id}']"
                " td:nth-child(7)\").textContent.includes('no answer')",
                timeout=10_000,
            )
            page.screenshot(path=str(shots / "ui-2-instance-down.png"), full_page=True)

            victim.start()
            victim.wait()
            page.wait_for_selector(
                f"#fleet tbody tr[data-instance='{victim.id}'][data-health='healthy']",
                timeout=15_000,
            )
            assert page.locator(rows("healthy")).count() == 3

            explain = {
                "model": MODEL,
                "user": "ayla",
                "messages": [
                    {"role": "system", "content": PERSONA},
                    {"role": "user", "content": "ayla asks about turn 1. " * 5},
                ],
            }
            page.fill("#explainbody", json.dumps(explain))
            page.click("#explainform button")
            page.wait_for_selector("#explaintable tbody tr", timeout=10_000)
            headers = page.locator("#explaintable thead th").all_inner_texts()
            assert {"predicted TTFT s", "prefill_s", "queue_wait_s"} <= set(headers), headers
            assert page.locator("#explaintable tbody tr").count() == 3
            assert page.locator("#explaintable tbody tr.chosen").count() == 1
            cached = page.inner_text("#explaintable tbody tr.chosen td:nth-child(3)")
            assert cached.startswith("hbm "), cached  # the persona is cached where it went
            page.screenshot(path=str(shots / "ui-3-back-and-explain.png"), full_page=True)
            browser.close()
    finally:
        stop.set()
        traffic.join(timeout=30)
    assert not errors, errors
    for name in ("ui-1-healthy.png", "ui-2-instance-down.png", "ui-3-back-and-explain.png"):
        assert (shots / name).stat().st_size > 10_000
