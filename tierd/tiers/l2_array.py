"""L2: the array directory, content-addressed slice files that several tierds may share.

Layout: ``<dir>/<hh>/<hash:016x>.slice`` (``hh`` = the hash's top byte, to keep
directories small), each file one slice record (`tierd.slices`: header then payload).
A write goes to ``<hh>/.tmp-<hash>-<pid>-<n>`` and is renamed into place, so a reader
sees a whole file or none; a crash leaves only temp files, which every scan ignores and
removes once older than a grace period (a peer sharing the directory may be mid-write).
A file that fails its checks is moved to ``<dir>/quarantine/`` and never served.
Reads of many slices go through the native `read_batch` (parallel preads, O_DIRECT where
the filesystem allows it).
All methods here are synchronous and meant to run in a worker thread.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tierd.native import probe_direct, read_batch, write_batch
from tierd.slices import (
    HEADER_BYTES,
    CorruptSliceError,
    Payload,
    SliceMeta,
    decode_header,
    encode_header,
    verify_payload,
)

SUFFIX = ".slice"
TEMP_PREFIX = ".tmp-"


@dataclass(frozen=True, slots=True)
class ReadResult:
    """One slice read from the array: its bytes, or why not (missing or corrupt)."""

    hash: int
    meta: SliceMeta | None
    payload: memoryview | None  # a view into the batch's read buffer (no copy)
    corrupt: str | None = None


class ArrayDir:
    """Synchronous file operations on one array directory."""

    def __init__(
        self, root: Path, max_slice_bytes: int, *, fsync: bool = False, allow_direct: bool = True
    ) -> None:
        self.root = root
        self.allow_direct = allow_direct
        self.max_slice_bytes = max_slice_bytes
        self.fsync = fsync
        self.direct = False  # O_DIRECT reads: set by `probe()` where the filesystem allows
        self.direct_reason = "not probed"
        self.quarantine_dir = root / "quarantine"
        self._seq = itertools.count()

    def probe(self) -> bool:
        """Create the directory; use O_DIRECT for reads if its filesystem takes it (no
        page-cache copy, and parallel reads of many small files go faster; `tierd bench`)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.allow_direct:
            self.direct, self.direct_reason = False, "off by setting (array_o_direct)"
            return False
        self.direct, self.direct_reason = probe_direct(self.root)
        return self.direct

    def path(self, h: int) -> Path:
        name = f"{h:016x}"
        return self.root / name[:2] / f"{name}{SUFFIX}"

    def exists(self, h: int) -> bool:
        return self.path(h).is_file()

    def write(self, items: Sequence[tuple[SliceMeta, Payload]]) -> list[bool]:
        """Write each slice to a temp file and rename it into place; per slice: ok."""
        if not items:
            return []
        temps: list[Path] = []
        finals: list[Path] = []
        chunks: list[bytes] = []
        for meta, payload in items:
            final = self.path(meta.hash)
            final.parent.mkdir(parents=True, exist_ok=True)
            tag = f"{final.stem}-{os.getpid()}-{next(self._seq)}"
            temps.append(final.parent / f"{TEMP_PREFIX}{tag}")
            finals.append(final)
            chunks.append(encode_header(meta) + payload)
        offsets = list(itertools.accumulate((len(c) for c in chunks), initial=0))[:-1]
        sizes = [len(c) for c in chunks]
        results = write_batch(
            [str(t) for t in temps], b"".join(chunks), offsets, sizes, fsync=self.fsync
        )
        ok: list[bool] = []
        for temp, final, n, size in zip(temps, finals, results, sizes, strict=True):
            if n == size:
                try:
                    os.replace(temp, final)
                    ok.append(True)
                    continue
                except OSError:
                    pass
            temp.unlink(missing_ok=True)
            ok.append(False)
        return ok

    def read(self, hashes: list[int]) -> list[ReadResult]:
        """Read and verify each slice (in parallel); corrupt files are quarantined."""
        if not hashes:
            return []
        span = HEADER_BYTES + self.max_slice_bytes + 1  # +1 detects an over-long file
        buf = bytearray(span * len(hashes))
        got = read_batch(
            [str(self.path(h)) for h in hashes],
            buf,
            [i * span for i in range(len(hashes))],
            [span] * len(hashes),
            direct=self.direct,
        )
        view = memoryview(buf)
        out: list[ReadResult] = []
        for i, (h, n) in enumerate(zip(hashes, got, strict=True)):
            if n < 0:
                out.append(ReadResult(h, None, None))
                continue
            rec = view[i * span : i * span + n]
            try:
                meta = decode_header(rec)
                if n != HEADER_BYTES + meta.length:
                    raise CorruptSliceError(f"file of {n} bytes, header says {meta.length}")
                payload = rec[HEADER_BYTES:]
                verify_payload(meta, payload, h)
            except CorruptSliceError as exc:
                self.quarantine(h)
                out.append(ReadResult(h, None, None, corrupt=str(exc)))
                continue
            out.append(ReadResult(h, meta, payload))
        return out

    def quarantine(self, h: int) -> None:
        src = self.path(h)
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        dst = self.quarantine_dir / f"{src.name}.{time.time_ns()}"
        with contextlib.suppress(FileNotFoundError):
            os.replace(src, dst)

    def delete(self, h: int) -> None:
        self.path(h).unlink(missing_ok=True)

    def scan(self, temp_grace_s: float) -> tuple[dict[int, SliceMeta], list[int], int]:
        """Rebuild the index from headers: (slices, quarantined hashes, temp files removed).

        Only the header is checked here (payloads are verified on every read); files whose
        header is bad or whose size disagrees with it are quarantined.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        found: dict[int, SliceMeta] = {}
        bad: list[int] = []
        removed = 0
        now = time.time()
        for sub in sorted(p for p in self.root.iterdir() if p.is_dir() and len(p.name) == 2):
            for entry in os.scandir(sub):
                name = entry.name
                if name.startswith(TEMP_PREFIX):
                    try:
                        if now - entry.stat().st_mtime > temp_grace_s:
                            os.unlink(entry.path)
                            removed += 1
                    except FileNotFoundError:
                        pass
                    continue
                if not name.endswith(SUFFIX):
                    continue
                try:
                    h = int(name[: -len(SUFFIX)], 16)
                except ValueError:
                    continue
                try:
                    with open(entry.path, "rb") as f:
                        head = f.read(HEADER_BYTES)
                        size = os.fstat(f.fileno()).st_size
                    meta = decode_header(head)
                    if meta.hash != h or size != HEADER_BYTES + meta.length:
                        raise CorruptSliceError("name or size disagrees with header")
                except CorruptSliceError:
                    self.quarantine(h)
                    bad.append(h)
                    continue
                except FileNotFoundError:
                    continue
                found[h] = meta
        return found, bad, removed
