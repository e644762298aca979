"""Real engines that die, restart and were there before the gateway: what the gateway
believes they cache follows what they really cache (tests/support/vllm.py's fleet)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from gateway.launch.vllm_fleet import VllmFleet
from tests.integration.test_vllm_precise import SERVED_MODEL, chat, client, prose
from tests.support.vllm import Gateway, VllmFleets, gateway_for

pytestmark = [pytest.mark.slow, pytest.mark.fleet("vllm")]


@pytest.fixture(scope="module")
def fleet(vllm_fleets: VllmFleets) -> VllmFleet:
    return vllm_fleets.get()


def _predicted(gw: Gateway, body: dict[str, Any]) -> dict[str, int]:
    out = httpx.post(f"{gw.base}/admin/route/explain", json=body, timeout=30).json()
    return {c["instance"]: sum(c["cached_tokens_by_tier"].values()) for c in out["candidates"]}


def _health(gw: Gateway) -> dict[str, str]:
    return {i["id"]: i["health"]["state"] for i in gw.admin("instances")["instances"]}


def _until(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"{what}: never true")


def test_a_gateway_started_after_its_engines_knows_what_they_hold(
    fleet: VllmFleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """vLLM's event replay: blocks computed before the gateway existed are predicted."""
    engine = fleet.engines[0]
    body = {"model": SERVED_MODEL, "prompt": prose(f"before-{uuid.uuid4().hex[:8]}", 900)}
    first = httpx.post(f"{engine.url}/v1/completions", json={**body, "max_tokens": 1}, timeout=120)
    prompt_tokens = first.json()["usage"]["prompt_tokens"]
    with gateway_for(tmp_path_factory.mktemp("late"), fleet) as gw:
        predicted = _predicted(gw, body)[engine.id]
        again = httpx.post(
            f"{engine.url}/v1/completions", json={**body, "max_tokens": 1}, timeout=120
        ).json()
        assert predicted == again["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert predicted == (prompt_tokens - 1) // 128 * 128 > 0
        source = httpx.get(f"{gw.base}/readyz", timeout=10).json()["checks"]["kv_events"]
        assert source["sources"][engine.id]["replays"] >= 1, source


def test_engine_sigkill_and_restart_on_the_same_port_then_predictions_are_right(
    fleet: VllmFleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with gateway_for(tmp_path_factory.mktemp("restart"), fleet) as gw:
        c = client(gw)
        messages = [{"role": "system", "content": prose(f"restart-{uuid.uuid4().hex[:8]}", 1000)}]
        messages.append({"role": "user", "content": "Where is the gate?"})
        where, _, _, reply = chat(c, messages, stream=False)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And?"}]
        again = chat(c, messages, stream=True)
        assert again[0] == where and again[1] == again[2] > 0, again
        engine = next(e for e in fleet if e.id == where)
        pids = engine.pids()
        assert len(pids) >= 3  # API server, EngineCore, Worker
        engine.kill_all()  # SIGKILL, children included: nothing of it is left
        assert not any(_alive(p) for p in pids)
        _until(lambda: _health(gw)[where] == "unhealthy", 30, f"{where} unhealthy")
        body = {"model": SERVED_MODEL, "messages": messages, "max_tokens": 4}
        assert where not in _predicted(gw, body)  # not a candidate while down
        engine.start()
        engine.wait_ready()
        _until(lambda: _health(gw)[where] == "healthy", 60, f"{where} healthy again")
        # back to healthy, it sits out of the candidates while the join probe prices it
        _until(lambda: where in _predicted(gw, body), 30, f"{where} probed, a candidate again")
        assert _predicted(gw, body)[where] == 0  # it came back empty: nothing is predicted
        turns = [chat(c, messages, stream=False) for _ in range(2)]
        assert all(pred == rep for _, pred, rep, _ in turns), turns
        assert turns[-1][2] > 0, turns  # and the cache builds again, predicted right


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] != b"Z"
