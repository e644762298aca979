"""The connector's worker side: copies blocks between the engine's KV tensors and tierd's
shared L1 arena, and keeps its links to tierd.

Host KV (vLLM CPU) moves through the native module's `copy_batch` (parallel memcpy, GIL
released) straight between the KV storage and the mapped arena. Device KV (CUDA/HIP) moves
with torch copies between the device tensor and the arena mapped as a host tensor; that
path has not run on a GPU in this repository yet (no device here); the device check
(`python -m tierd.connector.device_check` with the engine's python) runs it on whatever
device torch has, and on the CPU here. A link that fails is dropped and retried after a pause;
while it is down, loads fail (the engine recomputes) and saves are skipped, both counted.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tierd.connector.layout import BlockLayout, LayerRuns, layer_runs
from tierd.kvwire import KvClient, KvSocketError

log = logging.getLogger("vllm.tierd.connector")  # under vllm.: vLLM prints only those
RETRY_S = 1.0


class Link:
    """A KvClient that reconnects (at most once per `RETRY_S`) after a failure."""

    def __init__(self, path: str, namespace: str, role: str, counters: Counter[str]) -> None:
        self.path, self.namespace, self.role = path, namespace, role
        self.counters = counters
        self.client: KvClient | None = None
        self._failed_at = -RETRY_S

    def get(self) -> KvClient | None:
        if self.client is None and time.monotonic() - self._failed_at >= RETRY_S:
            try:
                self.client = KvClient(self.path, self.namespace, self.role)
                self.counters["connects"] += 1
            except KvSocketError as exc:
                self.fail(exc)
        return self.client

    def call(self, msg: dict[str, Any]) -> tuple[KvClient, dict[str, Any]]:
        """One request and its answer (and the client that answered: its arena is the one the
        answer's offsets point into). A link that was up but has gone stale (tierd
        restarted) is redialled once at once; otherwise KvSocketError."""
        for redial in (False, True):
            client = self.get()
            if client is None:
                raise KvSocketError(f"tierd at {self.path} is unreachable")
            try:
                return client, client.call(msg)
            except KvSocketError as exc:
                self.fail(exc)
                if redial:
                    raise
            self._failed_at = -RETRY_S  # redial now, not after the back-off
        raise AssertionError("unreachable")

    def fail(self, exc: Exception) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        self._failed_at = time.monotonic()
        self.counters["link_failures"] += 1
        log.warning("tierd link (%s) down: %s", self.role, exc)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def write_stats(path: Path | None, counters: Counter[str]) -> None:
    """The counters as one JSON file, replaced whole: how tests and benches read them."""
    if path is None:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        snapshot = dict(counters)  # the save thread may add a key meanwhile: next time
    except RuntimeError:
        return
    try:
        tmp.write_text(json.dumps(snapshot))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot write connector stats to %s: %s", path, exc)


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The whole storage under `t` as a flat uint8 tensor."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


class BlockMover:
    """Loads and saves whole blocks for one worker."""

    def __init__(
        self,
        kv_caches: dict[str, torch.Tensor],
        num_blocks: int,
        path: str,
        namespace: str,
        counters: Counter[str],
        stats_file: str | None = None,
        *,
        torch_copies: bool = False,
    ) -> None:
        self.counters = counters
        self.stats_file = Path(stats_file) if stats_file else None
        storages: dict[int, torch.Tensor] = {}
        layers: list[LayerRuns] = []
        for name in sorted(kv_caches):
            t = kv_caches[name]
            key = t.untyped_storage().data_ptr()
            if key not in storages:
                storages[key] = _storage_bytes(t)
            idx = list(storages).index(key)
            layers.append(
                layer_runs(
                    t.shape, t.stride(), t.element_size(), t.storage_offset(), num_blocks, idx
                )
            )
        self.layout = BlockLayout(tuple(layers))
        self.storages = list(storages.values())
        # torch copies for device KV (and, for the device check, on demand on the CPU)
        self.on_device = torch_copies or any(s.device.type != "cpu" for s in self.storages)
        self.save_link = Link(path, namespace, "worker-save", counters)
        self.load_link = Link(path, namespace, "worker-load", counters)
        self._load_lock = threading.Lock()
        log.info(
            "tierd connector: %d layers, %d bytes per block, %s copies",
            len(layers),
            self.layout.slice_bytes,
            "torch (device)" if self.on_device else "native (host)",
        )

    # -- copies --------------------------------------------------------------------------

    def _copy(
        self, arena: Any, blocks: Sequence[int], offsets: Sequence[int], *, load: bool
    ) -> None:
        for sidx, (eng, slc, sizes) in self.layout.copies(blocks, offsets).items():
            storage = self.storages[sidx]
            if not self.on_device:
                from tierd.native import copy_batch

                view = storage.numpy()
                if load:
                    copy_batch(view, eng, arena, slc, sizes)
                else:
                    copy_batch(arena, slc, view, eng, sizes)
                continue
            host = torch.frombuffer(arena, dtype=torch.uint8)
            for e, s, n in zip(eng, slc, sizes, strict=True):
                if load:
                    storage[e : e + n].copy_(host[s : s + n])
                else:
                    host[s : s + n].copy_(storage[e : e + n])
            if not load and storage.device.type == "cuda":  # ROCm builds say "cuda" too
                torch.cuda.synchronize()  # the arena must hold the bytes before the commit

    # -- loads ---------------------------------------------------------------------------

    def load(self, pairs: Sequence[tuple[int, int]]) -> set[int]:
        """Copy these (key, block id) into the engine; the block ids that failed (from the
        first one that did: vLLM recomputes from there)."""
        with self._load_lock:
            return self._load(pairs)

    def _load(self, pairs: Sequence[tuple[int, int]]) -> set[int]:
        ids = [b for _, b in pairs]
        t0 = time.perf_counter()
        try:
            client, answer = self.load_link.call({"op": "load", "hashes": [k for k, _ in pairs]})
            if client.arena is None or client.slot_bytes < self.layout.slice_bytes:
                raise KvSocketError("tierd's slots are smaller than one KV block")
            slots = answer["slots"]
            good = 0
            for slot in slots:
                if slot is None or slot[1] != self.layout.slice_bytes:
                    break
                good += 1
            self._copy(client.arena, ids[:good], [s[0] for s in slots[:good]], load=True)
            client.send({"op": "release", "lease": answer["lease"]})
        except (KvSocketError, KeyError, TypeError) as exc:
            if not isinstance(exc, KvSocketError):
                self.load_link.fail(exc)
            self.counters["load_failed_blocks"] += len(ids)
            return set(ids)
        self.counters["loaded_blocks"] += good
        self.counters["loaded_bytes"] += good * self.layout.slice_bytes
        self.counters["load_us"] += int((time.perf_counter() - t0) * 1e6)
        failed = set(ids[good:])
        self.counters["load_failed_blocks"] += len(failed)
        self.write_stats()
        return failed

    # -- saves ---------------------------------------------------------------------------

    def save(self, items: Sequence[tuple[int, int, int | None]], block_size: int) -> None:
        """Copy these (key, block id, parent key) into reserved L1 slots and commit them;
        tierd checksums and stores them on its own time. Skipped (counted) if tierd is down."""
        if not items:
            return
        t0 = time.perf_counter()
        try:
            client, answer = self.save_link.call({"op": "reserve", "n": len(items)})
            offsets = answer["offsets"]
            if client.arena is None or client.slot_bytes < self.layout.slice_bytes:
                client.send({"op": "drop", "offsets": offsets})
                raise KvSocketError("tierd's slots are smaller than one KV block")
            todo = items[: len(offsets)]
            self._copy(client.arena, [b for _, b, _ in todo], offsets, load=False)
            n = self.layout.slice_bytes
            client.send(
                {
                    "op": "commit",
                    "items": [
                        [k, o, n, p, block_size]
                        for (k, _, p), o in zip(todo, offsets, strict=False)
                    ],
                }
            )
        except (KvSocketError, KeyError, TypeError) as exc:
            if self.save_link.client is not None:
                self.save_link.fail(exc)
            self.counters["save_skipped_blocks"] += len(items)
            return
        self.counters["saved_blocks"] += len(todo)
        self.counters["save_skipped_blocks"] += len(items) - len(todo)
        self.counters["saved_bytes"] += len(todo) * self.layout.slice_bytes
        self.counters["save_us"] += int((time.perf_counter() - t0) * 1e6)
        self.write_stats()

    def write_stats(self) -> None:
        write_stats(self.stats_file, self.counters)

    def close(self) -> None:
        self.write_stats()
        self.save_link.close()
        self.load_link.close()
