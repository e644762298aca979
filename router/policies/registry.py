"""`default_registry()`: every routing policy by name."""

from __future__ import annotations

from typing import Any

from router.policies.base import Policy, PolicyRegistry
from router.policies.least_load import LeastLoadPolicy
from router.policies.prefix import PrefixPolicy
from router.policies.round_robin import RoundRobinPolicy
from router.policies.session import SessionPolicy
from router.policies.ttft import TtftPolicy


def _round_robin(**params: Any) -> Policy:
    return RoundRobinPolicy(**params)


def _least_load(**params: Any) -> Policy:
    return LeastLoadPolicy(**params)


def _session(**params: Any) -> Policy:
    return SessionPolicy(**params)


def _prefix(**params: Any) -> Policy:
    return PrefixPolicy(**params)


def _ttft(**params: Any) -> Policy:
    return TtftPolicy(**params)


def default_registry() -> PolicyRegistry:
    registry = PolicyRegistry()
    registry.register("round_robin", _round_robin)
    registry.register("least_load", _least_load)
    registry.register("session", _session)
    registry.register("prefix", _prefix)
    registry.register("ttft", _ttft)
    return registry
