"""tierd.native.BlockCopier, host backend, both implementations (C extension and pure-Python
fallback): gathers KV blocks of every layout the connector meets out of engine-owned buffers
(numpy arrays here, given by raw pointer like torch's data_ptr()) into host slices and back,
byte-exactly, and refuses bad input with the right exception before a byte moves. The same
code path serves the GPU backends (only the final copies differ); torch-made tensors go
through it in tests/integration/test_connector_device_check.py."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest

from tests.unit.native_impls import impl
from tierd.connector.layout import BlockLayout, layer_runs

__all__ = ["impl"]

NB, HEADS, DIM, LAYERS = 24, 2, 16, 3


def phys_and_view(layout: str, bs: int) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """Physical per-layer shape, and the axis order of the logical view (None: itself)."""
    return {
        "cpu": ((NB, HEADS, bs, 2 * DIM), None),
        "flash_attn": ((2, NB, bs, HEADS, DIM), None),
        "flashinfer": ((NB, 2, HEADS, bs, DIM), None),
        "nhd_view": ((NB, bs, HEADS, 2 * DIM), (0, 2, 1, 3)),
    }[layout]


def make_kv(layout: str, bs: int) -> tuple[np.ndarray, list[np.ndarray], BlockLayout, list[Any]]:
    """One buffer holding every layer (as vLLM allocates), the layer views, the block
    layout the connector derives from them, and BlockCopier's layer specs."""
    phys, order = phys_and_view(layout, bs)
    rng = np.random.default_rng(7)
    base = rng.integers(0, 2**16, size=(LAYERS, *phys), dtype=np.uint16)
    views = [base[i] if order is None else base[i].transpose(order) for i in range(LAYERS)]
    item = base.itemsize
    addr = base.ctypes.data
    runs = []
    for v in views:
        offset = (v.ctypes.data - addr) // item
        strides = tuple(s // item for s in v.strides)
        runs.append(layer_runs(v.shape, strides, item, offset, NB))
    specs = [(addr, base.nbytes, list(r.starts), r.block_stride, r.run_bytes) for r in runs]
    return base, views, BlockLayout(tuple(runs)), specs


def block_bytes(views: list[np.ndarray], layout: str, b: int) -> bytes:
    """The slice a block must become: per layer, its runs in order (K then V when split)."""
    out = b""
    for v in views:
        if layout == "flash_attn":
            out += v[0, b].tobytes() + v[1, b].tobytes()
        else:  # one run: the block's bytes as they lie in memory
            phys = v if layout != "nhd_view" else v.transpose(0, 2, 1, 3)
            out += phys[b].tobytes()
    return out


LAYOUT_BS = [("cpu", 128), ("flash_attn", 16), ("flashinfer", 16), ("nhd_view", 16)]


@pytest.mark.parametrize(("layout", "bs"), LAYOUT_BS)
def test_gather_then_scatter_round_trips_byte_exactly(
    impl: ModuleType,
    layout: str,
    bs: int,
) -> None:
    base, views, bl, specs = make_kv(layout, bs)
    blocks = [5, 0, 23, 11]
    sb = bl.slice_bytes
    host = bytearray(len(blocks) * sb + 64)
    offs = [64 + i * sb for i in range(len(blocks))][::-1]  # not in block order
    c = impl.BlockCopier()
    ticket = c.copy(specs, NB, blocks, host, offs, to_host=True)
    assert c.done(ticket)
    c.wait(ticket)
    for b, off in zip(blocks, offs, strict=True):
        assert bytes(host[off : off + sb]) == block_bytes(views, layout, b)
    assert c.last_bytes == len(blocks) * sb
    want = base.copy()
    base[:] = 0
    c.copy(specs, NB, blocks, host, offs, to_host=False)
    for b in blocks:
        assert block_bytes(views, layout, b) == block_bytes(
            [w if layout != "nhd_view" else w.transpose(0, 2, 1, 3) for w in want], layout, b
        )
    for b in (b for b in range(NB) if b not in blocks):  # zeroed above, and not loaded into
        assert not any(block_bytes(views, layout, b))
    c.close()
    assert c.backend == "closed"


def test_contiguous_runs_are_merged_into_one_copy(impl: ModuleType) -> None:
    specs = make_kv("cpu", 128)[3]
    one = [specs[0]]  # one layer: consecutive blocks to consecutive slices are one run
    sb = specs[0][4]
    host = bytearray(4 * sb)
    c = impl.BlockCopier()
    c.copy(one, NB, [4, 5, 6, 7], host, [0, sb, 2 * sb, 3 * sb], to_host=True)
    assert c.last_copies == 1
    c.copy(specs, NB, [4], host, [0], to_host=True)
    assert c.last_copies == LAYERS  # layers are apart in the buffer


def _refusal(impl: ModuleType, **change: Any) -> None:
    base, _, bl, specs = make_kv("flash_attn", 16)
    host = bytearray(2 * bl.slice_bytes)
    args: dict[str, Any] = {
        "layers": specs, "num_blocks": NB, "block_ids": [1, 2], "host": host,
        "host_offsets": [0, bl.slice_bytes], "to_host": True,
    }  # fmt: skip
    args.update(change)
    before = bytes(host), base.tobytes()
    c = impl.BlockCopier()
    try:
        c.copy(**args)
    finally:
        assert (bytes(host), base.tobytes()) == before  # nothing moved


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        ({"block_ids": [1, NB]}, IndexError, "block id 24 is out of range"),
        ({"block_ids": [-1, 2]}, ValueError, "negative"),
        ({"host_offsets": [0, 1]}, ValueError, "overlap"),
        ({"host_offsets": [0, 10**6]}, IndexError, "host"),
        ({"host_offsets": [0]}, ValueError, "differ in length"),
        ({"num_blocks": -1}, ValueError, "num_blocks"),
        ({"host": bytes(10**6)}, TypeError, "writable"),
        ({"host": 5}, TypeError, "buffer"),
        ({"block_ids": [1, "x"]}, TypeError, "int"),
    ],
)
def test_bad_input_is_refused_before_a_byte_moves(
    impl: ModuleType,
    change: dict[str, Any],
    exc: type[Exception],
    match: str,
) -> None:
    with pytest.raises(exc, match=match):
        _refusal(impl, **change)


