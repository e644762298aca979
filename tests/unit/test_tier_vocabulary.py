"""One tier vocabulary (issue 20, item 4): `contracts.tiers` defines the tiers, their default
bandwidths and what each of tierd's levels is; the simulator's profiles, tierd's emulation,
the cost model's prior, tierd's wire names and the index's bit field all derive from it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from contracts.tiers import (
    DEFAULT_BANDWIDTH_BPS,
    TIER_OF_MEDIUM,
    TIERD_ARENA,
    TIERD_LEVEL_BY_NAME,
    TIERD_LEVEL_OF_TIER,
    TIERD_LEVELS,
    Tier,
    tier_of_medium,
)
from router import index as index_module
from router.cost import CostParams
from router.index import ARRAY, PrefixIndex
from sim.cluster.runner import cost_params
from sim.engine.tiers import LOADED_LABEL
from sim.profiles import DEFAULT_PROFILE, PROFILES, Profile, ProfileBandwidthError
from tests.unit.test_tierd_store import make_settings, put_chain, running
from tierd import emulation
from tierd import events as tierd_events
from tierd.daemon import MEDIUMS

REPO = Path(__file__).resolve().parents[2]
SLOW_TIERS = [t for t in Tier if t is not Tier.HBM]

# profiles that deliberately differ from the defaults, and why
OVERRIDES = {"zero": "no compute and free loads: measures a gateway's own overhead"}


def test_no_bandwidth_figure_outside_contracts() -> None:
    figures = set(DEFAULT_BANDWIDTH_BPS.values())
    literal = re.compile(r"\b(25|10|3)(\.0+)?e9\b|\b(25|10|3)_?000_?000_?000\b")
    found = []
    for pkg in ("sim", "router", "tierd"):
        for path in sorted((REPO / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Constant)
                    and type(node.value) in (int, float)
                    and node.value in figures
                ):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
        for path in sorted((REPO / pkg).rglob("*.[ch]")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if literal.search(line):
                    found.append(f"{path.relative_to(REPO)}:{n}")
    assert found == []


def test_every_slower_tier_has_a_default_bandwidth() -> None:
    assert list(DEFAULT_BANDWIDTH_BPS) == SLOW_TIERS
    assert all(bps > 0 for bps in DEFAULT_BANDWIDTH_BPS.values())


def test_simulator_profiles_take_the_defaults_unless_they_say_otherwise() -> None:
    assert PROFILES[DEFAULT_PROFILE].bandwidths == DEFAULT_BANDWIDTH_BPS
    for name, profile in PROFILES.items():
        assert list(profile.bandwidths) == SLOW_TIERS, name
        if name in OVERRIDES:
            assert profile.bandwidths != DEFAULT_BANDWIDTH_BPS, name
        else:
            assert profile.bandwidths == DEFAULT_BANDWIDTH_BPS, name
    assert set(PROFILES["zero"].bandwidths.values()) == {1e18}  # free loads
    # a copy each: no profile can change the contracts' figures
    assert PROFILES[DEFAULT_PROFILE].bandwidths is not DEFAULT_BANDWIDTH_BPS


def test_a_profile_without_a_tier_is_refused() -> None:
    base = PROFILES[DEFAULT_PROFILE]
    fields = {f: getattr(base, f) for f in Profile.__dataclass_fields__}
    with pytest.raises(ProfileBandwidthError, match="snapshot"):
        Profile(**{**fields, "bandwidths": {Tier.HOST: 1e9, Tier.ARRAY: 1e9}})
    with pytest.raises(ProfileBandwidthError, match="host"):
        Profile(**{**fields, "bandwidths": {**DEFAULT_BANDWIDTH_BPS, Tier.HOST: 0.0}})


def test_cost_model_and_tierd_emulation_take_the_same_figures() -> None:
    by_label = {t.label: bps for t, bps in DEFAULT_BANDWIDTH_BPS.items()}
    assert dict(CostParams().bandwidths) == by_label
    assert dict(cost_params(PROFILES[DEFAULT_PROFILE]).bandwidths) == by_label
    for name, p in emulation.PROFILES.items():
        # tierd cannot import sim: its table is named as the simulator's, with the same KV size
        assert p.kv_bytes_per_token == PROFILES[name].kv_bytes_per_token, name
        if name in OVERRIDES:
            assert (p.array_bps, p.snapshot_bps) == (0.0, 0.0)  # 0: a free link
            continue
        assert p.array_bps == DEFAULT_BANDWIDTH_BPS[Tier.ARRAY], name
        assert p.snapshot_bps == DEFAULT_BANDWIDTH_BPS[Tier.SNAPSHOT], name


def test_tierd_levels_cover_every_tier_tierd_publishes() -> None:
    assert [lv.tier for lv in TIERD_LEVELS] == SLOW_TIERS
    assert {lv.tier: lv for lv in TIERD_LEVELS} == TIERD_LEVEL_OF_TIER
    assert len(TIERD_LEVEL_BY_NAME) == len(TIERD_LEVELS)
    assert len({lv.key for lv in TIERD_LEVELS}) == len(TIERD_LEVELS)
    for lv in TIERD_LEVELS:
        assert TIER_OF_MEDIUM[lv.medium] is lv.tier
        assert tier_of_medium(lv.medium) is lv.tier
    # tierd and the simulated engine translate through the table
    assert {lv.name: lv.medium for lv in TIERD_LEVELS} == tierd_events.EVENT_MEDIUM
    assert (tierd_events.GPU, tierd_events.ARRAY, tierd_events.SNAPSHOT) == MEDIUMS
    assert tuple(lv.name for lv in TIERD_LEVELS) == MEDIUMS
    assert set(LOADED_LABEL) == {lv.tier for lv in TIERD_LEVELS}
    # the wire names stay what they were
    assert [(lv.name, lv.medium, lv.key) for lv in TIERD_LEVELS] == [
        ("GPU", "CPU", "l1"),
        ("ARRAY", "ARRAY", "array"),
        ("SNAPSHOT", "SNAPSHOT", "snapshot"),
    ]


async def test_tierd_answers_in_its_level_names_and_bandwidths_by_tier_label(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path, emulate=DEFAULT_PROFILE, time_scale=1e-6)
    async with running(settings) as d:
        chain = [101, 102, 103]
        await put_chain(d, chain)
        found = await d.store.lookup(chain)
        assert set(found["counts"]) == set(TIERD_LEVEL_BY_NAME)
        assert found["tiers"] == [TIERD_ARENA.name] * 3
        await d.evict(None, TIERD_ARENA.name)  # written down to the array (a session's)
        assert await d.loader.get(101) is not None  # loaded back from the array
        stats = d.stats()
    assert list(stats["tiers"]) == [lv.key for lv in TIERD_LEVELS]
    for lv in TIERD_LEVELS:
        assert stats["tiers"][lv.key]["medium"] == lv.medium
    assert stats["hits"][TIERD_LEVEL_OF_TIER[Tier.ARRAY].key] == 1
    labels = {t.label for t in SLOW_TIERS}
    bandwidths = stats["bandwidth_bytes_per_s"]
    assert set(bandwidths["configured"]) <= labels and set(bandwidths["measured"]) <= labels
    assert bandwidths["configured"] == {
        t.label: DEFAULT_BANDWIDTH_BPS[t] for t in (Tier.ARRAY, Tier.SNAPSHOT)
    }
    assert bandwidths["measured"][Tier.ARRAY.label] is not None


def test_index_keeps_one_bit_per_tier() -> None:
    assert len(Tier) == index_module._PRED
    assert len(Tier) + 1 == index_module._WIDTH
    assert {t: t.value for t in Tier} == index_module._TIER_BIT
    assert (1 << len(Tier)) - 1 == index_module._ABOVE
    # the C table holds packed ints it does not look into: nothing there knows the width
    index = PrefixIndex(ttl_s=60.0, capacity_blocks=100, clock=lambda: 0.0)
    for n, tier in enumerate(Tier):
        index.insert(f"i{n}", [1, 2], tier)
    index.insert("i0", [1, 2], Tier.SNAPSHOT)  # the fastest tier counts
    index.insert("p", [1], predicted=True)
    names = [f"i{n}" for n in range(len(Tier))]
    got = index.match([1, 2], [*names, "p"])
    assert got == {**{f"i{n}": {t: 2} for n, t in enumerate(Tier)}, "p": {Tier.HBM: 1}}
    index.insert(ARRAY, [1, 2], Tier.ARRAY)
    assert index.match([1, 2], ["cold"]) == {"cold": {Tier.ARRAY: 2}}
