"""`default_registry()`: every routing policy by name."""

from __future__ import annotations

from router.policies.base import PolicyRegistry
from router.policies.least_load import LeastLoadPolicy
from router.policies.prefix import PrefixPolicy
from router.policies.round_robin import RoundRobinPolicy
from router.policies.session import SessionPolicy
from router.policies.ttft import TtftPolicy


def default_registry() -> PolicyRegistry:
    registry = PolicyRegistry()
    for cls in (RoundRobinPolicy, LeastLoadPolicy, SessionPolicy, PrefixPolicy, TtftPolicy):
        registry.register(cls)
    return registry
