"""tierd's HTTP API (FastAPI): control plane (prefetch, lookup, evict, snapshot, stats),
data plane (PUT/GET slice bytes), health and Prometheus metrics.

Block hashes are unsigned 64-bit integers (decimal in paths, JSON numbers in bodies), the
same values the router and the KV events use. Errors use the OpenAI error shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from contracts.tiers import TIERD_ARENA
from tierd.daemon import MEDIUMS, Daemon
from tierd.metrics import make_registry
from tierd.settings import TierdSettings
from tierd.slices import U64
from tierd.store import SliceTooLargeError

Hash = Annotated[int, Field(ge=0, le=U64)]


class PrefetchBody(BaseModel):
    hashes: list[Hash]
    deadline_s: float = Field(default=0.5, ge=0.0, le=3600.0)
    session: str | None = None
    wait: bool = False  # answer with the outcome (after at most the deadline)


class ChainBody(BaseModel):
    hashes: list[Hash]


class EvictBody(BaseModel):
    hashes: list[Hash] | None = None  # None: the whole tier
    tier: str = TIERD_ARENA.name  # "GPU"


class SnapshotBody(BaseModel):
    hashes: list[Hash]
    wait: bool = False  # answer once the object is written


def error(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param}}
    body["error"]["code"] = code
    return JSONResponse(body, status_code=status)


def _parse_hash(text: str) -> int | None:
    try:
        value = int(text, 0) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None
    return value if 0 <= value <= U64 else None


MAX_TOKENS = 1 << 32  # a slice header stores its token count in 32 bits
DEGRADED_FOR_S = 60.0  # /readyz says degraded this long after an evicted slice was lost


def create_app(settings: TierdSettings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        daemon = Daemon(settings)
        await daemon.start()
        app.state.daemon = daemon
        app.state.registry = make_registry(daemon)
        try:
            yield
        finally:
            await daemon.close()

    app = FastAPI(title="tierd", lifespan=lifespan)

    def daemon_of(request: Request) -> Daemon:
        d: Daemon = request.app.state.daemon
        return d

    @app.get("/livez")
    async def livez() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        d = daemon_of(request)
        ready = d.store.ready
        body: dict[str, Any] = {"ready": ready, "error": d.open_error}
        # still serving (L1, reads) but losing what it evicts: ready, and says it is degraded
        last = d.store.drops.last_at
        recent = last is not None and d.store.clock() - last < DEGRADED_FOR_S
        body["degraded"] = recent
        body["array_writes"] = {
            "ok": not recent,
            "dropped_slices": d.store.counters.write_failures,
            "last_drop_s_ago": None if last is None else round(d.store.clock() - last, 3),
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/stats")
    async def stats(request: Request) -> dict[str, Any]:
        return daemon_of(request).stats()

    @app.post("/v1/prefetch")
    async def prefetch(body: PrefetchBody, request: Request) -> JSONResponse:
        d = daemon_of(request)
        if body.wait:
            result = await d.prefetcher.prefetch(body.hashes, body.deadline_s, body.session)
            return JSONResponse(result)
        d.prefetch_in_background(body.hashes, body.deadline_s, body.session)
        return JSONResponse({"accepted": True, "blocks": len(body.hashes)}, status_code=202)

    @app.post("/v1/lookup")
    async def lookup(body: ChainBody, request: Request) -> dict[str, Any]:
        return await daemon_of(request).store.lookup(body.hashes)

    @app.put("/v1/slices/{block_hash}")
    async def put_slice(
        block_hash: str,
        request: Request,
        parent: Annotated[int | None, Query(ge=0, le=U64)] = None,
        tokens: Annotated[int | None, Query(ge=0, lt=MAX_TOKENS)] = None,
        session: str | None = None,
        x_tierd_parent: Annotated[int | None, Header(ge=0, le=U64)] = None,
        x_tierd_tokens: Annotated[int | None, Header(ge=0, lt=MAX_TOKENS)] = None,
        x_tierd_session: Annotated[str | None, Header()] = None,
    ) -> JSONResponse:
        h = _parse_hash(block_hash)
        if h is None:
            return error(400, f"bad block hash {block_hash!r}", "invalid_hash", "hash")
        limit = daemon_of(request).settings.slice_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return error(413, f"slice of {declared} bytes exceeds {limit}", "slice_too_large")
        data = await request.body()
        try:
            stored = await daemon_of(request).store.put(
                h,
                data,
                parent=parent if parent is not None else x_tierd_parent,
                tokens=tokens if tokens is not None else x_tierd_tokens,
                session=session or x_tierd_session,
            )
        except SliceTooLargeError as exc:
            return error(413, str(exc), "slice_too_large")
        except BufferError as exc:
            return JSONResponse(
                {
                    "error": {
                        "message": str(exc),
                        "type": "server_busy",
                        "param": None,
                        "code": "l1_busy",
                    }
                },
                status_code=503,
                headers={"Retry-After": "1"},
            )
        return JSONResponse({"hash": h, "stored": stored}, status_code=201 if stored else 200)

    @app.get("/v1/slices/{block_hash}")
    async def get_slice(block_hash: str, request: Request) -> Response:
        h = _parse_hash(block_hash)
        if h is None:
            return error(400, f"bad block hash {block_hash!r}", "invalid_hash", "hash")
        data = await daemon_of(request).loader.get(h)
        if data is None:
            return error(404, f"slice {h} is in no tier", "slice_not_found", "hash")
        return Response(data, media_type="application/octet-stream")

    @app.post("/v1/evict")
    async def evict(body: EvictBody, request: Request) -> JSONResponse:
        if body.tier not in MEDIUMS:
            return error(400, f"tier must be one of {list(MEDIUMS)}", "invalid_tier", "tier")
        n = await daemon_of(request).evict(body.hashes, body.tier)
        return JSONResponse({"tier": body.tier, "evicted": n})

    @app.post("/v1/snapshot")
    async def snapshot(body: SnapshotBody, request: Request) -> JSONResponse:
        d = daemon_of(request)
        if body.wait:
            return JSONResponse(await d.snapshotter.snapshot(body.hashes))
        sid = d.snapshotter.schedule(body.hashes)
        return JSONResponse({"accepted": True, "id": sid}, status_code=202)

    return app
