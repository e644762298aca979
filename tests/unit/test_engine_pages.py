"""gateway.fleet.engine_pages against real loopback servers: a GET reads the page on a kept-alive
connection (one connection for repeated GETs, the request line a bare GET), and each way of
not answering is a `PageUnavailable` saying why in the operator's words, within the timeout
for the whole exchange; the load scrape over it asks for the load's series, else the page."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.config.settings import InstanceSettings
from gateway.engine.base import EngineLoad
from gateway.engine.vllm import VLLM
from gateway.fleet.engine_load import scrape
from gateway.fleet.engine_pages import EnginePages, PageUnavailable
from tests.support.procs import free_port
from tests.unit import test_transports
from tests.unit.test_transports import Serve, Server

serve = test_transports.serve  # the loopback-server fixture, shared


async def page_server(serve: Serve) -> Server:
    """A server answering every request on a connection with a one-line metrics page."""
    server: Server

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.read_request(reader)
            body = b'vllm:num_requests_waiting{engine="0"} 2.0\n'
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    server = await serve(handler)
    return server


async def test_gets_read_the_page_over_one_kept_alive_connection(serve: Serve) -> None:
    server = await page_server(serve)
    pages = EnginePages(max_connections=2, timeout_s=2.0)
    try:
        for _ in range(3):
            page = await pages.get(f"http://127.0.0.1:{server.port}/metrics", 2.0)
            assert page.status_code == 200 and page.text.startswith("vllm:num_requests_waiting")
    finally:
        await pages.aclose()
    assert server.connections == 1
    assert all(r.startswith(b"GET /metrics HTTP/1.1\r\n") for r in server.requests)
    assert not any(b"content-length" in r.lower() for r in server.requests)


async def test_a_refused_connection_says_so() -> None:
    pages = EnginePages(max_connections=2, timeout_s=1.0)
    try:
        with pytest.raises(PageUnavailable, match="UpstreamConnectError"):
            await pages.get(f"http://127.0.0.1:{free_port()}/health", 1.0)
    finally:
        await pages.aclose()


async def test_an_engine_that_never_answers_is_given_up_on_at_the_timeout(serve: Serve) -> None:
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    server = await serve(hang)
    pages = EnginePages(max_connections=2, timeout_s=5.0)
    started = time.monotonic()
    try:
        with pytest.raises(PageUnavailable, match=r"no answer within 0\.3 s"):
            await pages.get(f"http://127.0.0.1:{server.port}/health", 0.3)
    finally:
        await pages.aclose()
    assert time.monotonic() - started < 2.0


async def test_a_page_that_is_not_json_is_a_value_error(serve: Serve) -> None:
    server = await page_server(serve)
    pages = EnginePages(max_connections=2, timeout_s=2.0)
    try:
        page = await pages.get(f"http://127.0.0.1:{server.port}/v1/models", 2.0)
        with pytest.raises(ValueError):
            page.json()
    finally:
        await pages.aclose()


async def test_the_load_scrape_reads_the_series_page_else_the_whole_one(serve: Serve) -> None:
    """The scrape asks for the load's series alone (vLLM's `/metrics/?name[]=...`); an
    engine that serves no such page still has its load read, from the whole page."""
    server: Server

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.read_request(reader)
            whole = server.requests[-1].startswith(b"GET /metrics HTTP/1.1")
            status, body = (b"200 OK", b'vllm:num_requests_waiting{engine="0"} 2.0\n')
            if not whole:
                status, body = (b"404 Not Found", b"{}")
            writer.write(b"HTTP/1.1 %s\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body))
            await writer.drain()

    server = await serve(handler)
    inst = InstanceSettings(id="a", url=f"http://127.0.0.1:{server.port}")
    pages = EnginePages(max_connections=2, timeout_s=2.0)
    try:
        load = await scrape(pages, inst, 2.0)
        assert isinstance(load, EngineLoad) and load.waiting == 2.0
        lines = [r.split(b"\r\n")[0] for r in server.requests]
        assert lines == [
            f"GET {VLLM.load_path} HTTP/1.1".encode(),
            b"GET /metrics HTTP/1.1",
        ]
        assert VLLM.load_path.startswith("/metrics/?name%5B%5D=vllm%3Anum_requests_waiting&")
        broken = InstanceSettings(id="b", url=f"http://127.0.0.1:{free_port()}")
        assert "UpstreamConnectError" in str(await scrape(pages, broken, 1.0))
    finally:
        await pages.aclose()
