"""The floor of a Python proxy on warmgate's stack, for `warmgate bench overhead --floor`.

What any proxy in this process model does for one request and no more: uvicorn's
httptools protocol as the gateway runs it (gateway.http.listener's, head sent with the
first body bytes) on uvloop, the client's body read whole and posted unchanged to one
engine over the gateway's own keep-alive pool (gateway.upstream.h1pool), the answer relayed
as it arrives. No parsing, routing, accounting, metrics or disconnect watch. Whatever this
costs per request, warmgate cannot cost less without leaving this server; set against
smg's figure in the same rounds it says how far the Python edge itself is from a target.
With several `--upstream`s it takes them in turn (round robin, nothing else): `bench
compare`'s `floor` gateway, whose time outside the engines is the least a Python hop adds.

`--server raw` is the same relay without uvicorn or ASGI: an asyncio protocol on uvloop
parsing with httptools itself and writing to the socket (`RawFloorProtocol`), the least a
Python HTTP edge can do. Its figure against uvicorn's says what replacing the server would
buy, and against smg's whether any Python edge can reach a target.

    python -m bench.proxy_floor --port P --upstream http://127.0.0.1:E [--upstream ...] \
        [--server raw]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from collections.abc import Iterator, Sequence
from typing import Any, cast

import httptools
import uvicorn
import uvloop
from starlette.types import Receive, Scope, Send

from gateway.config.guards import ServerLimits
from gateway.http.listener import guarded_protocol
from gateway.http.quiet_server import QuietServer
from gateway.upstream.h1pool import H1Pool
from gateway.upstream.transport import Timeouts, target_of

_HEADERS = {"content-type": "application/json", "accept-encoding": "identity"}


def command(port: int, upstreams: Sequence[str], server: str = "uvicorn") -> list[str]:
    """The command line that runs this floor on `port` in front of `upstreams`."""
    args = [sys.executable, "-m", "bench.proxy_floor", "--port", str(port), "--server", server]
    for url in upstreams:
        args += ["--upstream", url]
    return args


def _in_turn(upstreams: Sequence[str]) -> Iterator[str]:
    return itertools.cycle([u.rstrip("/") for u in upstreams])


class FloorProxy:
    """An ASGI app: every POST goes to the next of `upstreams` + its path, relayed back."""

    def __init__(self, upstreams: Sequence[str]) -> None:
        self.upstreams = _in_turn(upstreams)
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
            target_of(next(self.upstreams) + scope["path"]), _HEADERS, b"".join(chunks)
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


class RawFloorProtocol(asyncio.Protocol):
    """One client connection: HTTP/1.1 keep-alive requests parsed by httptools, each POST
    relayed to the engine over the pool, its answer sent back with chunked encoding (one
    write for the head and first chunk, one a chunk after). Requests on a connection are
    answered in order, one at a time, as a client that does not pipeline sends them."""

    def __init__(self, upstreams: Iterator[str], pool: H1Pool) -> None:
        self.upstreams = upstreams
        self.pool = pool
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        path, body, method = self.url.decode(), b"".join(self.body), self.parser.get_method()
        self.url, self.body = b"", []
        asyncio.get_running_loop().create_task(self._answer(method, path, body))

    async def _answer(self, method: bytes, path: str, body: bytes) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        if method != b"POST":  # readiness
            t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            return
        resp = await self.pool.post(target_of(next(self.upstreams) + path), _HEADERS, body)
        content_type = resp.headers.get("content-type", "application/json")
        head: bytes | None = (
            f"HTTP/1.1 {resp.status_code} OK\r\ncontent-type: {content_type}\r\n"
            "transfer-encoding: chunked\r\n\r\n"
        ).encode()
        try:
            async for chunk in resp.aiter_bytes():
                framed = b"%x\r\n%b\r\n" % (len(chunk), chunk)
                t.write(framed if head is None else head + framed)
                head = None
        finally:
            await resp.aclose()
        t.write(b"0\r\n\r\n" if head is None else head + b"0\r\n\r\n")


async def _serve_raw(port: int, upstreams: Sequence[str]) -> None:
    timeouts = Timeouts(connect_s=5.0, read_s=60.0, write_s=30.0, pool_s=30.0)
    pool = H1Pool(timeouts, max_connections=256, max_keepalive=256)
    loop = asyncio.get_running_loop()
    in_turn = _in_turn(upstreams)  # one turn for all connections
    server = await loop.create_server(
        lambda: RawFloorProtocol(in_turn, pool), "127.0.0.1", port, reuse_address=True
    )
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.proxy_floor", description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument(
        "--upstream", action="append", required=True,
        help="an engine's base URL (repeat for several: taken in turn)",
    )  # fmt: skip
    p.add_argument("--server", choices=("uvicorn", "raw"), default="uvicorn")
    args = p.parse_args(argv)
    if args.server == "raw":
        uvloop.run(_serve_raw(args.port, args.upstream))
        return 0
    config = uvicorn.Config(
        FloorProxy(args.upstream),
        host="127.0.0.1",
        port=args.port,
        http=guarded_protocol(ServerLimits()),
        access_log=False,
        log_level="warning",
    )
    QuietServer(config).run()  # the gateway's server, as the gateway runs it
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
