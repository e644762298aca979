"""When a session's binding yields to load (gateway/pipeline/session_bindings.py): the one
rule, pure, shared with the cluster simulator's warms (sim/cluster/hints.py)."""

from __future__ import annotations

from collections.abc import Sequence

OVERLOAD_FACTOR = 2.0  # a bound instance past this x the candidates' mean in flight (+ 4)


def overloaded(in_flight: int, loads: Sequence[int], factor: float = OVERLOAD_FACTOR) -> bool:
    """Whether the bound instance, with `in_flight` requests, is clearly overloaded among
    candidates with `loads` in flight: the binding then moves to the policy's choice."""
    mean = sum(loads) / len(loads) if loads else 0.0
    return in_flight > factor * mean + 4
