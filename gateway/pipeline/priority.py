"""Per-request priority classes and TTFT deadlines (issue 22, item 3): reading them from a
request, and the admission rules over a routing decision.

A request names its class (interactive, normal, background) with the header
`x-warmgate-priority` or the body field `priority` holding the class name (the OpenAI SDK's
`extra_headers` / `extra_body`); the header wins when both are given. A body `priority` that
is an integer is vLLM's own field and is forwarded untouched. An instance whose engine
schedules by priority (`priority_scheduling: true`, vLLM's `--scheduling-policy priority`)
gets the class's level (`priority.levels`, lower is earlier) in its engine kind's priority
header (`InstanceSettings.priority_header`: vLLM's `X-Vllm-Priority`, which vLLM reads before
the body field); other instances get nothing, so an FCFS engine never sees one.

`x-warmgate-ttft-deadline-ms` (a positive number) asks for a first token within that time:
when the routing decision's predicted TTFT (the ttft policy's, in the decision's candidates)
misses it, the request goes to the candidate predicted fastest among those that meet it;
when none does, it is answered at once with `x-warmgate-deadline-miss` (429, the default,
or 503) and Retry-After. A policy that predicts nothing leaves the deadline unjudged.

Admission sheds background work first: a background request is refused with 429 while its
instance already has `priority.background_max_in_flight` requests in flight.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config.warm import PRIORITY_CLASSES, PriorityClass, PrioritySettings
from gateway.errors import OpenAIError, bad_request
from gateway.pipeline.decide import Routed
from router.types import ordered_fallbacks

PRIORITY_HEADER = "x-warmgate-priority"
DEADLINE_HEADER = "x-warmgate-ttft-deadline-ms"
MISS_HEADER = "x-warmgate-deadline-miss"


@dataclass(frozen=True, slots=True)
class RequestPriority:
    """What a request asked for; `NONE` when it asked for nothing."""

    klass: PriorityClass | None = None
    level: int | None = None  # the engine priority its class maps to
    deadline_s: float | None = None
    miss_status: int = 429

    @property
    def asks(self) -> bool:
        return self.klass is not None or self.deadline_s is not None

    def engine_headers(self, headers: dict[str, str], header: str | None) -> dict[str, str]:
        """The attempt's headers: with the priority level in `header`, the instance's
        `priority_header` (None: it does not schedule by priority, nothing added)."""
        if self.level is None or header is None:
            return headers
        return {**headers, header: str(self.level)}


NONE = RequestPriority()


def _class_of(value: object, param: str) -> PriorityClass:
    if isinstance(value, str):
        name = value.strip().lower()
        for c in PRIORITY_CLASSES:
            if c == name:
                return c
    raise bad_request(
        f"`{param}` must be one of {', '.join(PRIORITY_CLASSES)} (got {value!r}).",
        param=param,
        code="invalid_priority",
    )


def read_priority(
    headers: Mapping[str, str], body: dict[str, Any], settings: PrioritySettings
) -> tuple[RequestPriority, dict[str, Any] | None]:
    """The request's priority and deadline (a 400 naming what is wrong), and its body with a
    class-named `priority` field taken out (None when the body is unchanged)."""
    klass: PriorityClass | None = None
    stripped: dict[str, Any] | None = None
    field = body.get("priority")
    if isinstance(field, str):
        klass = _class_of(field, "priority")
        stripped = {k: v for k, v in body.items() if k != "priority"}
    header = headers.get(PRIORITY_HEADER)
    if header is not None:
        klass = _class_of(header, PRIORITY_HEADER)
    deadline_s = None
    raw_deadline = headers.get(DEADLINE_HEADER)
    if raw_deadline is not None:
        try:
            ms = float(raw_deadline)
        except ValueError:
            ms = math.nan
        if not math.isfinite(ms) or ms <= 0:
            raise bad_request(
                f"`{DEADLINE_HEADER}` must be a positive number of milliseconds "
                f"(got {raw_deadline!r}).",
                param=DEADLINE_HEADER,
                code="invalid_deadline",
            )
        deadline_s = ms / 1000.0
    miss = settings.deadline_miss_status
    raw_miss = headers.get(MISS_HEADER)
    if raw_miss is not None:
        if raw_miss.strip() not in ("429", "503"):
            raise bad_request(
                f"`{MISS_HEADER}` must be 429 or 503 (got {raw_miss!r}).",
                param=MISS_HEADER,
                code="invalid_deadline",
            )
        miss = 429 if raw_miss.strip() == "429" else 503
    if klass is None and deadline_s is None:
        return NONE, stripped
    level = settings.levels[klass] if klass is not None else None
    return RequestPriority(klass, level, deadline_s, miss), stripped


def admit(
    routed: Routed,
    priority: RequestPriority,
    in_flight: Callable[[str], int],
    settings: PrioritySettings,
) -> Routed:
    """The decision to dispatch under the request's class and deadline: unchanged, sent to
    a candidate that meets the deadline, or refused (an `OpenAIError` to answer at once)."""
    instance = routed.decision.instance
    if priority.klass == "background":
        busy = in_flight(instance)
        if settings.sheds(priority.klass, busy):
            raise background_shed(
                f"{instance} has {busy} requests in flight "
                f"(limit {settings.background_max_in_flight})",
                settings,
            )
    if priority.deadline_s is None:
        return routed
    return _meet_deadline(routed, priority.deadline_s, priority.miss_status)


def background_shed(why: str, settings: PrioritySettings) -> OpenAIError:
    """The 429 that sheds a background request (over the in-flight limit, or out of time
    waiting for a prefill slot: gateway/pipeline/prefill_gate.py)."""
    return OpenAIError(
        429,
        f"Background work is shed: {why}; retry later.",
        type="rate_limit_error",
        code="background_shed",
        headers={"retry-after": str(settings.retry_after_s)},
    )


def _meet_deadline(routed: Routed, deadline_s: float, miss_status: int) -> Routed:
    decision = routed.decision
    allowed = set(routed.candidates)
    predicted = {
        c.instance: c.predicted_ttft_s
        for c in decision.candidates
        if c.predicted_ttft_s is not None and c.instance in allowed
    }
    mine = predicted.get(decision.instance, decision.predicted_ttft_s)
    if mine is None or mine <= deadline_s:
        return routed  # no prediction to judge by, or it meets the deadline
    meeting = [(p, i) for i, p in predicted.items() if p <= deadline_s]
    if not meeting:
        best = min(predicted.values(), default=mine)
        wait_s = max(1, math.ceil(best - deadline_s))
        return _refuse(deadline_s, best, miss_status, wait_s)
    _, chosen = min(meeting)
    score = next(c for c in decision.candidates if c.instance == chosen)
    by_tier = dict(score.cached_tokens_by_tier)
    moved = dataclasses.replace(
        decision,
        instance=chosen,
        reason=f"ttft deadline {deadline_s * 1000:g} ms ({decision.instance} predicted "
        f"{mine * 1000:.0f} ms: {decision.reason})",
        cached_tokens=sum(by_tier.values()),
        cached_tokens_by_tier=by_tier,
        predicted_ttft_s=score.predicted_ttft_s,
        fallbacks=ordered_fallbacks(chosen, [decision.instance, *decision.fallbacks]),
    )
    plan = routed.prefetch
    prefetch = dataclasses.replace(plan, instance=chosen) if plan is not None else None
    return dataclasses.replace(routed, decision=moved, prefetch=prefetch)


def _refuse(deadline_s: float, best_s: float, status: int, wait_s: int) -> Routed:
    raise OpenAIError(
        status,
        f"No instance is predicted to answer within the TTFT deadline of "
        f"{deadline_s * 1000:g} ms (fastest predicted {best_s * 1000:.0f} ms); "
        "retry later or with a longer deadline.",
        type="rate_limit_error" if status == 429 else "server_error",
        code="deadline_unmeetable",
        headers={"retry-after": str(wait_s)},
    )
