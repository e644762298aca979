"""The simulator's physics fixed against real vLLM (`bench simfit`): tier hits found by the
KV connector when a request is admitted (sim.cluster.connector), and engines sharing a
machine's cores (sim.cluster.cores)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from router.policies.registry import default_registry
from sim.cluster.cores import SharedCores, SharedCoresError
from sim.cluster.simulator import ClusterConfig, ClusterSimulator, SimulatorParamsError
from sim.profiles import PROFILES, Profile
from sim.traces import TraceRequest

CPU = replace(
    PROFILES["llama3-8b-h100"],
    name="cpu-like",
    prefill_overhead_s=0.01,
    prefill_per_token_s=1e-3,
    prefill_attention_s=0.0,
    max_batch_tokens=2048,
)


def _trace() -> list[TraceRequest]:
    # session A's turn, then 6 other prompts that fill the small HBM and queue up, then A's
    # next turn (the same 8 blocks and 2 more) arriving behind them
    reqs = [TraceRequest(0.0, 1024, 1, tuple(range(8)), "A")]
    for i in range(6):
        reqs.append(
            TraceRequest(1000.0 + i, 1024, 1, tuple(range(100 + 10 * i, 108 + 10 * i)), f"o{i}")
        )
    reqs.append(TraceRequest(1010.0, 1280, 1, tuple(range(10)), "A"))
    return reqs


def _run(config: ClusterConfig, profile: Profile = CPU) -> list[float]:
    policy = default_registry().create("round_robin")
    record = ClusterSimulator(config, policy, profile=profile).run(_trace())
    return [r.cached_tokens for r in record.requests]


def test_the_connector_finds_at_admission_what_the_queue_evicted_from_hbm() -> None:
    base = ClusterConfig(
        instances=1, block_tokens=128, l1_tokens=16 * 128, l2_tokens=100 * 128,
        array_tokens=1000 * 128, array_write_through=True,
    )  # fmt: skip
    # arrival-time prefetch lands A's blocks in HBM, where the 6 queued prompts evict them
    arrival = _run(base)
    admission = _run(replace(base, tier_loads="admission"))
    assert arrival[-1] < 1024
    assert admission[-1] == 1024  # the 8 blocks, found in host memory when A is admitted
    with pytest.raises(SimulatorParamsError):
        ClusterSimulator(
            replace(base, tier_loads="never"), default_registry().create("round_robin")
        )


def test_a_step_is_slower_while_another_engine_computes() -> None:
    cores = SharedCores(1.5)
    assert cores.step_scale(0) == 1.0  # alone
    assert cores.step_scale(1) == 1.5  # 0 computes
    assert cores.step_scale(0) == 1.5
    cores.idle(1)
    assert cores.step_scale(0) == 1.0
    with pytest.raises(SharedCoresError):
        SharedCores(0.5)


def test_shared_cores_stretch_the_simulated_fleet_only_when_both_compute() -> None:
    trace = [
        TraceRequest(0.0, 2048, 1, tuple(range(16)), "a"),
        TraceRequest(0.0, 2048, 1, tuple(range(50, 66)), "b"),
    ]
    config = ClusterConfig(instances=2, block_tokens=128, l1_tokens=10_000)
    policy = default_registry().create("round_robin")
    own = ClusterSimulator(config, policy, profile=CPU).run(trace)
    shared = ClusterSimulator(
        config,
        default_registry().create("round_robin"),
        profile=replace(CPU, shared_core_slowdown=1.5),
    ).run(trace)
    own_ttft = sorted(r.ttft_s or 0 for r in own.requests)
    shared_ttft = sorted(r.ttft_s or 0 for r in shared.requests)
    assert shared_ttft[1] == pytest.approx(1.5 * own_ttft[1])
    lone = ClusterSimulator(
        config,
        default_registry().create("round_robin"),
        profile=replace(CPU, shared_core_slowdown=1.5),
    ).run(trace[:1])
    assert lone.requests[0].ttft_s == pytest.approx(own_ttft[0])
