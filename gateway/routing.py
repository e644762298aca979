"""Builds the router the gateway uses from its settings (the named policy from the registry
with its parameters, a prefix index with the configured TTL and capacity, a load view), and
the `RouteRequest` of each request in the configured mode (precise, falling back to
approximate when tokens cannot be had)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.parse import ParsedRequest, route_request
from gateway.settings import RoutingSettings
from gateway.state import AppState
from router.index import PrefixIndex
from router.load import LoadView
from router.policies.registry import default_registry
from router.router import Router
from router.types import RouteRequest


def build_router(settings: RoutingSettings) -> Router:
    policy = default_registry().create(settings.policy, **settings.params)
    index = PrefixIndex(ttl_s=settings.index_ttl_s, capacity_blocks=settings.index_capacity_blocks)
    return Router(policy, index, LoadView())


async def request_for_routing(
    state: AppState, parsed: ParsedRequest, candidates: Sequence[str]
) -> RouteRequest:
    """The request as the router sees it, in the configured mode."""
    if state.precise is not None:
        rr = await state.precise.route_request(parsed, candidates)
        if rr is not None:
            return rr
    return route_request(parsed, state.settings.routing)


def hint_chain(state: AppState, parsed: ParsedRequest, rr: RouteRequest) -> list[int]:
    """The chain a prefetch hint names: tierd keys slices by the gateway's approximate
    blocks (as `sim.engine` stores them), whatever the routing mode."""
    if state.precise is None:
        return list(rr.block_hashes)
    return list(route_request(parsed, state.settings.routing).block_hashes)
