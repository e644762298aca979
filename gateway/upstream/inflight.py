"""Attempts in flight on each instance, so a hung one is given up on at once.

A SIGSTOPped engine accepts connections (the kernel does) and never answers: its requests
would wait out `timeouts.read_s`. Two bounds end that:
- per request, `timeouts.first_byte_s` (response head and first chunk) and
  `timeouts.stall_s` (between two chunks) — enforced by the reads themselves;
- per instance, the health checks: when they mark it unhealthy, every attempt in flight
  there fails now (`fail_instance`): one waiting for its head is abandoned (its
  `abandoned` future resolves), one reading a body has its connection failed. Those not
  yet answered fail over; streams already answering are continued elsewhere
  (gateway/upstream/continuation.py) or end with an error event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.upstream.transport import UpstreamResponse


class Attempt:
    """One attempt on one instance."""

    __slots__ = ("abandoned", "instance", "prefilling", "response", "streaming")

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self.abandoned: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.response: UpstreamResponse | None = None
        self.streaming = False  # handed to a relay, which ends it
        self.prefilling = True  # sent, no first token yet (`Inflight.prefilled`)

    def fail(self, reason: str) -> None:
        if not self.abandoned.done():
            self.abandoned.set_result(reason)
        if self.response is not None:
            self.response.abort(reason)


class Inflight:
    def __init__(self) -> None:
        self._by_instance: dict[str, set[Attempt]] = {}
        self._prefilling: dict[str, int] = {}
        self._prefills_done: dict[str, list[asyncio.Future[None]]] = {}  # `prefills_done`
        # called with the instance as each attempt begins (warms give way to real requests,
        # gateway/pipeline/warm_engine.py); pure in-memory callbacks, they must not block
        self.on_begin: list[Callable[[str], None]] = []

    def begin(self, instance: str) -> Attempt:
        attempt = Attempt(instance)
        self._by_instance.setdefault(instance, set()).add(attempt)
        self._prefilling[instance] = self._prefilling.get(instance, 0) + 1
        for hook in self.on_begin:
            hook(instance)
        return attempt

    def prefilled(self, attempt: Attempt) -> None:
        """`attempt` got its first token (safe to say twice; `end` says it too)."""
        if not attempt.prefilling:
            return
        attempt.prefilling = False
        instance = attempt.instance
        self._prefilling[instance] -= 1
        if not self._prefilling[instance]:
            for waiter in self._prefills_done.pop(instance, ()):
                if not waiter.done():
                    waiter.set_result(None)

    def end(self, attempt: Attempt) -> None:
        held = self._by_instance.get(attempt.instance)
        if held is not None and attempt in held:
            held.discard(attempt)
            self.prefilled(attempt)

    def count(self, instance: str) -> int:
        return len(self._by_instance.get(instance, ()))

    def prefilling(self, instance: str) -> int:
        """Attempts in flight on `instance` that have not had their first token."""
        return self._prefilling.get(instance, 0)

    async def prefills_done(self, instance: str, within_s: float) -> bool:
        """Wait until no attempt on `instance` is prefilling; False after `within_s`."""
        if not self.prefilling(instance):
            return True
        if within_s <= 0:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._prefills_done.setdefault(instance, [])
        waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, within_s)
        except TimeoutError:
            return False
        finally:
            if waiter in waiters:
                waiters.remove(waiter)
        return True

    def on_unhealthy(self, instance: str, reason: str) -> None:
        """A health-checker hook: an instance marked unhealthy fails its attempts at once."""
        self.fail_instance(instance, f"{instance} marked unhealthy: {reason}")

    def fail_instance(self, instance: str, reason: str) -> int:
        """Fail every attempt in flight on `instance`; how many there were."""
        attempts = list(self._by_instance.get(instance, ()))
        for a in attempts:
            a.fail(reason)
        return len(attempts)
