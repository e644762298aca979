"""Precise mode: block chains cut from real token ids, hashed so they match the engine's own.

How it works:
- `cut_blocks(tokens, block_size)` keeps only full blocks (an engine never reuses a partial one).
- `VllmBlockHasher` reproduces vLLM's prefix-cache block hash with a portable algorithm
  (`--prefix-caching-hash-algo sha256_cbor`, or `xxhash_cbor`):
      NONE_HASH = H(cbor(PYTHONHASHSEED string))
      h_i       = H(cbor([h_{i-1} or NONE_HASH (bytes), [tokens of block i], extras_i or null]))
  CBOR is canonical (`cbor2.dumps(..., canonical=True)`, as vLLM calls it). Extra keys are
  tagged tuples, in vLLM's order (vllm/v1/core/kv_cache_utils.py
  `generate_block_hash_extra_keys`): `("lora", name, path)` on every block of a LoRA
  request, then `("cache_salt", salt)` on the first block; multimodal and prompt-embedding
  keys are not supported here. KV events carry the low 64 bits of the
  big-endian digest (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`): `block_hashes()` returns those.
- `Xxh3BlockHasher` is warmgate's own fast precise scheme for engines we control, chained
  like the approximate mode's blocks: h_i = xxh3_64(tokens of block i as u32 LE,
  seed=h_{i-1}), h_{-1} = `router.blocks.chain_seed(model, cache_salt)`.
- `precise_route_request()` turns a request payload into a `RouteRequest`: tokens from a
  callable the caller supplies (sync or async: a local tokenizer, the engine's /tokenize),
  hashing off the event loop for long prompts. Nothing here speaks HTTP.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, Protocol

import cbor2
import xxhash

from contracts.errors import ConfigurationError, InputError
from contracts.slices import normalize
from router.blocks import BlockSizeError, chain_seed
from router.types import RouteRequest

VllmHashAlgo = Literal["sha256_cbor", "xxhash_cbor"]
DEFAULT_VLLM_BLOCK_SIZE = 16
THREAD_THRESHOLD_BLOCKS = 64  # hash longer chains in a worker thread, off the event loop
# The int vLLM publishes in KV events for a block digest (its low 64 bits, big-endian): the
# digest -> u64 rule has one owner, the slice-key rule.
event_int = normalize


class UnsupportedHashError(ConfigurationError, ValueError):
    """A block hash algorithm precise mode cannot reproduce (not portable, or unknown)."""


class TokenIdRangeError(InputError, ValueError):
    """A token id outside [0, 2**32)."""


Tokenizer = Callable[[Any], Sequence[int] | Awaitable[Sequence[int]]]


def cut_blocks(tokens: Sequence[int], block_size: int) -> list[Sequence[int]]:
    """The full blocks of `tokens`, in order (a trailing partial block is dropped)."""
    if block_size <= 0:
        raise BlockSizeError("block_size must be positive")
    full = len(tokens) // block_size
    return [tokens[i * block_size : (i + 1) * block_size] for i in range(full)]


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _xxh3_128(data: bytes) -> bytes:
    digest: bytes = xxhash.xxh3_128_digest(data)
    return digest


class BlockHasher(Protocol):
    """What the router needs of a precise hasher."""

    block_size: int

    def block_hashes(
        self,
        tokens: Sequence[int],
        *,
        cache_salt: str | None = None,
        lora_name: str | None = None,
        lora_path: str | None = None,
    ) -> list[int]: ...


class VllmBlockHasher:
    """vLLM's block hash (`sha256_cbor` or `xxhash_cbor`) for one hash seed and block size."""

    def __init__(
        self,
        *,
        hash_seed: str,
        block_size: int = DEFAULT_VLLM_BLOCK_SIZE,
        algo: VllmHashAlgo = "sha256_cbor",
    ) -> None:
        if block_size <= 0:
            raise BlockSizeError("block_size must be positive")
        if algo == "sha256_cbor":
            self._fn: Callable[[bytes], bytes] = _sha256
        elif algo == "xxhash_cbor":
            self._fn = _xxh3_128
        else:
            raise UnsupportedHashError(
                f"unsupported hash algorithm {algo!r} (not portable or unknown)"
            )
        self.algo = algo
        self.block_size = block_size
        self.none_hash = self._hash(hash_seed)

    def _hash(self, obj: object) -> bytes:
        return self._fn(cbor2.dumps(obj, canonical=True))

    def block_digests(
        self,
        tokens: Sequence[int],
        *,
        cache_salt: str | None = None,
        lora_name: str | None = None,
        lora_path: str | None = None,
        parent: bytes | None = None,
    ) -> list[bytes]:
        """Full digests of every full block, chained from `parent` (default NONE_HASH).
        A LoRA request is keyed by its adapter's name and path, as the engine loaded it."""
        digests: list[bytes] = []
        prev = parent or self.none_hash
        lora: tuple[tuple[str, ...], ...] = (
            (("lora", lora_name, lora_path or ""),) if lora_name else ()
        )
        salt: tuple[tuple[str, ...], ...] = (("cache_salt", cache_salt),) if cache_salt else ()
        for i, block in enumerate(cut_blocks(tokens, self.block_size)):
            extras = lora + salt if i == 0 and parent is None else lora
            prev = self._hash((prev, tuple(block), extras or None))
            digests.append(prev)
        return digests

    def block_hashes(
        self,
        tokens: Sequence[int],
        *,
        cache_salt: str | None = None,
        lora_name: str | None = None,
        lora_path: str | None = None,
    ) -> list[int]:
        """The block hashes as vLLM's KV events carry them (low 64 bits of each digest)."""
        digests = self.block_digests(
            tokens, cache_salt=cache_salt, lora_name=lora_name, lora_path=lora_path
        )
        return [event_int(d) for d in digests]


