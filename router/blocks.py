"""Prompt -> block chain (approximate mode).

A request's prompt is rendered canonically (roles included, messages in their order, which
game prompts keep stable -> volatile) and cut into fixed-size character blocks. Each block
is named by a chained hash, so equal names mean equal prefixes:

    h_0 = xxh3_64(block_0, seed=s)      h_i = xxh3_64(block_i, seed=h_{i-1})
    s = xxh3_64(model || 0x00 || cache_salt)

Each block's hash keys the next (xxh3's 64-bit seed), so a name depends on the model, the
salt and every block before it. Keying by seed instead of prepending the parent's bytes
saves a copy and a conversion per block: hashing a 32k-token prompt (512 blocks) is the
largest part of a routing decision.

Only full blocks are hashed: a trailing partial block can never be reused by an engine.
An ASCII prompt (the usual case: characters are bytes) is hashed in one C call,
`router.accel.hash_blocks` (~3x faster than the Python loop; the pure-Python fallback when
the extension is not built or `WARMGATE_NATIVE=python`); other text is cut on characters
here.
Precise mode (real tokens, vLLM-compatible hashes) lives in `router.precise`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import xxhash

from router import accel
from router.errors import BlockSizeError as BlockSizeError  # where router._accel finds it

CHARS_PER_TOKEN = 4  # the usual estimate for English text with BPE tokenizers
DEFAULT_BLOCK_TOKENS = 64
DEFAULT_BLOCK_CHARS = DEFAULT_BLOCK_TOKENS * CHARS_PER_TOKEN


def chain_seed(model: str, cache_salt: str | None = None) -> int:
    """The hash seed that keeps models (and salted tenants) from sharing blocks."""
    key = model.encode() + b"\x00" + (cache_salt or "").encode()
    return xxhash.xxh3_64_intdigest(key)


def content_text(content: Any) -> str:
    """Text of an OpenAI message `content`: a string, or a list of typed parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces: list[str] = []
        for part in content:
            if isinstance(part, Mapping):
                if part.get("type") == "text":
                    pieces.append(str(part.get("text", "")))
                else:  # images, audio, files: their identity, not their bytes
                    pieces.append(json.dumps(part, sort_keys=True, separators=(",", ":")))
            else:
                pieces.append(str(part))
        return "".join(pieces)
    return json.dumps(content, sort_keys=True, separators=(",", ":"))


def render_chat(messages: Iterable[Mapping[str, Any]], tools: Sequence[Any] | None = None) -> str:
    """Canonical text of a chat request: tools first (they precede messages in templates),
    then each message as `<|role|>content` with tool calls and names kept."""
    parts: list[str] = []
    if tools:
        parts.append("<|tools|>" + json.dumps(list(tools), sort_keys=True, separators=(",", ":")))
    for message in messages:
        role = str(message.get("role", ""))
        name = message.get("name")
        header = f"<|{role}|>" if name is None else f"<|{role}:{name}|>"
        parts.append(header)
        parts.append(content_text(message.get("content")))  # long: copied once, by the join
        tool_calls = message.get("tool_calls")
        if tool_calls:
            parts.append(json.dumps(tool_calls, sort_keys=True, separators=(",", ":")))
        parts.append("\n")
    return "".join(parts)


def render_prompt(prompt: str | Sequence[Any]) -> str:
    """Canonical text of a completions `prompt` (a string, or a list holding one)."""
    if isinstance(prompt, str):
        return prompt
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if all(isinstance(t, int) for t in prompt):  # pre-tokenised prompt
        return " ".join(str(t) for t in prompt)
    return json.dumps(list(prompt), separators=(",", ":"))


def hash_blocks(text: str, *, seed: int, block_chars: int = DEFAULT_BLOCK_CHARS) -> list[int]:
    """Chained hashes of every full `block_chars`-character block of `text`; `seed` is a
    u64 (OverflowError otherwise)."""
    if block_chars <= 0:
        raise BlockSizeError("block_chars must be positive")
    data = text.encode("utf-8", "surrogatepass")
    if len(data) == len(text):  # ASCII fast path: characters are bytes
        return accel.hash_blocks(data, seed, block_chars)
    if not 0 <= seed < 1 << 64:  # as the fast path: xxhash alone would wrap it
        raise OverflowError("seed must fit in an unsigned 64-bit int")
    # Cut on characters, not bytes, so a block boundary never splits a code point.
    hashes: list[int] = []
    h = seed
    digest = xxhash.xxh3_64_intdigest
    append = hashes.append
    for i in range(len(text) // block_chars):
        h = digest(
            text[i * block_chars : (i + 1) * block_chars].encode("utf-8", "surrogatepass"), h
        )
        append(h)
    return hashes


def estimate_tokens(text: str) -> int:
    """Approximate token count of `text` (ceil of chars / CHARS_PER_TOKEN)."""
    return -(-len(text) // CHARS_PER_TOKEN)
