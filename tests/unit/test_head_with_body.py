"""A response's head leaves with its first body bytes in one write (gateway/http/listener.py
`HeadWithBody`), and never waits past the loop's next turn or the close."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.http.listener import HeadWithBody


class Recording(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 7


async def test_head_and_body_in_one_write() -> None:
    t = Recording()
    h = HeadWithBody(t, asyncio.get_running_loop())
    h.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert t.writes == []
    h.write(b"body")
    h.write(b"more")
    assert t.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"more"]
    await asyncio.sleep(0)  # the held head's flush finds nothing left
    assert len(t.writes) == 2
    assert h.get_write_buffer_size() == 7  # the rest is the connection's transport


async def test_a_head_alone_goes_on_the_next_turn() -> None:
    t = Recording()
    h = HeadWithBody(t, asyncio.get_running_loop())
    h.write(b"head")
    await asyncio.sleep(0)
    assert t.writes == [b"head"]
    h.write(b"body")
    assert t.writes == [b"head", b"body"]


async def test_close_sends_the_head_first_and_a_big_body_is_not_copied() -> None:
    t = Recording()
    h = HeadWithBody(t, asyncio.get_running_loop())
    h.write(b"head")
    h.close()
    assert t.writes == [b"head"] and t.closed
    t2 = Recording()
    h2 = HeadWithBody(t2, asyncio.get_running_loop())
    h2.write(b"head")
    big = b"x" * 70_000
    h2.write(big)
    assert t2.writes == [b"head", big]
