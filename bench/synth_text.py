"""Text for Mooncake-format traces, which carry block ids but no text.

A Mooncake line names its prompt by chained block ids: id k at position i means "this block
and everything before it", so two requests that share their first j ids share their first
j blocks of tokens. To replay such a trace live, every block id is turned into a fixed
piece of text:

- the text of block id k is drawn from a word list by a generator seeded with
  (seed, k, parent id), so equal ids give equal text and the same id reached through a
  different parent (which a well-formed trace never has) still gives different text;
- every block is exactly `block_tokens` tokens of the simulated engine's tokenizer and
  `4 * block_tokens` characters (words of 3 and 7 letters, see below), so block boundaries
  fall on the same character and token offsets in every request: the gateway's character
  blocks (256 chars = 64 tokens) and the engine's token blocks tile each trace block
  without straddling two of them;
- the prompt is the concatenation of its blocks' texts, cut to `input_length` tokens' worth
  of characters (the last trace block is usually partial).

Texts of recent ids are kept in a bounded LRU map, since prefixes repeat heavily.
"""

from __future__ import annotations

import json
import random
from collections import OrderedDict
from collections.abc import Sequence

import xxhash

from bench.replay import ReplayItem

# Words of 3 and 7 letters: with its leading space a 3-letter word is one token of 4
# characters under the simulated engine's tokenizer (sim.tokenizer: a space plus up to four
# letters a token) and a 7-letter word two tokens of 8, so synthesised text has exactly
# 4 characters a token there, and block boundaries fall between tokens.
_WORD_TEXT = (
    "the and for are but not you all any can had her was one our out day get has him his how "
    "man new now old see two way who boy did its let put say she too use art bar bed big box "
    "cat cup dog ear egg eye fan fox gem hat ice ink jar key kit leg map mud net oak owl pan "
    "pen pig pot rat red row sea sky sun tea toy van war web wig yak zoo axe bow elf orc inn "
    "ancient balance captain dungeon emerald faction general harvest journey kingdom lantern "
    "machine network outpost pilgrim quarter rampart sailors scholar thunder uniform village "
    "warrior wizards bastion cavalry descent emperor fortune gallery harbour justice knights "
    "lookout mermaid nomadic oracles phantom healing dragons goblins potions castles forests "
    "islands temples caverns bandits archers armored blessed crystal dwarven evening fallows"
)
_W3 = tuple(w for w in _WORD_TEXT.split() if len(w) == 3)
_W7 = tuple(w for w in _WORD_TEXT.split() if len(w) == 7)
_LETTERS = "abcdefghijklmnopqrstuvwxyz"

CHARS_PER_TOKEN = 4
DEFAULT_CACHE_BLOCKS = 65_536


class BlockTextSynth:
    """Deterministic text for chained block ids (see the module docstring)."""

    def __init__(
        self,
        *,
        block_tokens: int,
        seed: int = 0,
        cache_blocks: int = DEFAULT_CACHE_BLOCKS,
    ) -> None:
        if block_tokens < 2:
            raise ValueError("block_tokens must be at least 2")
        self.block_tokens = block_tokens
        self.block_chars = block_tokens * CHARS_PER_TOKEN
        self.seed = seed
        self._cache: OrderedDict[tuple[int, int | None], str] = OrderedDict()
        self._cache_blocks = cache_blocks

    def block_text(self, block_id: int, parent_id: int | None = None) -> str:
        """The text of one block: exactly `block_chars` characters."""
        key = (block_id, parent_id)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        text = self._make(block_id, parent_id)
        self._cache[key] = text
        if len(self._cache) > self._cache_blocks:
            self._cache.popitem(last=False)
        return text

    def _make(self, block_id: int, parent_id: int | None) -> str:
        tag = f"{self.seed}:{block_id}:{'-' if parent_id is None else parent_id}"
        digest = xxhash.xxh3_64_intdigest(tag.encode())
        rng = random.Random(digest)
        # A 7-letter tag first (2 tokens): texts of distinct ids part within a few characters.
        name = "".join(_LETTERS[(digest >> (5 * k)) % 26] for k in range(7))
        words = [" " + name]
        left = self.block_chars - 8
        while left > 0:
            if left >= 8 and rng.random() < 0.4:
                words.append(" " + _W7[rng.randrange(len(_W7))])
                left -= 8
            else:
                words.append(" " + _W3[rng.randrange(len(_W3))])
                left -= 4
        return "".join(words)

    def prompt(self, hash_ids: Sequence[int], input_tokens: int) -> str:
        """The prompt of a trace line: its blocks' texts, cut to `input_tokens` tokens."""
        chars = max(0, input_tokens) * CHARS_PER_TOKEN
        parts: list[str] = []
        have = 0
        parent: int | None = None
        for block_id in hash_ids:
            if have >= chars:
                break
            text = self.block_text(block_id, parent)
            parts.append(text)
            have += len(text)
            parent = block_id
        if have < chars:  # a line whose ids cover fewer tokens than it claims: pad, unshared
            filler_id = xxhash.xxh3_64_intdigest(f"pad:{list(hash_ids)}".encode())
            while have < chars:
                text = self.block_text(filler_id, parent)
                parts.append(text)
                have += len(text)
                parent, filler_id = filler_id, filler_id + 1
        return "".join(parts)[:chars]


def mooncake_items(
    lines: Sequence[str],
    *,
    block_tokens: int = 512,
    seed: int = 0,
    limit: int | None = None,
    max_output_tokens: int | None = None,
) -> list[ReplayItem]:
    """Replay items for Mooncake-format JSON lines (`timestamp` in ms, `input_length`,
    `output_length`, `hash_ids`), each prompt one user message of synthesised text."""
    synth = BlockTextSynth(block_tokens=block_tokens, seed=seed)
    items: list[ReplayItem] = []
    for n, line in enumerate(lines):
        if limit is not None and len(items) >= limit:
            break
        if not line.strip():
            continue
        row = json.loads(line)
        out = int(row["output_length"])
        if max_output_tokens is not None:
            out = min(out, max_output_tokens)
        text = synth.prompt([int(h) for h in row["hash_ids"]], int(row["input_length"]))
        items.append(
            ReplayItem(
                at_s=float(row["timestamp"]) / 1000.0,
                messages=[{"role": "user", "content": text}],
                max_tokens=max(1, out),
                session=str(row["session"]) if row.get("session") is not None else None,
                tag=f"line {n}",
            )
        )
    return items
