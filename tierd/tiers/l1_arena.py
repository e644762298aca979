"""L1: the "HBM" arena, one native arena cut into fixed-size slots with a free list.

The arena is device memory (`DeviceArena`, CUDA or HIP) when a GPU backend of the native
module is usable and `backend` allows it, else page-aligned host memory (`HostArena`):
the code path is the same, `copy_batch` moves bytes either way. Backend `shm` is host
memory in a memfd (`shm_fd`), which tierd hands to an engine's connector over its KV socket
(`tierd.kvserver`) so KV bytes move between the engine and L1 with one copy and no socket.

A slice occupies one slot (its length may be less than the slot). A slot is reserved
before its bytes are written and the slice becomes visible only once the copy is done;
readers pin a slice while its bytes are copied out so eviction cannot reuse the slot under
them. Byte moves run in threads (the native copies release the GIL).
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass

from contracts.errors import ConfigurationError
from tierd.native import DeviceArena, HostArena, backends, copy_batch
from tierd.slices import Payload, SliceMeta


class NoHostViewError(ConfigurationError, TypeError):
    """A host view asked of an L1 whose arena is device memory (`l1_backend` cuda or hip)."""


class L1SizeError(ConfigurationError, ValueError):
    """L1 too small for one slot (`l1_bytes` below `slice_bytes`)."""


@dataclass(slots=True)
class L1Entry:
    slot: int
    meta: SliceMeta
    sticky: bool = False  # put with a session key: passes the frequency gate
    pins: int = 0


Arena = HostArena | DeviceArena | mmap.mmap


def _copy_each(arena: Arena, dst: list[int], payloads: Sequence[Payload]) -> None:
    for offset, p in zip(dst, payloads, strict=True):
        copy_batch(arena, [offset], p, [0], [len(p)])


def shared_arena(nbytes: int) -> tuple[mmap.mmap, int]:
    """Host memory another process can map: a memfd (no name anywhere, freed when the last
    process holding it exits, so a killed tierd leaks nothing) and our mapping of it."""
    fd = os.memfd_create("tierd-l1", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        return mmap.mmap(fd, nbytes), fd
    except BaseException:
        os.close(fd)
        raise


def make_arena(nbytes: int, backend: str) -> HostArena | DeviceArena:
    """`host`, `cuda`, `hip`, or `auto`: the first usable GPU backend, else host memory."""
    if backend == "host":
        return HostArena(nbytes)
    if backend == "auto":
        info = backends()
        for name in ("cuda", "hip"):
            if info.get(name, {}).get("usable"):
                return DeviceArena(nbytes, name)
        return HostArena(nbytes)
    return DeviceArena(nbytes, backend)


class L1Arena:
    """Fixed-slot arena: reserve → write → commit; pin → read → unpin; free."""

    def __init__(self, nbytes: int, slot_bytes: int, backend: str = "auto") -> None:
        self.slot_bytes = slot_bytes
        self.slots = nbytes // slot_bytes
        if self.slots < 1:
            raise L1SizeError(f"L1 of {nbytes} bytes holds no slot of {slot_bytes} bytes")
        self.shm_fd: int | None = None
        self.arena: Arena
        if backend == "shm":
            self.arena, self.shm_fd = shared_arena(self.slots * slot_bytes)
            self.backend = "shm"
        else:
            self.arena = make_arena(self.slots * slot_bytes, backend)
            self.backend = self.arena.backend
        self._free: list[int] = list(range(self.slots - 1, -1, -1))
        self._entries: dict[int, L1Entry] = {}
        self.used_bytes = 0

    def close(self) -> None:
        """Release the arena; if a worker thread still copies from it (a transfer cancelled
        at shutdown), leave it to the process exit rather than pull memory from under it."""
        with contextlib.suppress(BufferError):
            self.arena.close()
        if self.shm_fd is not None:
            os.close(self.shm_fd)
            self.shm_fd = None

    def __contains__(self, h: object) -> bool:
        return h in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, h: int) -> L1Entry | None:
        return self._entries.get(h)

    def hashes(self) -> list[int]:
        return list(self._entries)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def reserve(self) -> int | None:
        return self._free.pop() if self._free else None

    def view(self, slot: int, length: int) -> memoryview:
        """The bytes of a slot in place (host arenas only; release the view after use)."""
        if isinstance(self.arena, DeviceArena):
            raise NoHostViewError("a device arena has no host view")
        start = slot * self.slot_bytes
        return memoryview(self.arena)[start : start + length]

    def release(self, slot: int) -> None:
        """Give back a reserved slot that was never committed."""
        self._free.append(slot)

    async def write(self, slots: list[int], payloads: Sequence[Payload]) -> None:
        """Copy each payload into its slot, straight from where it lies (no staging copy)."""
        if slots:
            dst = [s * self.slot_bytes for s in slots]
            await asyncio.to_thread(_copy_each, self.arena, dst, payloads)

    def commit(self, h: int, slot: int, meta: SliceMeta, sticky: bool) -> None:
        old = self._entries.get(h)
        if old is not None:  # raced with another install of the same slice: keep one
            self._free.append(slot)
            old.sticky = old.sticky or sticky
            return
        self._entries[h] = L1Entry(slot, meta, sticky)
        self.used_bytes += meta.length

    def pinned(self, h: int) -> bool:
        e = self._entries.get(h)
        return e is not None and e.pins > 0

    async def read(self, hashes: list[int]) -> list[bytes] | None:
        """Copy the slices out (all of them, pinned meanwhile); None if one is absent."""
        entries = [self._entries.get(h) for h in hashes]
        present = [e for e in entries if e is not None]
        if len(present) != len(entries):
            return None
        for e in present:
            e.pins += 1
        try:
            sizes = [e.meta.length for e in present]
            out = bytearray(sum(sizes))
            offsets: list[int] = []
            pos = 0
            for n in sizes:
                offsets.append(pos)
                pos += n
            src = [e.slot * self.slot_bytes for e in present]
            await asyncio.to_thread(copy_batch, out, offsets, self.arena, src, sizes)
        finally:
            for e in present:
                e.pins -= 1
        view = memoryview(out)
        return [bytes(view[o : o + n]) for o, n in zip(offsets, sizes, strict=True)]

    def free(self, h: int) -> L1Entry | None:
        e = self._entries.get(h)
        if e is None or e.pins > 0:
            return None
        del self._entries[h]
        self._free.append(e.slot)
        self.used_bytes -= e.meta.length
        return e
