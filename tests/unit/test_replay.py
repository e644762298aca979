"""The live replay client against a real simulated engine on loopback."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.replay import Progress, ReplayItem, build_body, instance_from_headers, replay
from bench.workloads import game_items, sidecar_items
from sim.players.encode import write_sidecar
from sim.players.params import GameParams
from sim.players.workload import generate
from tests.support.procs import ManagedProcess, free_port, python_module

MODEL = "sim-test"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    args = python_module(
        "sim.engine", "--port", str(port), "--instance-id", "solo", "--model", MODEL,
        "--time-scale", "0.02", "--seed", "1",
    )  # fmt: skip
    proc = ManagedProcess(args, log)
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/health")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


def _item(at_s: float, text: str, max_tokens: int = 8, session: str | None = None) -> ReplayItem:
    return ReplayItem(
        at_s=at_s, messages=[{"role": "user", "content": text}], max_tokens=max_tokens,
        session=session,
    )  # fmt: skip


async def test_records_carry_timings_usage_and_instance(engine: str) -> None:
    shared = "the same long world state " * 80
    items = [_item(0.0, shared + "first"), _item(0.2, shared + "second", max_tokens=5)]
    records = await replay(engine + "/v1", items, model=MODEL, progress_label=None)
    assert [r.index for r in records] == [0, 1]
    for rec, item in zip(records, items, strict=True):
        assert rec.ok, rec.error
        assert rec.status == 200
        assert rec.instance == "solo"  # from the engine's x-engine-instance header
        assert rec.completion_tokens == item.max_tokens
        assert rec.ttft_s is not None and rec.e2e_s is not None
        assert 0 < rec.ttft_s <= rec.e2e_s
        assert len(rec.gaps_s) >= 1  # several text chunks after the first
        assert rec.prompt_tokens > 400
    # The second request's arrival is kept; its shared prefix is found cached.
    assert records[1].sent_s >= records[1].scheduled_s == pytest.approx(0.2)
    assert records[1].cached_tokens is not None and records[1].cached_tokens > 300
    assert records[1].tpot_s is not None


async def test_compression_and_concurrency_cap(engine: str) -> None:
    items = [_item(10.0 * i, f"player {i} says hello", max_tokens=20) for i in range(8)]
    records = await replay(
        engine + "/v1", items, model=MODEL, compress=100.0, concurrency=2, progress_label=None
    )
    assert all(r.ok for r in records)
    assert [r.scheduled_s for r in records] == pytest.approx([0.1 * i for i in range(8)])
    spans = [(r.sent_s, r.sent_s + (r.e2e_s or 0.0)) for r in records]
    for start, _ in spans:  # never more than 2 requests in flight when one is sent
        assert sum(1 for s, e in spans if s <= start < e) <= 2


async def test_a_session_waits_for_its_previous_answer(engine: str) -> None:
    # the later lines are due 1 ms after the first: well before its answer (tens of decode
    # steps, ~10 ms here), so only waiting for that answer can delay them
    items = [
        _item(0.0, "first line of a long talk", max_tokens=160, session="p1"),
        _item(0.001, "second line", max_tokens=3, session="p1"),
        _item(0.001, "someone else", max_tokens=3, session="p2"),
    ]
    for closed in (False, True):
        first, second, other = await replay(
            engine + "/v1", items, model=MODEL, closed_loop=closed, progress_label=None
        )
        assert first.ok and second.ok and other.ok
        assert first.e2e_s is not None
        assert second.sent_s >= first.sent_s + first.e2e_s  # sent only once p1 was answered
        assert other.sent_s < first.sent_s + first.e2e_s  # other sessions do not wait
    unordered = await replay(
        engine + "/v1", items, model=MODEL, session_order=False, progress_label=None
    )
    assert unordered[1].sent_s < unordered[0].sent_s + (unordered[0].e2e_s or 0.0)


async def test_closed_loop_ignores_arrival_times(engine: str) -> None:
    items = [_item(1000.0 * i, f"line {i}", max_tokens=3) for i in range(4)]
    records = await replay(
        engine + "/v1", items, model=MODEL, closed_loop=True, concurrency=4, progress_label=None
    )
    assert all(r.ok and r.scheduled_s == 0.0 for r in records)
    assert max(r.sent_s for r in records) < 100.0


async def test_http_errors_are_recorded_not_raised(engine: str) -> None:
    records = await replay(
        engine + "/v1", [_item(0.0, "hi")], model="no-such-model", progress_label=None
    )
    assert records[0].status == 404 and not records[0].ok
    assert records[0].error and "model" in records[0].error
    down = f"http://127.0.0.1:{free_port()}/v1"
    records = await replay(down, [_item(0.0, "hi")], model=MODEL, progress_label=None)
    assert records[0].status == 0 and not records[0].ok
    assert records[0].error and "Connect" in records[0].error


def test_instance_headers_in_order_of_trust() -> None:
    by_url = {"http://127.0.0.1:9001": "e0"}
    assert instance_from_headers({"x-engine-instance": "e1"}, by_url) == "e1"
    both = {"x-warmgate-instance": "w", "x-engine-instance": "e1"}
    assert instance_from_headers(both, by_url) == "w"
    assert instance_from_headers({"llm_provider-x-engine-instance": "e2"}, by_url) == "e2"
    lite = {"x-litellm-model-api-base": "http://127.0.0.1:9001/v1"}
    assert instance_from_headers(lite, by_url) == "e0"
    assert instance_from_headers({}, by_url) is None


def test_body_is_streamed_with_usage_and_session() -> None:
    body = build_body(_item(0.0, "x", max_tokens=7, session="p9"), "m")
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 7 and body["model"] == "m"
    assert body["user"] == "p9" and body["prompt_cache_key"] == "p9"
    assert "user" not in build_body(_item(0.0, "x"), "m")


def test_progress_writes_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress(4, "t", stream=out)
    progress.done, progress.errors = 4, 1
    progress.update(force=True)
    assert "4/4" in out.getvalue() and "errors 1" in out.getvalue()


def test_game_workload_in_process_and_from_its_sidecar_agree(tmp_path: Path) -> None:
    items = game_items(8, 1.0, 3)
    assert items and all(i.session and i.max_tokens > 0 for i in items)
    assert [i.at_s for i in items] == sorted(i.at_s for i in items)
    requests = generate(GameParams(players=8, minutes=1.0, seed=3))
    sidecar = tmp_path / "game.sidecar.jsonl"
    write_sidecar(sidecar, requests)
    loaded = sidecar_items(sidecar)
    assert len(loaded) == len(items)
    for a, b in zip(items, loaded, strict=True):
        assert a.messages == b.messages and a.session == b.session
        assert a.max_tokens == b.max_tokens and a.at_s == pytest.approx(b.at_s, abs=1e-3)
    half = sidecar_items(sidecar, minutes=0.5)
    assert 0 < len(half) < len(loaded) and all(i.at_s < 30.0 for i in half)
