"""A prefetch hint leaves ahead of its request: over the proxy's own pool, the hint's first
step writes it to a kept-alive connection to tierd, so one turn of the loop (what the proxy
gives it before posting the request) puts the hint on tierd's socket, before the engine can
have the request whose lookup it races. A real loopback socket stands in for tierd; the
test reads what reached it without giving the loop another turn. A hint that the request
waits for (`tiers.prefetch_hold_s`) ends only once a real tierd has the chain in host
memory."""

from __future__ import annotations

import asyncio
import json
import random
import socket
from pathlib import Path

import httpx

from gateway.config.settings import InstanceSettings
from gateway.observe.metrics import GatewayMetrics
from gateway.pipeline.prefetch import PrefetchHints
from gateway.upstream.h1pool import H1Pool
from gateway.upstream.transport import Timeouts
from tests.support.procs import ManagedProcess, free_port, python_module
from tierd.client import TierdClient

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def _request(conn: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    data = b""
    while b"\r\n\r\n" not in data or not data.endswith(b"}"):
        data += await loop.sock_recv(conn, 65536)
    return data


def test_one_turn_of_the_loop_puts_the_hint_on_tierds_socket() -> None:
    async def scenario() -> tuple[bytes, bytes]:
        loop = asyncio.get_running_loop()
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        port = listener.getsockname()[1]
        timeouts = Timeouts(connect_s=2.0, read_s=5.0, write_s=5.0, pool_s=2.0)
        pool = H1Pool(timeouts, max_connections=4, max_keepalive=4)
        inst = InstanceSettings(
            id="e0", url="http://127.0.0.1:1", tierd_url=f"http://127.0.0.1:{port}"
        )
        async with httpx.AsyncClient() as client:
            hints = PrefetchHints([inst], GatewayMetrics(), client, pool, enabled=True)
            conn: socket.socket | None = None
            try:
                # the first hint opens the connection (an await of its own), answered
                assert hints.hint("e0", [1, 2, 3], 2.0, "player-1")
                conn, _ = await loop.sock_accept(listener)
                first = await _request(conn)
                await loop.sock_sendall(conn, OK)
                for _ in range(200):  # until the answer is read and the connection idle
                    if not hints._pending:
                        break
                    await asyncio.sleep(0.01)
                # the next hint: one turn, then look at tierd's side without another
                assert hints.hint("e0", [4, 5], 2.0, "player-2")
                await asyncio.sleep(0)
                try:
                    second = conn.recv(65536, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    second = b""
                await loop.sock_sendall(conn, OK)
            finally:
                await hints.aclose()
                await pool.aclose()
                if conn is not None:
                    conn.close()
                listener.close()
        return first, second

    first, second = asyncio.run(scenario())
    assert first.startswith(b"POST /v1/prefetch HTTP/1.1\r\n")
    assert second.startswith(b"POST /v1/prefetch HTTP/1.1\r\n"), second
    body = json.loads(second.split(b"\r\n\r\n", 1)[1])
    assert body == {"hashes": [4, 5], "deadline_s": 2.0, "session": "player-2", "wait": False}


async def test_a_hint_waited_for_ends_when_tierd_holds_the_chain_in_host_memory(
    tmp_path: Path,
) -> None:
    port = free_port()
    # 2000-byte slices over a 20 kB/s emulated array link: 0.4 s to read the chain of four
    tierd = ManagedProcess(
        python_module(
            "tierd.cli", "serve", "--port", str(port), "--instance-id", "t0",
            "--l1-bytes", str(16 * 4096), "--slice-bytes", "4096",
            "--array-dir", str(tmp_path / "array"), "--snapshot-dir", str(tmp_path / "snap"),
            "--array-gbps", "2e-5",
        ),
        tmp_path / "tierd.log",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    timeouts = Timeouts(connect_s=2.0, read_s=5.0, write_s=5.0, pool_s=2.0)
    pool = H1Pool(timeouts, max_connections=4, max_keepalive=4)
    inst = InstanceSettings(id="e0", url="http://127.0.0.1:1", tierd_url=url)
    try:
        tierd.wait_http(f"{url}/readyz", timeout_s=30)
        async with httpx.AsyncClient() as http, TierdClient(url, client=http) as client:
            chains = {"raced": [11, 12, 13, 14], "held": [21, 22, 23, 24]}
            for chain in chains.values():
                parent = None
                for h in chain:
                    data = random.Random(h).randbytes(2000)
                    await client.put_slice(h, data, parent=parent, tokens=16, session="p")
                    parent = h
                assert await client.evict(chain, tier="GPU") == len(chain)  # array only
            hints = PrefetchHints([inst], GatewayMetrics(), http, pool, enabled=True)
            try:
                raced = hints.hint("e0", chains["raced"], 2.0, "p")
                assert raced is not None
                await raced  # answered at once: the reads go on behind it
                assert (await client.lookup(chains["raced"]))["leading"]["GPU"] == 0
                held = hints.hint("e0", chains["held"], 2.0, "p", wait=True)
                assert held is not None
                await held  # tierd answers once its reads into host memory are done
                assert (await client.lookup(chains["held"]))["leading"]["GPU"] == 4
            finally:
                await hints.aclose()
    finally:
        await pool.aclose()
        tierd.stop()
