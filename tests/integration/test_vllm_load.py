"""What real vLLM engines report about themselves, used: the overload veto on
vllm:num_requests_waiting and their prompt-token accounting beside warmgate's."""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from typing import Any

import httpx
import pytest

from gateway.engine.vllm import VLLM
from gateway.engine.vllm_metrics import LOAD_SERIES
from gateway.launch.vllm_fleet import VllmFleet
from tests.integration.test_vllm_precise import SERVED_MODEL, chat, client, prose
from tests.support.vllm import VllmFleets, gateway_for

pytestmark = [pytest.mark.slow, pytest.mark.fleet("vllm")]


@pytest.fixture(scope="module")
def fleet(vllm_fleets: VllmFleets) -> VllmFleet:
    return vllm_fleets.get()


def _engine_view(base: str, instance: str) -> dict[str, Any] | None:
    out = httpx.get(f"{base}/admin/instances", timeout=10).json()["instances"]
    view: dict[str, Any] | None = next(i for i in out if i["id"] == instance)["engine"]
    return view


def test_an_engine_with_requests_waiting_is_vetoed(
    fleet: VllmFleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    busy, idle = fleet.engines
    settings = {"engine_metrics": {"interval_s": 0.2, "veto_waiting": 1}}
    with gateway_for(tmp_path_factory.mktemp("veto"), fleet, **settings) as gw:
        # requests of 1.6k tokens straight to one engine: its 2,048-token step budget takes
        # one at a time, the others wait
        bodies = [
            {"model": SERVED_MODEL, "max_tokens": 1,
             "prompt": prose(f"busy-{i}-{uuid.uuid4().hex[:8]}", 1600, seed=300 + i)}
            for i in range(4)
        ]  # fmt: skip
        body = {
            "model": SERVED_MODEL,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "[veto] hello"}],
        }
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [
                pool.submit(httpx.post, f"{busy.url}/v1/completions", json=b, timeout=300)
                for b in bodies
            ]
            seen: list[Any] = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                view = _engine_view(gw.base, busy.id)
                seen.append(view)
                if view and view["overloaded"]:
                    explained = httpx.post(
                        f"{gw.base}/admin/route/explain", json=body, timeout=30
                    ).json()
                    break
                time.sleep(0.05)
            else:
                raise AssertionError(f"never seen overloaded: {seen[-3:]}\n{gw.log_tail()}")
            assert [r.result().status_code for r in futures] == [200] * 4
        assert "requests waiting" in view["overloaded"]
        assert [c["instance"] for c in explained["candidates"]] == [idle.id], explained
        deadline = time.monotonic() + 30  # the queue drained: the veto lifts
        while _engine_view(gw.base, busy.id)["overloaded"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _engine_view(gw.base, busy.id)["overloaded"] is None


def test_the_load_scrape_asks_vllm_for_the_series_it_reads(fleet: VllmFleet) -> None:
    """vLLM honours prometheus_client's `name[]`: the scrape every 2 s reads a page of the
    load's series, not 55 kB of histograms its API server renders on the engine's core."""
    engine = fleet.engines[0]
    whole = httpx.get(f"{engine.url}{VLLM.metrics_path}", timeout=10).text
    page = httpx.get(f"{engine.url}{VLLM.load_path}", timeout=10).text
    series = {
        line.split("{")[0].split(" ")[0]
        for line in page.splitlines()
        if line and not line.startswith("#")
    }
    assert series == set(LOAD_SERIES), series
    assert len(page) * 10 < len(whole)
    load = VLLM.load(page)
    assert load.waiting is not None and load.kv_usage is not None
    assert set(load.prompt_tokens_by_source) == set(VLLM.load(whole).prompt_tokens_by_source)


def test_engine_accounting_is_beside_warmgates(
    fleet: VllmFleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with gateway_for(tmp_path_factory.mktemp("acct"), fleet) as gw:
        c = client(gw)
        messages = [{"role": "user", "content": prose(f"acct-{uuid.uuid4().hex[:8]}", 700)}]
        chat(c, messages, stream=False)
        chat(c, messages, stream=False)
        time.sleep(2.5)  # one scrape interval
        stats = gw.admin("stats")
        engines = stats["engine_reported"]
        for e in fleet:
            page = httpx.get(f"{e.url}/metrics", timeout=10).text
            line = next(
                ln for ln in page.splitlines()
                if ln.startswith("vllm:prompt_tokens_by_source_total")
                and 'source="local_cache_hit"' in ln
            )  # fmt: skip
            hit = float(line.rsplit(" ", 1)[1])
            assert engines["instances"][e.id]["prompt_tokens_by_source"]["local_cache_hit"] == hit
        metrics = httpx.get(f"{gw.base}/metrics", timeout=10).text
        assert (
            'warmgate_engine_prompt_tokens{instance="vllm-0",source="local_cache_hit"}' in metrics
        )
        assert stats["cached_tokens"]["reported"] > 0
