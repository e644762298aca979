"""The native block copier against torch-made KV tensors of every layout, without tierd:
bytes compared, bad input refused, and GB/s of each way to copy (the device check's half
that needs no daemon; run with the engine's python: it needs torch).

Layouts (`make_kv`), per layer, all layers views of one buffer as vLLM allocates them:

- ``cpu``: vLLM CPU ``(num_blocks, kv_heads, block_size, 2*head_dim)``: one run per block.
- ``flash_attn``: ``(2, num_blocks, block_size, kv_heads, head_dim)``: K run + V run.
- ``flashinfer``: ``(num_blocks, 2, kv_heads, block_size, head_dim)``: one run.
- ``nhd_view``: vLLM 0.32's logical ``(num_blocks, kv_heads, block_size, 2*head_dim)`` over
  NHD memory ``(num_blocks, block_size, kv_heads, 2*head_dim)`` (a permuted view): one run.

Ways timed (gather = save direction, device -> host; scatter = load):
``native`` (BlockCopier on the tensors' device: host backend on CPU, CUDA/HIP on a GPU;
host buffer page-locked with register() on a GPU), ``native_pageable`` (GPU only, not
registered), ``torch_runs`` (the connector's torch fallback: one copy_ per run, into the
pageable arena), and on a GPU ``torch_index_select`` (index_select per layer + one
non_blocking copy into pinned memory: a bound for torch, not a drop-in, since its bytes
come out layer-major rather than in tierd's slice order).
"""

from __future__ import annotations

import mmap
import time
from collections.abc import Callable
from typing import Any

import torch

from tierd.connector.copier import NativeCopies, choose
from tierd.connector.layout import BlockLayout, layer_runs

LAYOUTS = ("cpu", "flash_attn", "flashinfer", "nhd_view")
BLOCK_DIM = {"cpu": 0, "flash_attn": 1, "flashinfer": 0, "nhd_view": 0}


