"""Where a stream that failed mid-way goes on: the request's remaining fallbacks (then any
healthy instance serving the model), each asked with the continuations of
gateway/upstream/continuation.py, best first (by token ids, then by text: a 4xx to a
token-id prompt, an instance that cannot take one, is asked by text), under the same
first-byte deadline as a first attempt."""

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
    tried: set[str] = set()

    async def resume(sent: SoFar) -> Resumed | None:
        ways = continuations(life.parsed, sent, path)
        if not ways:
            return None
        healthy = life.candidates()
        failed = set(sent.continued_from)
        todo = [i for i in dict.fromkeys([*order, *healthy]) if i in healthy]
        for instance in todo:
            if instance in failed or instance in tried:
                continue
            tried.add(instance)
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
