"""Prefix block hashes, computed the way vLLM computes them (PROTOCOLS §2).

Only full blocks of `block_tokens` tokens are hashed. Block i is named by

    h_i = H((h_{i-1} or NONE_HASH, tuple(tokens_i), extra_keys_i or None))

with H = SHA-256 of canonical CBOR (vLLM's `sha256_cbor`), or xxh3-128 of canonical CBOR
(`xxhash_cbor`). NONE_HASH = H(str(seed)) where the seed is PYTHONHASHSEED; vLLM draws 32
random bytes when it is unset, which makes its hashes unreproducible, and so do we.
`cache_salt` is the first block's extra key, as in vLLM. KV events carry each hash as the
low 64 bits of its big-endian digest (`event_int`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import cbor2
import xxhash

HashFn = Callable[[Any], bytes]
_MASK64 = (1 << 64) - 1


def sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def xxhash_cbor(obj: Any) -> bytes:
    return bytes(xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True)))


HASH_FUNCTIONS: dict[str, HashFn] = {"sha256_cbor": sha256_cbor, "xxhash_cbor": xxhash_cbor}


def none_hash(hash_fn: HashFn, seed: str | None) -> bytes:
    """The root parent of every chain: H(seed), or 32 random bytes without a seed."""
    if seed is None:
        return os.urandom(32)
    return hash_fn(seed)


def event_int(digest: bytes) -> int:
    """A block hash as vLLM's KV events publish it (low 64 bits, big-endian)."""
    return int.from_bytes(digest, "big") & _MASK64


class BlockHasher:
    """Chained hashes of full token blocks for one engine (one algorithm, one seed)."""

    def __init__(self, block_tokens: int, algorithm: str = "sha256_cbor", seed: str | None = None):
        if block_tokens <= 0:
            raise ValueError("block_tokens must be positive")
        try:
            self.hash_fn = HASH_FUNCTIONS[algorithm]
        except KeyError:
            raise ValueError(f"unknown block hash {algorithm!r}") from None
        self.block_tokens = block_tokens
        self.algorithm = algorithm
        self.none_hash = none_hash(self.hash_fn, seed)

    def block(self, parent: bytes | None, tokens: Sequence[int], extra: Any = None) -> bytes:
        return self.hash_fn((parent or self.none_hash, tuple(tokens), extra))

    def chain(
        self,
        token_ids: Sequence[int],
        *,
        parent: bytes | None = None,
        start_block: int = 0,
        cache_salt: str | None = None,
    ) -> list[bytes]:
        """Hashes of the full blocks of `token_ids` from block `start_block` on, chained to
        `parent` (the hash of block `start_block - 1`, None for the first)."""
        bs = self.block_tokens
        out: list[bytes] = []
        prev = parent
        for i in range(start_block, len(token_ids) // bs):
            extra = [cache_salt] if (i == 0 and cache_salt) else None
            prev = self.block(prev, token_ids[i * bs : (i + 1) * bs], extra)
            out.append(prev)
        return out
