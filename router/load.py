"""The load view: how busy each instance is, as the router itself has seen it.

Per instance it keeps requests in flight (routed, not finished) and queued prefill tokens
(the tokens to compute of requests routed there whose first token has not been seen yet:
the prefill work still ahead of a new request). The router passes each request's prompt
tokens less what it predicted cached there, since a cached follow-up turn queues far less
work than its prompt length. Counts from other gateway replicas arrive through `set_remote`
(the shared state feeds them) and are added to this replica's own in-flight count.
Counters never go below zero, so a duplicate or late completion cannot corrupt them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Load:
    in_flight: int = 0
    queued_tokens: int = 0
    remote_in_flight: int = 0


class LoadView:
    """In-flight requests and queued prefill tokens per instance."""

    def __init__(self) -> None:
        self._loads: dict[str, _Load] = {}

    def _get(self, instance: str) -> _Load:
        load = self._loads.get(instance)
        if load is None:
            load = self._loads[instance] = _Load()
        return load

    def on_dispatch(self, instance: str, prefill_tokens: int) -> None:
        """A request with `prefill_tokens` to compute was sent to `instance`."""
        load = self._get(instance)
        load.in_flight += 1
        load.queued_tokens += max(0, prefill_tokens)

    def on_first_token(self, instance: str, prefill_tokens: int) -> None:
        """Its prefill is done: its tokens leave the queue."""
        load = self._get(instance)
        load.queued_tokens = max(0, load.queued_tokens - max(0, prefill_tokens))

    def on_finish(self, instance: str, prefill_tokens: int, got_first_token: bool) -> None:
        """It finished (or failed); a request that never saw a first token leaves the queue now."""
        load = self._get(instance)
        load.in_flight = max(0, load.in_flight - 1)
        if not got_first_token:
            load.queued_tokens = max(0, load.queued_tokens - max(0, prefill_tokens))

    def set_remote(self, instance: str, in_flight: int) -> None:
        """Other gateway replicas' in-flight requests on `instance` (replaces the last value)."""
        self._get(instance).remote_in_flight = max(0, in_flight)

    def view(self, instance: str) -> tuple[int, int]:
        """(in-flight requests from every replica, queued prefill tokens seen here)."""
        load = self._loads.get(instance)
        if load is None:
            return 0, 0
        return load.in_flight + load.remote_in_flight, load.queued_tokens

    def local_in_flight(self, instance: str) -> int:
        """This replica's own in-flight requests on `instance` (what it publishes to others)."""
        load = self._loads.get(instance)
        return 0 if load is None else load.in_flight

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Every instance's counts, for stats and the admin API."""
        return {
            name: {
                "in_flight": load.in_flight + load.remote_in_flight,
                "local_in_flight": load.in_flight,
                "remote_in_flight": load.remote_in_flight,
                "queued_prefill_tokens": load.queued_tokens,
            }
            for name, load in self._loads.items()
        }
