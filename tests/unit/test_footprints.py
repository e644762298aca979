"""SessionFootprints: the KV active sessions hold per instance, moves, expiry, the learned
window and the bounds."""

from __future__ import annotations

import pytest

from router.footprints import SessionFootprints


def test_turns_add_up_where_the_session_lives() -> None:
    fp = SessionFootprints(default_window_s=60.0)
    fp.record("p1", "a", 5000, now=0.0)
    fp.record("p1", "a", 300, now=10.0)
    fp.record("p2", "a", 2000, now=11.0)
    fp.record("p3", "b", 4000, now=12.0)
    assert fp.working_set("a") == 7300
    assert fp.working_set("b") == 4000
    assert fp.footprint("p1") == ("a", 5300)
    assert len(fp) == 3


def test_a_move_leaves_the_old_copy_uncounted() -> None:
    fp = SessionFootprints(default_window_s=60.0)
    fp.record("p1", "a", 5000, now=0.0)
    fp.record("p1", "b", 6000, now=5.0)  # recomputed its history on b
    assert fp.working_set("a") == 0
    assert fp.working_set("b") == 6000
    assert fp.footprint("p1") == ("b", 6000)


def test_idle_sessions_expire() -> None:
    fp = SessionFootprints(default_window_s=30.0)
    fp.record("p1", "a", 1000, now=0.0)
    fp.record("p2", "a", 500, now=20.0)
    fp.expire(now=40.0)  # p1 idle 40 s > 30 s, p2 idle 20 s
    assert fp.working_set("a") == 500
    assert fp.footprint("p1") is None
    # a session that returns after expiring starts a new footprint
    fp.record("p1", "a", 700, now=45.0)
    assert fp.working_set("a") == 1200


def test_the_window_is_learned_from_gaps_between_turns() -> None:
    fp = SessionFootprints(default_window_s=60.0, min_gaps=10, refresh_every=10, quantile=0.9)
    for i in range(20):  # every session comes back after 12 s, one after 100 s
        fp.record(f"s{i}", "a", 10, now=0.0)
    for i in range(20):
        fp.record(f"s{i}", "a", 10, now=12.0 if i else 100.0)
    assert fp.window_s == pytest.approx(12.0)


def test_a_late_return_still_teaches_its_gap() -> None:
    fp = SessionFootprints(default_window_s=5.0, min_gaps=4, refresh_every=4, quantile=0.5)
    for i in range(4):
        fp.record(f"s{i}", "a", 10, now=0.0)
    for i in range(4):  # back after 50 s, long after they expired from the working set
        fp.record(f"s{i}", "a", 10, now=50.0)
    assert fp.window_s == pytest.approx(50.0)


def test_bounded_number_of_sessions() -> None:
    fp = SessionFootprints(default_window_s=1e9, max_sessions=3)
    for i in range(5):
        fp.record(f"s{i}", "a", 100, now=float(i))
    assert len(fp) == 3
    assert fp.working_set("a") == 300
    assert fp.footprint("s0") is None


@pytest.mark.parametrize(
    "kwargs",
    [{"default_window_s": 0.0}, {"quantile": 1.0}, {"max_sessions": 0}, {"min_window_s": -1}],
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SessionFootprints(**kwargs)  # type: ignore[arg-type]
