"""`BlockCopier` of the pure-Python fallback: the host backend only, with the C extension's
arithmetic, checks and exceptions (wg_kvplan.c), copying with ctypes.memmove.

Layers are (ptr, nbytes, starts, block_stride, run_bytes): block b's runs in that buffer are
[ptr + start + b * block_stride, +run_bytes) for each start; block i's slice is every
layer's runs end to end from host_offsets[i] in `host`.
"""

from __future__ import annotations

import ctypes
import operator
from collections.abc import Sequence
from typing import Any

from tierd.native import _checks
from tierd.native.errors import (
    BackendUnavailableError,
    ClosedHandleError,
    CopyOverlapError,
    NativeArgumentError,
    NativeArgumentTypeError,
    UnknownBackendError,
)

Layer = tuple[int, int, Sequence[int], int, int]


def _layers(layers: Sequence[Layer]) -> list[tuple[int, int, list[int], int, int]]:
    out = []
    for i, spec in enumerate(layers):
        if not isinstance(spec, tuple) or len(spec) != 5:
            raise NativeArgumentTypeError(
                f"layer {i} must be (ptr, nbytes, starts, block_stride, run_bytes)"
            )
        ptr, nbytes, stride, run = (operator.index(spec[k]) for k in (0, 1, 3, 4))  # type: ignore[arg-type]
        if min(ptr, nbytes, stride, run) < 0:
            raise NativeArgumentError(
                f"layer {i}: negative pointer, nbytes, block_stride or run_bytes"
            )
        starts = _checks.int_list(spec[2], "starts")
        if any(s < 0 for s in starts):
            raise NativeArgumentError(f"layer {i}: a negative start")
        if not ptr or not run or not stride or not starts:
            raise NativeArgumentError(
                f"layer {i}: pointer, run_bytes, block_stride and starts must be "
                "non-zero / non-empty"
            )
        out.append((ptr, nbytes, starts, stride, run))
    return out


def plan(
    layers: Sequence[Layer],
    num_blocks: int,
    block_ids: Sequence[int],
    host_address: int,
    host_len: int,
    host_offsets: Sequence[int],
) -> list[tuple[int, int, int]]:
    """(engine-side address, host address, size) of every run, contiguous neighbours
    merged; IndexError / NativeArgumentError as the C extension raises them."""
    if num_blocks < 0:
        raise NativeArgumentError("num_blocks must be >= 0")
    specs = _layers(layers)
    blocks = _checks.int_list(block_ids, "block_ids")
    offsets = _checks.int_list(host_offsets, "host_offsets")
    if len(blocks) != len(offsets):
        raise NativeArgumentError(
            f"block_ids and host_offsets differ in length ({len(blocks)}, {len(offsets)})"
        )
    for name, values in (("block_ids", blocks), ("host_offsets", offsets)):
        for i, v in enumerate(values):
            if v < 0:
                raise NativeArgumentError(f"{name}[{i}] is negative")
    slice_bytes = sum(len(starts) * run for _, _, starts, _, run in specs)
    out: list[tuple[int, int, int]] = []
    for i, (b, hoff) in enumerate(zip(blocks, offsets, strict=True)):
        if b >= num_blocks:
            raise IndexError(f"block id {b} is out of range ({num_blocks} blocks)")
        if hoff + slice_bytes > host_len:
            raise IndexError(
                f"slice {i}: host[{hoff}:+{slice_bytes}] is out of range (length {host_len})"
            )
        pos = hoff
        for li, (ptr, nbytes, starts, stride, run) in enumerate(specs):
            for j, start in enumerate(starts):
                off = start + b * stride
                if off + run > nbytes:
                    raise IndexError(
                        f"block {b}, layer {li}, run {j}: bytes [{off}:+{run}] are past the "
                        f"KV buffer ({nbytes} bytes)"
                    )
                d, h = ptr + off, host_address + pos
                if out and out[-1][0] + out[-1][2] == d and out[-1][1] + out[-1][2] == h:
                    out[-1] = (out[-1][0], out[-1][1], out[-1][2] + run)
                else:
                    out.append((d, h, run))
                pos += run
    return out


class BlockCopier:
    """The host backend (synchronous memmove); GPU backends need the C extension."""

    device: int
    batch_api: bool
    last_copies: int
    last_bytes: int
    registered: int

    def __init__(self, backend: str = "host", *, device: int = 0) -> None:
        if device < 0:
            raise NativeArgumentError("device must be >= 0")
        if backend not in ("host", "cuda", "hip"):
            raise UnknownBackendError(f"unknown backend '{backend}' (host, cuda or hip)")
        if backend != "host":
            raise BackendUnavailableError(
                f"{backend} backend not usable: the C extension is not loaded"
            )
        self.device, self.batch_api, self.registered = device, False, 0
        self.last_copies = self.last_bytes = 0
        self._issued = 0
        self._open = True

    @property
    def backend(self) -> str:
        return "host" if self._open else "closed"

    def copy(
        self,
        layers: Sequence[Layer],
        num_blocks: int,
        block_ids: Sequence[int],
        host: Any,
        host_offsets: Sequence[int],
        *,
        to_host: bool,
        stream: int | None = None,
    ) -> int:
        if not self._open:
            raise ClosedHandleError("BlockCopier is closed")
        view = _checks.as_bytes_view(host, "host", writable=to_host)
        base = _checks.address_of(view)
        runs = plan(layers, num_blocks, block_ids, base, view.nbytes, host_offsets)
        dst = [(h if to_host else d) for d, h, _ in runs]
        src = [(d if to_host else h) for d, h, _ in runs]
        sizes = [n for _, _, n in runs]
        try:
            _checks.check_no_overlap(0, dst, sizes, 0, src, src_len=1 << 64, dst_len=1 << 64)
        except CopyOverlapError:
            raise CopyOverlapError(
                "destination runs overlap (a block id or host slice given twice, "
                "or the KV buffer overlaps the host buffer)"
            ) from None
        for d, s, n in zip(dst, src, sizes, strict=True):
            ctypes.memmove(d, s, n)
        self._issued += 1
        self.last_copies, self.last_bytes = len(runs), sum(sizes)
        return self._issued

    def _ticket(self, ticket: int) -> None:
        if not 0 < ticket <= self._issued:
            raise NativeArgumentError(f"unknown ticket {ticket} (issued {self._issued})")

    def wait(self, ticket: int) -> None:
        self._ticket(ticket)

    def done(self, ticket: int) -> bool:
        self._ticket(ticket)
        return True

    def synchronize(self) -> None:
        pass

    def register(self, buffer: Any) -> bool:
        memoryview(buffer)  # a buffer, as the C extension requires
        return False

    def unregister(self, buffer: Any) -> bool:
        memoryview(buffer)
        return False

    def close(self) -> None:
        self._open = False

    def __enter__(self) -> BlockCopier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
