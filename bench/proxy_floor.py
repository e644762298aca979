"""The floor of a Python proxy on warmgate's stack, for `warmgate bench overhead --floor`.

What any proxy in this process model does for one request and no more: uvicorn's
httptools protocol as the gateway runs it (gateway.http.listener's, head sent with the
first body bytes) on uvloop, the client's body read whole and posted unchanged to one
engine over the gateway's own keep-alive pool (gateway.upstream.h1pool), the answer relayed
as it arrives. No parsing, routing, accounting, metrics or disconnect watch. Whatever this
costs per request, warmgate cannot cost less without leaving this server; set against
smg's figure in the same rounds it says how far the Python edge itself is from a target.

    python -m bench.proxy_floor --port P --upstream http://127.0.0.1:E
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send

from gateway.config.guards import ServerLimits
from gateway.http.listener import guarded_protocol
from gateway.upstream.h1pool import H1Pool
from gateway.upstream.transport import Timeouts, target_of

_HEADERS = {"content-type": "application/json", "accept-encoding": "identity"}


class FloorProxy:
    """An ASGI app: every POST goes to `upstream` + its path, relayed back."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.pool: H1Pool | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["method"] != "POST":  # readiness
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        assert self.pool is not None
        resp = await self.pool.post(
            target_of(self.upstream + scope["path"]), _HEADERS, b"".join(chunks)
        )
        content_type = resp.headers.get("content-type", "application/json").encode()
        await send(
            {
                "type": "http.response.start",
                "status": resp.status_code,
                "headers": [(b"content-type", content_type)],
            }
        )
        try:
            async for chunk in resp.aiter_bytes():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            await resp.aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message: Any = await receive()
            if message["type"] == "lifespan.startup":
                timeouts = Timeouts(connect_s=5.0, read_s=60.0, write_s=30.0, pool_s=30.0)
                self.pool = H1Pool(timeouts, max_connections=256, max_keepalive=256)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.proxy_floor", description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="the engine's base URL")
    args = p.parse_args(argv)
    config = uvicorn.Config(
        FloorProxy(args.upstream),
        host="127.0.0.1",
        port=args.port,
        http=guarded_protocol(ServerLimits()),
        access_log=False,
        log_level="warning",
    )
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
