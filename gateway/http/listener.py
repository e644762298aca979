"""The gateway's listeners: uvicorn's httptools protocol with the limits a public port needs.

uvicorn alone holds a connection that sends nothing (its keep-alive timer starts only after
a first response), accepts headers of any size (llhttp has no limit) and any number of
connections, until file descriptors run out and the proxy cannot reach the engines. So each
connection here gets:
- a header deadline from accept (and from each request's first byte) to its headers'
  end: 408 and closed when passed (slowloris, idle sockets);
- a size limit on the request line and headers: 431 and closed;
- a cap on open connections: past it a new one is closed at once (before it costs more than
  its accept), so descriptors stay for upstream connections.
Body reads are bounded in the app (gateway/pipeline/parse.py `read_body`, `server.body_timeout_s`).

Each response's head leaves with its first body bytes in one send (`HeadWithBody`): uvicorn
writes the head as soon as the app starts the response, and on loopback every write is a
system call that also runs the receiver's side of TCP, a fifth of the gateway's CPU per
proxied request in py-spy; the head waits at most one turn of the loop.

`serve()` runs the app on the main listener and, when `auth.admin_port` is set, on the admin
listener too (the same app; gateway/http/roles.py tells them apart by the local port).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from typing import Any

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.config.guards import ServerLimits
from gateway.config.settings import Settings
from gateway.http.quiet_server import QuietServer

log = logging.getLogger("warmgate.listener")

_CLOSED = {
    408: b"HTTP/1.1 408 Request Timeout\r\n",
    431: b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
    503: b"HTTP/1.1 503 Service Unavailable\r\n",
}
_REASONS = {
    408: b'{"error":{"message":"The request headers did not arrive in time.",'
    b'"type":"invalid_request_error","param":null,"code":"request_timeout"}}',
    431: b'{"error":{"message":"The request line and headers are too large.",'
    b'"type":"invalid_request_error","param":null,"code":"headers_too_large"}}',
    503: b'{"error":{"message":"Too many open connections.",'
    b'"type":"server_error","param":null,"code":"too_many_connections"}}',
}


class _HeadersTooLarge(Exception):
    pass


_JOIN_UP_TO = 65536  # a longer first body goes in its own write (no copy into the head)


class HeadWithBody:
    """One response's transport: its first write (the head) is held until the next write,
    which goes out with it, or until the loop's next turn, or the close; everything else is
    the connection's transport."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._held: bytes | None = None
        self._loop: asyncio.AbstractEventLoop | None = loop  # None once the head has gone

    def write(self, data: bytes) -> None:
        held, self._held = self._held, None
        if held is not None:
            if len(data) <= _JOIN_UP_TO:
                self._transport.write(held + data)
                return
            self._transport.write(held)
        elif self._loop is not None:  # the head: hold it back
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
            self._loop = None
            return
        self._transport.write(data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def guarded_protocol(limits: ServerLimits) -> type[HttpToolsProtocol]:
    """An `HttpToolsProtocol` class enforcing `limits` (uvicorn's `http=` accepts a class)."""

    class GuardedProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._header_bytes = 0
            self._too_large = False
            self._header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                self._close_with(503)
                return
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._header_late)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being served: its own deadlines apply
            self._close_with(408)

        def _close_with(self, status: int) -> None:
            body = _REASONS[status]
            self.transport.write(
                _CLOSED[status]
                + b"content-type: application/json\r\ncontent-length: "
                + str(len(body)).encode()
                + b"\r\nconnection: close\r\n\r\n"
                + body
            )
            self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._header_bytes = 0
            self._arm_header_timer()

        def _count(self, n: int) -> None:
            self._header_bytes += n
            if self._header_bytes > limits.max_header_bytes:
                self._too_large = True
                raise _HeadersTooLarge()

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._disarm_header_timer()
            super().on_headers_complete()
            if self.cycle is not None:  # the request's own: its head goes with its body
                self.cycle.transport = HeadWithBody(self.transport, self.loop)  # type: ignore[assignment]

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._disarm_header_timer()  # idle now: uvicorn's keep-alive timer governs

        def data_received(self, data: bytes) -> None:
            if self._too_large:
                return
            try:
                super().data_received(data)
            except httptools.HttpParserError:  # pragma: no cover - uvicorn catches these
                self._close_with(431 if self._too_large else 408)

        def send_400_response(self, msg: str) -> None:
            if self._too_large:
                self._close_with(431)
                return
            super().send_400_response(msg)

    return GuardedProtocol


def raise_fd_limit() -> int:
    """Raise the soft descriptor limit to the hard one; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.set_inheritable(True)
    return sock


def serve(app: Any, settings: Settings, log_config: dict[str, Any]) -> None:
    """Serve `app` on the main listener (and the admin listener when configured)."""
    limits = settings.server
    fds = raise_fd_limit()
    if limits.max_connections > fds - 256:
        log.warning(
            "server.max_connections %d leaves few of %d descriptors for upstream connections",
            limits.max_connections,
            fds,
        )
    config = uvicorn.Config(
        app,
        http=guarded_protocol(limits),
        log_config=log_config,
        access_log=False,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=int(max(1, limits.keep_alive_s)),
        backlog=2048,
    )
    sockets = [_bind(settings.host, settings.port)]
    auth = settings.auth
    if auth.admin_port is not None:
        sockets.append(_bind(auth.admin_host, auth.admin_port))
    QuietServer(config).run(sockets=sockets)
