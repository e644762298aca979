"""Text for Mooncake-format traces, which carry block ids but no text.

A Mooncake line names its prompt by chained block ids: id k at position i means "this block
and everything before it", so two requests that share their first j ids share their first
j blocks of tokens. To replay such a trace live, every block id is turned into a fixed
piece of text:

- the text of block id k is drawn from a word list by a generator seeded with
  (seed, k, parent id), so equal ids give equal text and the same id reached through a
  different parent (which a well-formed trace never has) still gives different text;
- every block is exactly `block_tokens * chars_per_token` characters (words, padded or cut),
  so block boundaries fall on the same character offsets in every request and character
  blocks of the gateway (256 chars) and token blocks of the engine tile each trace block
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

# Short common words: ~4-5 characters a word with its space, like the English text the
# 4-chars-per-token estimate is made for.
_WORD_TEXT = (
    "the of and to in is it you that he was for on are with as his they be at one have "
    "this from or had by hot word but what some we can out other were all there when up "
    "use your how said an each she which do their time if will way about many then them "
    "write would like so these her long make thing see him two has look more day could go "
    "come did number sound no most people my over know water than call first who may down "
    "side been now find any new work part take get place made live where after back little "
    "only round man year came show every good me give our under name very through just form "
    "sentence great think say help low line differ turn cause much mean before move right "
    "boy old too same tell does set three want air well also play small end put home read "
    "hand port large spell add even land here must big high such follow act why ask men "
    "change went light kind off need house picture try us again animal point mother world "
    "near build self earth father head stand own page should country found answer school "
    "grow study still learn plant cover food sun four between state keep eye never last let "
    "thought city tree cross farm hard start might story saw far sea draw left late run "
    "while press close night real life few north open seem together next white children "
    "begin got walk example ease paper group always music those both mark often letter until "
    "mile river car feet care second book carry took science eat room friend began idea fish "
    "mountain stop once base hear horse cut sure watch color face wood main enough plain "
    "girl usual young ready above ever red list though feel talk bird soon body dog family "
    "direct pose leave song measure door product black short numeral class wind question"
)
_WORDS = tuple(_WORD_TEXT.split())

DEFAULT_CHARS_PER_TOKEN = 4
DEFAULT_CACHE_BLOCKS = 65_536


class BlockTextSynth:
    """Deterministic text for chained block ids (see the module docstring)."""

    def __init__(
        self,
        *,
        block_tokens: int,
        chars_per_token: int = DEFAULT_CHARS_PER_TOKEN,
        seed: int = 0,
        cache_blocks: int = DEFAULT_CACHE_BLOCKS,
    ) -> None:
        if block_tokens <= 0 or chars_per_token <= 0:
            raise ValueError("block_tokens and chars_per_token must be positive")
        self.block_tokens = block_tokens
        self.chars_per_token = chars_per_token
        self.block_chars = block_tokens * chars_per_token
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
        # A hex tag first: texts of distinct ids part within their first few characters.
        words: list[str] = [f"{digest:016x}"[:8]]
        size = len(words[0])
        while size < self.block_chars:
            word = _WORDS[rng.randrange(len(_WORDS))]
            words.append(word)
            size += len(word) + 1
        text = " ".join(words)[: self.block_chars - 1]
        return text + ("\n" if rng.random() < 0.1 else " ")

    def prompt(self, hash_ids: Sequence[int], input_tokens: int) -> str:
        """The prompt of a trace line: its blocks' texts, cut to `input_tokens` tokens."""
        chars = max(0, input_tokens) * self.chars_per_token
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
    chars_per_token: int = DEFAULT_CHARS_PER_TOKEN,
    seed: int = 0,
    limit: int | None = None,
    max_output_tokens: int | None = None,
) -> list[ReplayItem]:
    """Replay items for Mooncake-format JSON lines (`timestamp` in ms, `input_length`,
    `output_length`, `hash_ids`), each prompt one user message of synthesised text."""
    synth = BlockTextSynth(block_tokens=block_tokens, chars_per_token=chars_per_token, seed=seed)
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
                tag=f"line {n}",
            )
        )
    return items
