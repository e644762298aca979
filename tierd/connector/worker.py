"""The connector's worker side: copies blocks between the engine's KV tensors and tierd's
shared L1 arena, and keeps its links to tierd.

Blocks move through the native module's `BlockCopier` (`tierd.connector.copier`: its host
backend for vLLM CPU, its CUDA/HIP backend for KV on a GPU, all layers in one call) or,
where that is not possible, torch copies; `copier.choose` says which, once, and it is
logged and counted. On a GPU a save only enqueues its copies; the slots are committed to
tierd when they are done (`poll`, each engine step). The GPU paths have not run in this
repository yet (no device here); `scripts/tierd-device-check.sh` runs them on one. A link
that fails is dropped and retried after a pause; while it is down, loads fail (the engine
recomputes) and saves are skipped, both counted.
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

from tierd.connector import copier
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
        self.copy_path, why = copier.choose(self.storages, force_torch=torch_copies)
        self.native: copier.NativeCopies | None = None
        if self.copy_path != "torch":
            self.native = copier.NativeCopies(
                self.copy_path, self.layout, self.storages, num_blocks, counters
            )
        counters[f"copy_path_{self.copy_path}"] = 1
        self.save_link = Link(path, namespace, "worker-save", counters)
        self.load_link = Link(path, namespace, "worker-load", counters)
        self._load_lock = threading.Lock()
        self._save_lock = threading.Lock()  # the save link and the saver copier: one user
        # saves whose GPU copies are in flight: (client, ticket, commit items, t0)
        self._pending: list[tuple[KvClient, int, list[list[Any]], float]] = []
        log.info(
            "tierd connector: %d layers, %d bytes per block, %s copies (%s)",
            len(layers),
            self.layout.slice_bytes,
            self.copy_path,
            why,
        )

    # -- copies --------------------------------------------------------------------------

    def current_stream(self) -> int | None:
        """The engine's current stream (GPU native path), for a load run on another thread."""
        return self.native.current_stream() if self.native else None

    def _copy(
        self,
        arena: Any,
        blocks: Sequence[int],
        offsets: Sequence[int],
        *,
        load: bool,
        stream: int | None = None,
    ) -> int | None:
        """Copies these blocks; for a native save, the ticket to wait for before the commit
        (host backend: done already; it takes the same deferred path, so that path runs on
        CPU engines too), else None: the bytes are where they go on return."""
        if self.native is not None:
            if stream is None:
                stream = self.native.current_stream()
            try:
                if load:
                    self.native.load(arena, blocks, offsets, stream)
                    return None
                return self.native.save(arena, blocks, offsets, stream)
            except RuntimeError as exc:  # the GPU runtime failed: torch does this one
                self.counters["native_copy_errors"] += 1
                log.warning("native block copy failed (%s); torch copies this batch", exc)
        self.counters["torch_copy_calls"] += 1
        if self.storages[0].device.type == "cuda":  # ROCm builds say "cuda" too
            torch.cuda.synchronize()  # the engine's work (any stream, any thread) is done
        for sidx, (eng, slc, sizes) in self.layout.copies(blocks, offsets).items():
            storage = self.storages[sidx]
            host = torch.frombuffer(arena, dtype=torch.uint8)
            for e, s, n in zip(eng, slc, sizes, strict=True):
                if load:
                    storage[e : e + n].copy_(host[s : s + n])
                else:
                    host[s : s + n].copy_(storage[e : e + n])
            if not load and storage.device.type == "cuda":  # ROCm builds say "cuda" too
                torch.cuda.synchronize()  # the arena must hold the bytes before the commit
        return None

    # -- loads ---------------------------------------------------------------------------

    def load(self, pairs: Sequence[tuple[int, int]], stream: int | None = None) -> set[int]:
        """Copy these (key, block id) into the engine; the block ids that failed (from the
        first one that did: vLLM recomputes from there). `stream`: the engine's stream the
        load must follow (default: this thread's current one)."""
        with self._load_lock:
            return self._load(pairs, stream)

    def _load(self, pairs: Sequence[tuple[int, int]], stream: int | None) -> set[int]:
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
            arena, offsets = client.arena, [s[0] for s in slots[:good]]
            self._copy(arena, ids[:good], offsets, load=True, stream=stream)
            client.send({"op": "release", "lease": answer["lease"]})
        except (KvSocketError, KeyError, TypeError, ValueError, IndexError) as exc:
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

    def save(
        self,
        items: Sequence[tuple[int, int, int | None]],
        block_size: int,
        stream: int | None = None,
    ) -> None:
        """Copy these (key, block id, parent key) into reserved L1 slots and commit them;
        tierd checksums and stores them on its own time. Skipped (counted) if tierd is down.
        Native GPU copies are only enqueued here: `poll` commits them once done. `stream`:
        the engine's stream the copies must follow (default: this thread's current one;
        a caller on another thread passes `current_stream()` taken on the engine's)."""
        with self._save_lock:
            self._poll(wait=False)
            self._save(items, block_size, stream)

    def _save(
        self, items: Sequence[tuple[int, int, int | None]], block_size: int, stream: int | None
    ) -> None:
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
            blocks = [b for _, b, _ in todo]
            ticket = self._copy(client.arena, blocks, offsets, load=False, stream=stream)
            n = self.layout.slice_bytes
            commit = [[k, o, n, p, block_size] for (k, _, p), o in zip(todo, offsets, strict=False)]
            if ticket is None:
                self._commit(client, commit, t0)
            else:
                self._pending.append((client, ticket, commit, t0))
                self._poll(wait=False)  # host backend: committed now; GPU: when done
        except (KvSocketError, KeyError, TypeError, ValueError, IndexError) as exc:
            if self.save_link.client is not None:
                self.save_link.fail(exc)
            self.counters["save_skipped_blocks"] += len(items)
            return
        self.counters["save_skipped_blocks"] += len(items) - len(todo)
        self.counters["save_us"] += int((time.perf_counter() - t0) * 1e6)
        self.write_stats()

    def _commit(self, client: KvClient, commit: list[list[Any]], t0: float) -> None:
        client.send({"op": "commit", "items": commit})
        self.counters["saved_blocks"] += len(commit)
        self.counters["saved_bytes"] += len(commit) * self.layout.slice_bytes
        self.counters["save_commit_us"] += int((time.perf_counter() - t0) * 1e6)

    def poll(self, *, wait: bool = False) -> None:
        """Commit the deferred saves whose copies are done (all of them with `wait`), in
        order. A save whose link has since been replaced is dropped (its slots were in the
        old tierd's arena), counted as skipped. Skipped while a save runs on another thread
        (that save polls first)."""
        if not self._save_lock.acquire(blocking=wait):
            return
        try:
            self._poll(wait=wait)
        finally:
            self._save_lock.release()

    def _poll(self, *, wait: bool) -> None:
        while self._pending:
            client, ticket, commit, t0 = self._pending[0]
            try:
                if self.native is not None and not wait and not self.native.done(ticket):
                    return
                if self.native is not None:
                    self.native.wait(ticket)
                self._pending.pop(0)
                if client is not self.save_link.client:
                    raise KvSocketError("the link was replaced")
                self._commit(client, commit, t0)
            except (KvSocketError, RuntimeError) as exc:
                if self._pending and self._pending[0][1] == ticket:
                    self._pending.pop(0)
                self.counters["save_skipped_blocks"] += len(commit)
                if isinstance(exc, RuntimeError):  # the copy itself failed on the device
                    self.counters["native_copy_errors"] += 1
                    log.warning("deferred save dropped: %s", exc)
                elif self.save_link.client is client:
                    self.save_link.fail(exc)

    def write_stats(self) -> None:
        write_stats(self.stats_file, self.counters)

    def close(self) -> None:
        self.poll(wait=True)
        if self.native is not None:
            self.native.close()
        self.write_stats()
        self.save_link.close()
        self.load_link.close()