def test_a_run_past_the_kv_buffer_is_refused(impl: ModuleType) -> None:
    """Here block NB-1's V run would end past a KV buffer said to be a byte shorter: the
    sizes given are the bounds, whatever the pointer."""
    _, _, _, specs = make_kv("flash_attn", 16)
    short = [(p, n - 1, s, st, r) for p, n, s, st, r in specs]
    with pytest.raises(IndexError, match="past the KV buffer"):
        _refusal(impl, layers=short, block_ids=[NB - 1, 0])


def test_a_block_twice_in_a_load_is_refused(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="overlap"):
        _refusal(impl, block_ids=[3, 3], to_host=False)


@pytest.mark.parametrize(
    "layer",
    [
        (1, 2, [0], 4),  # four fields
        [1, 2, [0], 4, 4],  # a list, not a tuple
    ],
)
def test_malformed_layers_are_type_errors(impl: ModuleType, layer: Any) -> None:
    with pytest.raises(TypeError, match="layer 0"):
        _refusal(impl, layers=[layer])


def test_zero_sizes_and_null_pointers_are_refused(impl: ModuleType) -> None:
    for bad in [(0, 100, [0], 4, 4), (8, 100, [0], 0, 4), (8, 100, [0], 4, 0), (8, 100, [], 4, 4)]:
        with pytest.raises(ValueError, match="non-zero"):
            _refusal(impl, layers=[bad])


def test_backends_and_tickets(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        impl.BlockCopier("metal")
    with pytest.raises(ValueError, match="device"):
        impl.BlockCopier(device=-1)
    c = impl.BlockCopier("host")
    assert c.backend == "host" and c.device == 0
    assert c.register(bytearray(4096)) is False  # host memory needs no page-locking
    with pytest.raises(ValueError, match="ticket"):
        c.wait(1)
    c.close()
    with pytest.raises(ValueError, match="closed"):
        c.copy([], 0, [], bytearray(1), [], to_host=True)


def test_gpu_backend_without_a_device_says_why(impl: ModuleType) -> None:
    import tierd.native as native

    row = native.backends()["cuda"] if impl.IMPLEMENTATION == "c" else {"usable": False}
    if row["usable"]:
        pytest.skip("a CUDA device is present: the device check covers it")
    with pytest.raises(RuntimeError, match="cuda backend not usable"):
        impl.BlockCopier("cuda")
