"""`start_epp(state)`: the Endpoint Picker started in the gateway's lifespan when `epp.port`
is set (gateway/epp/service.py); nothing, and no gRPC import, otherwise."""

from __future__ import annotations

from typing import TYPE_CHECKING

from contracts.errors import ConfigurationError
from gateway.epp.endpoints import EndpointNames

if TYPE_CHECKING:
    from gateway.epp.service import EppServer
    from gateway.state import AppState


async def start_epp(state: AppState) -> EppServer | None:
    epp = state.settings.epp
    if epp.port is None:
        return None
    try:  # the `epp` extra
        from gateway.epp.picker import PickerParts
        from gateway.epp.service import EppServer
    except ImportError as exc:
        raise ConfigurationError(
            f"epp.port is set but the endpoint picker's packages are missing ({exc}): "
            "pip install 'warmgate[epp]'"
        ) from None
    assert state.pipeline is not None, "start the picker after the pipeline"
    parts = PickerParts(
        settings=state.settings,
        pipeline=state.pipeline,
        router=state.router,
        health=state.health,
        metrics=state.metrics,
        stats=state.stats,
        tracing=state.tracing,
        names=EndpointNames(state.health.instance_url, ttl_s=epp.resolve_ttl_s),
    )
    server = EppServer(parts, epp.host, epp.port)
    await server.start()
    state.closers.append(server.stop)
    return server
