"""The gateway's local tokenizer (gateway.pipeline.hf_tokenizer) on a tokenizer directory made here:
the chat template rendered as transformers renders it, the text encoded as vLLM encodes it,
and every request shape it cannot reproduce refused (so the gateway asks an engine).
Its agreement with a real vLLM engine's /tokenize is tests/integration/test_vllm_tokenizer.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from tokenizers import Tokenizer

from gateway.config.settings import PreciseSettings
from gateway.pipeline.hf_tokenizer import (
    THREAD_THRESHOLD_CHARS,
    HfChatTokenizer,
    LocalTokenizeUnsupported,
)
from tests.support.hf_tokenizer_dir import build, whole_ids


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tok"))


async def test_chat_renders_the_template_and_encodes_without_adding_specials(
    directory: Path,
) -> None:
    tok = HfChatTokenizer(directory)
    parts = [{"type": "text", "text": "Hi"}, {"type": "text", "text": "forge?"}]
    payload = {
        "messages": [
            {"role": "system", "content": "You are Maren."},
            {"role": "user", "content": parts},
        ],
        "add_generation_prompt": True,
    }
    text = (
        "<|im_start|>system\nYou are Maren.<|im_end|>\n"
        "<|im_start|>user\nHi\nforge?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.render(payload) == text
    ids = await tok(payload)
    assert list(ids) == whole_ids(directory, text, special=False)
    im_start = Tokenizer.from_file(str(directory / "tokenizer.json")).token_to_id("<|im_start|>")
    assert ids[0] == im_start and list(ids).count(im_start) == 3  # one id, not its characters
    no_prompt = tok.render({**payload, "add_generation_prompt": False})
    assert no_prompt == text.removesuffix("<|im_start|>assistant\n")


async def test_a_text_prompt_is_encoded_with_the_tokenizers_specials(directory: Path) -> None:
    tok = HfChatTokenizer(directory)
    prompt = "Where is the old forge?"
    assert list(await tok({"prompt": prompt})) == whole_ids(directory, prompt, special=True)


async def test_long_texts_encode_alike_off_the_loop(directory: Path) -> None:
    tok = HfChatTokenizer(directory)
    prompt = "The harbor is frozen. " * (THREAD_THRESHOLD_CHARS // 10)
    assert len(prompt) > THREAD_THRESHOLD_CHARS
    assert list(await tok({"prompt": prompt})) == whole_ids(directory, prompt, special=True)


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
        [{"type": "text", "text": "hi"}, "not a part"],
        {"text": "an object"},
    ],
)
async def test_content_it_cannot_reproduce_is_refused(directory: Path, content: object) -> None:
    tok = HfChatTokenizer(directory)
    with pytest.raises(LocalTokenizeUnsupported):
        await tok({"messages": [{"role": "user", "content": content}]})
    with pytest.raises(LocalTokenizeUnsupported):
        await tok({"prompt": ["two", "prompts"]})


async def test_template_features_transformers_provides(tmp_path: Path) -> None:
    template = (
        "{% if messages[0]['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
        "{{ eos_token }}|{{ pad_token }}|{{ tools | tojson }}|{{ messages | length }}"
    )
    tok = HfChatTokenizer(build(tmp_path / "t", template=template))
    tools = [{"type": "function", "function": {"name": "<b>find</b>", "description": "é"}}]
    rendered = tok.render({"messages": [{"role": "user", "content": "x"}], "tools": tools})
    # the special tokens as variables (an AddedToken dict too); JSON without HTML or ASCII
    # escapes, as transformers' tojson writes it
    assert rendered == (
        '<|im_end|>|<|endoftext|>|[{"type": "function", "function": {"name": "<b>find</b>", '
        '"description": "é"}}]|1'
    )
    with pytest.raises(LocalTokenizeUnsupported, match="no tools here"):
        tok.render({"messages": [{"role": "tool", "content": "x"}]})


async def test_chat_template_jinja_wins_and_no_template_is_refused(tmp_path: Path) -> None:
    directory = build(tmp_path / "j")
    (directory / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    assert HfChatTokenizer(directory).render({"messages": [{"content": "hey"}]}) == "hey!"
    bare = HfChatTokenizer(build(tmp_path / "none", template=None))
    with pytest.raises(LocalTokenizeUnsupported, match="no chat template"):
        await bare({"messages": [{"role": "user", "content": "x"}]})
    assert list(await bare({"prompt": "forge"})) == whole_ids(directory, "forge", special=True)


def test_a_directory_without_tokenizer_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no tokenizer\.json"):
        HfChatTokenizer(tmp_path)


def test_one_local_tokenizer_at_a_time() -> None:
    with pytest.raises(ValidationError, match="not both"):
        PreciseSettings(tokenizer="pkg:factory", tokenizer_dir="/models/tiny")
