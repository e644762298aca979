"""How long a request waits for one of an engine's running-sequence slots.

An engine runs at most `max_num_seqs` sequences at once (vLLM's flag). A request arriving
at an instance with that many or more in flight waits until `in_flight - max_num_seqs + 1`
of them finish, and once every slot is taken they finish at the instance's completion rate:
decode speed, which no prefill calibration sees. `SlotWaits` keeps that rate per instance
(finishes per second over `window_s`, at least one a window before any is seen) and prices
the wait. The `ttft` policy (router/policies/ttft.py) adds it to a candidate's predicted
TTFT only while some candidate has a free slot.
"""

from __future__ import annotations

from collections.abc import Iterable

from router.cost import ArrivalRate
from router.errors import PolicyConfigError
from router.policies.base import InstanceView


class SlotWaits:
    def __init__(self, max_num_seqs: int, window_s: float) -> None:
        if max_num_seqs <= 0:
            raise PolicyConfigError("max_num_seqs must be positive")
        self.max_num_seqs = max_num_seqs
        self.window_s = window_s
        self._finishes: dict[str, ArrivalRate] = {}

    def record_finish(self, instance: str, now: float) -> None:
        """A request on `instance` ended (a slot came free)."""
        meter = self._finishes.get(instance)
        if meter is None:
            meter = self._finishes[instance] = ArrivalRate(self.window_s)
        meter.tick(now)

    def any_free(self, candidates: Iterable[InstanceView]) -> bool:
        return any(v.in_flight < self.max_num_seqs for v in candidates)

    def wait_s(self, instance: str, in_flight: int, now: float) -> float:
        """Seconds a request arriving now at `instance` waits for a slot (0 with one free)."""
        ahead = in_flight - self.max_num_seqs + 1
        if ahead <= 0:
            return 0.0
        meter = self._finishes.get(instance)
        floor = 1.0 / self.window_s
        rate = max(meter.rate(now), floor) if meter is not None else floor
        return ahead / rate