class Xxh3BlockHasher:
    """warmgate's fast precise chain: xxh3_64 over u32-LE tokens, seeded per model and salt."""

    def __init__(self, *, model: str, block_size: int) -> None:
        if block_size <= 0:
            raise BlockSizeError("block_size must be positive")
        self.model = model
        self.block_size = block_size
        self._block = struct.Struct(f"<{block_size}I")

    def block_hashes(
        self,
        tokens: Sequence[int],
        *,
        cache_salt: str | None = None,
        lora_name: str | None = None,
        lora_path: str | None = None,
    ) -> list[int]:
        lora = f"{lora_name}\x00{lora_path or ''}" if lora_name else ""
        salt = cache_salt if not lora_name else f"{cache_salt or ''}\x00lora:{lora}"
        seed = chain_seed(self.model, salt)
        full = len(tokens) // self.block_size
        try:
            data = struct.pack(f"<{full * self.block_size}I", *tokens[: full * self.block_size])
        except struct.error as exc:
            raise TokenIdRangeError(f"token ids must be in [0, 2**32): {exc}") from None
        digest = xxhash.xxh3_64_intdigest
        hashes: list[int] = []
        append = hashes.append
        h = seed
        for (chunk,) in struct.iter_unpack(f"{self._block.size}s", data):
            h = digest(chunk, h)
            append(h)
        return hashes


async def tokens_of(tokenize: Tokenizer, payload: Any) -> list[int]:
    """Token ids of `payload` from the caller's tokenizer, sync or async."""
    result = tokenize(payload)
    if inspect.isawaitable(result):
        result = await result
    return list(result)


async def precise_route_request(
    payload: Any,
    *,
    tokenize: Tokenizer,
    hasher: BlockHasher,
    model: str,
    cache_salt: str | None = None,
    lora_name: str | None = None,
    lora_path: str | None = None,
    session_key: str | None = None,
    max_tokens: int | None = None,
) -> RouteRequest:
    """A `RouteRequest` whose block chain matches the engine's own block hashes."""
    tokens = await tokens_of(tokenize, payload)
    keys = {"cache_salt": cache_salt, "lora_name": lora_name, "lora_path": lora_path}
    if len(tokens) // hasher.block_size > THREAD_THRESHOLD_BLOCKS:
        hashes = await asyncio.to_thread(functools.partial(hasher.block_hashes, tokens, **keys))
    else:
        hashes = hasher.block_hashes(tokens, **keys)
    return RouteRequest(
        model=model,
        block_hashes=hashes,
        block_tokens=hasher.block_size,
        prompt_tokens=len(tokens),
        session_key=session_key,
        max_tokens=max_tokens,
    )
