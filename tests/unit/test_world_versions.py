"""VersionDetector: a new block under an established stem, reached by enough sessions within the
window, is a new world version; an old shared prefix, a prompt new from its root and one
dialogue's own next turn are not."""

from __future__ import annotations

import pytest

from gateway.pipeline.world_versions import VersionDetector

STEM = (1, 2, 3)  # the zone's lore
V1 = (10, 11)  # its world status, version 1
V2 = (20, 21)  # version 2


def tail(i: int, depth: int = 2) -> tuple[int, ...]:
    """Session i's own blocks (persona, history): nobody else's."""
    return tuple(1000 * (i + 1) + d for d in range(depth))


def detector() -> VersionDetector:
    return VersionDetector(window_s=5.0, min_sessions=3)


def warm_up(d: VersionDetector, sessions: int = 4) -> None:
    """Version 1 established at t=0, each session on its own instance."""
    for i in range(sessions):
        assert d.observe(STEM + V1 + tail(i), f"s{i}", f"e{i % 2}", 0.0) is None


def test_a_new_version_reached_by_enough_sessions_is_a_bump() -> None:
    d = detector()
    warm_up(d)
    assert d.observe(STEM + V2 + tail(0, 3), "s0", "e0", 10.0) is None
    assert d.observe(STEM + V2 + tail(1, 3), "s1", "e0", 10.5) is None
    bump = d.observe(STEM + V2 + tail(2, 3), "s2", "e0", 11.0)
    assert bump is not None
    assert bump.chain == STEM + V2  # the hot part: what all three share
    assert bump.stem_blocks == len(STEM)
    assert bump.sessions == 3 and bump.session == "s2"
    assert bump.holders == ("e0",)
    assert bump.zone == ("e0", "e1")  # s1 was on e1 before the bump
    assert bump.superseded == V1  # the sessions moved from version 1
    # once only
    assert d.observe(STEM + V2 + tail(3, 3), "s3", "e1", 11.5) is None


def test_an_old_shared_prefix_is_not_a_version() -> None:
    d = detector()
    warm_up(d)
    for i in range(8):  # everybody back on version 1 after the window: nothing new
        assert d.observe(STEM + V1 + tail(i, 4), f"s{i}", "e0", 20.0 + i * 0.1) is None


def test_a_prompt_new_from_its_first_block_is_not_a_version() -> None:
    d = detector()  # start-up: nothing is established yet
    for i in range(8):
        assert d.observe(STEM + V1 + tail(i), f"s{i}", "e0", 0.1 * i) is None


def test_sessions_spread_over_more_than_the_window_do_not_count() -> None:
    d = detector()
    warm_up(d)
    assert d.observe(STEM + V2 + tail(0), "s0", "e0", 10.0) is None
    assert d.observe(STEM + V2 + tail(1), "s1", "e0", 12.0) is None
    # V2's first sighting was 6 s ago: no longer new, whoever reaches it now
    assert d.observe(STEM + V2 + tail(2), "s2", "e0", 16.0) is None


def test_one_dialogue_growing_is_not_a_version() -> None:
    d = detector()
    warm_up(d)
    chain = STEM + V1 + tail(0)
    for turn in range(6):
        chain = (*chain, 5000 + turn)
        assert d.observe(chain, "s0", "e0", 10.0 + turn) is None


def test_new_sessions_count_but_supersede_nothing() -> None:
    d = detector()
    warm_up(d, 1)
    bumps = [d.observe(STEM + V2 + tail(i), f"new{i}", "e1", 10.0) for i in range(3)]
    assert bumps[:2] == [None, None]
    bump = bumps[2]
    assert bump is not None and bump.chain == STEM + V2 and bump.superseded == ()


def test_forget_leaves_an_announced_version_to_its_announcement() -> None:
    d = detector()
    warm_up(d)
    d.observe(STEM + V2 + tail(0), "s0", "e0", 10.0)
    d.forget(STEM + V2)
    assert all(d.observe(STEM + V2 + tail(i), f"s{i}", "e0", 10.1) is None for i in range(1, 4))


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        VersionDetector(window_s=0)
    with pytest.raises(ValueError):
        VersionDetector(min_sessions=1)