def make_kv(
    layout: str, layers: int, nb: int, bs: int, heads: int, dim: int, device: str
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(the one buffer, {layer name: that layer's KV tensor}), random fp16."""
    phys = {
        "cpu": (nb, heads, bs, 2 * dim),
        "flash_attn": (2, nb, bs, heads, dim),
        "flashinfer": (nb, 2, heads, bs, dim),
        "nhd_view": (nb, bs, heads, 2 * dim),
    }[layout]
    base = torch.randn((layers, *phys), dtype=torch.float16, device=device)
    views = [base[i] for i in range(layers)]
    if layout == "nhd_view":
        views = [v.permute(0, 2, 1, 3) for v in views]
    return base, {f"layer.{i}": v for i, v in enumerate(views)}


def layout_of(kv: dict[str, torch.Tensor], nb: int) -> tuple[BlockLayout, list[torch.Tensor]]:
    """The block layout and flat uint8 storages, as the connector's BlockMover builds them."""
    storages: dict[int, torch.Tensor] = {}
    runs = []
    for name in sorted(kv):
        t = kv[name]
        key = t.untyped_storage().data_ptr()
        if key not in storages:
            storages[key] = torch.empty(0, dtype=torch.uint8, device=t.device).set_(
                t.untyped_storage()
            )
        idx = list(storages).index(key)
        runs.append(layer_runs(t.shape, t.stride(), t.element_size(), t.storage_offset(), nb, idx))
    return BlockLayout(tuple(runs)), list(storages.values())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def torch_runs(
    layout: BlockLayout, storages: list[torch.Tensor], host: Any, blocks: list[int],
    offsets: list[int], *, to_host: bool,
) -> None:  # fmt: skip
    """The connector's torch fallback: one copy per run."""
    flat = torch.frombuffer(host, dtype=torch.uint8)
    for sidx, (eng, slc, sizes) in layout.copies(blocks, offsets).items():
        st = storages[sidx]
        for e, s, n in zip(eng, slc, sizes, strict=True):
            if to_host:
                flat[s : s + n].copy_(st[e : e + n])
            else:
                st[e : e + n].copy_(flat[s : s + n])
    _sync(storages[0].device)


def _best(repeat: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _refusals(native: NativeCopies, host: Any, nb: int, slice_bytes: int) -> dict[str, str]:
    """Bad input must be refused with the right exception type before a byte moves: the
    builtin each refusal is (a ValueError is a `tierd.native.errors` class)."""
    out: dict[str, str] = {}
    cases: dict[str, tuple[Any, list[int], list[int]]] = {
        "block_out_of_range": (native.specs, [nb], [0]),
        "slice_past_host": (native.specs, [0], [len(host) - slice_bytes + 1]),
        "run_past_buffer": ([(p, n - 1, *rest) for p, n, *rest in native.specs], [nb - 1], [0]),
        "negative_block": (native.specs, [-1], [0]),
    }  # fmt: skip
    for name, (specs, blocks, offs) in cases.items():
        try:
            native.saver.copy(specs, nb, blocks, host, offs, to_host=True)
            out[name] = "not refused"
        except IndexError:
            out[name] = "IndexError"
        except ValueError:
            out[name] = "ValueError"
    return out


def run_layout(
    layout_name: str, device: str, *, layers: int, nb: int, bs: int, heads: int, dim: int,
    nblocks: int, repeat: int,
) -> dict[str, Any]:  # fmt: skip
    base, kv = make_kv(layout_name, layers, nb, bs, heads, dim, device)
    layout, storages = layout_of(kv, nb)
    path, why = choose(storages)
    report: dict[str, Any] = {"layout": layout_name, "device": device, "path": path, "why": why}
    if path == "torch":
        report["error"] = "no native path here"
        return report
    from collections import Counter

    counters: Counter[str] = Counter()
    native = NativeCopies(path, layout, storages, nb, counters)
    sb = layout.slice_bytes
    blocks = list(range(nb - 1, nb - 1 - 2 * nblocks, -2))  # scattered, descending
    offs = [i * sb for i in range(nblocks)]
    pinned = mmap.mmap(-1, nblocks * sb)  # as tierd's arena: an mmap, page-locked if GPU
    pageable = mmap.mmap(-1, nblocks * sb)
    total = nblocks * sb
    stream = native.current_stream()
    native.pin = False  # registration by hand: one buffer page-locked, the other not
    try:
        if native.gpu:
            report["registered"] = native.saver.register(pinned)
        # gather: native vs torch, bytes equal
        native.saver.wait(native.save(pinned, blocks, offs, stream))
        torch_runs(layout, storages, pageable, blocks, offs, to_host=True)
        report["gather_equal"] = pinned[:] == pageable[:]
        report["copies_per_call"] = native.saver.last_copies
        report["batch_api"] = bool(native.saver.batch_api)
        # scatter into zeroed blocks, compare with the original
        want = base.clone()
        bdim = BLOCK_DIM[layout_name] + 1  # base has the layer dim in front
        idx = torch.tensor(blocks, device=device)
        base.index_fill_(bdim, idx, 0)
        zeroed = not torch.equal(base, want)
        native.load(pinned, blocks, offs, stream)
        _sync(base.device)
        report["scatter_equal"] = zeroed and bool(torch.equal(base, want))
        report["refusals"] = _refusals(native, pinned, nb, sb)
        gbps = report.setdefault("gbps", {})

        def gather(buf: Any) -> None:
            native.saver.wait(native.save(buf, blocks, offs, stream))

        def scatter(buf: Any) -> None:
            native.load(buf, blocks, offs, stream)

        def rate(fn: Callable[[], object]) -> float:
            return total / _best(repeat, fn) / 1e9

        gbps["native_gather"] = rate(lambda: gather(pinned))
        gbps["native_scatter"] = rate(lambda: scatter(pinned))
        if native.gpu:
            gbps["native_pageable_gather"] = rate(lambda: gather(pageable))
            gbps["native_pageable_scatter"] = rate(lambda: scatter(pageable))
        args = (layout, storages, pageable, blocks, offs)
        gbps["torch_runs_gather"] = rate(lambda: torch_runs(*args, to_host=True))
        gbps["torch_runs_scatter"] = rate(lambda: torch_runs(*args, to_host=False))
        if native.gpu:
            gbps["torch_index_select_gather"] = _index_select_gbps(kv, layout_name, idx, repeat)
    finally:
        native.close()
    report["ok"] = bool(
        report.get("gather_equal") and report.get("scatter_equal")
        and all(v in ("IndexError", "ValueError") for v in report["refusals"].values())
        and report["refusals"]["block_out_of_range"] == "IndexError"
        and report["refusals"]["run_past_buffer"] == "IndexError"
        and report["refusals"]["slice_past_host"] == "IndexError"
    )  # fmt: skip
    return report


def _index_select_gbps(
    kv: dict[str, torch.Tensor], layout_name: str, idx: torch.Tensor, repeat: int
) -> float:
    bdim = BLOCK_DIM[layout_name]
    parts = [torch.index_select(t, bdim, idx) for t in kv.values()]
    outs = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in parts]
    total = float(sum(p.numel() * p.element_size() for p in parts))

    def run() -> None:
        for t, o in zip(kv.values(), outs, strict=True):
            o.copy_(torch.index_select(t, bdim, idx), non_blocking=True)
        torch.cuda.synchronize()

    return float(total / _best(repeat, run) / 1e9)
