"""Instances that share one machine's cores (the real CPU engines of `bench compare
--engines vllm`: two engines, each computing on a core of its own, with their API servers,
the gateway and tierd running on the same two cores between them).

Measured (`warmgate bench simfit`): a prompt computed while the other engine also computes
takes `slowdown` x its time alone, the processes that are no engine's compute thread then
having no idle core to run on. A step is charged at the rate of the moment it starts: x
`slowdown` when another instance is computing then, x 1 otherwise.
"""

from __future__ import annotations

from contracts.errors import ConfigurationError


class SharedCoresError(ConfigurationError, ValueError):
    """A shared-core slowdown below 1 (sharing never speeds a step up)."""


class SharedCores:
    def __init__(self, slowdown: float) -> None:
        if not slowdown >= 1.0:
            raise SharedCoresError(f"shared-core slowdown must be >= 1, got {slowdown}")
        self.slowdown = slowdown
        self._computing: set[int] = set()

    def step_scale(self, instance: int) -> float:
        """The factor on a step `instance` starts now, and it counts as computing from now."""
        others = len(self._computing - {instance})
        self._computing.add(instance)
        return self.slowdown if others else 1.0

    def idle(self, instance: int) -> None:
        self._computing.discard(instance)
