"""The connector's pure parts: where a block lies in KV tensors, and what to load and save."""

from __future__ import annotations

import hashlib

import pytest

from tierd.connector import plan as P
from tierd.connector.layout import BlockLayout, layer_runs


def strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out = [1]
    for n in reversed(shape[1:]):
        out.insert(0, out[0] * n)
    return tuple(out)


def test_cpu_layout_is_one_run_per_block_per_layer() -> None:
    shape = (682, 4, 128, 128)  # vLLM CPU: blocks, kv heads, block size, 2 * head dim
    r = layer_runs(shape, strides(shape), 4, 0, 682)
    assert r.starts == (0,)
    assert r.run_bytes == 4 * 128 * 128 * 4
    assert r.block_stride == r.run_bytes


def test_flash_attention_layout_is_k_then_v() -> None:
    shape = (2, 100, 16, 8, 64)  # K/V, blocks, block size, kv heads, head dim
    r = layer_runs(shape, strides(shape), 2, 10, 100)
    per_block = 16 * 8 * 64
    assert r.starts == (10 * 2, (10 + 100 * per_block) * 2)
    assert r.run_bytes == per_block * 2
    assert r.block_stride == per_block * 2


def test_a_layout_not_dense_below_the_block_dim_is_refused() -> None:
    with pytest.raises(ValueError, match="dense"):
        layer_runs((10, 4, 8), (64, 1, 8), 4, 0, 10)  # a gap between the 4s
    with pytest.raises(ValueError, match="blocks"):
        layer_runs((3, 4), (4, 1), 4, 0, 10)
    with pytest.raises(ValueError, match="overlapping"):
        layer_runs((10, 4, 8), (16, 8, 1), 4, 0, 10)  # blocks 32 elements wide, 16 apart


def test_a_permuted_dense_view_is_one_run() -> None:
    """vLLM 0.32: logical (blocks, heads, block size, 2*head dim) over NHD memory
    (blocks, block size, heads, 2*head dim): the block's bytes are still one run."""
    nb, bs, h, c = 50, 16, 8, 256
    phys = strides((nb, bs, h, c))
    r = layer_runs((nb, h, bs, c), (phys[0], phys[2], phys[1], phys[3]), 2, 0, nb)
    assert r.starts == (0,)
    assert r.run_bytes == bs * h * c * 2 == r.block_stride


def test_an_outer_dimension_by_stride_gives_one_run_per_index() -> None:
    """LHBNC: logical (blocks, heads, block size, C) over (heads, blocks, block size, C)."""
    nb, h, bs, c = 20, 4, 16, 128
    phys = strides((h, nb, bs, c))
    r = layer_runs((nb, h, bs, c), (phys[1], phys[0], phys[2], phys[3]), 2, 0, nb)
    assert r.starts == tuple(i * nb * bs * c * 2 for i in range(h))
    assert r.run_bytes == bs * c * 2 == r.block_stride


def test_copies_lay_layers_end_to_end_in_the_slice() -> None:
    shape = (10, 2, 4)
    layers = tuple(layer_runs(shape, strides(shape), 4, off, 10) for off in (0, 80))
    layout = BlockLayout(layers)
    assert layout.slice_bytes == 2 * 2 * 4 * 4
    eng, arena, sizes = layout.copies([3, 7], [1000, 2000])[0]
    assert eng == [3 * 32, 80 * 4 + 3 * 32, 7 * 32, 80 * 4 + 7 * 32]
    assert arena == [1000, 1032, 2000, 2032]
    assert sizes == [32] * 4


def test_block_key_is_the_low_64_bits_like_vllm_events() -> None:
    digest = hashlib.sha256(b"x").digest()
    assert P.block_key(digest) == int.from_bytes(digest[-8:], "big")
    assert P.block_key(2**70 + 5) == 5


def test_lookup_window_leaves_one_token_and_starts_after_the_local_hit() -> None:
    assert P.lookup_window(3000, 0, 128) == (0, 23)
    assert P.lookup_window(3072, 0, 128) == (0, 23)  # 3071 tokens hold 23 full blocks
    assert P.lookup_window(3073, 0, 128) == (0, 24)
    assert P.lookup_window(3000, 1024, 128) == (8, 23)
    assert P.lookup_window(100, 0, 128) == (0, 0)


def test_saves_follow_chunked_prefill_and_decode() -> None:
    keys = list(range(100, 124))  # 24 full blocks of a 3100-token prompt
    plan = P.ReqPlan("r", local_blocks=2, ext_blocks=3, saved_upto=5)
    plan.block_ids = list(range(50, 75))
    first = P.due_saves(plan, keys, 2048, 128)  # first chunk ends at 2048 tokens
    assert [k for k, _, _ in first] == list(range(105, 116))
    assert first[0] == (105, 55, 104)
    second = P.due_saves(plan, keys, 3100, 128)  # the rest of the prompt
    assert [k for k, _, _ in second] == list(range(116, 124))
    assert P.due_saves(plan, keys, 3101, 128) == []  # a decode step completes no block
    keys.append(124)  # the block the decode steps fill gets its hash
    assert P.due_saves(plan, keys, 3200, 128) == [(124, 74, 123)]


def test_load_pairs_and_hit_sources() -> None:
    plan = P.ReqPlan("r", local_blocks=1, ext_blocks=3, tiers={"GPU": 1, "ARRAY": 2})
    assert P.load_pairs(plan, [9, 8, 7, 6, 5], [0, 1, 2, 3, 4], 3) == [(8, 1), (7, 2), (6, 3)]
    assert P.hit_sources(plan, 384, 128) == {"host": 128, "disk": 256}
    assert P.hit_sources(plan, 100, 128) == {"host": 100}


def test_a_waiting_requests_lookup_is_reused_only_for_its_window_and_while_fresh() -> None:
    memo = P.LookupMemo(0.5)
    memo.put("r", P.LookupAnswer((2, 9), 5, {"GPU": 5}, asked_at_s=10.0))
    assert memo.get("r", (2, 9), 10.4) == P.LookupAnswer((2, 9), 5, {"GPU": 5}, 10.0)
    assert memo.get("r", (2, 9), 10.5) is None  # stale: ask tierd again
    assert memo.get("r", (3, 9), 10.1) is None  # vLLM's own cache moved: another window
    assert memo.get("other", (2, 9), 10.1) is None
    memo.drop("r")
    assert memo.get("r", (2, 9), 10.1) is None and len(memo) == 0


def test_no_lookup_reuse_asks_every_time_and_a_negative_one_is_refused() -> None:
    memo = P.LookupMemo(0)
    memo.put("r", P.LookupAnswer((0, 4), 4, {}, asked_at_s=1.0))
    assert memo.get("r", (0, 4), 1.0) is None and len(memo) == 0
    with pytest.raises(P.LookupReuseError, match=">= 0"):
        P.LookupMemo(-1)
