"""Admin REST for runtime fleet changes (`gateway.fleet.runtime`):

- `POST /admin/instances` with an instance's settings (`id`, `url`, optional `tierd_url`,
  `models`, `kv_events_endpoint`): validated (`gateway.fleet.validate`), then it joins every
  replica's fleet; 201 with the checks, 422 with them when one failed, 409 if the id is taken;
- `POST /admin/instances/{id}/drain`: no new request goes there; it leaves once the
  requests in flight on it have finished (202);
- `DELETE /admin/instances/{id}`: it leaves now (requests already there still finish);
- `GET /admin/fleet`: the stored records, and each draining instance's in-flight count.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from gateway.config.settings import InstanceSettings
from gateway.errors import OpenAIError, error_body
from gateway.fleet.checks import ValidationFailedError
from gateway.fleet.runtime import FleetError, fleet_of
from gateway.fleet.validate import validate_instance
from gateway.pipeline.parse import parse_json_object, read_body
from gateway.state import app_state
from router.state.base import StateUnavailableError


@contextlib.contextmanager
def _fleet_change(status: int, code: str) -> Iterator[None]:
    """A fleet change's refusal as `status`/`code`; the store being down as a 503."""
    try:
        yield
    except FleetError as exc:
        raise OpenAIError(status, str(exc), code=code) from None
    except StateUnavailableError as exc:
        raise OpenAIError(
            503,
            f"the fleet store is unavailable: {exc}",
            type="server_error",
            code="state_unavailable",
        ) from None


def build_fleet_router() -> APIRouter:
    router = APIRouter(prefix="/admin")

    @router.post("/instances")
    async def add_instance(request: Request) -> JSONResponse:
        state = app_state(request)
        body = parse_json_object(await read_body(request, state.settings.max_body_bytes))
        try:
            spec = InstanceSettings.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first.get("loc", ())) or None
            msg = f"bad instance settings: {first.get('msg')}"
            raise OpenAIError(400, msg, param=param) from None
        fleet = fleet_of(state)
        if state.health.spec(spec.id) is not None:
            raise OpenAIError(409, f"instance {spec.id!r} is already in the fleet", code="conflict")
        try:
            checks = await validate_instance(
                state.client, spec, state.settings.routing, state.settings.health.timeout_s * 5
            )
        except ValidationFailedError as exc:
            body_out = error_body(
                f"instance {spec.id!r} refused: {exc}", "invalid_request_error", None, "invalid"
            )
            return JSONResponse({**body_out, "checks": exc.to_list()}, status_code=422)
        with _fleet_change(409, "conflict"):
            await fleet.add(spec)
        return JSONResponse(
            {
                "instance": spec.model_dump(),
                "status": "active",
                "checks": [dataclasses.asdict(c) for c in checks],
            },
            status_code=201,
        )

    @router.post("/instances/{instance_id}/drain")
    async def drain_instance(instance_id: str, request: Request) -> JSONResponse:
        state = app_state(request)
        fleet = fleet_of(state)
        with _fleet_change(404, "instance_not_found"):
            await fleet.drain(instance_id)
        return JSONResponse(
            {
                "id": instance_id,
                **fleet.status_of(instance_id),
                "in_flight": state.router.load.view(instance_id)[0],
            },
            status_code=202,
        )

    @router.delete("/instances/{instance_id}")
    async def remove_instance(instance_id: str, request: Request) -> JSONResponse:
        state = app_state(request)
        fleet = fleet_of(state)
        in_flight = state.router.load.view(instance_id)[0]
        with _fleet_change(404, "instance_not_found"):
            await fleet.remove(instance_id)
        return JSONResponse({"id": instance_id, "status": "removed", "in_flight": in_flight})

    @router.get("/fleet")
    async def fleet_view(request: Request) -> JSONResponse:
        fleet = fleet_of(app_state(request))
        records: dict[str, Any] = {
            iid: {"status": r.status, "since": r.since_s, "by": r.by, "spec": r.spec}
            for iid, r in sorted(fleet.records.items())
        }
        return JSONResponse(
            {
                "backend": fleet.store.backend,
                "replica": fleet.replica,
                "records": records,
                "draining": fleet.draining(),
                "instances": [i.id for i in fleet.state.health.instances()],
            }
        )

    return router
