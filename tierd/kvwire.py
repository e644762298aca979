"""The local KV socket between an engine's connector and its tierd: framing and the client.

Only keys and offsets travel here; KV bytes move through tierd's L1 arena, a memfd the
client maps after the welcome frame hands it over (SCM_RIGHTS). A frame is a 4-byte
little-endian length and a JSON object. The client is synchronous on purpose: vLLM calls
its connector from plain threads (the scheduler loop, the worker's step), not from an event
loop. Standard library only: this module is imported inside the engine's own environment.

Requests carry ``op``; those that expect an answer get exactly one, in order, on the same
connection (``release``, ``commit`` and ``drop`` are one-way). Ops (tierd side:
`tierd.kvserver`): ``hello {namespace, role}`` → ``{ok, slot_bytes, arena_bytes}``;
``lookup {hashes}`` → ``{n, tiers}`` (the leading run held in any tier);
``load {hashes}`` → ``{lease, slots: [[offset, length] | null]}`` (slices pinned in L1 until
``release {lease}``); ``reserve {n}`` → ``{offsets}`` (free slots to write into, then
``commit {items: [[hash, offset, length, parent, tokens]]}`` or ``drop {offsets}``);
``removed {hashes}`` (the engine evicted these blocks); ``stats`` → counters.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import socket
import struct
from typing import Any

from contracts.errors import UpstreamError

_LEN = struct.Struct("<I")
MAX_FRAME = 64 * 1024 * 1024


class KvSocketError(UpstreamError, OSError):
    """tierd is unreachable, refused us, or broke the protocol."""


def encode(obj: dict[str, Any]) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return _LEN.pack(len(body)) + body


def decode_length(head: bytes) -> int:
    (n,) = _LEN.unpack(head)
    if n > MAX_FRAME:
        raise KvSocketError(f"frame of {n} bytes exceeds {MAX_FRAME}")
    return int(n)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise KvSocketError("tierd closed the KV socket")
        buf += chunk
    return bytes(buf)


class KvClient:
    """One connection to a tierd's KV socket and its mapped L1 arena."""

    def __init__(self, path: str, namespace: str, role: str, *, timeout_s: float = 5.0) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        self.arena: mmap.mmap | None = None
        try:
            self.sock.connect(path)
            msg, fds, _, _ = socket.recv_fds(self.sock, 4096, 1)
            if len(fds) != 1 or len(msg) < _LEN.size:
                raise KvSocketError("tierd sent no arena with its welcome")
            welcome = json.loads(msg[_LEN.size :])
            try:
                self.arena = mmap.mmap(fds[0], int(welcome["arena_bytes"]))
            finally:
                os.close(fds[0])
            self.slot_bytes = int(welcome["slot_bytes"])
            self.instance = str(welcome.get("instance", ""))
            answer = self.call({"op": "hello", "namespace": namespace, "role": role})
            if not answer.get("ok"):
                raise KvSocketError(f"tierd refused the connector: {answer.get('error')}")
        except (OSError, ValueError, KeyError) as exc:
            self.close()
            if isinstance(exc, KvSocketError):
                raise
            raise KvSocketError(f"cannot attach to tierd at {path}: {exc}") from exc

    def send(self, obj: dict[str, Any]) -> None:
        """One-way request (no answer)."""
        try:
            self.sock.sendall(encode(obj))
        except OSError as exc:
            raise KvSocketError(f"KV socket send failed: {exc}") from exc

    def call(self, obj: dict[str, Any]) -> dict[str, Any]:
        try:
            self.sock.sendall(encode(obj))
            n = decode_length(_recv_exact(self.sock, _LEN.size))
            answer: dict[str, Any] = json.loads(_recv_exact(self.sock, n))
        except (OSError, ValueError) as exc:
            if isinstance(exc, KvSocketError):
                raise
            raise KvSocketError(f"KV socket call {obj.get('op')} failed: {exc}") from exc
        if "error" in answer and not answer.get("ok", True):
            raise KvSocketError(f"tierd: {answer['error']}")
        return answer

    def close(self) -> None:
        if self.arena is not None:
            with contextlib.suppress(BufferError):  # a view is alive: the exit unmaps it
                self.arena.close()
            self.arena = None
        self.sock.close()
