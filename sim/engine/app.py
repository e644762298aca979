"""The simulated engine's HTTP server: vLLM's OpenAI-compatible surface.

Routes: `POST /v1/chat/completions`, `POST /v1/completions` (plain and SSE), `GET /v1/models`,
`GET /health`, `POST /tokenize`, `POST /detokenize`, `GET /metrics`,
`POST /reset_prefix_cache`, `GET /stats`, and SGLang's info routes (`sim.engine.compat`).
Every response carries `x-engine-instance`; `x-request-id` is echoed. A client that goes
away (stream closed, or disconnect while waiting for a full response) aborts its request,
which frees its batch slot and KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from sim.engine.compat import add_sglang_routes
from sim.engine.config import EngineConfig
from sim.engine.core import ChatPrompt, Engine, Prompt
from sim.engine.openai_api import (
    APIError,
    ResponseShape,
    bad,
    parse_json,
    parse_messages,
    parse_params,
    parse_prompts,
    parse_tools,
)
from sim.engine.sequence import Sequence
from sim.engine.streams import AbortingStream, collect, sse_frames, total_usage

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class InstanceHeader:
    """ASGI middleware: adds `x-engine-instance` and echoes `x-request-id` on every response."""

    def __init__(self, app: ASGIApp, instance_id: str):
        self.app = app
        self.header = (b"x-engine-instance", instance_id.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = next((v for k, v in scope["headers"] if k == b"x-request-id"), None)

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append(self.header)
                if request_id is not None:
                    headers.append((b"x-request-id", request_id))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_header)


def abort_all(engine: Engine, seqs: list[Sequence]) -> None:
    for seq in seqs:
        engine.abort(seq)


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(config: EngineConfig) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = Engine(config)
        await engine.start()
        app.state.engine = engine
        try:
            yield
        finally:
            await engine.stop()

    app = FastAPI(title="warmgate sim engine", lifespan=lifespan)

    def engine_of(request: Request) -> Engine:
        engine: Engine = request.app.state.engine
        return engine

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        err = APIError(exc.status_code, str(exc.detail), type_="invalid_request_error")
        return JSONResponse(err.body(), status_code=exc.status_code)

    async def generate(request: Request, chat: bool) -> Response:
        engine = engine_of(request)
        body = parse_json(await request.body())
        params = parse_params(body, chat=chat)
        engine.check_model(params.model)
        prompts: list[Prompt] = (
            [ChatPrompt(parse_messages(body), parse_tools(body))]
            if chat
            else [*parse_prompts(body)]
        )
        if not config.token_ids:
            params.return_token_ids = False  # an engine that does not know the field
        if params.session is None:
            params.session = request.headers.get("x-session-id")
        seqs = [await engine.prepare(params, p) for p in prompts]
        rid = request.headers.get("x-request-id")
        prefix = "chatcmpl" if chat else "cmpl"
        shape = ResponseShape(chat, params.model, f"{prefix}-{rid}" if rid else "")
        await asyncio.gather(*(engine.load_from_tiers(s) for s in seqs))
        try:
            for seq in seqs:
                engine.submit(seq)
        except APIError:
            abort_all(engine, seqs)
            raise
        if params.stream:
            return AbortingStream(
                sse_frames(seqs, shape, params.include_usage, params.return_token_ids),
                on_close=partial(abort_all, engine, seqs),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache"},
            )
        done = asyncio.ensure_future(collect(seqs))
        disconnect = asyncio.ensure_future(_wait_disconnect(request))
        try:
            await asyncio.wait({done, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            disconnect.cancel()
            if not done.done():
                done.cancel()
                abort_all(engine, seqs)
            with contextlib.suppress(asyncio.CancelledError):
                await disconnect
        if done.cancelled():
            return Response(status_code=499)
        ids = [(s.prompt_ids, s.output_ids) for s in seqs] if params.return_token_ids else None
        return JSONResponse(shape.full(done.result(), total_usage(seqs), ids))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        engine = engine_of(request)
        return {
            "object": "list",
            "data": [
                {
                    "id": config.model,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "warmgate-sim",
                    "root": config.model,
                    "parent": None,
                    "max_model_len": engine.max_model_len,
                }
            ],
        }

    @app.get("/health")
    async def health(request: Request) -> Response:
        return Response(status_code=200 if engine_of(request).healthy else 503)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        engine = engine_of(request)
        body = parse_json(await request.body())
        model = body.get("model")
        if model is not None:
            engine.check_model(str(model))
        if "messages" in body:
            messages = parse_messages(body)
            add_gen = body.get("add_generation_prompt", True)
            if not isinstance(add_gen, bool):
                raise bad("'add_generation_prompt' must be a boolean", "add_generation_prompt")
            ids = await asyncio.to_thread(engine.encode_chat, messages, parse_tools(body), add_gen)
        elif isinstance(body.get("prompt"), str):
            ids = await asyncio.to_thread(engine.tokenizer.encode, body["prompt"])
        else:
            raise bad("give 'prompt' (a string) or 'messages'", "prompt")
        return {
            "count": len(ids),
            "max_model_len": engine.max_model_len,
            "tokens": ids,
            "token_strs": None,
        }

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        engine = engine_of(request)
        body = parse_json(await request.body())
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            raise bad("'tokens' must be a list of integers", "tokens")
        return {"prompt": engine.tokenizer.decode(tokens)}

    @app.get("/metrics")
    @app.get("/metrics/")
    async def metrics(request: Request) -> Response:
        # `name[]`: the named series alone, as prometheus_client's app under vLLM's /metrics/
        names = request.query_params.getlist("name[]")
        page = engine_of(request).metrics.render(names or None)
        return Response(page, media_type=CONTENT_TYPE_LATEST)

    @app.get("/stats")
    async def stats(request: Request) -> dict[str, Any]:
        return engine_of(request).stats()

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> Response:
        ok = engine_of(request).cache.reset()
        return Response(status_code=200 if ok else 409)

    add_sglang_routes(app, engine_of)
    app.add_middleware(InstanceHeader, instance_id=config.instance_id)
    return app
