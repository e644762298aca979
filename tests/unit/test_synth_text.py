"""Text synthesised for Mooncake traces reproduces their prefix sharing, block for block."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from bench.synth_text import BlockTextSynth, mooncake_items
from router.blocks import chain_seed, hash_blocks
from sim.tokenizer import Tokenizer

# The real Mooncake trace, committed (bench/data/traces/README.md says whence); its first 40 lines.
TRACE = Path(__file__).resolve().parents[2] / "bench/data/traces/mooncake_conversation.jsonl"


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_blocks_have_exact_size_and_equal_ids_equal_text() -> None:
    synth = BlockTextSynth(block_tokens=16, seed=3)
    a = synth.block_text(7, parent_id=2)
    assert len(a) == 64
    assert synth.block_text(7, parent_id=2) == a
    assert BlockTextSynth(block_tokens=16, seed=3).block_text(7, parent_id=2) == a
    assert synth.block_text(8, parent_id=2) != a
    assert synth.block_text(7, parent_id=3) != a
    assert BlockTextSynth(block_tokens=16, seed=4).block_text(7, parent_id=2) != a


@pytest.mark.parametrize("shared", [0, 1, 3, 5])
def test_shared_ids_give_exactly_the_shared_prefix(shared: int) -> None:
    synth = BlockTextSynth(block_tokens=64, seed=0)  # 256 chars a block
    ids_a = [*range(shared), 100, 101]
    ids_b = [*range(shared), 200, 201, 202]
    a = synth.prompt(ids_a, input_tokens=64 * len(ids_a))
    b = synth.prompt(ids_b, input_tokens=64 * len(ids_b) - 10)  # last block partial
    assert len(a) == 256 * len(ids_a)
    assert len(b) == 4 * (64 * len(ids_b) - 10)
    # Distinct blocks part within their leading 7-letter tag (equal by chance at most).
    assert 256 * shared <= _common_prefix(a, b) < 256 * shared + 8


def test_gateway_block_hashes_share_exactly_the_shared_blocks() -> None:
    synth = BlockTextSynth(block_tokens=512, seed=1)  # Mooncake blocks: 2048 chars = 8 x 256
    seed = chain_seed("m")
    a = hash_blocks(synth.prompt([0, 1, 2, 9], 2048), seed=seed)
    b = hash_blocks(synth.prompt([0, 1, 2, 7, 8], 2560), seed=seed)
    shared = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        shared += 1
    assert shared == 3 * 8


def test_prompt_pads_when_ids_cover_too_few_tokens() -> None:
    synth = BlockTextSynth(block_tokens=8, seed=0)
    text = synth.prompt([5], input_tokens=20)
    assert len(text) == 80
    assert text.startswith(synth.block_text(5))


def test_invalid_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        BlockTextSynth(block_tokens=1)


def test_blocks_are_exactly_block_tokens_of_the_sim_tokenizer() -> None:
    tok = Tokenizer()
    synth = BlockTextSynth(block_tokens=512, seed=2)
    for block_id in range(20):
        assert len(tok.encode(synth.block_text(block_id, parent_id=block_id - 1))) == 512
    prompt = synth.prompt(list(range(7)), input_tokens=3000)
    assert len(tok.encode(prompt)) == 3000
    # Token boundaries fall on block boundaries: a prefix of blocks is a prefix of tokens.
    head = synth.prompt(list(range(3)), input_tokens=3 * 512)
    assert tok.encode(prompt)[: 3 * 512] == tok.encode(head)


def test_mooncake_items_from_the_real_trace() -> None:
    if not TRACE.exists():
        pytest.fail(f"trace missing: {TRACE}")
    with TRACE.open(encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in itertools.islice(f, 40)]
    items = mooncake_items(lines, block_tokens=512, max_output_tokens=64)
    rows = [json.loads(line) for line in lines]
    assert len(items) == 40
    for item, row in zip(items, rows, strict=True):
        assert item.at_s == row["timestamp"] / 1000.0
        assert item.max_tokens == min(64, row["output_length"])
        assert len(item.messages[0]["content"]) == 4 * row["input_length"]
    # Every Mooncake request starts with block 0: all prompts share its 2048 characters.
    first = items[0].messages[0]["content"][:2048]
    assert all(it.messages[0]["content"].startswith(first) for it in items)
    assert len(mooncake_items(lines, limit=5)) == 5
