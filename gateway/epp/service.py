"""The Endpoint Picker's gRPC server: Envoy's ExternalProcessor service (one `PickStream` per
HTTP request) and the standard gRPC health service with the protocol's names (`liveness`,
`readiness`, `envoy.service.ext_proc.v3.ExternalProcessor`), on `epp.host:epp.port`, in the
gateway's own event loop and beside its HTTP listener (grpc.aio). Needs the `epp` extra."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gateway.epp.picker import EppProtocolError, PickerParts, PickStream

log = logging.getLogger("warmgate.epp")

HEALTH_NAMES = ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor")


class ExternalProcessor(ep_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, parts: PickerParts) -> None:
        self.parts = parts

    async def Process(  # the service's method name
        self, requests: AsyncIterator[ep.ProcessingRequest], context: Any
    ) -> AsyncIterator[ep.ProcessingResponse]:
        stream = PickStream(self.parts)
        try:
            async for message in requests:
                yield await stream.handle(message)
                if stream.finished:
                    return  # an immediate response: Envoy answers the client itself
        except EppProtocolError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:  # the picker failed: Envoy's failureMode decides
            if isinstance(exc, grpc.aio.AbortError):
                raise
            log.exception("endpoint picker failed")
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"endpoint picker failed: {exc!r}")
        finally:
            stream.end()


class EppServer:
    """The started server; `port` is the one bound (`epp.port: 0` picks a free one)."""

    def __init__(self, parts: PickerParts, host: str, port: int) -> None:
        self.server = grpc.aio.server()
        ep_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(parts), self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(f"{host}:{port}")

    async def start(self) -> None:
        await self.server.start()
        for name in HEALTH_NAMES:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("endpoint picker listening on port %d", self.port)

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace=2.0)
