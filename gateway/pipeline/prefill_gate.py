"""Background prefills one at a time per instance, so an interactive line never waits behind
a pile of them (issue 22, item 3).

vLLM's priority scheduling orders the *waiting* queue; it does not take a step's token budget
back from requests already running. Every background request it has admitted keeps its
prefill chunks ahead of an interactive line that arrives later, so with many background
prompts in flight that line waits for all of their prefills (measured on the CPU engine:
interactive p99 1.7-2.1x its p99 alone beside background load at twice capacity). A background
request therefore goes to its instance only while fewer than `limit` other background
requests there are still prefilling (sent, no first token yet); the others wait here, in
arrival order, and are answered 429 (`background_shed`, Retry-After) after `wait_s`. An
interactive line then waits behind at most `limit` background prefills. Decoding is not
held: a background answer streams beside everything once its first token is out. Measured
(docs/BENCHMARKS.md, "Background prefills one at a time"): interactive p99 1.38-1.66x alone's
with the gate against 1.77-2.24x without it in the same run, and twice the background served.

Releasing is the owner's: `Slot.release()` at the first token, when the attempt fails or when
the request ends, whichever is first (safe to call again).
"""

from __future__ import annotations

import asyncio
from collections import deque

from contracts.errors import RoutingError


class GateTimeout(RoutingError, TimeoutError):
    """A background request waited `wait_s` for a prefill slot."""


class Slot:
    """One background prefill admitted on `instance`; `release()` frees it once."""

    __slots__ = ("_gate", "instance", "released")

    def __init__(self, gate: PrefillGate, instance: str) -> None:
        self._gate = gate
        self.instance = instance
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._gate._leave(self.instance)


class PrefillGate:
    """At most `limit` background prefills in flight on each instance."""

    def __init__(self, limit: int, wait_s: float) -> None:
        self.limit = limit
        self.wait_s = wait_s
        self._busy: dict[str, int] = {}
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    def prefilling(self, instance: str) -> int:
        return self._busy.get(instance, 0)

    def queued(self, instance: str) -> int:
        return sum(1 for f in self._waiting.get(instance, ()) if not f.done())

    async def enter(self, instance: str) -> Slot:
        """A slot on `instance`, at once or in arrival order; `GateTimeout` after `wait_s`."""
        queue = self._waiting.setdefault(instance, deque())
        if self._busy.get(instance, 0) < self.limit and not any(not f.done() for f in queue):
            self._busy[instance] = self._busy.get(instance, 0) + 1
            return Slot(self, instance)
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(turn)
        try:
            await asyncio.wait_for(asyncio.shield(turn), self.wait_s)
        except BaseException as exc:  # the wait ran out, or the client went away
            if turn.done() and not turn.cancelled():  # handed a slot as the wait ended
                self._leave(instance)
            turn.cancel()
            if isinstance(exc, TimeoutError):
                raise GateTimeout(
                    f"waited {self.wait_s:g} s for one of {self.limit} background prefill "
                    f"slots on {instance}"
                ) from None
            raise
        return Slot(self, instance)  # the slot was counted when it was handed over

    def _leave(self, instance: str) -> None:
        queue = self._waiting.get(instance)
        while queue:
            turn = queue.popleft()
            if not turn.done():
                turn.set_result(None)  # the slot passes to the next in line, still counted
                return
        self._busy[instance] = max(0, self._busy.get(instance, 0) - 1)
