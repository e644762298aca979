"""A request's priority class reaches real vLLM (issue 22, item 3): one engine with
`--scheduling-policy priority` and a single batch slot; two requests wait behind a running
one, the normal one first, the interactive one second; when the slot frees, vLLM starts the
interactive one first, and the normal one only once the interactive one is gone. With FCFS,
or without the gateway's priority, the normal one would start first (the arrival order).

The order is read where vLLM decides it, not from when answers come back: every request
streams and asks for more tokens than it is left to produce, so with one batch slot the one
running holds it, and the other cannot send its first chunk, until the test closes the
running one's stream (vLLM aborts it). A busy machine slows every step, but cannot reorder
first chunks that only one slot, handed over by the test, lets out."""

from __future__ import annotations

import os
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
HOLD_TOKENS = 4000  # more than a request produces before the test closes it (max_model_len 4096)


@pytest.fixture(scope="module")
def fleet(vllm_fleets: VllmFleets) -> Iterator[VllmFleet]:
    yield vllm_fleets.get(
        engines=1, scheduling_policy="priority", extra_args=("--max-num-seqs", "1")
    )
    vllm_fleets.release()  # the next module's fleet is the default kind


def _waiting(fleet: VllmFleet) -> int:
    text = httpx.get(f"{fleet.engines[0].url}/metrics", timeout=10).text
    return int(sum(float(v) for v in _WAITING.findall(text)))


def _body(tag: str) -> dict[str, object]:
    return {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": f"[{tag}] Tell the tale of the forge."}],
        "max_tokens": HOLD_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }


class Held:
    """One streamed request on a thread of its own: it notes when its first chunk arrives
    (vLLM ran it) and keeps the stream open, so the request keeps the batch slot, until
    `close()`; closing the stream makes the gateway, then vLLM, abort it."""

    def __init__(self, base: str, klass: str, started: list[str], lock: threading.Lock) -> None:
        self.klass = klass
        self._base = base
        self._started = started
        self._lock = lock
        self._close = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"held-{klass}")
        self.thread.start()

    def _run(self) -> None:
        try:
            headers = {"x-warmgate-priority": self.klass}
            with (
                httpx.Client(base_url=self._base, timeout=300) as c,
                c.stream(
                    "POST", "/v1/chat/completions", json=_body(self.klass), headers=headers
                ) as r,
            ):
                assert r.status_code == 200, r.read()
                # held in a name: a generator dropped mid-way is closed, and closing it
                # closes the connection (httpcore), which would abort the request
                lines = r.iter_lines()
                if not any(line.startswith("data:") for line in lines):
                    raise AssertionError(f"the {self.klass} stream ended without a chunk")
                with self._lock:
                    self._started.append(self.klass)
                self._close.wait(300)
        except BaseException as exc:  # reported by the test's thread (check())
            self.error = exc

    def check(self) -> None:
        """Fails, naming why, if the request ended before the test closed it."""
        if self.error is not None:
            raise AssertionError(f"the {self.klass} request failed: {self.error!r}")
        if not self.thread.is_alive() and not self._close.is_set():
            raise AssertionError(f"the {self.klass} request ended before the test closed it")

    def close(self) -> None:
        self._close.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), f"the {self.klass} stream did not close"


def _queued(fleet: VllmFleet, n: int, held: list[Held]) -> bool:
    """True once vLLM has `n` requests waiting; fails at once if a request sent ended."""
    for h in held:
        h.check()
    return _waiting(fleet) >= n


def _started(started: list[str], n: int, held: list[Held]) -> list[str] | None:
    for h in held:
        h.check()
    return list(started) if len(started) >= n else None


def test_interactive_overtakes_normal_in_vllms_queue(
    fleet: VllmFleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    engine = fleet.engines[0]
    # every engine process on its core (tests/support/vllm.py): a busy-polling EngineCore
    # elsewhere starved this test's client and the gateway for seconds
    assert {frozenset(os.sched_getaffinity(pid)) for pid in engine.pids()} == {
        frozenset({engine.core})
    }
    started: list[str] = []  # the queued requests, in the order their first chunk came
    lock = threading.Lock()

    # without the join probe: its cold prompts would take the engine's one batch slot too
    probe_off = {"probe": False}
    with gateway_for(tmp_path_factory.mktemp("prio"), fleet, calibration=probe_off) as gw:
        running: list[str] = []
        background = Held(gw.base, "background", running, lock)
        held: list[Held] = []
        try:
            # it holds the engine's one batch slot once its first chunk came
            wait_until(lambda: _started(running, 1, [background]), 60, "the background ran")
            held.append(Held(gw.base, "normal", started, lock))
            wait_until(lambda: _queued(fleet, 1, [background, *held]), 60, "normal queued")
            held.append(Held(gw.base, "interactive", started, lock))
            wait_until(lambda: _queued(fleet, 2, [background, *held]), 60, "both queued")
            assert started == []  # neither ran while the slot was held
            normal, interactive = held
            background.close()  # vLLM aborts it and picks the next waiting one by priority
            first = wait_until(lambda: _started(started, 1, held), 60, "one queued started")
            assert first == ["interactive"], gw.log_tail()
            # the normal one still waits: the interactive one holds the slot until closed
            # (read from the first chunks: vLLM's waiting gauge lags a step behind)
            assert started == ["interactive"]
            normal.check()
            interactive.close()
            both = wait_until(lambda: _started(started, 2, [normal]), 60, "the normal started")
            assert both == ["interactive", "normal"], gw.log_tail()
        finally:
            for h in [background, *held]:
                h.close()
        for h in [background, *held]:
            assert h.error is None, f"{h.klass}: {h.error!r}"
