"""The game workload of a real `bench compare` run as a cluster-simulator trace: the same
requests (`bench.workloads.game_items`, the seed, players, minutes and scale of the run),
each tokenized as the engines tokenized it (the tiny model's own tokenizer and chat template,
`gateway.pipeline.hf_tokenizer`, what precise mode reads), cut into the engines' KV blocks.

Block ids follow vLLM's prefix cache: block i of a prompt is named by its tokens and every
token before it (a chain), so equal prefixes get equal ids; only full blocks are ever
shared, as vLLM caches only full blocks, so a prompt's partial last block gets an id of its
own that nothing else can match. Ids are small integers in order of first appearance.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from bench.workloads import game_items
from gateway.pipeline.hf_tokenizer import HfChatTokenizer
from router.errors import BlockSizeError
from sim.traces import TraceRequest


class TokenBlockIds:
    """Chained full blocks of token ids -> small integer ids, first seen first."""

    def __init__(self, block_tokens: int) -> None:
        if block_tokens <= 0:
            raise BlockSizeError("block_tokens must be positive")
        self.block_tokens = block_tokens
        self._ids: dict[bytes, int] = {}
        self._next = 0

    def _new(self) -> int:
        ident = self._next
        self._next += 1
        return ident

    def ids(self, tokens: Sequence[int]) -> list[int]:
        bt = self.block_tokens
        out: list[int] = []
        parent = b""
        full = len(tokens) // bt
        for i in range(full):
            block = ",".join(map(str, tokens[i * bt : (i + 1) * bt])).encode()
            parent = hashlib.blake2b(parent + block, digest_size=16).digest()
            ident = self._ids.get(parent)
            if ident is None:
                ident = self._ids[parent] = self._new()
            out.append(ident)
        if len(tokens) > full * bt:
            out.append(self._new())  # a partial block: never cached, never shared
        return out


def token_trace(
    rows: Iterable[tuple[float, Sequence[int], int, str | None]], block_tokens: int
) -> list[TraceRequest]:
    """(arrival s, prompt token ids, output tokens, session) rows -> trace records."""
    chains = TokenBlockIds(block_tokens)
    return [
        TraceRequest(
            timestamp_ms=round(at_s * 1000.0, 3),
            input_length=len(tokens),
            output_length=output,
            hash_ids=tuple(chains.ids(tokens)),
            session=session,
        )
        for at_s, tokens, output, session in rows
    ]


def game_trace(
    *,
    players: int,
    minutes: float,
    seed: int,
    scale: str,
    tokenizer_dir: Path,
    block_tokens: int,
) -> list[TraceRequest]:
    """The requests a `bench compare --workload game` run replayed, as the engines saw them."""
    items = game_items(players, minutes, seed, scale)
    tokenizer = HfChatTokenizer(tokenizer_dir)

    async def encode() -> list[Sequence[int]]:
        return [await tokenizer({"messages": it.messages}) for it in items]

    encoded = asyncio.run(encode())
    rows = [
        (it.at_s, toks, it.max_tokens, it.session) for it, toks in zip(items, encoded, strict=True)
    ]
    return token_trace(rows, block_tokens)
