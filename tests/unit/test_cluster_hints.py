"""The game server's hints in the cluster simulator (issue 22 item 5): the trace's optional
fields round-trip and old records read as before; a warm never delays a real request and
makes its line's blocks cached; waiting queues follow the classes; background is shed; the
gateway's own `VersionDetector` triggers a replication; everything off is the plain
simulator, request for request. Simulated time only: nothing here is timed."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from bench.cluster_hint_args import HintFiguresError, add_hint_flags, hint_run, parse_hint_figures
from contracts.tiers import Tier
from gateway.config.warm import PrioritySettings, WarmSettings
from gateway.pipeline.binding_rule import overloaded
from gateway.pipeline.world_versions import VersionDetector
from router.policies.registry import default_registry
from sim.cluster.hint_metrics import hint_figures
from sim.cluster.hints import HintedSimulator, HintSettings
from sim.cluster.instance import queue_by_level
from sim.cluster.simulator import ClusterConfig, ClusterSimulator, RunRecord, SimClock
from sim.players.encode import to_trace
from sim.players.params import GameParams
from sim.players.workload import generate
from sim.profiles import Profile
from sim.traces import TraceFormatError, TraceRequest, parse_mooncake_line

BT = 16
# 1 ms per prefilled token, 10 ms per decode step: easy to reason about
SIMPLE = Profile(
    name="simple",
    source="test",
    kv_bytes_per_token=1000,
    prefill_overhead_s=0.0,
    prefill_per_token_s=1e-3,
    prefill_attention_s=0.0,
    step_base_s=0.01,
    step_per_seq_s=0.0,
    step_per_kv_token_s=0.0,
    kv_capacity_tokens=100_000,
    max_batch_tokens=512,
    bandwidths={Tier.HOST: 1e6, Tier.ARRAY: 1e5, Tier.SNAPSHOT: 1e5},
)


def _req(t_ms: float, ids: range | list[int], out: int = 4, **extra: object) -> TraceRequest:
    ids = list(ids)
    return TraceRequest(t_ms, len(ids) * BT, out, tuple(ids), **extra)  # type: ignore[arg-type]


def _sim(
    trace: list[TraceRequest],
    hints: HintSettings | None,
    *,
    instances: int = 1,
    policy: str = "prefix",
) -> tuple[ClusterSimulator, RunRecord]:
    config = ClusterConfig(instances=instances, block_tokens=BT, l1_tokens=BT * 10_000)
    clock = SimClock()
    built = default_registry().create(policy)
    sim: ClusterSimulator
    if hints is None:
        sim = ClusterSimulator(config, built, clock, profile=SIMPLE)
    else:
        sim = HintedSimulator(config, built, clock, hints=hints, profile=SIMPLE)
    return sim, sim.run(trace)


def _ttfts(run: RunRecord) -> dict[int, float | None]:
    return {r.idx: r.ttft_s for r in run.requests}


# -- the trace ------------------------------------------------------------------------------


def test_hint_fields_round_trip_and_old_records_read_unchanged() -> None:
    full = TraceRequest(
        5000.0, 64, 8, (1, 2, 3, 4), "p1:npc", warm_lead_ms=4000.0, warm_tokens=50,
        warm_blocks=3, priority="interactive", world_version="zone-1:2", world_blocks=2,
    )  # fmt: skip
    assert parse_mooncake_line(full.to_json()) == full
    plain = TraceRequest(10.0, 32, 4, (1, 2), "s")
    assert plain.to_json() == (
        '{"timestamp": 10, "input_length": 32, "output_length": 4, "hash_ids": [1, 2], '
        '"session": "s"}'
    )
    old = parse_mooncake_line('{"timestamp": 1, "input_length": 3, "output_length": 2, '
                              '"hash_ids": [7]}')  # fmt: skip
    assert (old.warm_lead_ms, old.priority, old.world_version) == (None, None, None)
    with pytest.raises(TraceFormatError):
        parse_mooncake_line(dataclasses.replace(full, warm_blocks=9).to_json())


def test_game_traces_carry_the_hints_only_when_asked() -> None:
    params = GameParams(players=12, minutes=3.0, seed=3)
    plain = to_trace(generate(params), BT)
    assert all(t.warm_lead_ms is None and t.priority is None for t in plain)
    assert all(t.world_version is None for t in plain)
    hinted = generate(
        dataclasses.replace(
            params, warm_lead_s=4.0, bump_at_s=(60.0,), bark_rate_per_s=0.5, priority_classes=True
        )
    )
    trace = to_trace(hinted, BT, world_tags=True)
    first = [t for t in trace if t.warm_lead_ms is not None]
    assert first and all(t.warm_lead_ms == 4000.0 for t in first)
    for t in first:  # the warm's context is the prompt less its line: a prefix of its blocks
        assert t.warm_blocks is not None and t.warm_tokens is not None
        assert 0 < t.warm_blocks * BT <= t.warm_tokens < t.input_length
    barks = [t for t in trace if t.priority == "background"]
    assert barks and all(t.session is None for t in barks)
    assert {t.priority for t in trace if t.session} == {"interactive"}
    tagged = [t for t in trace if t.world_version is not None]
    assert len({t.world_version for t in tagged}) == len(tagged) >= params.zones  # the bump
    assert all(0 < (t.world_blocks or 0) <= len(t.hash_ids) for t in tagged)


# -- warms ----------------------------------------------------------------------------------


def _warm_trace() -> list[TraceRequest]:
    # a first line of 300 blocks warmed 9 s ahead (at 0); an unrelated request arrives
    # 0.05 s after the warm started (300 x 16 tokens take 4.8 s to compute)
    line = _req(9000, range(1, 301), session="p", warm_lead_ms=9000.0, warm_tokens=4790,
                warm_blocks=299)  # fmt: skip
    other = _req(50, range(1000, 1100), session="q")
    return [line, other]


def test_a_warm_never_delays_a_real_request_and_its_line_finds_the_blocks_cached() -> None:
    trace = _warm_trace()
    _, without = _sim(trace, HintSettings())
    sim, with_warm = _sim(trace, HintSettings(warms=True))
    assert isinstance(sim, HintedSimulator)
    # the unrelated request arrived while the warm was computing: it starts at once
    assert _ttfts(with_warm)[1] == _ttfts(without)[1]
    [warm] = sim.warms
    assert warm.outcome == "done" and warm.cached_blocks == 0
    assert sim.queues[0].busy_s > 0
    line = next(r for r in with_warm.requests if r.idx == 0)
    assert line.cached_tokens == 299 * BT
    assert (_ttfts(with_warm)[0] or 0) < 0.5 * (_ttfts(without)[0] or 0)
    figures = hint_figures(trace, with_warm.requests, sim, block_tokens=BT)
    assert figures["warms"]["cached_over_warmed_blocks"] == 1.0
    assert figures["first_lines"]["n"] == 1 and figures["other_lines"]["n"] == 1


def test_a_warm_is_deferred_by_the_gateways_admission_when_the_instance_is_busy() -> None:
    busy = [_req(0, range(2000 + 100 * k, 2100 + 100 * k), out=200, session=f"b{k}")
            for k in range(4)]  # fmt: skip
    line = _req(5000, range(1, 301), session="p", warm_lead_ms=4900.0, warm_tokens=4790,
                warm_blocks=299)  # fmt: skip
    sim, _ = _sim([line, *busy], HintSettings(warms=True))
    assert isinstance(sim, HintedSimulator)
    assert [w.outcome for w in sim.warms] == ["deferred"]  # 4 real in flight at 0.1 s


def test_the_gateways_rules_that_the_simulator_applies() -> None:
    warm = WarmSettings()
    assert warm.refusal(0, warm.max_real_in_flight - 1, 0) is None
    assert warm.refusal(0, warm.max_real_in_flight, 0) is not None
    assert warm.refusal(warm.max_per_instance, 0, None) is not None
    assert warm.refusal(0, 0, warm.max_engine_waiting + 1) is not None
    assert not warm.gives_up_on_yield()  # it goes on after the real prefills
    assert WarmSettings(resume_after_yield=False).gives_up_on_yield()
    assert not WarmSettings(yield_to_real=False, resume_after_yield=False).gives_up_on_yield()
    prio = PrioritySettings()
    assert prio.sheds("background", prio.background_max_in_flight)
    assert not prio.sheds("interactive", 10_000)
    assert overloaded(20, [20, 0, 0, 0]) and not overloaded(5, [5, 4, 4, 4])


# -- priority classes -------------------------------------------------------------------


def test_queue_by_level_is_priority_then_first_come() -> None:
    from collections import deque

    from router.types import RouteRequest
    from sim.cluster.request import SimRequest

    def r(idx: int, level: int) -> SimRequest:
        route = RouteRequest(model="m", block_hashes=(idx,), block_tokens=BT, prompt_tokens=BT)
        return SimRequest(idx, 0.0, BT, 1, (idx,), route, level=level)

    waiting: deque[SimRequest] = deque()
    for idx, level in enumerate([0, 10, -10, 0, 10, -10]):
        queue_by_level(waiting, r(idx, level))
    assert [w.idx for w in waiting] == [2, 5, 0, 3, 1, 4]


def _class_trace() -> list[TraceRequest]:
    long = _req(0, range(1, 65), session="a")  # 1,024 tokens: two steps of 512
    bark = _req(10, range(100, 132), priority="background")
    line = _req(20, range(200, 232), session="c", priority="interactive")
    return [long, bark, line]


def test_waiting_requests_follow_their_class_only_with_classes_on() -> None:
    _, off = _sim(_class_trace(), HintSettings())
    t = _ttfts(off)
    assert (t[1] or 0) + 0.010 < (t[2] or 0) + 0.020  # first come, first served
    _, on = _sim(_class_trace(), HintSettings(priority_classes=True))
    t = _ttfts(on)
    assert (t[2] or 0) + 0.020 < (t[1] or 0) + 0.010  # the interactive line went first


def test_background_is_shed_past_the_gateways_limit() -> None:
    limit = PrioritySettings().background_max_in_flight
    barks = [_req(0, range(100 * k + 1, 100 * k + 9), out=50, priority="background")
             for k in range(limit + 3)]  # fmt: skip
    sim, run = _sim(barks, HintSettings(priority_classes=True))
    assert isinstance(sim, HintedSimulator)
    assert len(sim.shed) == 3
    assert sum(1 for r in run.requests if r.ttft_s is not None) == limit


# -- world versions -----------------------------------------------------------------------


def _bump_trace() -> list[TraceRequest]:
    # the stem (block 1) is established at 0; 20 s later four sessions start a new version
    # (block 3 under it) within a second, each going on with a turn of its own
    before = [_req(0, [1, 2, 10 + k], session=f"s{k}") for k in range(4)]
    after = [_req(20_000 + 200 * k, [1, 3, 20 + k], session=f"s{k}") for k in range(4)]
    return before + after


def test_a_new_version_found_by_the_gateways_detector_is_warmed_on_the_other_instance() -> None:
    sim, _ = _sim(_bump_trace(), HintSettings(replication=True), instances=2)
    assert isinstance(sim, HintedSimulator)
    assert isinstance(sim.detector, VersionDetector)  # the gateway's, imported
    [version] = sim.versions
    assert version["trigger"] == "detected" and version["sessions"] == 4
    warmed = [w for w in sim.warms if w.kind == "replication"]
    assert warmed and all(w.chain == (1, 3) for w in warmed)
    assert all(inst.l1.leading_match((1, 3)) == 2 for inst in sim.instances)
    off, _ = _sim(_bump_trace(), HintSettings(), instances=2)
    assert isinstance(off, HintedSimulator) and off.versions == [] and off.detector is None


# -- everything off ---------------------------------------------------------------------------


def test_hints_off_is_the_plain_simulator_request_for_request() -> None:
    params = GameParams(players=10, minutes=2.0, seed=5, warm_lead_s=4.0, bark_rate_per_s=0.3,
                        priority_classes=True, bump_at_s=(40.0,))  # fmt: skip
    trace = to_trace(generate(params), BT, world_tags=True)
    _, plain = _sim(trace, None, instances=2)
    _, hinted = _sim(trace, HintSettings(), instances=2)
    assert _ttfts(hinted) == _ttfts(plain)
    assert [r.instance for r in hinted.requests] == [r.instance for r in plain.requests]


def test_the_cli_asks_for_no_hints_by_default() -> None:
    p = argparse.ArgumentParser()
    add_hint_flags(p)
    assert hint_run(p.parse_args([])) is None
    run = hint_run(p.parse_args(["--warm-lead-s", "4", "--bumps", "60,90", "--replication"]))
    assert run is not None and run.hints is not None
    assert run.hints.warms and run.hints.replication and not run.hints.priority_classes
    assert run.server == {"warm_lead_s": 4.0, "bump_at_s": (60.0, 90.0)}
    assert parse_hint_figures("warm, barks") == ("warm", "barks")
    with pytest.raises(HintFiguresError):
        parse_hint_figures("warm,herding")
