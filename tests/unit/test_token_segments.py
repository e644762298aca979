"""A chat prompt encoded a message at a time (gateway.pipeline.token_segments): the ids equal
the whole prompt's ids for any dialogue, a dialogue's next turn encodes only its new lines,
the cache keeps to its bound, and only added tokens that cut exactly are cut at. The same
against a real vLLM engine's /tokenize: tests/integration/test_vllm_tokenizer.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.pipeline.hf_tokenizer import THREAD_THRESHOLD_CHARS, HfChatTokenizer
from gateway.pipeline.token_segments import (
    PIECE_OVERHEAD_TOKENS,
    SegmentCache,
    cut_pattern,
    pieces,
)
from tests.support.hf_tokenizer_dir import build, whole_ids


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tok"))


def _chat(*contents: str) -> dict[str, Any]:
    roles = ["system", *["user", "assistant"] * len(contents)][: len(contents)]
    return {
        "messages": [{"role": r, "content": c} for r, c in zip(roles, contents, strict=True)],
        "add_generation_prompt": True,
    }


LINE = st.lists(
    st.sampled_from([*"abc forge? \n\t.,'s 12 ÜΩ漢🗡", "<|im_end|>", "<|im_start|>"]),
    max_size=60,
).map("".join)


@settings(max_examples=150, deadline=None)
@given(dialogue=st.lists(LINE, min_size=1, max_size=6))
async def test_any_dialogue_encodes_to_the_whole_prompts_ids(
    directory: Path, dialogue: list[str]
) -> None:
    cached = HfChatTokenizer(directory, segment_cache_tokens=10_000)
    for turn in range(1, len(dialogue) + 1):  # each turn re-sends the ones before it
        payload = _chat(*dialogue[:turn])
        assert list(await cached(payload)) == whole_ids(
            directory, cached.render(payload), special=False
        )


async def test_the_next_turn_encodes_only_its_new_lines(directory: Path) -> None:
    tok = HfChatTokenizer(directory, segment_cache_tokens=10_000)
    world = "The blacksmith of Northwatch speaks briefly and remembers every traveler. " * 20
    first = _chat(world, "Where is the old forge?")
    await tok(first)
    assert tok.segments is not None
    encoded_first = tok.segments.encoded_tokens
    second = _chat(world, "Where is the old forge?", "Nobody knows.", "And the harbor?")
    ids = await tok(second)
    assert list(ids) == whole_ids(directory, tok.render(second), special=False)
    new = tok.segments.encoded_tokens - encoded_first
    # the world and the first line came from the cache; the two new lines and the
    # generation prompt were encoded (the first turn's generation prompt is now the
    # assistant's line, a new piece)
    assert tok.segments.hit_tokens >= len(
        whole_ids(directory, tok.render(_chat(world)), special=False)
    )
    assert 0 < new < len(ids) / 4


async def test_without_a_cache_the_prompt_is_encoded_whole(directory: Path) -> None:
    tok = HfChatTokenizer(directory)  # segment_cache_tokens defaults to 0 here
    assert tok.segments is None
    payload = _chat("You are Maren.", "Hi")
    assert list(await tok(payload)) == whole_ids(directory, tok.render(payload), special=False)


def test_the_cache_keeps_to_its_bound_and_a_prompt_over_it_still_encodes() -> None:
    # room for two 4-id pieces ("<s>a": one id a character) with their overhead
    cache = SegmentCache(re.compile(re.escape("<s>")), max_tokens=2 * (4 + PIECE_OVERHEAD_TOKENS))

    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    def ids_of(text: str) -> list[int]:
        parts, known, missing = cache.split(text)
        return cache.join(parts, known, {p: encode(p) for p in missing})

    for text in ["<s>a<s>b", "<s>a<s>c", "<s>a<s>b<s>c<s>d", "<s>" + "x" * 40 + "<s>e"]:
        assert ids_of(text) == encode(text)
        assert cache.held_tokens <= cache.max_tokens
    # the 43-id piece is over the bound, never kept; "<s>e" and the last kept piece stay
    assert cache.held_tokens == 2 * (4 + PIECE_OVERHEAD_TOKENS)
    _, known, missing = cache.split("<s>d<s>e")
    assert set(known) == {"<s>d", "<s>e"} and not missing
    # a hit evicted between its split and its join (another request's join) still joins
    parts, known, missing = cache.split("<s>e<s>f")
    assert "<s>e" in known and missing == ["<s>f"]
    ids_of("<s>g<s>h")  # evicts everything before it
    assert "<s>e" not in cache.split("<s>e")[1]
    assert cache.join(parts, known, {p: encode(p) for p in missing}) == encode("<s>e<s>f")


def test_pieces_join_back_and_cut_only_before_a_token() -> None:
    pattern = re.compile(re.escape("<|a|>"))
    for text in ["", "plain", "<|a|>", "x<|a|>y<|a|><|a|>z", "<|a|>start"]:
        parts = pieces(text, pattern)
        assert "".join(parts) == text
        assert all(p.startswith("<|a|>") for p in parts[1:])


def test_only_added_tokens_that_cut_exactly_are_cut_at() -> None:
    tokens: list[dict[str, Any]] = [
        {"content": "<|im_start|>"},
        {"content": "<|im_end|>", "normalized": False},
        {"content": "<lstrip>", "lstrip": True},  # takes the whitespace before it
        {"content": "<norm>", "normalized": True},  # matched after normalization
        {"content": "<word>", "single_word": True},  # depends on its neighbours
        {"content": "<in>"},
        {"content": "x<in>"},  # contains <in>: a match of it could start before the cut
        {"content": "[[b"},
        {"content": "a[["},  # ends with the beginning of [[b: "a[[b" matches a[[ first
    ]
    pattern = cut_pattern(tokens)
    assert pattern is not None
    text = " ".join(str(t["content"]) for t in tokens)
    assert {m.group(0) for m in pattern.finditer(text)} == {
        "<|im_start|>",
        "<|im_end|>",
        "x<in>",
        "a[[",
    }
    assert cut_pattern([{"content": "<lstrip>", "lstrip": True}]) is None


async def test_many_new_lines_are_encoded_off_the_event_loop(
    directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = HfChatTokenizer(directory, segment_cache_tokens=100_000)
    threads: list[int] = []
    original = tok._encode_pieces

    def recording(texts: Any) -> dict[str, list[int]]:
        import threading

        threads.append(threading.get_ident())
        return original(texts)

    monkeypatch.setattr(tok, "_encode_pieces", recording)
    import threading

    loop_thread = threading.get_ident()
    await tok(_chat("short"))
    long_line = "Where is the old forge? " * (THREAD_THRESHOLD_CHARS // 20)
    await tok(_chat("short", long_line))
    assert threads[0] == loop_thread and threads[1] != loop_thread
