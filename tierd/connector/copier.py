"""Which copy path moves a worker's KV blocks, and the native one (`tierd.native.BlockCopier`).

Paths, chosen once per worker (`choose`), logged and counted (`copy_path_<name>` = 1):

- ``native-host``: the engine's KV is host memory (vLLM CPU): the native module's host
  backend gathers / scatters every layer's runs with memcpy (a few threads when large).
- ``native-cuda`` / ``native-hip``: the KV is on a GPU and the native module has a usable
  backend for its runtime (`torch.version.hip` tells which): the backend's stream copies
  every run in one call (cudaMemcpyBatchAsync where the runtime has it), ordered after the
  engine's current stream and before its later work; tierd's arena is page-locked once
  (cudaHostRegister / hipHostRegister) so the copies are DMA. CUDA: a save returns at once
  with a ticket, the worker commits the slots to tierd once the ticket is done, and the
  engine's stream waits (on the device) for the copies, so no later kernel overwrites a
  block before it is copied. HIP: the engine's stream is synchronised before the copies and
  they are waited for (a hipStream_t belongs to one HIP runtime, and torch may carry its
  own), so saves there are synchronous.
- ``torch``: everything else (the native module or its GPU backend missing or not usable,
  KV spread over several devices, ``WARMGATE_KV_COPY=torch``): one torch copy per run.

``WARMGATE_KV_COPY=auto|native|torch`` (default auto; ``native`` fails loudly if it cannot).
``WARMGATE_KV_PIN=0`` leaves the arena pageable.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from contracts.errors import ConfigurationError
from tierd.connector.layout import BlockLayout

log = logging.getLogger("vllm.tierd.connector")


class NativeCopyRefusedError(ConfigurationError, RuntimeError):
    """`WARMGATE_KV_COPY=native`, but the native path cannot move this worker's KV (several
    devices, tensors of a kind it has no backend for, or its backend not usable here)."""


def choose(storages: Sequence[torch.Tensor], *, force_torch: bool = False) -> tuple[str, str]:
    """(path, why) for KV held in these storages."""
    mode = os.environ.get("WARMGATE_KV_COPY", "auto").strip().lower()
    if force_torch or mode == "torch":
        return "torch", "torch copies asked for"
    devices = {(s.device.type, s.device.index) for s in storages}
    if len(devices) != 1:
        return _refuse(mode, f"KV on several devices {sorted(map(str, devices))}")
    kind, _ = devices.pop()
    if kind == "cpu":
        return "native-host", "KV in host memory"
    if kind != "cuda":  # ROCm builds of torch say "cuda" too
        return _refuse(mode, f"no native backend for {kind} tensors")
    backend = "hip" if getattr(torch.version, "hip", None) else "cuda"
    import tierd.native as native

    row = native.backends().get(backend, {})
    if not row.get("usable"):
        return _refuse(mode, f"native {backend} backend not usable: {row.get('reason')}")
    return f"native-{backend}", f"native {backend} backend on {row.get('device_name')}"


def _refuse(mode: str, why: str) -> tuple[str, str]:
    if mode == "native":
        raise NativeCopyRefusedError(f"WARMGATE_KV_COPY=native, but {why}")
    return "torch", why


class NativeCopies:
    """Every layer's runs of a block layout, as BlockCopier's layer specs, and two copiers
    (saves on the engine's thread, loads possibly on a loader thread: one each)."""

    def __init__(
        self,
        path: str,
        layout: BlockLayout,
        storages: Sequence[torch.Tensor],
        num_blocks: int,
        counters: Counter[str],
    ) -> None:
        from tierd.native import BlockCopier

        backend = path.removeprefix("native-")
        device = storages[0].device.index or 0
        self.gpu = backend != "host"
        self.device = storages[0].device
        self.num_blocks = num_blocks
        self.counters = counters
        self.specs = [
            (
                int(storages[r.storage].data_ptr()),
                int(storages[r.storage].numel()),  # flat uint8 views: bytes
                list(r.starts),
                r.block_stride,
                r.run_bytes,
            )
            for r in layout.layers
        ]
        self.saver = BlockCopier(backend, device=device)
        self.loader = BlockCopier(backend, device=device)
        self.stream_order = backend == "cuda"  # see the module docstring (HIP)
        self.pin = os.environ.get("WARMGATE_KV_PIN", "1") != "0"
        self._arenas: dict[int, Any] = {}  # id(copier) -> the arena it has registered

    def current_stream(self) -> int | None:
        """The raw handle of this thread's current stream on the KV's device (GPU only)."""
        if not self.gpu or not self.stream_order:
            return None
        return int(torch.cuda.current_stream(self.device).cuda_stream)

    def _unordered_sync(self) -> None:
        """Without stream ordering: what the engine queued (on any stream: the save may run
        on the saver's thread) finishes before our copies."""
        if self.gpu and not self.stream_order:
            torch.cuda.synchronize(self.device)

    def _attach(self, copier: Any, arena: Any) -> None:
        """Page-lock the arena this copier's link maps, once (again after a reconnect maps
        a new one; the old one is unregistered, waiting for copies still using it)."""
        old = self._arenas.get(id(copier))
        if arena is old or not self.gpu or not self.pin:
            return
        if old is not None:
            copier.unregister(old)
        ok = copier.register(arena)
        self.counters["arena_registered" if ok else "arena_register_failed"] += 1
        if not ok:
            log.warning("tierd arena could not be page-locked: copies are staged (slower)")
        self._arenas[id(copier)] = arena

    def save(
        self, arena: Any, blocks: Sequence[int], offsets: Sequence[int], stream: int | None
    ) -> int:
        """Enqueue the gather; the ticket to wait for before the slots are committed."""
        self._attach(self.saver, arena)
        self._unordered_sync()
        ticket = self.saver.copy(
            self.specs, self.num_blocks, blocks, arena, offsets, to_host=True, stream=stream
        )
        self.counters["native_copies"] += self.saver.last_copies
        if self.gpu and not self.stream_order:
            self.saver.wait(ticket)
        return int(ticket)

    def load(
        self, arena: Any, blocks: Sequence[int], offsets: Sequence[int], stream: int | None
    ) -> None:
        """Scatter and wait (the lease on the slots is released after this)."""
        self._attach(self.loader, arena)
        self._unordered_sync()
        ticket = self.loader.copy(
            self.specs, self.num_blocks, blocks, arena, offsets, to_host=False, stream=stream
        )
        self.counters["native_copies"] += self.loader.last_copies
        self.loader.wait(ticket)

    def done(self, ticket: int) -> bool:
        return bool(self.saver.done(ticket))

    def wait(self, ticket: int) -> None:
        self.saver.wait(ticket)

    def close(self) -> None:
        """Waits for every copy, unregisters the arenas, frees the streams."""
        self._arenas.clear()
        self.saver.close()
        self.loader.close()
