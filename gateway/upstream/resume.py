"""Where a stream that failed mid-way goes on: the request's remaining fallbacks (then any
healthy instance serving the model), each asked with the continuations of
gateway/upstream/continuation.py, best first (by token ids, then by text: a 4xx to a
token-id prompt, an instance that cannot take one, is asked by text), under the same
first-byte deadline as a first attempt.

When no instance is left that this stream has not failed on, an instance it went silent
on (past `stall_s`, not a broken connection) that still passes its health checks is asked
again, each once a stream: the one that stalled longest ago first, the one just cut last. A
stream cut a second time on a two-engine fleet (the survivor of a fault, overloaded,
silent past `stall_s`) used to end with an error event; asked again from the token ids
sent, the engine that stalled (or the one that stalled first, back by then) finishes the
same answer. An instance that broke the stream's connection is not asked again: what cut
it once would likely cut it again."""

from __future__ import annotations

import logging

from gateway.json_codec import encode
from gateway.pipeline.lifecycle import RequestLifecycle
from gateway.state import AppState
from gateway.upstream.continuation import Continuation, SoFar, continuations
from gateway.upstream.relay import Resume, Resumed
from gateway.upstream.transport import TransportError, target_of

log = logging.getLogger("warmgate.proxy")


def resumer(
    state: AppState, life: RequestLifecycle, path: str, headers: dict[str, str], order: list[str]
) -> Resume:
    tried: set[str] = set()  # asked to continue this stream
    again: set[str] = set()  # asked a second time, once nothing new was left

    async def resume(sent: SoFar) -> Resumed | None:
        ways = continuations(life.parsed, sent, path)
        if not ways:
            return None
        candidates = life.candidates()
        healthy = set(candidates)
        failed = set(sent.continued_from)
        for instance in dict.fromkeys([*order, *candidates]):
            if instance in healthy and instance not in failed and instance not in tried:
                tried.add(instance)
                if resumed := await _ask(instance, ways):
                    return resumed
        # nothing new left: where this stream went silent before, by when it last did (the
        # one just cut last)
        stalled = list(dict.fromkeys(reversed(sent.stalled_on)))[::-1]
        for instance in stalled:
            if instance in healthy and instance not in again:
                again.add(instance)
                if resumed := await _ask(instance, ways):
                    return resumed
        return None

    async def _ask(instance: str, ways: list[Continuation]) -> Resumed | None:
        for way in ways:
            resumed, refused = await _try(state, life, instance, headers, way)
            if resumed is not None:
                return resumed
            if not refused:
                break  # the instance failed, not the way of asking: the next instance
        return None

    return resume


async def _try(
    state: AppState,
    life: RequestLifecycle,
    instance: str,
    headers: dict[str, str],
    way: Continuation,
) -> tuple[Resumed | None, bool]:
    """The continuation under way on `instance`, or None and whether the instance refused
    this way of asking (a 4xx other than 429), so another way may be tried there."""
    t = life.timeouts
    attempt = life.begin(instance)
    target = target_of(state.health.instance_url(instance) + way.path)
    raw = encode(way.body, life.parsed.fast_json)
    try:
        resp = await state.upstream.post(target, headers, raw, t.first_byte_s)
    except TransportError as exc:
        life.end(attempt)
        log.info("continuation on %s failed: %s", instance, exc)
        return None, False
    attempt.response = resp
    status = resp.status_code
    it = resp.aiter_bytes(t.stall_s, first_s=t.first_byte_s)
    try:
        first = await anext(it, b"") if status == 200 else b""
    except TransportError:
        first = b""
    if not first:
        await resp.aclose()
        life.end(attempt)
        refused = 400 <= status < 500 and status != 429
        if refused:
            log.info("continuation by %s refused by %s (%d)", way.mode, instance, status)
        return None, refused
    attempt.streaming = True
    return Resumed(instance, resp, it, first, attempt, way.mode, way.kind), False
