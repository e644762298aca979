"""The operator page: `/ui` serves a static page (no build step: plain HTML, CSS and one
script, committed under `static/`), which holds no data; everything it shows comes from
admin calls it makes with the key the operator enters (`/admin/ui/state` every second,
`/admin/route/explain` from its form), so with keys configured nothing is seen without one."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.admin.ui.live import ui_of, ui_state
from gateway.state import app_state

_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}


def _static(name: str) -> bytes:
    return (Path(__file__).parent / "static" / name).read_bytes()  # package data


def build_ui_router() -> APIRouter:
    router = APIRouter()
    files = {name: _static(name) for name in _TYPES}  # read once, at app build

    @router.get("/ui")
    async def page() -> Response:
        return Response(files["index.html"], media_type=_TYPES["index.html"])

    @router.get("/ui/{name}")
    async def asset(name: str) -> Response:
        if name not in files:
            return Response(b"not found", status_code=404, media_type="text/plain")
        return Response(files[name], media_type=_TYPES[name], headers={"cache-control": "no-cache"})

    return router


def build_ui_admin_router() -> APIRouter:
    router = APIRouter(prefix="/admin")

    @router.get("/ui/state")
    async def live(request: Request) -> JSONResponse:
        state = app_state(request)
        return JSONResponse(ui_state(state, ui_of(state)))

    return router
