"""gateway.pipeline.priority: reading a request's class and deadline, and the admission rules
over a routing decision (deadline redirect, early refusal, background shedding)."""

from __future__ import annotations

import pytest

from gateway.config.warm import PriorityClass, PrioritySettings
from gateway.errors import OpenAIError
from gateway.pipeline.decide import PrefetchPlan, Routed
from gateway.pipeline.priority import NONE, RequestPriority, admit, read_priority
from router.types import CandidateScore, Decision, RouteRequest

SETTINGS = PrioritySettings()


def routed(predicted: dict[str, float | None], chosen: str = "a") -> Routed:
    scores = tuple(
        CandidateScore(i, {"hbm": 64} if i == "b" else {}, 0, p) for i, p in predicted.items()
    )
    others = tuple(i for i in predicted if i != chosen)
    decision = Decision(
        chosen,
        "ttft",
        "lowest",
        predicted_ttft_s=predicted[chosen],
        fallbacks=others,
        candidates=scores,
    )
    rr = RouteRequest("m", [1, 2], 64, 200)
    plan = PrefetchPlan(chosen, [1, 2], 2.0, None)
    return Routed(rr, decision, tuple(predicted), chosen, None, None, plan)


def test_nothing_asked_is_none_and_the_body_untouched() -> None:
    assert read_priority({}, {"model": "m"}, SETTINGS) == (NONE, None)
    prio, body = read_priority({}, {"model": "m", "priority": 3}, SETTINGS)
    assert prio is NONE and body is None  # vLLM's own integer field: forwarded as sent


def test_a_class_from_the_body_is_taken_out_and_the_header_wins() -> None:
    prio, body = read_priority({}, {"model": "m", "priority": "Background"}, SETTINGS)
    assert (prio.klass, prio.level, body) == ("background", 10, {"model": "m"})
    prio, _ = read_priority(
        {"x-warmgate-priority": "interactive"}, {"priority": "normal"}, SETTINGS
    )
    assert (prio.klass, prio.level) == ("interactive", -10)


@pytest.mark.parametrize(
    "headers",
    [
        {"x-warmgate-ttft-deadline-ms": "soon"},
        {"x-warmgate-ttft-deadline-ms": "nan"},
        {"x-warmgate-ttft-deadline-ms": "inf"},
        {"x-warmgate-ttft-deadline-ms": "0"},
        {"x-warmgate-ttft-deadline-ms": "5", "x-warmgate-deadline-miss": "500"},
        {"x-warmgate-priority": "urgent"},
    ],
)
def test_bad_values_are_400(headers: dict[str, str]) -> None:
    with pytest.raises(OpenAIError) as exc:
        read_priority(headers, {}, SETTINGS)
    assert exc.value.status == 400


def test_deadline_and_miss_status_are_read() -> None:
    h = {"x-warmgate-ttft-deadline-ms": "250", "x-warmgate-deadline-miss": "503"}
    prio, _ = read_priority(h, {}, SETTINGS)
    assert (prio.deadline_s, prio.miss_status, prio.klass) == (0.25, 503, None)


def test_engine_headers_only_where_the_instance_schedules_by_priority() -> None:
    prio = RequestPriority("background", 10)
    assert prio.engine_headers({"a": "1"}, None) == {"a": "1"}
    assert prio.engine_headers({"a": "1"}, "x-vllm-priority") == {"a": "1", "x-vllm-priority": "10"}
    assert NONE.engine_headers({"a": "1"}, "x-vllm-priority") == {"a": "1"}


def never_busy(instance: str) -> int:
    return 0


def test_a_met_deadline_keeps_the_decision() -> None:
    r = routed({"a": 0.1, "b": 0.05})
    assert admit(r, RequestPriority(deadline_s=0.2), never_busy, SETTINGS) is r


def test_a_missed_deadline_moves_to_the_fastest_that_meets_it() -> None:
    r = routed({"a": 0.5, "b": 0.15, "c": 0.1})
    moved = admit(r, RequestPriority(deadline_s=0.2), never_busy, SETTINGS)
    assert moved.decision.instance == "c"
    assert moved.attempt_order()[0] == "c" and "a" in moved.attempt_order()
    assert moved.prefetch is not None and moved.prefetch.instance == "c"
    assert moved.decision.predicted_ttft_s == 0.1


@pytest.mark.parametrize("status", [429, 503])
def test_no_instance_meets_it_answers_at_once(status: int) -> None:
    r = routed({"a": 3.2, "b": 2.5})
    with pytest.raises(OpenAIError) as exc:
        admit(r, RequestPriority(deadline_s=0.2, miss_status=status), never_busy, SETTINGS)
    assert exc.value.status == status
    assert exc.value.code == "deadline_unmeetable"
    assert exc.value.headers["retry-after"] == "3"  # ceil(2.5 - 0.2)


def test_without_predictions_the_deadline_is_unjudged() -> None:
    r = routed({"a": None, "b": None})
    assert admit(r, RequestPriority(deadline_s=0.001), never_busy, SETTINGS) is r


def test_background_is_shed_first() -> None:
    r = routed({"a": 0.1})
    limit = SETTINGS.background_max_in_flight

    def busy(instance: str) -> int:
        return limit

    classes: tuple[PriorityClass, ...] = ("interactive", "normal")
    for klass in classes:
        assert admit(r, RequestPriority(klass, 0), busy, SETTINGS) is r
    with pytest.raises(OpenAIError) as exc:
        admit(r, RequestPriority("background", 10), busy, SETTINGS)
    assert (exc.value.status, exc.value.code) == (429, "background_shed")
    assert admit(r, RequestPriority("background", 10), never_busy, SETTINGS) is r
