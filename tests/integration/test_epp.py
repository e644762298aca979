"""The Endpoint Picker (gateway/epp/) driven as Envoy drives it: a real gRPC client over the
ext_proc protos on loopback, in front of a gateway process with three simulated engines; the
request goes to the picked endpoint over real HTTP, and its response comes back through the
stream. The pick is in the header and the `envoy.lb` metadata alike; a player's turns stay on
one endpoint; the subset Envoy offers is honoured; what cannot be picked is an
ImmediateResponse (503 with no eligible endpoint, the proxy's 4xx for a bad request); a
request Envoy served from a fallback is accounted there; the outcome reaches the stats."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.fleet import MODEL, Fleet
from tests.support.procs import free_port

try:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from tests.support.envoy_ext_proc import EnvoyLike
except ImportError:  # the `epp` extra (in `dev`)
    if os.environ.get("CI") == "true":
        raise
    pytest.skip("grpcio / xds-protos missing: pip install -e '.[dev]'", allow_module_level=True)

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp: Path = tmp_path_factory.mktemp("epp")
    settings = {"epp": {"port": free_port(), "host": "127.0.0.1"}, "calibration": {"probe": False}}
    f = Fleet(tmp, 3, settings=settings).start()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def envoy(fleet: Fleet) -> Iterator[EnvoyLike]:
    e = EnvoyLike(f"127.0.0.1:{fleet.settings['epp']['port']}")
    yield e
    e.close()


def endpoints(fleet: Fleet) -> dict[str, str]:
    """ip:port -> instance id."""
    return {e.url.removeprefix("http://"): e.id for e in fleet.engines}


def turn(player: str, n: int, *, stream: bool = True) -> dict[str, object]:
    lore = f"You are the innkeeper of {player}'s village. " * 30
    messages = [{"role": "system", "content": lore}]
    for k in range(n):
        messages += [
            {"role": "user", "content": f"{player} says line {k}"},
            {"role": "assistant", "content": f"reply {k}"},
        ]
    messages.append({"role": "user", "content": f"{player} says line {n}"})
    return {"model": MODEL, "messages": messages, "max_tokens": 4, "stream": stream}


def test_a_players_turns_go_to_one_endpoint_and_are_accounted(
    fleet: Fleet, envoy: EnvoyLike
) -> None:
    names = endpoints(fleet)
    before = fleet.admin("stats")
    seen: dict[str, set[str]] = {}
    for player in ("ayla", "bren", "cato"):
        for n in range(4):
            ex = envoy.request(CHAT, turn(player, n), headers={"x-session-id": player})
            assert ex.picked is not None, ex.immediate
            assert ",".join(ex.endpoints) == ex.metadata_value  # header and metadata agree
            assert set(ex.endpoints) <= set(names) and len(ex.endpoints) == len(set(ex.endpoints))
            assert ex.served_by == names[ex.endpoints[0]]  # the engine that answered
            assert ex.client_headers["x-warmgate-instance"] == ex.served_by
            assert b"data: [DONE]" in ex.client_body
            # usage was asked of the engine for the picker, not shown to the client
            assert b'"usage"' not in ex.client_body
            seen.setdefault(player, set()).add(ex.endpoints[0])
    assert all(len(s) == 1 for s in seen.values()), seen
    after = fleet.admin("stats")
    assert after["requests"]["ok"] - before["requests"].get("ok", 0) == 12
    assert after["ttft_s"]["samples"] - before["ttft_s"]["samples"] == 12
    got = after["cached_tokens"]["reported"] - before["cached_tokens"]["reported"]
    assert got > 0  # later turns hit the cache the first ones left, as the engines said
    assert after["router"]["routed"] - before["router"]["routed"] == 12


def test_a_non_streaming_answer_is_accounted_with_its_usage(fleet: Fleet, envoy: EnvoyLike) -> None:
    before = fleet.admin("stats")
    ex = envoy.request(CHAT, turn("dara", 0, stream=False))
    assert ex.picked is not None and not ex.picked.request_body.response.HasField("body_mutation")
    assert json.loads(ex.client_body)["usage"]["prompt_tokens"] > 0
    after = fleet.admin("stats")
    assert after["requests"]["ok"] == before["requests"].get("ok", 0) + 1
    assert after["cached_tokens"]["requests_with_report"] == (
        before["cached_tokens"]["requests_with_report"] + 1
    )


def test_the_offered_subset_is_honoured(fleet: Fleet, envoy: EnvoyLike) -> None:
    names = endpoints(fleet)
    first = envoy.request(CHAT, turn("eryn", 1), headers={"x-session-id": "eryn"})
    home = first.endpoints[0]
    others = [n for n in names if n != home]
    ex = envoy.request(CHAT, turn("eryn", 2), headers={"x-session-id": "eryn"}, subset=others)
    assert ex.picked is not None and set(ex.endpoints) <= set(others)
    assert ex.served_by == names[ex.endpoints[0]]
    only = envoy.request(CHAT, turn("eryn", 3), subset=[others[1], "not-an-endpoint"])
    assert only.endpoints == [others[1]]


def test_no_eligible_endpoint_is_a_503_immediate_response(envoy: EnvoyLike) -> None:
    for subset in ([], ["192.0.2.1:9"], ["nonsense"]):
        ex = envoy.request(CHAT, turn("fenn", 0), subset=subset)
        status, body = ex.error()
        assert status == 503 and body["error"]["code"] == "no_healthy_instance", subset
        headers = {h.header.key for h in ex.immediate.headers.set_headers}  # type: ignore[union-attr]
        assert "retry-after" in headers


def test_requests_the_proxy_refuses_are_refused_alike(envoy: EnvoyLike) -> None:
    status, body = envoy.request(CHAT, {**turn("gale", 0), "model": "no-such-model"}).error()
    assert (status, body["error"]["code"]) == (404, "model_not_found")
    status, body = envoy.request(CHAT, b"{not json").error()
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = envoy.request(CHAT, {"model": MODEL}).error()
    assert status == 400 and body["error"]["param"] == "messages"


def test_a_request_served_from_a_fallback_is_accounted_there(
    fleet: Fleet, envoy: EnvoyLike
) -> None:
    names = endpoints(fleet)
    failovers = _metric(fleet, "warmgate_failovers_total")
    ex = envoy.request(CHAT, turn("hale", 0), serve_from=1)  # Envoy retried on the fallback
    assert len(ex.endpoints) >= 2
    assert ex.client_headers["x-warmgate-instance"] == names[ex.endpoints[1]] == ex.served_by
    assert _metric(fleet, "warmgate_failovers_total") == failovers + 1


def test_health_and_protocol_misuse(fleet: Fleet, envoy: EnvoyLike) -> None:
    stub = health_pb2_grpc.HealthStub(envoy.channel)
    for name in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    body_first = ep.ProcessingRequest(request_body=ep.HttpBody(body=b"{}", end_of_stream=True))
    with pytest.raises(grpc.RpcError) as err:
        list(envoy.stub.Process(iter([body_first]), timeout=5))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def _metric(fleet: Fleet, name: str) -> float:
    for line in httpx.get(f"{fleet.base}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0
