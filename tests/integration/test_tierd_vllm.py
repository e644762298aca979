"""tierd's KV connector between two real vLLM engines, each with its own tierd and one
shared array: engine A computes a prompt, engine B serves it from the array; a corrupt
slice and a killed tierd never change what B answers."""

from __future__ import annotations

import random
import re
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.launch.models import ensure_tiny_model
from gateway.launch.tiered import TieredConfig, TieredFleet
from gateway.launch.vllm_fleet import FleetConfig
from tests.support.engines import engine_python_or_skip
from tests.support.otlp import Receiver, attributes
from tests.support.procs import free_port
from tests.support.vllm import Gateway, gateway_config
from tests.support.vllm_fleets import FleetSlot
from tierd.slices import HEADER_BYTES
from tierd.tiers.l2_array import ArrayDir

pytestmark = [pytest.mark.slow, pytest.mark.fleet("tierd-connector")]
BLOCK = 128  # vLLM's CPU default
MODEL = "warmgate-tiny"


@pytest.fixture(scope="module")
def fleet(session_fleets: FleetSlot, otlp_receiver: Receiver) -> TieredFleet:
    python = engine_python_or_skip()

    def build(run_dir: Path) -> TieredFleet:
        model = ensure_tiny_model(python=python)
        return TieredFleet(
            TieredConfig(
                FleetConfig(
                    model_dir=model,
                    engines=2,
                    run_dir=run_dir,
                    served_model_name=MODEL,
                    python=python,
                    pin_tree=True,  # as the other test fleets (tests/support/vllm.py)
                    # vLLM's tracing on: its spans and the connector's reach the receiver
                    otlp_traces=(f"{otlp_receiver.url}/v1/traces", "http/protobuf"),
                    extra_env={"OTEL_BSP_SCHEDULE_DELAY": "100"},
                ),
                l1_bytes=256 * 1024 * 1024,
                loads=("sync", "async"),  # B loads in a thread while its request waits
                lookups=("sync", "async"),  # and looks up off vLLM's scheduler loop
            )
        )

    f: TieredFleet = session_fleets.get("tierd-connector", build)
    return f


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 4000) for _ in range(n)]


