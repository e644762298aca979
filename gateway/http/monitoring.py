"""Operational endpoints: `/livez` (the process answers; depends on nothing else), `/readyz`
(settings loaded, at least one healthy instance, every required extension check passing;
detail as JSON) and `/metrics` (Prometheus text of this app's registry)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.state import app_state
from router.state.redact import redact


def build_monitoring_router() -> APIRouter:
    router = APIRouter()

    @router.get("/livez")
    async def livez() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @router.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        state = app_state(request)
        healthy = state.health.healthy_ids()
        checks: dict[str, Any] = {
            "settings": {"ok": True},
            "instances": {
                "ok": bool(healthy),
                "healthy": len(healthy),
                "configured": len(state.health.health),
                "states": {i: h.state for i, h in state.health.health.items()},
            },
        }
        names = list(state.readiness)
        results = await asyncio.gather(
            *(state.readiness[n]() for n in names), return_exceptions=True
        )
        for name, result in zip(names, results, strict=True):
            if isinstance(result, BaseException):
                checks[name] = {"ok": False, "required": True, "error": redact(repr(result))}
            else:
                checks[name] = result
        ready = all(bool(c.get("ok")) or not c.get("required", True) for c in checks.values())
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    @router.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(app_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return router
