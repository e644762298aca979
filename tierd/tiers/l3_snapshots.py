"""L3: cold snapshots, zstd-compressed objects that each hold a run of slices (typically
a whole dialogue chain, so a returning player costs one sequential read).

An object ``<id>.zst`` is the zstd compression of the slices' records (`tierd.slices`
header + payload) laid end to end. Its manifest ``<id>.json`` lists the entries (hash,
parent, tokens, length, crc, offset in the decompressed stream) and the object's size and
crc32c. Both are written to temp names and renamed, the object first, the manifest last:
a snapshot exists once its manifest does, and the index is rebuilt on start from the
manifests alone. A load verifies the object's checksum and every record; a snapshot that
fails is moved to ``quarantine/`` and loads nothing. Synchronous; run in worker threads.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard

from tierd.slices import (
    HEADER_BYTES,
    CorruptSliceError,
    Payload,
    SliceMeta,
    checksum,
    decode_record,
    encode_header,
)

MANIFEST_VERSION = 1


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A snapshot's manifest: which slices it holds and how big the object is."""

    id: str
    entries: tuple[SliceMeta, ...]
    object_bytes: int
    raw_bytes: int


def _meta_json(m: SliceMeta, offset: int) -> dict[str, Any]:
    return {
        "hash": m.hash,
        "parent": m.parent,
        "tokens": m.tokens,
        "length": m.length,
        "crc": m.crc,
        "offset": offset,
    }


class SnapshotDir:
    """Synchronous snapshot objects and manifests in one directory."""

    def __init__(self, root: Path, level: int = 3) -> None:
        self.root = root
        self.level = level
        self.quarantine_dir = root / "quarantine"

    def write(self, snap_id: str, items: Sequence[tuple[SliceMeta, Payload]]) -> Snapshot:
        raw = bytearray()
        entries: list[dict[str, Any]] = []
        for meta, payload in items:
            entries.append(_meta_json(meta, len(raw)))
            raw += encode_header(meta)
            raw += payload
        obj = zstandard.ZstdCompressor(level=self.level).compress(bytes(raw))
        self.root.mkdir(parents=True, exist_ok=True)
        tag = f"{os.getpid()}-{time.time_ns()}"
        obj_path = self.root / f"{snap_id}.zst"
        tmp_obj = self.root / f".tmp-{snap_id}.zst-{tag}"
        tmp_obj.write_bytes(obj)
        os.replace(tmp_obj, obj_path)
        manifest = {
            "version": MANIFEST_VERSION,
            "id": snap_id,
            "object_bytes": len(obj),
            "object_crc": checksum(obj),
            "raw_bytes": len(raw),
            "entries": entries,
            "created": time.time(),
        }
        tmp_man = self.root / f".tmp-{snap_id}.json-{tag}"
        tmp_man.write_text(json.dumps(manifest))
        os.replace(tmp_man, self.root / f"{snap_id}.json")
        return Snapshot(snap_id, tuple(m for m, _ in items), len(obj), len(raw))

    def load(self, snap_id: str) -> list[tuple[SliceMeta, Payload]]:
        """Every slice of the snapshot, verified; raises `CorruptSliceError` (and quarantines)."""
        try:
            manifest = json.loads((self.root / f"{snap_id}.json").read_text())
            obj = (self.root / f"{snap_id}.zst").read_bytes()
            if len(obj) != manifest["object_bytes"] or checksum(obj) != manifest["object_crc"]:
                raise CorruptSliceError("snapshot object checksum mismatch")
            raw = zstandard.ZstdDecompressor().decompress(
                obj, max_output_size=int(manifest["raw_bytes"])
            )
            if len(raw) != manifest["raw_bytes"]:
                raise CorruptSliceError("snapshot object decompresses to the wrong size")
            view = memoryview(raw)
            out: list[tuple[SliceMeta, Payload]] = []
            for e in manifest["entries"]:
                start = int(e["offset"])
                end = start + HEADER_BYTES + int(e["length"])
                out.append(decode_record(view[start:end], int(e["hash"])))
            return out
        except FileNotFoundError:
            raise
        except (CorruptSliceError, zstandard.ZstdError, ValueError, KeyError) as exc:
            self.quarantine(snap_id)
            raise CorruptSliceError(f"snapshot {snap_id}: {exc}") from exc

    def quarantine(self, snap_id: str) -> None:
        stamp = time.time_ns()
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        for suffix in (".json", ".zst"):
            src = self.root / f"{snap_id}{suffix}"
            with contextlib.suppress(FileNotFoundError):
                os.replace(src, self.quarantine_dir / f"{src.name}.{stamp}")

    def delete(self, snap_id: str) -> None:
        for suffix in (".json", ".zst"):
            (self.root / f"{snap_id}{suffix}").unlink(missing_ok=True)

    def scan(self, temp_grace_s: float) -> tuple[list[Snapshot], int]:
        """Manifests found (with their object present) and leftover files removed."""
        self.root.mkdir(parents=True, exist_ok=True)
        snaps: list[Snapshot] = []
        removed = 0
        now = time.time()
        manifests = {p.stem for p in self.root.glob("*.json")}
        for entry in os.scandir(self.root):
            name = entry.name
            stale = False
            try:
                stale = now - entry.stat().st_mtime > temp_grace_s
            except FileNotFoundError:
                continue
            if (
                name.startswith(".tmp-") or (name.endswith(".zst") and name[:-4] not in manifests)
            ) and stale:
                Path(entry.path).unlink(missing_ok=True)
                removed += 1
        for snap_id in sorted(manifests):
            try:
                m = json.loads((self.root / f"{snap_id}.json").read_text())
                if not (self.root / f"{snap_id}.zst").is_file():
                    raise CorruptSliceError(f"snapshot {snap_id}: object missing")
                entries = tuple(
                    SliceMeta(
                        hash=int(e["hash"]),
                        length=int(e["length"]),
                        crc=int(e["crc"]),
                        parent=e["parent"],
                        tokens=e["tokens"],
                    )
                    for e in m["entries"]
                )
                snaps.append(
                    Snapshot(snap_id, entries, int(m["object_bytes"]), int(m["raw_bytes"]))
                )
            except (ValueError, KeyError, TypeError, OSError):
                self.quarantine(snap_id)
        return snaps, removed
