"""Deterministic prose of a given length in tokens (4 characters a token), from a small game
vocabulary: real words and sentences, so tokenizers and text-based routers see ordinary
text, while the same seed always gives the same characters."""

from __future__ import annotations

import random

CHARS_PER_TOKEN = 4

_VOCABULARY = (
    "the a of and to in on at by with from under over near beyond across through "
    "ancient old young wise bold quiet grim bright dark silver golden iron broken hidden "
    "sacred cursed wild frozen burning distant northern eastern royal humble loyal "
    "sword shield blade bow arrow helm cloak ring amulet potion scroll map key gate tower "
    "keep castle village market tavern forge temple shrine crypt cave forest river lake "
    "mountain valley bridge road harbor ship wagon caravan camp ruin wall field farm mill "
    "king queen knight guard merchant smith priest witch ranger thief bard hunter farmer "
    "captain soldier pilgrim stranger dragon wolf bear raven serpent giant goblin spirit "
    "gold coin debt price trade bargain rumor secret promise oath quest task reward "
    "danger storm winter harvest festival war peace treaty border raid siege battle "
    "is was has had will can must may should sees knows says asks tells brings seeks "
    "guards holds keeps finds loses carries sells buys trusts fears remembers waits "
    "fought traveled returned promised warned noticed offered refused followed built"
)
_WORDS = tuple(_VOCABULARY.split())


class TextSource:
    """Prose generator; one per workload, seeded."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def sentence(self) -> str:
        rng = self._rng
        n = rng.randint(6, 16)
        words = [rng.choice(_WORDS) for _ in range(n)]
        return " ".join(words).capitalize() + rng.choice((".", ".", ".", "!", "?"))

    def prose(self, tokens: int, *, prefix: str = "") -> str:
        """About `tokens` tokens of text (exactly tokens x 4 characters, cut at the end)."""
        target = max(0, tokens) * CHARS_PER_TOKEN
        parts = [prefix] if prefix else []
        size = len(prefix)
        while size < target:
            s = self.sentence()
            parts.append(s)
            size += len(s) + 1
        return " ".join(parts)[:target]
