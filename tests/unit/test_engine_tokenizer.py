"""sim.tokenizer: stable ids, about four characters a token, ChatML template."""

from __future__ import annotations

from typing import Any

from sim.tokenizer import IM_END, IM_START, SPECIAL_TOKENS, Tokenizer, render_chat, split_pieces

TEXT = (
    "The old blacksmith of Rivermoor remembers every sword she ever forged, "
    "and 1,024 of them still hang in the northern keep!"
)


def test_same_text_same_ids_across_instances() -> None:
    assert Tokenizer().encode(TEXT) == Tokenizer().encode(TEXT)


def test_roughly_four_characters_a_token() -> None:
    n = len(Tokenizer().encode(TEXT * 20))
    chars_per_token = len(TEXT * 20) / n
    assert 2.5 <= chars_per_token <= 5.0, chars_per_token


def test_pieces_rebuild_the_text_and_decode_round_trips() -> None:
    assert "".join(split_pieces(TEXT)) == TEXT
    tok = Tokenizer()
    assert tok.decode(tok.encode(TEXT)) == TEXT


def test_long_words_are_cut_and_prefixes_share_ids() -> None:
    tok = Tokenizer()
    assert split_pieces(" blacksmith") == [" black", "smith"]
    head = tok.encode("The tavern keeper said")
    a, b = tok.encode("The tavern keeper said hello"), tok.encode("The tavern keeper said goodbye")
    assert a[: len(head)] == head == b[: len(head)]
    assert a != b


def test_special_tokens_have_fixed_ids() -> None:
    ids = Tokenizer().encode(f"{IM_START}user\nhi{IM_END}")
    assert ids[0] == SPECIAL_TOKENS[IM_START]
    assert ids[-1] == SPECIAL_TOKENS[IM_END]
    assert all(0 <= t < 151_646 for t in ids)


def test_chat_template_renders_roles_and_generation_prompt() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a guard."},
        {"role": "user", "content": [{"type": "text", "text": "Open the gate."}]},
    ]
    text = render_chat(messages)
    assert text == (
        f"{IM_START}system\nYou are a guard.{IM_END}\n"
        f"{IM_START}user\nOpen the gate.{IM_END}\n"
        f"{IM_START}assistant\n"
    )
    assert not render_chat(messages, add_generation_prompt=False).endswith("assistant\n")
    tools = [{"type": "function", "function": {"name": "open_gate"}}]
    assert "open_gate" in render_chat(messages, tools=tools)
    tok = Tokenizer()
    assert tok.encode_chat(messages) == tok.encode(text)
