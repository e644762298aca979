"""tierd's KV socket: the local Unix socket an engine's connector talks to (`tierd.kvwire`).

On accept, tierd sends a welcome frame with its L1 memfd attached (SCM_RIGHTS); the
connector maps it, so a load is: ``load`` (tierd brings the slices into L1 from the array
or a snapshot, single-flight, and pins them), one copy out of the shared arena, ``release``;
a save is: ``reserve`` (free L1 slots, evicting as usual), one copy into them, ``commit``
(tierd checksums the bytes in place and installs them; with write-through it also writes
them to the shared array in the background, where other instances find them). Pins and
reserved slots belong to the connection: a connector that dies gives them back.
``removed`` (vLLM's BlockRemoved, or the engine-events subscriber) marks a block as no
longer in the engine, which lets L1's copy pass the frequency gate into the array.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.errors import ConfigurationError
from contracts.tiers import Tier
from tierd import events as ev
from tierd.counters import ThroughputMeter
from tierd.hints import HintLedger
from tierd.kvwire import decode_length, encode
from tierd.loader import Loader
from tierd.residency import EngineResidency
from tierd.slices import SliceMeta, make_meta
from tierd.store import TieredStore

log = logging.getLogger("tierd.kvserver")
NAMESPACE_FILE = "NAMESPACE"


class KvSocketConfigError(ConfigurationError, RuntimeError):
    """The KV socket cannot run with these settings (L1 must be shared memory)."""


@dataclass
class Conn:
    """What one connector holds: pinned leases and reserved, uncommitted slots."""

    role: str = "?"
    leases: dict[int, list[int]] = field(default_factory=dict)
    lease_started: dict[int, tuple[float, int]] = field(default_factory=dict)
    reserved: set[int] = field(default_factory=set)


class KvServer:
    """Serves the KV socket of one tierd."""

    def __init__(
        self,
        store: TieredStore,
        loader: Loader,
        path: Path,
        hints: HintLedger | None = None,
        residency: EngineResidency | None = None,
    ) -> None:
        self.store = store
        self.hints = hints
        self.residency = residency
        self.loader = loader
        self.path = path
        self.namespace = store.settings.kv_namespace
        self.counters: Counter[str] = Counter()
        self._lease_ids = itertools.count(1)
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        # L1 -> engine: from the load request to the release, so the engine's copy counts
        self.host_meter = store.meters.setdefault(Tier.HOST.label, ThroughputMeter())

    async def start(self) -> None:
        if self.store.l1.shm_fd is None:
            raise KvSocketConfigError("the KV socket needs L1 in shared memory (backend shm)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.path))
        sock.listen(64)
        sock.setblocking(False)
        self._sock = sock
        self._accepting = asyncio.create_task(self._accept(), name="tierd-kv-accept")

    async def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()
            self.path.unlink(missing_ok=True)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        st = self.store
        welcome = encode(
            {
                "arena_bytes": st.l1.slots * st.l1.slot_bytes,
                "slot_bytes": st.l1.slot_bytes,
                "instance": st.settings.instance_id,
            }
        )
        while True:
            conn, _ = await loop.sock_accept(self._sock)
            try:
                conn.setblocking(True)  # a small frame: the kernel takes it at once
                socket.send_fds(conn, [welcome], [st.l1.shm_fd or -1])
                conn.setblocking(False)
            except OSError:
                conn.close()
                continue
            self.counters["connections"] += 1
            self._spawn(self._serve(conn))

    async def _serve(self, sock: socket.socket) -> None:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        conn = Conn()
        try:
            while True:
                head = await reader.readexactly(4)
                msg = json.loads(await reader.readexactly(decode_length(head)))
                answer = await self._handle(conn, msg)
                if answer is not None:
                    writer.write(encode(answer))
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, OSError):
            pass
        finally:
            self._drop_conn(conn)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _drop_conn(self, conn: Conn) -> None:
        for hashes in conn.leases.values():
            self._unpin(hashes)
        conn.leases.clear()
        for off in conn.reserved:
            self.store.l1.release(off // self.store.l1.slot_bytes)
        conn.reserved.clear()

    async def _handle(self, conn: Conn, msg: dict[str, Any]) -> dict[str, Any] | None:
        op = msg.get("op")
        self.counters[f"op_{op}"] += 1
        if op == "hello":
            return self._hello(conn, msg)
        if op == "lookup":
            req = msg.get("req")
            return await self._lookup(
                [int(h) for h in msg["hashes"]], None if req is None else str(req)
            )
        if op == "load":
            return await self._load(conn, [int(h) for h in msg["hashes"]])
        if op == "release":
            lease = int(msg["lease"])
            self._unpin(conn.leases.pop(lease, []))
            started = conn.lease_started.pop(lease, None)
            if started is not None and started[1] > 0:
                self.host_meter.record(started[1], started[0], time.monotonic())
            return None
        if op == "reserve":
            return await self._reserve(conn, int(msg["n"]))
        if op == "commit":
            await self._commit(conn, msg["items"])
            return None
        if op == "drop":
            for off in msg["offsets"]:
                if int(off) in conn.reserved:
                    conn.reserved.discard(int(off))
                    self.store.l1.release(int(off) // self.store.l1.slot_bytes)
            return None
        if op == "removed":
            self.engine_removed([int(h) for h in msg["hashes"]])
            return None
        if op == "stats":
            return {"ok": True, "counters": dict(self.counters)}
        return {"ok": False, "error": f"unknown op {op!r}"}

    # -- ops --------------------------------------------------------------------------------

    def _hello(self, conn: Conn, msg: dict[str, Any]) -> dict[str, Any]:
        ns = str(msg.get("namespace", ""))
        conn.role = str(msg.get("role", "?"))
        marker = self.store.settings.array_dir / NAMESPACE_FILE
        if self.namespace is None:
            with contextlib.suppress(OSError):
                self.namespace = marker.read_text().strip() or None
        if self.namespace is None:
            self.namespace = ns
            with contextlib.suppress(OSError):
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(ns + "\n")
        if ns != self.namespace:
            self.counters["refused"] += 1
            return {
                "ok": False,
                "error": f"namespace {ns!r} is not this tierd's {self.namespace!r}",
            }
        return {"ok": True, "namespace": ns}

    async def _lookup(self, hashes: list[int], request: str | None) -> dict[str, Any]:
        found = await self.store.lookup(hashes)
        n = int(found["available"])
        if self.hints is not None:  # before the reads below: was the prefetch on time?
            self.hints.asked(hashes[:n], lambda h: self.store.l1.entry(h) is not None, request)
        self.counters["lookup_blocks"] += len(hashes)
        self.counters["lookup_hit_blocks"] += n
        if n and found["counts"][ev.GPU] < n:  # start the reads now: the load joins them
            self._spawn(self._warm(hashes[:n]))
        return {"n": n, "tiers": found["counts"]}

    async def _warm(self, hashes: list[int]) -> None:
        transfers, _ = await self.loader.plan(hashes)
        for t in transfers:
            try:
                await self.loader.wait(t)
            except Exception:  # a failed read shows at load time as a missing slice
                pass
            finally:
                self.loader.release(t)

    async def _load(self, conn: Conn, hashes: list[int]) -> dict[str, Any]:
        st = self.store
        transfers, _ = await self.loader.plan(hashes)
        for t in transfers:
            try:
                await self.loader.wait(t)
            except Exception:
                self.counters["load_errors"] += 1
            finally:
                self.loader.release(t)
        t0 = time.monotonic()  # the host meter starts once the slices are in L1
        slots: list[list[int] | None] = []
        pinned: list[int] = []
        for h in hashes:  # no await from here on: what we see in L1 is what we pin
            entry = st.l1.entry(h)
            if entry is None:
                slots.append(None)
                continue
            entry.pins += 1
            pinned.append(h)
            st.history.touch(h)
            st.l1_order.update(h)
            slots.append([entry.slot * st.l1.slot_bytes, entry.meta.length])
        self.counters["load_blocks"] += len(pinned)
        self.counters["load_missing"] += len(hashes) - len(pinned)
        st.counters.hits["l1"] += len(pinned)
        st.counters.bytes_moved["get"] += sum(s[1] for s in slots if s is not None)
        lease = next(self._lease_ids)
        conn.leases[lease] = pinned
        conn.lease_started[lease] = (t0, sum(s[1] for s in slots if s is not None))
        return {"lease": lease, "slots": slots}

    def _unpin(self, hashes: list[int]) -> None:
        for h in hashes:
            entry = self.store.l1.entry(h)
            if entry is not None and entry.pins > 0:
                entry.pins -= 1

    async def _reserve(self, conn: Conn, n: int) -> dict[str, Any]:
        slots = await self.store.reserve(max(0, min(n, self.store.l1.slots // 2)))
        offsets = [s * self.store.l1.slot_bytes for s in slots]
        conn.reserved.update(offsets)
        self.counters["reserve_short"] += n - len(offsets)
        return {"offsets": offsets}

    async def _commit(self, conn: Conn, items: list[list[Any]]) -> None:
        st = self.store
        todo: list[tuple[int, int, int, int | None, int | None]] = []
        for h, off, length, parent, tokens in items:
            off = int(off)
            if off not in conn.reserved or not 0 < int(length) <= st.l1.slot_bytes:
                self.counters["commit_refused"] += 1
                continue
            conn.reserved.discard(off)
            todo.append((int(h), off // st.l1.slot_bytes, int(length), parent, tokens))
        metas = await asyncio.to_thread(self._checksum, todo)
        fresh: list[SliceMeta] = []
        for (h, slot, _, _, _), meta in zip(todo, metas, strict=True):
            st.history.touch(h)
            if h in st.l1:
                st.l1.release(slot)
                continue
            st.l1.commit(h, slot, meta, False)
            st.l1_order.update(h)
            st.events.stored(ev.GPU, [h], meta.parent, meta.tokens)
            st.counters.bytes_moved["put"] += meta.length
            fresh.append(meta)
        self.counters["commit_blocks"] += len(fresh)
        if fresh and st.settings.connector_write_through:
            self._spawn(self._write_through([m.hash for m in fresh]))

    def _checksum(
        self, todo: list[tuple[int, int, int, int | None, int | None]]
    ) -> list[SliceMeta]:
        out: list[SliceMeta] = []
        for h, slot, length, parent, tokens in todo:
            with self.store.l1.view(slot, length) as view:
                out.append(make_meta(h, view, parent, tokens))
        return out

    async def _write_through(self, hashes: list[int]) -> None:
        """Copy freshly saved slices to the shared array (peers read them there)."""
        st = self.store
        todo = [h for h in hashes if h in st.l1 and h not in st.array_index]
        payloads = await st.l1.read(todo) if todo else None
        if not payloads:
            return
        items = []
        for h, p in zip(todo, payloads, strict=True):
            entry = st.l1.entry(h)
            if entry is not None:
                items.append((entry.meta, p))
        ok = await asyncio.to_thread(st.array.write, items)
        for (meta, _), written in zip(items, ok, strict=True):
            if written:
                st.array_add(meta.hash, meta)
                st.counters.bytes_moved["l1_to_array"] += meta.length
                st.events.stored(ev.ARRAY, [meta.hash], meta.parent, meta.tokens)
                self.counters["write_through_blocks"] += 1
            else:
                st.counters.write_failures += 1
        if st.on_array_grew is not None:
            st.on_array_grew()

    def engine_stored(self, hashes: list[int]) -> None:
        """The engine holds these blocks in its device cache now."""
        if self.residency is not None:
            self.residency.stored(hashes)

    def engine_cleared(self) -> None:
        """The engine dropped its whole device cache."""
        if self.residency is not None:
            self.residency.cleared()

    def engine_removed(self, hashes: list[int]) -> None:
        """The engine dropped these blocks: tierd's copy is now the nearest one, so it may
        pass the frequency gate into the array when L1 evicts it."""
        if self.residency is not None:
            self.residency.removed(hashes)
        for h in hashes:
            entry = self.store.l1.entry(h)
            if entry is not None:
                entry.sticky = True
                self.counters["engine_removed_held"] += 1
        self.counters["engine_removed"] += len(hashes)

    def stats(self) -> dict[str, Any]:
        hints = self.hints.stats() if self.hints is not None else {}
        return {"socket": str(self.path), "namespace": self.namespace, **self.counters, **hints}
