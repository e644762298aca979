"""Game requests -> a Mooncake-format trace plus a text sidecar for live replay.

Hash ids come from the text itself, the way the gateway's approximate mode sees it: each
request's messages are rendered with `router.blocks.render_chat` and cut into blocks of
`block_tokens` x 4 characters; block i is named by the chained xxh3 of everything up to
its end (`router.blocks.hash_blocks`, the last, partial block chained on the same way),
and each distinct chained hash gets the next small integer id in order of first
appearance. So id k at position i means "this block and
everything before it", equal prefixes get equal ids, `input_length` is the rendered
length in tokens (4 characters a token) and `len(hash_ids) == ceil(input_length /
block_tokens)`, as in the Mooncake traces.

The sidecar (JSON lines) keeps the text once: `{"segment": id, "text": ...}` lines define
texts before their first use, and each request is
`{"request": n, "timestamp": ms, "user": session, "max_tokens": k, "tag": ...,
"messages": [[role, segment id], ...]}`. `iter_sidecar` gives back full chat requests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import xxhash

from router.blocks import BlockSizeError, chain_seed, estimate_tokens, hash_blocks, render_chat
from sim.players.text import CHARS_PER_TOKEN
from sim.players.workload import GameRequest
from sim.traces import TraceRequest

GAME_MODEL = "sim-qwen2.5-32b"


class ChainIds:
    """Chained block hashes of rendered prompts -> small integer ids, first seen first."""

    def __init__(self, block_tokens: int, model: str = GAME_MODEL) -> None:
        if block_tokens <= 0:
            raise BlockSizeError("block_tokens must be positive")
        self.block_chars = block_tokens * CHARS_PER_TOKEN
        self.seed = chain_seed(model)
        self._ids: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def ids(self, text: str) -> list[int]:
        # the gateway's own chain over the full blocks, then the partial last block chained on
        hashes = hash_blocks(text, seed=self.seed, block_chars=self.block_chars)
        tail = text[len(hashes) * self.block_chars :]
        if tail:
            parent = hashes[-1] if hashes else self.seed
            hashes.append(xxhash.xxh3_64_intdigest(tail.encode("utf-8", "surrogatepass"), parent))
        table = self._ids
        out: list[int] = []
        for h in hashes:
            ident = table.get(h)
            if ident is None:
                ident = table[h] = len(table)
            out.append(ident)
        return out


def to_trace(
    requests: Iterable[GameRequest], block_tokens: int, *, world_tags: bool = False
) -> list[TraceRequest]:
    """Mooncake-format records (with the session key) of game requests, and the game
    server's hints the requests carry (sim.traces: a first line's warm, its class). With
    `world_tags`, the first prompt of each zone's new world version is tagged with it."""
    chains = ChainIds(block_tokens)
    versions = _WorldVersions(chains.block_chars) if world_tags else None
    out: list[TraceRequest] = []
    for r in requests:
        text = render_chat(r.messages)
        warm: dict[str, Any] = {}
        if r.warm_lead_s and len(r.messages) > 1:
            context = render_chat(r.messages[:-1])  # a prefix of `text`: its blocks are too
            warm = {
                "warm_lead_ms": round(r.warm_lead_s * 1000.0, 3),
                "warm_tokens": estimate_tokens(context),
                "warm_blocks": len(context) // chains.block_chars,
            }
        world = versions.tag(r) if versions is not None else {}
        out.append(
            TraceRequest(
                timestamp_ms=round(r.at_s * 1000.0, 3),
                input_length=estimate_tokens(text),
                output_length=r.output_tokens,
                hash_ids=tuple(chains.ids(text)),
                session=r.session or None,  # barks have none
                priority=r.priority,
                **warm,
                **world,
            )
        )
    return out


class _WorldVersions:
    """Which prompt is the first of its zone's new world state (the first message, the
    game layout's world state, differing from the zone's previous one)."""

    def __init__(self, block_chars: int) -> None:
        self.block_chars = block_chars
        self._last: dict[str, tuple[str, int]] = {}  # zone -> (world text, version count)

    def tag(self, r: GameRequest) -> dict[str, Any]:
        zone = r.tag.partition("/")[0]
        world = r.messages[0]["content"] if r.messages else ""
        last = self._last.get(zone)
        if last is not None and last[0] == world:
            return {}
        version = 1 if last is None else last[1] + 1
        self._last[zone] = (world, version)
        if last is None:
            return {}  # the zone's first state: not a new version
        first = render_chat(r.messages[:1])
        return {
            "world_version": f"{zone}:{version}",
            "world_blocks": len(first) // self.block_chars,
        }


def write_sidecar(path: str | Path, requests: Iterable[GameRequest]) -> int:
    """Write the text sidecar; returns the number of requests written."""
    by_text: dict[str, int] = {}  # text -> segment id (str hashes are cached: cheap)
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for r in requests:
            refs: list[list[Any]] = []
            for m in r.messages:
                content = m["content"]
                sid = by_text.get(content)
                if sid is None:
                    sid = by_text[content] = len(by_text)
                    fh.write(json.dumps({"segment": sid, "text": content}) + "\n")
                refs.append([m["role"], sid])
            fh.write(
                json.dumps(
                    {
                        "request": n,
                        "timestamp": round(r.at_s * 1000.0, 3),
                        "user": r.session,
                        "max_tokens": r.output_tokens,
                        "tag": r.tag,
                        "messages": refs,
                    }
                )
                + "\n"
            )
            n += 1
    return n


def iter_sidecar(path: str | Path) -> Iterator[dict[str, Any]]:
    """Requests of a sidecar as chat bodies: `timestamp` (ms), `user`, `max_tokens`, `tag`,
    `messages` ([{"role", "content"}]), in file order."""
    texts: dict[int, str] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            obj = json.loads(line)
            if "segment" in obj:
                texts[int(obj["segment"])] = str(obj["text"])
                continue
            yield {
                "request": obj["request"],
                "timestamp": obj["timestamp"],
                "user": obj["user"],
                "max_tokens": obj["max_tokens"],
                "tag": obj.get("tag", ""),
                "messages": [
                    {"role": role, "content": texts[sid]} for role, sid in obj["messages"]
                ],
            }
