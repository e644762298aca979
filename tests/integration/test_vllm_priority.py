"""A request's priority class reaches real vLLM (issue 22, item 3): one engine with
`--scheduling-policy priority` and a single batch slot; two requests wait behind a running
one, the normal one first, the interactive one second; when the slot frees, vLLM runs the
interactive one first. With FCFS, or without the gateway's priority, the order is the
arrival order."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator

import httpx
import pytest

from gateway.launch.vllm_fleet import VllmFleet
from tests.e2e.fleet import wait_until
from tests.support.vllm import SERVED_MODEL, VllmFleets, gateway_for

pytestmark = [pytest.mark.slow, pytest.mark.fleet("vllm-priority")]
_WAITING = re.compile(r"^vllm:num_requests_waiting\{[^}]*\} ([0-9.e+]+)$", re.M)


@pytest.fixture(scope="module")
def fleet(vllm_fleets: VllmFleets) -> Iterator[VllmFleet]:
    yield vllm_fleets.get(
        engines=1, scheduling_policy="priority", extra_args=("--max-num-seqs", "1")
    )
    vllm_fleets.release()  # the next module's fleet is the default kind


def _waiting(fleet: VllmFleet) -> int:
    text = httpx.get(f"{fleet.engines[0].url}/metrics", timeout=10).text
    return int(sum(float(v) for v in _WAITING.findall(text)))


def _queued(fleet: VllmFleet, n: int, sent: list[threading.Thread]) -> bool:
    """True once vLLM has `n` requests waiting; fails at once, saying so, if one of those sent
    already finished (it ran instead of queueing: the long request no longer held the slot)."""
    if any(not t.is_alive() for t in sent):
        raise AssertionError(f"a request finished before {n} were seen queued in vLLM")
    return _waiting(fleet) >= n


def _body(tag: str, max_tokens: int, stream: bool = False) -> dict[str, object]:
    return {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": f"[{tag}] Tell the tale of the forge."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }


def test_interactive_overtakes_normal_in_vllms_queue(
    fleet: VllmFleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    finished: list[str] = []
    lock = threading.Lock()

    # without the join probe: its cold prompts would take the engine's one batch slot too
    probe_off = {"probe": False}
    with gateway_for(tmp_path_factory.mktemp("prio"), fleet, calibration=probe_off) as gw:

        def send(tag: str, klass: str) -> None:
            r = httpx.post(
                f"{gw.base}/v1/chat/completions",
                json=_body(tag, 4),
                headers={"x-warmgate-priority": klass},
                timeout=300,
            )
            assert r.status_code == 200, r.text
            with lock:
                finished.append(klass)

        with httpx.Client(base_url=gw.base, timeout=300) as c:
            long = _body("long", 4000, stream=True)  # aborted when closed: costs no time
            headers = {"x-warmgate-priority": "background"}
            with c.stream("POST", "/v1/chat/completions", json=long, headers=headers) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                next(lines)  # it holds the engine's one batch slot now
                normal = threading.Thread(target=send, args=("n", "normal"))
                normal.start()
                wait_until(lambda: _queued(fleet, 1, [normal]), 60, "the normal request queued")
                interactive = threading.Thread(target=send, args=("i", "interactive"))
                interactive.start()
                both = [normal, interactive]
                wait_until(lambda: _queued(fleet, 2, both), 60, "both requests queued")
            # the stream is closed: vLLM aborts it and picks the next by priority
        normal.join(300)
        interactive.join(300)
    assert finished == ["interactive", "normal"], gw.log_tail()
