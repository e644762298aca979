"""The discrete-event cluster simulator: hand-checked hits and times on tiny traces,
demotion to the shared array and loads from it, determinism, the index being fed, and the
`warmgate bench cluster` command end to end on a small trace file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.cluster_cli import main as bench_cluster_main
from contracts.tiers import Tier
from router.index import ARRAY
from router.policies.registry import default_registry
from sim.cluster.floor import lone_ttft_s, ttft_floors
from sim.cluster.metrics import summarise, ttft_floor, upper_bound_token_hit_rate
from sim.cluster.probe import probe_samples, probe_ttft
from sim.cluster.reuse import reusable_share, reusable_tokens, share_of_reusable
from sim.cluster.runner import run_policy
from sim.cluster.simulator import ClusterConfig, ClusterSimulator, RunRecord, SimClock
from sim.profiles import Profile
from sim.traces import TraceRequest, write_mooncake

# 1 ms per prefilled token, 10 ms per decode step, nothing else: easy to check by hand
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
    kv_capacity_tokens=10_000,
    max_batch_tokens=8192,
    bandwidths={Tier.HOST: 1e6, Tier.ARRAY: 1e5, Tier.SNAPSHOT: 1e5},
)


def _req(t_ms: float, ids: list[int], tokens: int, out: int = 1) -> TraceRequest:
    return TraceRequest(t_ms, tokens, out, tuple(ids))


def _run(
    trace: list[TraceRequest], config: ClusterConfig, policy: str = "round_robin"
) -> tuple[ClusterSimulator, RunRecord]:
    clock = SimClock()  # policies that keep time read simulated time, as in the runner
    params: dict[str, object] = {"clock": clock} if policy == "ttft" else {}
    built = default_registry().create(policy, **params)
    sim = ClusterSimulator(config, built, clock, profile=SIMPLE)
    return sim, sim.run(trace)


def test_prefix_hit_and_times_by_hand() -> None:
    # 10-token blocks; B shares A's first three blocks and arrives after A is done
    trace = [_req(0, [1, 2, 3, 4], 40), _req(1000, [1, 2, 3, 5], 40)]
    cfg = ClusterConfig(instances=1, block_tokens=10, l1_tokens=1000)
    sim, run = _run(trace, cfg)
    a, b = run.requests
    assert a.ttft_s == pytest.approx(0.040)  # 40 tokens at 1 ms
    assert b.cached_tokens == 30
    assert b.ttft_s == pytest.approx(0.010)  # only the new block is computed
    summary = summarise("round_robin", run)
    assert summary["token_hit_rate"] == pytest.approx(30 / 80)
    assert summary["hit_rate_by_tier"]["hbm"] == pytest.approx(30 / 80)
    assert summary["requests"] == 2
    # what the router's index learnt from the instance's residency events
    match = sim.index.match([1, 2, 3, 5], ["i0"])
    assert match["i0"] == {Tier.HBM: 4}


def test_decode_steps_are_coalesced_and_timed() -> None:
    trace = [_req(0, [1], 10, out=11), _req(0, [2], 10, out=3)]
    cfg = ClusterConfig(instances=1, block_tokens=10, l1_tokens=1000)
    _, run = _run(trace, cfg)
    a, b = run.requests
    # one step prefills both (20 ms); then both decode: b needs 2 more steps, a 10
    assert a.ttft_s == pytest.approx(0.020)
    assert b.finish_s == pytest.approx(0.020 + 2 * 0.010)
    assert a.finish_s == pytest.approx(0.020 + 10 * 0.010)


def test_arrival_cuts_a_decode_run_at_the_step_in_progress() -> None:
    # a decodes alone from t=10 ms; b arrives at t=45 ms, mid-step (steps end 20, 30, 40, 50)
    trace = [_req(0, [1], 10, out=100), _req(45, [2], 10)]
    cfg = ClusterConfig(instances=1, block_tokens=10, l1_tokens=1000)
    _, run = _run(trace, cfg)
    b = run.requests[1]
    # b's prefill joins the step after the one ending at 50 ms: decode 10 ms + 10 tokens
    assert b.first_token_s == pytest.approx(0.050 + 0.010 + 0.010)


def test_eviction_demotes_to_the_array_and_reuse_loads_from_it() -> None:
    # L1 holds 4 blocks; C's chain pushes A's out to the array; A again then loads it
    trace = [
        _req(0, [1, 2, 3, 4], 40),
        _req(1000, [5, 6, 7, 8], 40),
        _req(2000, [1, 2, 3, 9], 40),
    ]
    cfg = ClusterConfig(instances=1, block_tokens=10, l1_tokens=40, array_tokens=1000)
    sim, run = _run(trace, cfg)
    again = run.requests[2]
    assert again.cached_by_tier == {"array": 30}
    load_s = 30 * SIMPLE.kv_bytes_per_token / SIMPLE.bandwidths[Tier.ARRAY]  # 0.3 s
    assert again.ttft_s == pytest.approx(load_s + 0.010)
    summary = summarise("round_robin", run)
    assert summary["hit_rate_by_tier"]["array"] == pytest.approx(30 / 120)
    # the array's contents were published to the router's index as ARRAY residency
    assert sim.index.match([5, 6], ["i0"])["i0"].get(Tier.ARRAY, 0) >= 1
    assert sim.index.blocks_held(ARRAY) >= 4


def test_l2_is_preferred_over_the_array() -> None:
    trace = [
        _req(0, [1, 2, 3, 4], 40),
        _req(1000, [5, 6, 7, 8], 40),
        _req(2000, [1, 2, 3, 9], 40),
    ]
    cfg = ClusterConfig(
        instances=1, block_tokens=10, l1_tokens=40, l2_tokens=1000, array_tokens=1000
    )
    _, run = _run(trace, cfg)
    again = run.requests[2]
    assert again.cached_by_tier == {"host": 30}
    assert again.ttft_s == pytest.approx(30 * 1000 / 1e6 + 0.010)


def _mixed_trace(n: int = 200) -> list[TraceRequest]:
    out = []
    for i in range(n):
        session = i % 17
        turn = i // 17
        ids = [0, 1000 + session] + [10_000 * session + k for k in range(turn + 1)]
        out.append(_req(i * 50.0, ids, len(ids) * 10, out=5 + i % 7))
    return out


@pytest.mark.parametrize("policy", ["round_robin", "prefix", "ttft"])
def test_runs_are_deterministic(policy: str) -> None:
    cfg = ClusterConfig(instances=3, block_tokens=10, l1_tokens=200, array_tokens=400)
    trace = _mixed_trace()
    runs = [_run(trace, cfg, policy)[1] for _ in range(2)]
    first, second = (
        [(r.instance, r.first_token_s, r.finish_s, r.cached_tokens) for r in run.requests]
        for run in runs
    )
    assert first == second
    assert all(r.finish_s is not None for r in runs[0].requests)


def test_upper_bound_is_one_infinite_cache() -> None:
    trace = [_req(0, [1, 2], 20), _req(1, [1, 2, 3], 25), _req(2, [4], 10)]
    # second request reuses 20 of 25 tokens; nothing else is reusable
    assert upper_bound_token_hit_rate(trace, 10) == pytest.approx(20 / 55)


def test_bench_cluster_command_writes_the_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace_path = tmp_path / "t.jsonl"
    write_mooncake(trace_path, _mixed_trace(120))
    out = tmp_path / "out.json"
    rc = bench_cluster_main(
        [
            "--trace", str(trace_path), "--block-tokens", "10", "--instances", "3",
            "--l1-tokens", "300", "--array-tokens", "600", "--profile", "llama3-8b-h100",
            "--policies", "round_robin,least_load,session,prefix,ttft", "--json", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    data = json.loads(out.read_text())
    assert set(data["policies"]) == {"round_robin", "least_load", "session", "prefix", "ttft"}
    for figures in data["policies"].values():
        assert figures["requests"] == 120
        assert set(figures["hit_rate_by_tier"]) == {"hbm", "host", "array"}
        assert 0.0 <= figures["token_hit_rate"] <= data["upper_bound_token_hit_rate"] + 1e-9
        assert figures["ttft_p50_s"] <= figures["ttft_p90_s"] <= figures["ttft_p99_s"]
        # a simulated decode step is at least the profile's base step time
        assert 0.005 < figures["tpot_p50_s"] <= figures["tpot_p90_s"] <= figures["tpot_p99_s"]
        assert figures["load_imbalance"] >= 1.0
        assert len(figures["utilisation_by_instance"]) == 3
    assert "| ttft |" in capsys.readouterr().out


def test_bench_cluster_replays_an_azure_csv(tmp_path: Path) -> None:
    rows = "".join(
        f"2023-11-16 18:{15 + k // 60:02d}:{k % 60:02d}.5000000,{300 + 37 * k},{20 + k % 7}\n"
        for k in range(40)
    )
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    out = tmp_path / "out.json"
    rc = bench_cluster_main(
        [
            "--trace", str(path), "--block-tokens", "64", "--instances", "2",
            "--policies", "round_robin,ttft", "--json", str(out),
        ]
    )  # fmt: skip
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["upper_bound_token_hit_rate"] == 0.0  # nothing is shared
    for figures in data["policies"].values():
        assert figures["requests"] == 40
        assert figures["token_hit_rate"] == 0.0
        assert 0.0 < figures["ttft_p50_s"] <= figures["ttft_p99_s"]


def test_write_through_lets_another_instance_load_fresh_kv() -> None:
    # round robin sends the second request to the other instance: with write-through the
    # first one's blocks are already in the array, without it they are recomputed
    trace = [_req(0, [1, 2, 3, 4], 40), _req(1000, [1, 2, 3, 5], 40)]
    for write_through, expected in ((True, {"array": 30}), (False, {})):
        cfg = ClusterConfig(
            instances=2,
            block_tokens=10,
            l1_tokens=1000,
            array_tokens=1000,
            array_write_through=write_through,
        )
        _, run = _run(trace, cfg)
        second = run.requests[1]
        assert second.instance == 1
        assert second.cached_by_tier == expected


def test_the_reusable_maximum_counts_leading_blocks_an_earlier_request_computed() -> None:
    # b reuses a's two leading blocks (capped at its 15 tokens); c's chain starts anew, so
    # its block 2 (seen) is not reusable by a prefix cache; d repeats c exactly
    requests = [((1, 2, 3), 30), ((1, 2), 15), ((9, 2), 20), ((9, 2), 20)]
    assert reusable_tokens(requests, 10) == (15 + 20, 85)
    assert reusable_share([], 10) == 0.0
    assert share_of_reusable(0.2, 0.4) == pytest.approx(0.5)
    assert share_of_reusable(0.0, 0.0) is None


def test_the_ttft_floor_is_each_request_alone_with_every_earlier_block_and_none_beats_it() -> None:
    # far apart on one instance with room for everything, each request's TTFT is its floor
    trace = [_req(0, [1, 2, 3, 4], 40), _req(1000, [1, 2, 3, 5], 40), _req(2000, [9], 10)]
    _, run = _run(trace, ClusterConfig(instances=1, block_tokens=10, l1_tokens=1000))
    assert ttft_floors(trace, 10, SIMPLE) == pytest.approx([0.040, 0.010, 0.010])
    assert [r.ttft_s for r in run.requests] == pytest.approx([0.040, 0.010, 0.010])
    assert lone_ttft_s(SIMPLE, 40, 40) == pytest.approx(0.001)  # the last token is computed
    # a busy fleet with little memory: every request at or above its floor, by any policy,
    # and so is every percentile
    busy = [dataclasses.replace(r, timestamp_ms=r.timestamp_ms / 10) for r in _mixed_trace()]
    floors = ttft_floors(busy, 10, SIMPLE)
    bound = ttft_floor(busy, 10, SIMPLE)
    above = 0
    for policy in ("round_robin", "prefix", "ttft"):
        _, run = _run(busy, ClusterConfig(instances=2, block_tokens=10, l1_tokens=200), policy)
        ttfts = [r.ttft_s for r in sorted(run.requests, key=lambda r: r.idx)]
        assert all(t is not None and t >= f - 1e-12 for t, f in zip(ttfts, floors, strict=True))
        above += sum(1 for t, f in zip(ttfts, floors, strict=True) if t is not None and t > f)
        figures = summarise(policy, run)
        assert all(figures[k] >= bound[k] - 1e-12 for k in bound)
    assert above > 0  # the fleet was busy enough for queues to show


def test_the_simulated_probe_is_what_an_idle_instance_charges_a_lone_cold_prompt() -> None:
    # 10,000 tokens: two chunks of the 8,192-token budget on the simple profile
    cfg = ClusterConfig(instances=1, block_tokens=100, l1_tokens=20_000)
    _, run = _run([_req(0, list(range(100)), 10_000)], cfg)
    assert run.requests[0].ttft_s == pytest.approx(probe_ttft(SIMPLE, 10_000))
    samples = probe_samples(SIMPLE, (256, 1024))
    assert [s.prompt_tokens for s in samples] == [256, 1024]
    assert samples[1].ttft_s == pytest.approx(1.024)


def test_the_probe_prices_every_instance_before_the_first_request() -> None:
    cfg = ClusterConfig(instances=3, block_tokens=10, l1_tokens=300, profile="llama3-8b-h100")
    trace = [_req(0, [1, 2], 20)]  # one request: two instances never see an outcome
    probed = run_policy(trace, cfg, "ttft", probe=True)["policy_stats"]["instances"]
    assert set(probed) == {"i0", "i1", "i2"}
    unprobed = run_policy(trace, cfg, "ttft", probe=False)["policy_stats"]["instances"]
    assert len(unprobed) == 1


def test_bench_cluster_runs_many_seeds_with_medians_and_spreads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for seed in (1, 2, 3):
        mixed = _mixed_trace(40 + 10 * seed)
        write_mooncake(tmp_path / f"t{seed}.jsonl", mixed)
    out, md = tmp_path / "seeds.json", tmp_path / "seeds.md"
    rc = bench_cluster_main(
        [
            "--trace", str(tmp_path / "t{seed}.jsonl"), "--seeds", "1-3", "--block-tokens",
            "10", "--instances", "2", "--l1-share", "1/4", "--policies", "prefix,ttft",
            "--json", str(out), "--md", str(md), "--jobs", "2",
        ]
    )  # fmt: skip
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["seeds"] == [1, 2, 3] and data["baseline"] == "prefix"
    ratios = []
    for key in ("1", "2", "3"):
        row = data["per_seed"][key]
        assert row["requests"] == 40 + 10 * int(key)
        for figures in row["policies"].values():
            assert figures["token_hit_rate"] <= row["reusable_max"] + 1e-9
            assert figures["share_of_reusable"] == pytest.approx(
                figures["token_hit_rate"] / row["reusable_max"]
            )
        prefix, ttft = row["policies"]["prefix"], row["policies"]["ttft"]
        floor = row["ttft_floor"]["ttft_p99_s"]
        assert 0 < floor <= min(prefix["ttft_p99_s"], ttft["ttft_p99_s"])
        assert row["floor_ratios"]["ttft_p99_s"] == pytest.approx(floor / prefix["ttft_p99_s"])
        ratio = row["ratios"]["ttft"]["ttft_p99_s"]
        assert ratio == pytest.approx(ttft["ttft_p99_s"] / prefix["ttft_p99_s"])
        ratios.append(ratio)
    spread = data["summary"]["ttft"]["ratio"]["ttft_p99_s"]
    assert spread["min"] == min(ratios) and spread["max"] == max(ratios)
    assert spread["median"] == sorted(ratios)[1]
    assert data["floor_ratio"]["ttft_p99_s"]["max"] <= 1.0
    assert "| ttft |" in md.read_text() and "| ttft |" in capsys.readouterr().out
    assert "| floor (no policy is below it) |" in md.read_text()


def test_bench_cluster_refuses_a_bad_seed_spec(tmp_path: Path) -> None:
    assert bench_cluster_main(["--trace", "game", "--seeds", "9-3"]) == 2
    assert bench_cluster_main(["--trace", str(tmp_path / "x.jsonl"), "--seeds", "1-2"]) == 2


def test_the_simulated_probe_skips_what_the_gateway_would() -> None:
    """The simulator's probe follows the gateway's rule (gateway.fleet.probe_plan): on an
    engine so slow that the largest prompt would outlive the budget, it is not taken."""
    slow = dataclasses.replace(SIMPLE, prefill_per_token_s=4e-3)  # 4,096 tokens: 16 s
    taken = [s.prompt_tokens for s in probe_samples(slow, (256, 1024, 4096), budget_s=10.0)]
    fast = [s.prompt_tokens for s in probe_samples(SIMPLE, (256, 1024, 4096), budget_s=10.0)]
    assert fast == [256, 1024, 4096]
    assert taken == [256, 1024]
