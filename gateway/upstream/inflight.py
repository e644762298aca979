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
        # Pure in-memory callbacks with the instance, which must not block: `on_begin` as
        # each attempt begins, `on_prefilled` as one stops prefilling (its first token, or
        # its end). Warms give way to real requests and go on after their prefills
        # (gateway/pipeline/warm.py).
        self.on_begin: list[Callable[[str], None]] = []
        self.on_prefilled: list[Callable[[str], None]] = []

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
        for hook in self.on_prefilled:
            hook(instance)

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

    def on_unhealthy(self, instance: str, reason: str) -> None:
        """A health-checker hook: an instance marked unhealthy fails its attempts at once."""
        self.fail_instance(instance, f"{instance} marked unhealthy: {reason}")

    def fail_instance(self, instance: str, reason: str) -> int:
        """Fail every attempt in flight on `instance`; how many there were."""
        attempts = list(self._by_instance.get(instance, ()))
        for a in attempts:
            a.fail(reason)
        return len(attempts)
