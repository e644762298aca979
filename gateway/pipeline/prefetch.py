"""The gateway's side of tierd: prefetch hints and tier statistics.

Before a request is proxied, the chosen instance's tierd is told which block chain is coming
and by when (`POST /v1/prefetch`, tierd.client's `prefetch_body`), in a background task: the
hint never delays the request, and its failure is counted, never raised. Hints go over the
proxy's own upstream pool (`gateway/upstream/h1pool.py`): on a kept-alive connection its
first step writes the hint, so a proxy that lets that step run before posting the request
(`RequestPipeline.send_prefetch`, then one turn of the loop) has the hint on tierd's socket
before the engine has the request, whose lookup it races (sent after the request, a few
hints a run reached tierd after the engine's ask: docs/BENCHMARKS.md "The hint ahead of its
request"), and at a fraction of an httpx request's CPU. The tierd clients (httpx) poll
tierd's stats so the routing policy can use measured tier bandwidths (`set_bandwidths`), and
carry the restores a warm waits for. An instance without a `tierd_url` gets no hints.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import httpx

from gateway.config.settings import InstanceSettings
from gateway.json_codec import encode
from gateway.observe.metrics import GatewayMetrics
from gateway.upstream.transport import Target, UpstreamTransport, target_of
from tierd.client import PREFETCH_PATH, TierdClient, TierdError, prefetch_body

_HINT_HEADERS = {"content-type": "application/json"}

log = logging.getLogger("warmgate.prefetch")


class PrefetchHints:
    """The gateway's prefetch hints: one tierd client per instance that has a `tierd_url`,
    fire-and-forget hints. (tierd's side that carries them out is `tierd.prefetch`.)"""

    def __init__(
        self,
        instances: Sequence[InstanceSettings],
        metrics: GatewayMetrics,
        client: httpx.AsyncClient,
        upstream: UpstreamTransport,
        *,
        enabled: bool,
        max_pending: int = 10_000,
    ) -> None:
        self._metrics = metrics
        self._enabled = enabled
        self._max_pending = max_pending
        self._pending: set[asyncio.Task[None]] = set()
        self.clients: dict[str, TierdClient] = {}
        self._hint_targets: dict[str, Target] = {}
        self._client = client
        self._upstream = upstream
        for inst in instances:
            self.add(inst)

    def add(self, inst: InstanceSettings) -> None:
        """A tierd client for `inst` when it names a tierd (runtime fleet changes too)."""
        if inst.tierd_url:
            self.clients[inst.id] = TierdClient(inst.tierd_url, client=self._client)
            self._hint_targets[inst.id] = target_of(inst.tierd_url.rstrip("/") + PREFETCH_PATH)

    def remove(self, instance_id: str) -> None:
        # The shared httpx client and upstream pool stay open: they belong to the app.
        self.clients.pop(instance_id, None)
        self._hint_targets.pop(instance_id, None)

    @property
    def available(self) -> bool:
        return bool(self.clients)

    def wants(self, instance: str) -> bool:
        """Whether a hint to `instance` would be sent (so its chain is worth computing)."""
        return self._enabled and instance in self.clients

    def hint(
        self,
        instance: str,
        hashes: Sequence[int],
        deadline_s: float,
        session: str | None = None,
        *,
        wait: bool = False,
    ) -> asyncio.Task[None] | None:
        """Start a prefetch hint in the background (its first step, on the next turn of the
        loop, writes it when a kept-alive connection to that tierd is idle); None when none
        was sent. With `wait`, tierd answers once the chain's reads into its host memory
        are done (or at the deadline), so the task ends then: a request can be held for it."""
        target = self._hint_targets.get(instance)
        if not self._enabled or target is None or not hashes:
            return None
        if len(self._pending) >= self._max_pending:  # tierd is not keeping up: drop hints
            self._metrics.prefetch_hints.labels("dropped").inc()
            return None
        body = encode(prefetch_body(hashes, deadline_s, session, wait=wait))
        task = asyncio.create_task(self._send(instance, target, body, deadline_s))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    async def restore(
        self, instance: str, hashes: Sequence[int], deadline_s: float, session: str | None
    ) -> dict[str, Any]:
        """A hint waited for (a warm's restore): tierd's outcome counts (`hit`, `on_time`,
        `late`, `abandoned`, `miss`) within about `deadline_s`; raises when it fails."""
        client = self.clients.get(instance)
        if client is None:
            raise KeyError(f"{instance} has no tierd")
        pending = client.prefetch(list(hashes), deadline_s, session, wait=True)
        result = await asyncio.wait_for(pending, deadline_s + 1.0)
        self._metrics.prefetch_hints.labels("sent").inc()
        return result

    async def _send(self, instance: str, target: Target, body: bytes, deadline_s: float) -> None:
        try:
            # asyncio.timeout, not wait_for: no task of its own, so the write is this step's
            async with asyncio.timeout(deadline_s):
                resp = await self._upstream.post(target, _HINT_HEADERS, body, deadline_s)
                try:
                    answer = await resp.aread()
                finally:
                    await resp.aclose()
            if resp.status_code >= 400:
                raise TierdError(resp.status_code, answer.decode(errors="replace"))
        except Exception as exc:  # a hint is advice: its failure never reaches the request
            self._metrics.prefetch_hints.labels("failed").inc()
            log.debug("prefetch hint to %s failed: %r", instance, exc)
            return
        self._metrics.prefetch_hints.labels("sent").inc()

    async def aclose(self) -> None:
        pending = list(self._pending)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for client in self.clients.values():
            try:
                await client.aclose()
            except Exception as exc:
                log.debug("closing a tierd client failed: %r", exc)
