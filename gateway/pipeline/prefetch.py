"""The gateway's side of tierd: prefetch hints and tier statistics.

Before a request is proxied, the chosen instance's tierd is told which block chain is coming
and by when (`TierdClient.prefetch(hashes, deadline_s)`), in a background task: the hint
never delays the request, and its failure is counted, never raised. The same clients poll
tierd's stats so the routing policy can use measured tier bandwidths (`set_bandwidths`).
An instance without a `tierd_url` gets no hints.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import httpx

from gateway.config.settings import InstanceSettings
from gateway.observe.metrics import GatewayMetrics
from tierd.client import TierdClient

log = logging.getLogger("warmgate.prefetch")


class PrefetchHints:
    """The gateway's prefetch hints: one tierd client per instance that has a `tierd_url`,
    fire-and-forget hints. (tierd's side that carries them out is `tierd.prefetch`.)"""

    def __init__(
        self,
        instances: Sequence[InstanceSettings],
        metrics: GatewayMetrics,
        client: httpx.AsyncClient,
        *,
        enabled: bool,
        max_pending: int = 10_000,
    ) -> None:
        self._metrics = metrics
        self._enabled = enabled
        self._max_pending = max_pending
        self._pending: set[asyncio.Task[None]] = set()
        self.clients: dict[str, TierdClient] = {}
        self._client = client
        for inst in instances:
            self.add(inst)

    def add(self, inst: InstanceSettings) -> None:
        """A tierd client for `inst` when it names a tierd (runtime fleet changes too)."""
        if inst.tierd_url:
            self.clients[inst.id] = TierdClient(inst.tierd_url, client=self._client)

    def remove(self, instance_id: str) -> None:
        # The shared httpx client stays open: it belongs to the app, not to this tierd.
        self.clients.pop(instance_id, None)

    @property
    def available(self) -> bool:
        return bool(self.clients)

    def wants(self, instance: str) -> bool:
        """Whether a hint to `instance` would be sent (so its chain is worth computing)."""
        return self._enabled and instance in self.clients

    def hint(
        self, instance: str, hashes: Sequence[int], deadline_s: float, session: str | None = None
    ) -> bool:
        """Start a prefetch hint in the background; False when none was sent."""
        client = self.clients.get(instance)
        if not self._enabled or client is None or not hashes:
            return False
        if len(self._pending) >= self._max_pending:  # tierd is not keeping up: drop hints
            self._metrics.prefetch_hints.labels("dropped").inc()
            return False
        task = asyncio.create_task(self._send(instance, client, list(hashes), deadline_s, session))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return True

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

    async def _send(
        self,
        instance: str,
        client: TierdClient,
        hashes: list[int],
        deadline_s: float,
        session: str | None,
    ) -> None:
        try:
            await asyncio.wait_for(client.prefetch(hashes, deadline_s, session), deadline_s)
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
