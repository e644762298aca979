"""Failover and health with real processes: a killed engine's requests go to a fallback
(no client sees an error), it leaves the candidate set and says why, it comes back when it
answers again; nothing healthy is a 503 with Retry-After; everything dead is a 502."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.fleet import MODEL, Fleet, wait_until


def chat(i: int) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": f"line {i}"}], "max_tokens": 3}


def test_killed_engine_fails_over_then_leaves_and_rejoins(tmp_path: Path) -> None:
    # Slow health checks: the gateway learns of the kill from its own failed requests.
    fleet = Fleet(
        tmp_path,
        3,
        settings={
            "routing": {"policy": "round_robin"},
            "health": {"interval_s": 3600, "failure_threshold": 2, "success_threshold": 1},
        },
    ).start()
    try:
        with httpx.Client(base_url=fleet.base, timeout=30) as c:
            served = {
                c.post("/v1/chat/completions", json=chat(i)).headers["x-warmgate-instance"]
                for i in range(3)
            }
            assert served == {"sim-0", "sim-1", "sim-2"}
            victim = fleet.engines[1]
            victim.kill()
            for i in range(6):  # round robin sends two of these to the dead engine first
                r = c.post("/v1/chat/completions", json=chat(i))
                assert r.status_code == 200, r.text
                assert r.headers["x-warmgate-instance"] != victim.id
            for i in range(2):
                with c.stream(
                    "POST", "/v1/chat/completions", json={**chat(i), "stream": True}
                ) as s:
                    assert s.status_code == 200
                    assert s.read().decode().endswith("data: [DONE]\n\n")
                    assert s.headers["x-warmgate-instance"] != victim.id
            metrics = c.get("/metrics").text
            assert (
                f'warmgate_upstream_errors_total{{instance="{victim.id}",kind="connect"}}'
                in metrics
            )
            failovers = [
                s.value
                for family in text_string_to_metric_families(metrics)
                for s in family.samples
                if s.name == "warmgate_failovers_total"
            ]
            assert failovers and failovers[0] >= 1, failovers  # the count, not the HELP line
            assert c.get("/admin/stats").json()["failovers"] >= 1
            health = {i["id"]: i["health"] for i in c.get("/admin/instances").json()["instances"]}
            assert health[victim.id]["state"] == "unhealthy"
            assert "ConnectError" in health[victim.id]["reason"]
            assert health["sim-0"]["state"] == health["sim-2"]["state"] == "healthy"
    finally:
        fleet.stop()


def test_unhealthy_instance_returns_when_healthy(tmp_path: Path) -> None:
    fleet = Fleet(
        tmp_path,
        2,
        settings={
            "health": {
                "interval_s": 0.1,
                "timeout_s": 0.5,
                "failure_threshold": 2,
                "success_threshold": 2,
            }
        },
    ).start()
    try:
        victim = fleet.engines[0]
        victim.kill()
        wait_until(
            lambda: fleet.instance_health()[victim.id] == "unhealthy", what="marked unhealthy"
        )
        with httpx.Client(base_url=fleet.base, timeout=30) as c:
            for i in range(4):
                r = c.post("/v1/chat/completions", json=chat(i))
                assert r.headers["x-warmgate-instance"] == "sim-1"
            assert c.get("/readyz").json()["checks"]["instances"]["healthy"] == 1
        victim.start()
        victim.wait()
        wait_until(lambda: fleet.instance_health()[victim.id] == "healthy", what="healthy again")
        reason = next(i for i in fleet.admin("instances")["instances"] if i["id"] == victim.id)
        assert "passed" in reason["health"]["reason"]
    finally:
        fleet.stop()


def test_no_healthy_instance_is_503_and_all_dead_is_502(tmp_path: Path) -> None:
    dead_port = 9  # discard: nothing listens there on loopback
    fleet = Fleet(
        tmp_path,
        1,
        settings={"health": {"interval_s": 3600, "failure_threshold": 1}, "retry_after_s": 2},
        extra_instances=[
            {"id": "ghost", "url": f"http://127.0.0.1:{dead_port}", "models": ["ghost-model"]}
        ],
    ).start()
    try:
        with httpx.Client(base_url=fleet.base, timeout=30) as c:
            r = c.post("/v1/chat/completions", json={**chat(0), "model": "ghost-model"})
            assert r.status_code == 503
            assert r.headers["retry-after"] == "2"
            assert r.json()["error"]["code"] == "no_healthy_instance"
            assert c.get("/v1/models").json()["data"][0]["id"] == MODEL  # healthy ones only
            fleet.engines[0].kill()  # the gateway still believes it healthy (no checks yet)
            r = c.post("/v1/chat/completions", json=chat(1))
            assert r.status_code == 502
            assert r.headers["x-should-retry"] == "true"
            assert r.json()["error"]["type"] == "server_error"
            # the failed request counted against it: it is out, so now it is a 503
            r = c.post("/v1/chat/completions", json=chat(2))
            assert r.status_code == 503 and "retry-after" in r.headers
            assert c.get("/readyz").status_code == 503
            assert c.get("/livez").status_code == 200
    finally:
        fleet.stop()
