"""Builds the router the gateway uses from its settings: the named policy from the registry
with its typed parameters, a prefix index with the configured TTL and capacity, a load view.
(Each request's `RouteRequest` is the pipeline's, gateway/pipeline/decide.py.)"""

from __future__ import annotations

from gateway.config.settings import RoutingSettings
from router.index import PrefixIndex
from router.load import LoadView
from router.policies.registry import default_registry
from router.router import Router


def build_router(settings: RoutingSettings) -> Router:
    policy = default_registry().create(settings.policy, **settings.params)
    index = PrefixIndex(ttl_s=settings.index_ttl_s, capacity_blocks=settings.index_capacity_blocks)
    return Router(policy, index, LoadView())
