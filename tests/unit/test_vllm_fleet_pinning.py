"""When the launcher pins a vLLM engine's whole process tree to its core
(gateway.launch.vllm_fleet: FleetConfig.pin_tree, needs_pinning)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.launch.vllm_fleet import FleetConfig, needs_pinning


@pytest.mark.parametrize(
    ("engines", "cpus", "pinned"),
    [
        (1, 2, True),  # this machine's test fleets: the gateway and the test need the other core
        (2, 2, True),  # the benchmarks' fleet
        (1, 3, False),  # a core to compute, one for the EngineCore's poll, one for the rest
        (2, 4, True),
        (2, 5, False),
        (2, 16, False),
    ],
)
def test_engines_are_pinned_where_no_core_is_spare(engines: int, cpus: int, pinned: bool) -> None:
    assert needs_pinning(engines, cpus) is pinned
    cfg = FleetConfig(model_dir=Path("/m"), engines=engines)
    assert cfg.pins(cpus) is pinned


@pytest.mark.parametrize("setting", [True, False])
def test_an_explicit_setting_wins(setting: bool) -> None:
    cfg = FleetConfig(model_dir=Path("/m"), engines=2, pin_tree=setting)
    assert cfg.pins(2) is setting
    assert cfg.pins(64) is setting
