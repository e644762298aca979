"""`bench.loadgen.Load.run` keeps its Poisson schedule when the client's own event loop is
busy: arrivals already due start at once, each within a loop iteration of its time, not one
an iteration behind a growing backlog (the soak's 30 minutes of arrivals took 49.6 that way)."""

from __future__ import annotations

import asyncio
import json
import time

from bench.loadgen import Load

_CHUNK = {"id": "c1", "choices": [{"delta": {"content": "hi"}}]}
_SSE = f"data: {json.dumps(_CHUNK)}\n\ndata: [DONE]\n\n".encode()


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A real HTTP/1.1 server answering every request with one streamed chunk."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            )
            await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(_SSE), _SSE)
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass  # the client closed its connection
    finally:  # on every exit, cancellation included: no writer left for the GC after the loop
        writer.close()


def _hog(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Blocks 10 ms in every loop iteration: a client busy reading hundreds of streams."""
    if not stop.is_set():
        time.sleep(0.01)
        loop.call_soon(_hog, loop, stop)


async def test_a_busy_client_keeps_the_schedule_and_the_duration() -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    load = Load([f"http://127.0.0.1:{port}"], players=20, keep=False, model="m")
    stop = asyncio.Event()
    _hog(asyncio.get_running_loop(), stop)
    try:
        t0 = time.monotonic()
        await load.run(rate=150.0, duration_s=2.0)
        results = load.recorded()
    finally:
        stop.set()
        await load.aclose()
        await asyncio.sleep(0.1)  # the handlers see their clients go and close their writers
        server.close()
        await server.wait_closed()
    # a loop iteration takes 10 ms or more: a generator starting one arrival an iteration
    # sends at most 100 a second, and its last of 300 arrivals would start about 2 s late
    # (3.9 s into the run here); this one starts each within an iteration (0.2 s at most
    # seen on a slow machine, when an iteration also runs hundreds of requests' steps)
    assert 200 <= len(results) <= 400, len(results)
    assert max(r.started for r in results) - t0 < 3.0
    assert max(load.lag) < 0.6, max(load.lag)
    assert len(results) == len(load.lag) and all(r.status == 200 for r in results)
