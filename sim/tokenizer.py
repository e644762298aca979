"""A deterministic stand-in tokenizer with a ChatML chat template (Qwen2.5's layout).

How it works: text is cut by a GPT-2-style regex into pieces (an optional leading space plus
a run of letters, a digit, a run of punctuation, or whitespace); letter runs longer than
five characters are cut into five-letter chunks, which gives roughly four characters a
token on English text, like a BPE vocabulary. Each piece maps to a stable id: the special
tokens have Qwen2.5's ids, every other piece `256 + xxh3_64(piece) mod (151643 - 256)`, so
the same text always gives the same ids in every process. Decoding is the concatenation of
pieces, which the tokenizer remembers for every id it produced (hash collisions aside,
`decode(encode(t)) == t`).

The chat template renders `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message (tools as
a system block first) and, with `add_generation_prompt`, a trailing `<|im_start|>assistant\\n`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from router.blocks import content_text

VOCAB_SIZE = 151_643
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
SPECIAL_TOKENS: dict[str, int] = {END_OF_TEXT: 151_643, IM_START: 151_644, IM_END: 151_645}
_FIRST_ID = 256  # ids below are left free, as byte-level vocabularies reserve them
_SPAN = VOCAB_SIZE - _FIRST_ID
_MAX_LETTERS = 5
_MEMO_LIMIT = 500_000

_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")
# A letter run is cut into chunks of up to _MAX_LETTERS letters, the first with its space.
_PIECE_RE = re.compile(rf" ?[^\W\d_]{{1,{_MAX_LETTERS}}}| ?\d| ?[^\s\w]+|\s+(?!\S)|\s+", re.UNICODE)


def piece_id(piece: str) -> int:
    """The stable id of one ordinary piece."""
    special = SPECIAL_TOKENS.get(piece)
    if special is not None:
        return special
    return _FIRST_ID + xxhash.xxh3_64_intdigest(piece.encode()) % _SPAN


def split_pieces(text: str) -> list[str]:
    """Cut `text` into token pieces (special tokens kept whole)."""
    pieces: list[str] = []
    for part in _SPECIAL_RE.split(text):
        if part in SPECIAL_TOKENS:
            pieces.append(part)
        elif part:
            pieces.extend(_PIECE_RE.findall(part))
    return pieces


def render_chat(
    messages: Iterable[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The ChatML text of a conversation, as Qwen2.5's template lays it out."""
    parts: list[str] = []
    if tools:
        tools_json = json.dumps(list(tools), sort_keys=True, separators=(",", ":"))
        parts.append(f"{IM_START}system\n# Tools\n{tools_json}{IM_END}\n")
    for message in messages:
        role = str(message.get("role", "user"))
        body = content_text(message.get("content"))
        tool_calls = message.get("tool_calls")
        if tool_calls:
            body += "\n" + json.dumps(tool_calls, sort_keys=True, separators=(",", ":"))
        parts.append(f"{IM_START}{role}\n{body}{IM_END}\n")
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


@dataclass
class Tokenizer:
    """Encodes text to stable ids and decodes ids it has produced."""

    _pieces: dict[int, str] = field(default_factory=dict)  # id -> piece (at most the vocab)
    _ids: dict[str, int] = field(default_factory=dict)  # piece -> id, a bounded memo

    def encode(self, text: str) -> list[int]:
        memo = self._ids
        if len(memo) > _MEMO_LIMIT:
            memo.clear()
        ids: list[int] = []
        append = ids.append
        for piece in split_pieces(text):
            tid = memo.get(piece)
            if tid is None:
                tid = memo[piece] = piece_id(piece)
                self._pieces.setdefault(tid, piece)
            append(tid)
        return ids

    def tokenize(self, text: str) -> list[tuple[int, str]]:
        """(id, piece) pairs of `text`."""
        return [(piece_id(p), p) for p in split_pieces(text)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ids; an id never produced by this tokenizer decodes to `<|id|>`."""
        return "".join(self._pieces.get(t, f"<|{t}|>") for t in ids)

    def encode_chat(
        self,
        messages: Iterable[Mapping[str, Any]],
        tools: Sequence[Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        return self.encode(render_chat(messages, tools, add_generation_prompt))
