"""Approximate-mode blocks: canonical rendering and the chained hash definition. Every test
runs twice: with the ASCII fast path (`router.accel.hash_blocks`) in C and in pure Python."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
import xxhash

from router.blocks import chain_seed, estimate_tokens, hash_blocks, render_chat, render_prompt
from tests.unit.accel_impls import IMPLS, use_accel


@pytest.fixture(scope="module", params=IMPLS, autouse=True)
def accel_impl(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    yield from use_accel(request.param)


def test_hash_chain_definition() -> None:
    seed = chain_seed("m")
    text = "a" * 10 + "b" * 10 + "c" * 5
    h0 = xxhash.xxh3_64_intdigest(b"a" * 10, seed)
    h1 = xxhash.xxh3_64_intdigest(b"b" * 10, h0)  # each hash seeds the next
    assert hash_blocks(text, seed=seed, block_chars=10) == [h0, h1]
    assert hash_blocks("short", seed=seed, block_chars=10) == []
    assert hash_blocks("", seed=seed) == []


def test_shared_prefix_shares_hashes_and_seed_separates() -> None:
    seed = chain_seed("m")
    a = hash_blocks("x" * 300 + "tail one", seed=seed, block_chars=100)
    b = hash_blocks("x" * 300 + "other tail", seed=seed, block_chars=100)
    assert a == b  # both are 3 full blocks of x; tails are partial
    c = hash_blocks("x" * 100 + "y" * 200, seed=seed, block_chars=100)
    assert c[0] == a[0] and c[1:] != a[1:]
    assert hash_blocks("x" * 100, seed=chain_seed("m", "salt"), block_chars=100) != a[:1]
    assert chain_seed("m") != chain_seed("n")


def test_non_ascii_cut_on_characters() -> None:
    seed = chain_seed("m")
    text = "é" * 25
    hashes = hash_blocks(text, seed=seed, block_chars=10)
    assert len(hashes) == 2
    h0 = xxhash.xxh3_64_intdigest(("é" * 10).encode(), seed)
    assert hashes == [h0, xxhash.xxh3_64_intdigest(("é" * 10).encode(), h0)]


def test_ascii_and_non_ascii_paths_agree_on_the_chain_and_on_bad_seeds() -> None:
    seed = chain_seed("m")
    ascii_text = "ab" * 40 + "c"
    chain = hash_blocks(ascii_text, seed=seed, block_chars=16)
    h, want = seed, []
    for i in range(5):  # the definition, block by block
        h = xxhash.xxh3_64_intdigest(ascii_text[i * 16 : (i + 1) * 16].encode(), h)
        want.append(h)
    assert chain == want
    for text in (ascii_text, "é" * 40):
        for bad in (-1, 1 << 64):
            with pytest.raises(OverflowError):
                hash_blocks(text, seed=bad, block_chars=16)
        with pytest.raises(ValueError):
            hash_blocks(text, seed=seed, block_chars=0)


def test_render_chat_is_canonical_and_role_aware() -> None:
    msgs = [{"role": "system", "content": "world"}, {"role": "user", "content": "hi"}]
    assert render_chat(msgs) == "<|system|>world\n<|user|>hi\n"
    swapped = [{"role": "user", "content": "world"}, {"role": "user", "content": "hi"}]
    assert render_chat(swapped) != render_chat(msgs)
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}
    ]
    assert render_chat(parts) == "<|user|>hi\n"
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert render_chat(msgs, tools).startswith("<|tools|>")


def test_render_prompt_and_estimate() -> None:
    assert render_prompt("abc") == "abc"
    assert render_prompt(["abc"]) == "abc"
    assert render_prompt([1, 2, 3]) == "1 2 3"
    assert estimate_tokens("abcde") == 2
    assert estimate_tokens("") == 0
