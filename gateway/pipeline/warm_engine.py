"""A warm's one-token engine request, which gives way to real requests (gateway/pipeline/warm.py
decides when a warm needs the engine; this sends it).

`EngineWarms.run()` posts the client's prompt with `max_tokens: 1`, never streamed, its output
discarded. The moment a real request begins on the warm's instance (`Inflight.on_begin`) the
request is cancelled, whatever the engine's scheduling: vLLM's priority orders only its waiting
queue, and a warm already running keeps its share of every step, which the line beside it
would wait for. With `warm.resume_after_yield` it is sent again once no real request there is
prefilling (`Inflight.prefills_done`): the engine kept the full blocks the cancelled request
computed (vLLM caches each block as its step is scheduled and keeps it, unpinned, after an
abort), so only the rest is computed. After `warm.max_yields` yields, or past
`warm.engine_timeout_s` in all, it ends with the 429 of `deferred`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from gateway.config.warm import WarmSettings
from gateway.errors import OpenAIError
from gateway.fleet.health import HealthChecker
from gateway.json_codec import encode
from gateway.pipeline.parse import ParsedRequest
from gateway.upstream.inflight import Inflight

_PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}
# fields of the client's body that would change what the engine computes or sends back
_DROPPED = ("stream", "stream_options", "max_completion_tokens", "n", "logprobs", "top_logprobs")


def deferred(instance: str, why: str, retry_after_s: int) -> OpenAIError:
    """The warm's 429: it would compete with real work now."""
    return OpenAIError(
        429,
        f"Warm deferred: {instance} {why}; a warm never delays real requests. "
        f"Retry in {retry_after_s} s.",
        type="rate_limit_error",
        code="warm_deferred",
        headers={"retry-after": str(retry_after_s)},
    )


def failed(instance: str, why: str) -> OpenAIError:
    return OpenAIError(
        502, f"Warm failed: {instance} {why}", type="server_error", code="warm_failed"
    )


class EngineWarm:
    """One engine warm in flight: its current engine request (`task`, None while it waits
    for the instance's real prefills after giving way to them) and how often it gave way."""

    __slots__ = ("task", "yielded", "yields")

    def __init__(self) -> None:
        self.task: asyncio.Task[dict[str, Any]] | None = None
        self.yielded = False  # the current request was cancelled for a real one
        self.yields = 0


class EngineWarms:
    """The engine warms in flight per instance (module docstring)."""

    def __init__(
        self,
        config: WarmSettings,
        health: HealthChecker,
        inflight: Inflight,
        client: httpx.AsyncClient,
        count: Callable[[str], None],  # an outcome of an engine warm: yielded, resumed
    ) -> None:
        self.config = config
        self.health = health
        self.inflight = inflight
        self.client = client
        self._count = count
        self._running: dict[str, set[EngineWarm]] = {}
        inflight.on_begin.append(self._real_began)

    def in_flight(self, instance: str) -> int:
        return len(self._running.get(instance, ()))

    def instances(self) -> set[str]:
        return set(self._running)

    async def run(
        self,
        parsed: ParsedRequest,
        instance: str,
        headers: Mapping[str, str],
        warm: EngineWarm,
    ) -> dict[str, Any]:
        """The engine's answer to `warm`'s request on `instance`, sent again after each time
        it gave way, until it completes or gives up."""
        deadline = time.monotonic() + self.config.engine_timeout_s
        running = self._running.setdefault(instance, set())
        running.add(warm)
        try:
            while True:
                warm.yielded = False
                warm.task = asyncio.create_task(self._post(parsed, instance, headers))
                try:
                    return await warm.task
                except asyncio.CancelledError:
                    this = asyncio.current_task()
                    if not warm.yielded or (this is not None and this.cancelling()):
                        raise  # not a yield: the warm itself is cancelled (its client left)
                finally:
                    warm.task = None
                warm.yields += 1
                self._count("yielded")
                if self.config.gives_up_on_yield() or warm.yields > self.config.max_yields:
                    raise deferred(instance, "took a real request", self.config.retry_after_s)
                if not await self.inflight.prefills_done(instance, deadline - time.monotonic()):
                    why = "kept prefilling real requests"
                    raise deferred(instance, why, self.config.retry_after_s)
                self._count("resumed")
        finally:
            running.discard(warm)

    async def _post(
        self, parsed: ParsedRequest, instance: str, client_headers: Mapping[str, str]
    ) -> dict[str, Any]:
        body = {k: v for k, v in parsed.body.items() if k not in _DROPPED}
        body["max_tokens"] = 1
        body["stream"] = False
        headers = {"content-type": "application/json", **client_headers}
        spec = self.health.spec(instance)
        if spec is not None and spec.priority_header is not None:
            headers[spec.priority_header] = str(self.config.priority)
        url = self.health.instance_url(instance) + _PATHS[parsed.kind]
        try:
            async with asyncio.timeout(self.config.engine_timeout_s):
                r = await self.client.post(
                    url, content=encode(body, parsed.fast_json), headers=headers
                )
        except (httpx.HTTPError, TimeoutError) as exc:
            raise failed(instance, f"{type(exc).__name__}: {exc}") from None
        if r.status_code in (429, 503):
            raise deferred(instance, f"answered {r.status_code}", self.config.retry_after_s)
        if r.status_code >= 400:
            raise failed(instance, f"answered {r.status_code}: {r.text[:200]}")
        try:
            answer = r.json()
        except ValueError:
            raise failed(instance, "answered a body that is not JSON") from None
        return answer if isinstance(answer, dict) else {}

    def _real_began(self, instance: str) -> None:
        """An `Inflight.on_begin` hook: a real attempt started on `instance`, whose warms
        still computing give way to it (their engine requests are cancelled)."""
        if not self.config.yield_to_real:
            return
        for warm in self._running.get(instance, ()):
            if warm.task is not None and not warm.yielded:
                warm.yielded = True
                warm.task.cancel()
