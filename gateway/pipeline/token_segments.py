"""Token ids of a chat prompt, encoded one message at a time and remembered.

A game's prompts repeat: every turn of a dialogue re-sends the world state, the NPC's persona
and the dialogue so far, and only the newest lines are new. Encoding the whole rendered prompt
on every request costs the gateway about 0.8 µs a token (1 ms for a 1,300-token turn) on the
critical path; encoding only the text not seen before costs a few µs a line.

Why it is exact. A Hugging Face tokenizer first cuts the text at its added tokens (the chat
template's `<|im_start|>`, `<|im_end|>`, ...) and normalizes, pre-tokenizes and encodes each
piece between them on its own; no token spans an added token. So the ids of
`A + <|im_start|> + B` are the ids of `A` followed by those of `<|im_start|> + B`, and a prompt
cut just before each such token encodes to the same ids piece by piece as whole. That holds
for an added token matched as written: not normalized, not `single_word`, not `lstrip` (which
would take the whitespace before it, across the cut), and no other added token may contain it
or end inside it (a match of that one could start before the cut and run across it).
`cut_pattern` chooses those tokens; a tokenizer
without any is encoded whole, as before. tests/unit/test_token_segments.py checks the
equality against the real tokenizer files.

The cache is bounded by the tokens it holds (least recently used pieces go first); the event
loop is its only user, so it needs no lock.
"""

from __future__ import annotations

import itertools
import re
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

# what a kept piece costs beyond its ids, counted in tokens against the bound: its key, array
# and dict entry weigh about as much as 16 ids' worth of text and array, so many tiny pieces
# (a prompt full of added tokens) cannot hold far more memory than the bound suggests
PIECE_OVERHEAD_TOKENS = 16


def cut_pattern(added_tokens: Iterable[Mapping[str, Any]]) -> re.Pattern[str] | None:
    """The added tokens a prompt may be cut before (tokenizer.json's `added_tokens`), as one
    pattern; None when the tokenizer has none that cut exactly."""
    tokens = list(added_tokens)
    contents = [str(t["content"]) for t in tokens if t.get("content")]
    safe = [
        str(t["content"])
        for t in tokens
        if t.get("content")
        and not t.get("normalized", False)
        and not t.get("single_word", False)
        and not t.get("lstrip", False)
    ]
    safe = [c for c in safe if not any(_runs_into(other, c) for other in contents if other != c)]
    if not safe:
        return None
    return re.compile("|".join(re.escape(c) for c in sorted(set(safe), key=len, reverse=True)))


def _runs_into(other: str, token: str) -> bool:
    """Whether a match of `other` could cover the first character of `token` from before it:
    `other` contains `token`, or ends with a beginning of it."""
    return token in other or any(
        other.endswith(token[:k]) for k in range(1, min(len(other), len(token)))
    )


def pieces(text: str, pattern: re.Pattern[str]) -> list[str]:
    """`text` cut just before every match of `pattern` (the pieces join back to `text`)."""
    starts = [m.start() for m in pattern.finditer(text) if m.start() > 0]
    if not starts:
        return [text]
    bounds = [0, *starts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if a < b]


class SegmentCache:
    """Token ids of the pieces of prompts seen before, at most `max_tokens` of them (each piece
    counted with `PIECE_OVERHEAD_TOKENS` more)."""

    def __init__(self, pattern: re.Pattern[str], max_tokens: int) -> None:
        self.pattern = pattern
        self.max_tokens = max_tokens
        self._ids: OrderedDict[str, array[int]] = OrderedDict()
        self._held = 0
        self.hit_tokens = 0
        self.encoded_tokens = 0

    def split(self, text: str) -> tuple[list[str], dict[str, array[int]], list[str]]:
        """The pieces of `text`; the ids of those cached (held here, so a join after an await
        needs no piece to survive in the cache); the pieces to encode."""
        parts = pieces(text, self.pattern)
        known: dict[str, array[int]] = {}
        missing: list[str] = []
        for piece in dict.fromkeys(parts):
            ids = self._ids.get(piece)
            if ids is None:
                missing.append(piece)
            else:
                self._ids.move_to_end(piece)
                known[piece] = ids
        return parts, known, missing

    def join(
        self, parts: list[str], known: Mapping[str, array[int]], encoded: Mapping[str, list[int]]
    ) -> list[int]:
        """The ids of `parts` from `known` and `encoded` (the misses' ids, now kept)."""
        out: array[int] = array("i")
        for piece in parts:
            cached = known.get(piece)
            if cached is None:
                out.extend(encoded[piece])
            else:
                self.hit_tokens += len(cached)
                out.extend(cached)
        for piece, ids in encoded.items():
            self._keep(piece, ids)
            self.encoded_tokens += len(ids)
        return out.tolist()

    def _keep(self, piece: str, ids: list[int]) -> None:
        cost = len(ids) + PIECE_OVERHEAD_TOKENS
        if piece in self._ids or cost > self.max_tokens:
            return
        self._ids[piece] = array("i", ids)
        self._held += cost
        while self._held > self.max_tokens:
            _, old = self._ids.popitem(last=False)
            self._held -= len(old) + PIECE_OVERHEAD_TOKENS

    @property
    def held_tokens(self) -> int:
        """What the kept pieces count against the bound."""
        return self._held