def complete(
    url: str,
    ids: list[int],
    salt: str | None = None,
    n: int = 8,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": ids,
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    if salt is not None:
        body["cache_salt"] = salt
    r = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=300.0)
    assert r.status_code == 200, r.text
    out = r.json()
    return {
        "ids": out["choices"][0]["token_ids"],
        "cached": (out["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
    }


def external_tokens(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    m = re.search(
        r'^vllm:prompt_tokens_by_source_total\{[^}]*source="external_kv_transfer"[^}]*\} (\S+)$',
        text,
        re.M,
    )
    assert m, "vLLM exports no external_kv_transfer count"
    return float(m.group(1))


def wait_until(cond: Callable[[], bool], within_s: float = 30.0) -> None:
    end = time.monotonic() + within_s
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.1)


def settled(fleet: TieredFleet, quiet_s: float = 1.5, within_s: float = 60.0) -> None:
    """Waits until no save is still on its way: saves run off the engine's critical path,
    so an earlier request's blocks (a salted recompute's, say) can reach tierd and the array
    after its answer. A count or a set of slices taken before that would include them."""

    def landed() -> tuple[int, ...]:
        written = [
            i.tierd.stats()["connector"].get("write_through_blocks", 0) for i in fleet.instances
        ]
        return (*written, len(list(fleet.array_dir.glob("??/*.slice"))))

    end = time.monotonic() + within_s
    last, quiet_since = landed(), time.monotonic()
    while time.monotonic() - quiet_since < quiet_s:
        assert time.monotonic() < end, "saves still landing after 60 s"
        time.sleep(0.2)
        now = landed()
        if now != last:
            last, quiet_since = now, time.monotonic()


def computed_on_a(fleet: TieredFleet, ids: list[int]) -> dict[str, Any]:
    """Engine A computes the prompt cold; returns once its tierd holds every full block in
    the shared array."""
    a = fleet.instances[0]
    settled(fleet)
    written = a.tierd.stats()["connector"].get("write_through_blocks", 0)
    out = complete(a.engine.url, ids)
    assert out["cached"] == 0
    full = (len(ids) - 1) // BLOCK
    wait_until(
        lambda: a.tierd.stats()["connector"].get("write_through_blocks", 0) >= written + full
    )
    return out


def test_engine_b_serves_what_engine_a_computed(fleet: TieredFleet) -> None:
    ids = prompt(101, 2000)
    full = (len(ids) - 1) // BLOCK * BLOCK  # 1920: every full block below the last token
    a_out = computed_on_a(fleet, ids)
    b = fleet.instances[1]
    ext0 = external_tokens(b.engine.url)
    served = complete(b.engine.url, ids)
    assert served["cached"] == full
    assert external_tokens(b.engine.url) - ext0 == full
    recompute = complete(b.engine.url, ids, salt=f"recompute-{uuid.uuid4()}")
    assert recompute["cached"] == 0
    assert served["ids"] == recompute["ids"]
    assert a_out["ids"] == recompute["ids"]
    stats = b.stats()
    assert stats["loaded_blocks"] >= full // BLOCK
    # the native module's block copier moved them (host backend on CPU), torch not at all
    assert stats["copy_path_native-host"] == 1 and stats["native_copies"] > 0
    assert "torch_copy_calls" not in stats and "native_copy_errors" not in stats
    assert stats["lookup_rtt_samples"] >= 1
    assert stats["lookups_deferred"] >= 1  # B looked up off the scheduler loop
    assert "lookups_deferred" not in fleet.instances[0].stats()  # A on it


def _traced(span_id: str) -> tuple[str, dict[str, str]]:
    trace_id = uuid.uuid4().hex
    return trace_id, {"traceparent": f"00-{trace_id}-{span_id}-01"}


def test_a_traced_request_has_tierd_spans_beside_vllms(
    fleet: TieredFleet, otlp_receiver: Receiver
) -> None:
    a, b = fleet.instances
    ids = prompt(121, 1300)
    full = (len(ids) - 1) // BLOCK
    parent = "00f067aa0ba902b7"  # the gateway's upstream attempt, as vLLM gets it
    saved_trace, headers = _traced(parent)
    settled(fleet)
    written = a.tierd.stats()["connector"].get("write_through_blocks", 0)
    assert complete(a.engine.url, ids, headers=headers)["cached"] == 0
    wait_until(
        lambda: a.tierd.stats()["connector"].get("write_through_blocks", 0) >= written + full
    )
    loaded_trace, headers = _traced(parent)
    assert complete(b.engine.url, ids, headers=headers)["cached"] == full * BLOCK

    def spans_of(trace_id: str, names: set[str]) -> dict[str, Any]:
        wait_until(lambda: names <= set(otlp_receiver.of_trace(trace_id)), 30.0)
        return {name: span for name, (_, span) in otlp_receiver.of_trace(trace_id).items()}

    computed = spans_of(saved_trace, {"llm_request", "tierd lookup", "tierd save"})
    served = spans_of(loaded_trace, {"llm_request", "tierd lookup", "tierd load"})
    for spans in (computed, served):  # siblings of vLLM's span, under the caller's
        assert {s.parent_span_id.hex() for s in spans.values()} == {parent}
        assert all(s.end_time_unix_nano >= s.start_time_unix_nano > 0 for s in spans.values())
    assert attributes(computed["tierd lookup"])["tierd.hit_blocks"] == 0
    assert attributes(computed["tierd lookup"])["tierd.lookup.mode"] == "sync"  # A's
    assert attributes(computed["tierd save"])["tierd.blocks"] >= 1
    lookup = attributes(served["tierd lookup"])
    assert (lookup["tierd.hit_blocks"], lookup["tierd.lookup.mode"]) == (full, "async")
    load = attributes(served["tierd load"])
    assert (load["tierd.blocks"], load["tierd.failed_blocks"]) == (full, 0)
    assert load["tierd.load.mode"] == "async"
    # the load ends before vLLM's request does (it waited for its KV)
    assert served["tierd load"].end_time_unix_nano <= served["llm_request"].end_time_unix_nano


def test_an_untraced_request_records_no_tierd_span(
    fleet: TieredFleet, otlp_receiver: Receiver
) -> None:
    before = len(otlp_receiver.named("tierd lookup"))
    complete(fleet.instances[1].engine.url, prompt(122, 400))
    time.sleep(1.0)  # two export periods
    assert len(otlp_receiver.named("tierd lookup")) == before


def test_engine_a_loads_synchronously_what_engine_b_computed(fleet: TieredFleet) -> None:
    a, b = fleet.instances
    ids = prompt(150, 1400)
    settled(fleet)
    written = b.tierd.stats()["connector"].get("write_through_blocks", 0)
    assert complete(b.engine.url, ids)["cached"] == 0
    full = (len(ids) - 1) // BLOCK
    wait_until(
        lambda: b.tierd.stats()["connector"].get("write_through_blocks", 0) >= written + full
    )
    served = complete(a.engine.url, ids)
    assert served["cached"] == full * BLOCK
    assert served["ids"] == complete(a.engine.url, ids, salt=f"recompute-{uuid.uuid4()}")["ids"]


def test_a_partial_prefix_hit_loads_the_shared_part_only(fleet: TieredFleet) -> None:
    shared = prompt(202, 1024)
    computed_on_a(fleet, [*shared, *prompt(203, 300)])
    b = fleet.instances[1]
    other = [*shared, *prompt(204, 700)]  # same first 8 blocks, then different
    served = complete(b.engine.url, other)
    assert served["cached"] == len(shared)
    recompute = complete(b.engine.url, other, salt=f"recompute-{uuid.uuid4()}")
    assert served["ids"] == recompute["ids"]


def test_a_corrupt_slice_is_recomputed_not_served(fleet: TieredFleet) -> None:
    b = fleet.instances[1]
    ids = prompt(303, 1500)
    settled(fleet)
    before = set(fleet.array_dir.glob("??/*.slice"))
    computed_on_a(fleet, ids)
    chain = fleet.chain_since(before)
    assert len(chain) == (len(ids) - 1) // BLOCK
    victim = ArrayDir(fleet.array_dir, 0).path(chain[3])
    raw = bytearray(victim.read_bytes())
    for i in range(HEADER_BYTES + 100, len(raw), 4096):
        raw[i] ^= 0x5A  # payload damage: the header stays valid, the crc does not
    victim.write_bytes(bytes(raw))
    corrupt0 = b.tierd.stats()["corrupt"].get("array", 0)
    failed0 = b.stats().get("load_failed_blocks", 0)
    served = complete(b.engine.url, ids)
    recompute = complete(b.engine.url, ids, salt=f"recompute-{uuid.uuid4()}")
    assert served["ids"] == recompute["ids"]
    assert b.tierd.stats()["corrupt"]["array"] == corrupt0 + 1
    assert not victim.exists()
    assert any(p.name.startswith(victim.name) for p in (fleet.array_dir / "quarantine").iterdir())
    wait_until(lambda: b.stats().get("load_failed_blocks", 0) > failed0)


def test_tierd_killed_mid_run_loses_no_request(fleet: TieredFleet) -> None:
    a, b = fleet.instances
    warm = [prompt(400 + i, 1100) for i in range(3)]
    expected = [computed_on_a(fleet, ids)["ids"] for ids in warm]
    cold = [prompt(500 + i, 900) for i in range(3)]
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(complete, b.engine.url, ids) for ids in [*warm, *cold]]
        time.sleep(0.3)
        b.tierd.kill()
        results = [f.result() for f in futures]
    assert [r["ids"] for r in results[:3]] == expected
    for ids, r in zip(cold, results[3:], strict=True):
        assert r["ids"] == complete(a.engine.url, ids)["ids"]
    # with tierd gone the engine serves (and recomputes) everything new
    lone = prompt(600, 700)
    alone = complete(b.engine.url, lone)
    assert alone["cached"] == 0
    assert b.stats().get("link_failures", 0) + b.stats().get("lookup_unavailable", 0) >= 1
    # a new tierd on the same socket: the connector attaches again and loads from the array
    b.tierd.start()
    again = prompt(700, 1100)
    want = computed_on_a(fleet, again)
    time.sleep(1.2)  # the connector retries a lost link at most once a second
    got = complete(b.engine.url, again)
    assert got["ids"] == want["ids"]
    assert got["cached"] == (len(again) - 1) // BLOCK * BLOCK


def test_the_gateway_hints_the_next_engine_in_engine_hashes_and_the_prefetch_is_on_time(
    fleet: TieredFleet, tmp_path: Path
) -> None:
    """warmgate in precise mode with each instance's tierd: a turn routed to the engine that
    did not compute the prompt makes the gateway hint that engine's tierd with the prompt's
    chain in vLLM's own block hashes; tierd brings the blocks from the array into its L1
    before vLLM asks, and the engine loads them from there."""
    cfg = gateway_config(fleet, free_port())  # type: ignore[arg-type]
    urls = fleet.tierd_urls
    for inst in cfg["instances"]:
        inst["tierd_url"] = urls[inst["id"]]
    cfg["routing"]["policy"] = "round_robin"  # the second turn goes to the other engine
    cfg["tiers"] = {"hint_keys": "engine", "prefetch_deadline_s": 5.0}
    # no join probe: its cold prompts (up to 4096 tokens) outlived its 10 s timeout in a full
    # run, and their write-through counted toward the wait for the first turn's blocks below
    # (so the second turn came before they were in the array: 0 cached, 11 of 11 hints missed)
    cfg["calibration"] = {"probe": False}
    gw = Gateway(tmp_path, cfg).wait_ready()
    try:
        ids = prompt(800, 1500)
        full = (len(ids) - 1) // BLOCK * BLOCK
        body = {"model": MODEL, "prompt": ids, "max_tokens": 4, "temperature": 0}
        body |= {"ignore_eos": True, "return_token_ids": True}
        written = {i.engine.id: _written(i) for i in fleet.instances}
        first = httpx.post(f"{gw.base}/v1/completions", json=body, timeout=300.0)
        assert first.status_code == 200, first.text
        there = first.headers["x-warmgate-instance"]
        here = next(i for i in fleet.instances if i.engine.id != there)
        a = next(i for i in fleet.instances if i.engine.id == there)
        wait_until(lambda: _written(a) >= written[there] + full // BLOCK)
        before = here.tierd.stats()["prefetch"]
        second = httpx.post(f"{gw.base}/v1/completions", json=body, timeout=300.0)
        assert second.status_code == 200, second.text
        assert second.headers["x-warmgate-instance"] == here.engine.id
        usage = second.json()["usage"]
        after = here.tierd.stats()["prefetch"]
        why = {"connector": here.stats(), "prefetch": (before, after)}
        assert usage["prompt_tokens_details"]["cached_tokens"] == full, why
        assert after["requests"] == before["requests"] + 1
        brought = sum(after.get(k, 0) - before.get(k, 0) for k in ("on_time", "hit"))
        assert brought == full // BLOCK, (before, after)  # every block of the hint, in time
        assert second.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    finally:
        gw.stop()


def _written(inst: Any) -> int:
    return int(inst.tierd.stats()["connector"].get("write_through_blocks", 0))
