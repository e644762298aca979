"""Where one KV block lies in an engine's KV tensors, as byte runs (no torch here).

A tierd slice is one block of all layers: for each layer in name order, the block's
contiguous runs in that layer's tensor, laid end to end. The block dimension is the one
sized `num_blocks`; dims with a larger stride give several runs per block, dims with a
smaller one must tile a dense run (in any order). Layouts seen:

- vLLM CPU: ``(num_blocks, kv_heads, block_size, 2*head_dim)``: one run per block per layer
  (K of the block's tokens, then their V, per head) — the whole block is one memcpy.
- vLLM GPU, FlashAttention: ``(2, num_blocks, block_size, kv_heads, head_dim)``: two runs
  (K then V) per block per layer.
- FlashInfer / HND: ``(num_blocks, 2, kv_heads, block_size, head_dim)``: one run.
- vLLM 0.32's per-layer views: logical ``(num_blocks, kv_heads, block_size, 2*head_dim)``
  with the backend's physical stride order (``KVCacheLayout``): NHD strides still give one
  run per block; an H-outer order (LHBNC) gives one run per head.
Engines that share a namespace share a layout, so runs copy byte for byte between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts.errors import ConfigurationError


class KvLayoutError(ConfigurationError, ValueError):
    """An engine's KV tensor layout the connector cannot copy blocks of."""


@dataclass(frozen=True, slots=True)
class LayerRuns:
    """One layer's share of a block: `starts` are byte offsets of block 0's runs from the
    start of the layer's storage; block b adds `b * block_stride`; each run is `run_bytes`."""

    storage: int  # which storage (index into the caller's list of distinct buffers)
    starts: tuple[int, ...]
    block_stride: int
    run_bytes: int

    @property
    def bytes_per_block(self) -> int:
        return len(self.starts) * self.run_bytes


def layer_runs(
    shape: Sequence[int],
    strides: Sequence[int],
    itemsize: int,
    storage_offset: int,
    num_blocks: int,
    storage: int = 0,
) -> LayerRuns:
    """The runs of one layer tensor (shape and strides in elements, as torch gives them).

    The block dimension is the first one sized `num_blocks`. Every other dimension (size > 1)
    is inner (stride below the block stride: together they must tile one dense run, in any
    order, so permuted views such as vLLM's NHD-strided [B, H, N, C] are one run) or outer
    (stride above it, like FlashAttention's leading K/V dimension: one run per index, in
    logical order)."""
    dims = [i for i, n in enumerate(shape) if n == num_blocks]
    if not dims:
        raise KvLayoutError(f"no dimension of {tuple(shape)} has {num_blocks} blocks")
    bd = dims[0]
    bstride = strides[bd]
    others = [(strides[i], shape[i], i) for i in range(len(shape)) if i != bd and shape[i] > 1]
    inner = sorted((s, n) for s, n, _ in others if s < bstride)
    outer = [(s, n) for s, n, _ in sorted(others, key=lambda o: o[2]) if s > bstride]
    run = 1
    for s, n in inner:
        if s != run:
            raise KvLayoutError(f"layout {tuple(shape)}/{tuple(strides)} is not dense below blocks")
        run *= n
    if len(inner) + len(outer) != len(others) or (num_blocks > 1 and bstride < run):
        raise KvLayoutError(f"layout {tuple(shape)}/{tuple(strides)} has overlapping blocks")
    starts = [storage_offset]
    for s, n in outer:
        starts = [b + i * s for b in starts for i in range(n)]
    return LayerRuns(
        storage=storage,
        starts=tuple(x * itemsize for x in starts),
        block_stride=bstride * itemsize,
        run_bytes=run * itemsize,
    )


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """Every layer's runs, in the slice's order."""

    layers: tuple[LayerRuns, ...]

    @property
    def slice_bytes(self) -> int:
        return sum(layer.bytes_per_block for layer in self.layers)

    def copies(
        self, blocks: Sequence[int], slice_offsets: Sequence[int]
    ) -> dict[int, tuple[list[int], list[int], list[int]]]:
        """Per storage: (engine byte offsets, slice-side byte offsets, sizes) of every run of
        these blocks, block i's slice starting at `slice_offsets[i]` in the arena."""
        out: dict[int, tuple[list[int], list[int], list[int]]] = {}
        for b, base in zip(blocks, slice_offsets, strict=True):
            pos = base
            for layer in self.layers:
                eng, arena, sizes = out.setdefault(layer.storage, ([], [], []))
                for start in layer.starts:
                    eng.append(start + b * layer.block_stride)
                    arena.append(pos)
                    sizes.append(layer.run_bytes)
                    pos += layer.run_bytes
        return out
