"""Prefix block hashes, computed the way vLLM computes them (PROTOCOLS §2).

Only full blocks of `block_tokens` tokens are hashed. Block i is named by

    h_i = H((h_{i-1} or NONE_HASH, tuple(tokens_i), extra_keys_i or None))

with H = SHA-256 of canonical CBOR (vLLM's `sha256_cbor`), or xxh3-128 of canonical CBOR
(`xxhash_cbor`); `cache_salt` is the first block's extra key. The function itself is the
router's (`router.precise.VllmBlockHasher`), so the engine's block names and the router's
precise mode cannot drift apart. NONE_HASH = H(seed) where the seed is PYTHONHASHSEED; vLLM
draws 32 random bytes when it is unset, which makes its hashes unreproducible: without a
seed, so does this (a random seed string). This adapter adds what a running engine needs:
hashing one more block onto a chain (output tokens, as they fill blocks).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Sequence
from typing import Literal

from contracts.errors import ConfigurationError, InputError
from router.precise import VllmBlockHasher, event_int

__all__ = ["HASH_ALGORITHMS", "BlockHasher", "event_int"]


class UnknownBlockHashError(ConfigurationError, ValueError):
    """`--block-hash` names no algorithm the simulated engine has."""


class BlockLengthError(InputError, ValueError):
    """A block to hash is not of the engine's block size."""


HASH_ALGORITHMS = ("sha256_cbor", "xxhash_cbor")


class BlockHasher:
    """Chained hashes of full token blocks for one engine (one algorithm, one seed)."""

    def __init__(
        self,
        block_tokens: int,
        algorithm: str = "sha256_cbor",
        seed: str | None = None,
        memo_limit: int = 100_000,
    ):
        algo: Literal["sha256_cbor", "xxhash_cbor"]
        if algorithm == "sha256_cbor":
            algo = "sha256_cbor"
        elif algorithm == "xxhash_cbor":
            algo = "xxhash_cbor"
        else:
            raise UnknownBlockHashError(
                f"unknown block hash {algorithm!r}; one of {HASH_ALGORITHMS}"
            )
        self.block_tokens = block_tokens
        self.algorithm = algorithm
        self.seeded = seed is not None
        self._vllm = VllmBlockHasher(
            hash_seed=seed if seed is not None else secrets.token_hex(32),
            block_size=block_tokens,
            algo=algo,
        )
        self.none_hash: bytes = self._vllm.none_hash
        self.memo_limit = memo_limit
        self._memo: dict[tuple[bytes | None, tuple[int, ...], str | None], bytes] = {}
        self._lock = threading.Lock()

    def block(self, parent: bytes | None, tokens: Sequence[int]) -> bytes:
        """The hash of one full block following `parent` (None: the chain's first block)."""
        if len(tokens) != self.block_tokens:
            raise BlockLengthError(f"a block has {self.block_tokens} tokens, got {len(tokens)}")
        return self._vllm.block_digests(tokens, parent=parent)[0]

    def chain(self, token_ids: Sequence[int], *, cache_salt: str | None = None) -> list[bytes]:
        """Hashes of every full block of `token_ids`.

        Prompts repeat their prefixes turn after turn, so each block's digest is memoised
        under (parent digest, tokens, salt): a repeated prefix costs a dict lookup a block
        instead of a CBOR encoding and a SHA-256. The memo is bounded (oldest dropped)."""
        bs = self.block_tokens
        memo = self._memo
        out: list[bytes] = []
        parent: bytes | None = None
        for i in range(len(token_ids) // bs):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            salt = cache_salt if i == 0 else None
            key = (parent, tokens, salt)
            digest = memo.get(key)
            if digest is None:
                digest = self._vllm.block_digests(tokens, cache_salt=salt, parent=parent)[0]
                memo[key] = digest
                if len(memo) > self.memo_limit:
                    self._trim()
            out.append(digest)
            parent = digest
        return out

    def _trim(self) -> None:
        """Drop the oldest memo entries. Chains are hashed in worker threads too: another
        thread may insert meanwhile, which at worst ends this round early."""
        with self._lock:
            memo = self._memo
            while len(memo) > self.memo_limit:
                try:
                    del memo[next(iter(memo))]
                except (KeyError, RuntimeError, StopIteration):
                    return
