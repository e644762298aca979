"""Where a stream that failed mid-way goes on: the request's remaining fallbacks (then any
healthy instance serving the model), each asked with the continuation body
(gateway/upstream/continuation.py) under the same first-byte deadline as a first attempt."""

from __future__ import annotations

import logging

from gateway.json_codec import encode
from gateway.pipeline.accounting import RequestAccounting
from gateway.state import AppState
from gateway.upstream.continuation import SoFar, continuation_body
from gateway.upstream.relay import Resume, Resumed
from gateway.upstream.transport import TransportError, target_of

log = logging.getLogger("warmgate.proxy")


def resumer(
    state: AppState, ex: RequestAccounting, path: str, headers: dict[str, str], order: list[str]
) -> Resume:
    tried: set[str] = set()

    async def resume(sent: SoFar) -> Resumed | None:
        body = continuation_body(ex.parsed, sent)
        if body is None:
            return None
        raw = encode(body, ex.parsed.fast_json)
        healthy = state.health.candidates_for(ex.parsed.model)
        failed = set(sent.continued_from)
        todo = [i for i in dict.fromkeys([*order, *healthy]) if i in healthy]
        t = state.settings.timeouts
        for instance in todo:
            if instance in failed or instance in tried:
                continue
            tried.add(instance)
            inflight = state.inflight
            attempt = inflight.begin(instance)
            target = target_of(state.health.instance_url(instance) + path)
            try:
                resp = await state.upstream.post(target, headers, raw, t.first_byte_s)
            except TransportError as exc:
                inflight.end(attempt)
                log.info("continuation on %s failed: %s", instance, exc)
                continue
            attempt.response = resp
            it = resp.aiter_bytes(t.stall_s, first_s=t.first_byte_s)
            try:
                first = await anext(it, b"") if resp.status_code == 200 else b""
            except TransportError:
                first = b""
            if not first:
                await resp.aclose()
                inflight.end(attempt)
                continue
            attempt.streaming = True
            return Resumed(instance, resp, it, first, attempt)
        return None

    return resume
