"""Deterministic output text: what the simulated model "says".

How it works: a `random.Random` seeded by (engine seed, request seed, prompt token ids)
strings words from a small NPC-flavoured vocabulary into sentences; each word is cut into
token pieces by `sim.tokenizer`, and one piece is produced per decode step. The same prompt
gives the same text on every run and every instance. The model's "natural" answer length
(where it would emit end-of-sequence) is drawn from the same generator, between
`min_natural` and `max_natural` tokens.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence

import xxhash

from sim.tokenizer import piece_id, split_pieces

_VOCABULARY = (
    "the a an old young brave quiet wise dark bright ancient northern hidden broken "
    "traveler stranger friend guard merchant captain priest hunter blacksmith queen king "
    "village road forest river tower gate tavern market keep harbor mountain valley "
    "sword shield lantern map letter coin potion key relic bread ale storm fire frost "
    "is was will must could should might has had sees knows remembers waits watches "
    "walks speaks trades guards hides returns seeks finds keeps loses follows "
    "of in on at by with from beyond under near over through before after "
    "tonight tomorrow again soon still never always perhaps truly"
)
_WORDS: tuple[str, ...] = tuple(_VOCABULARY.split())
_ENDINGS = (".", ".", ".", "!", "?")


class TextGenerator:
    """Yields (piece, token id) one decode step at a time."""

    def __init__(
        self,
        prompt_ids: Sequence[int],
        seed: int = 0,
        request_seed: int | None = None,
        min_natural: int = 16,
        max_natural: int = 256,
    ):
        h = xxhash.xxh3_64()
        h.update(seed.to_bytes(8, "little", signed=True))
        h.update((request_seed or 0).to_bytes(8, "little", signed=True))
        h.update(b"".join(t.to_bytes(4, "little") for t in prompt_ids))
        self._rng = random.Random(h.intdigest())
        self.natural_tokens = self._rng.randint(min_natural, max_natural)
        self._pending: deque[str] = deque()
        self._words_in_sentence = 0
        self._sentence_len = self._rng.randint(5, 14)

    def _next_word(self) -> str:
        if self._words_in_sentence >= self._sentence_len:
            self._words_in_sentence = 0
            self._sentence_len = self._rng.randint(5, 14)
            return self._rng.choice(_ENDINGS)
        word = self._rng.choice(_WORDS)
        if self._words_in_sentence == 0:
            word = word.capitalize()
        self._words_in_sentence += 1
        return " " + word

    def next_piece(self) -> tuple[str, int]:
        while not self._pending:
            self._pending.extend(split_pieces(self._next_word()))
        piece = self._pending.popleft()
        return piece, piece_id(piece)
