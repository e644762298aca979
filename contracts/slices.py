"""The slice-key rule: what names a KV slice (the KV of one block of tokens, all layers).

A slice is named by the 64-bit hash of its block, so the router's index, the engines' KV
events and tierd's residency name the same blocks:

- precise mode (real token blocks of the engine's block size): the engine's own block hash
  (vLLM's `sha256_cbor` / `xxhash_cbor` chain, low 64 bits, `router.precise`), the hash its KV
  events carry;
- approximate mode (character blocks): the router's chained hash of the canonical prompt
  text (`router.blocks.hash_blocks`), which is also what the simulated engine stores in tierd.

Hashes travel as unsigned ints below 2**64 (`normalize` folds the digest bytes some
publishers send, as vLLM's events allow).
"""

from __future__ import annotations

HASH_MASK = (1 << 64) - 1


def normalize(value: int | bytes) -> int:
    """A block hash as the unsigned 64-bit int every package uses (digest bytes: their low
    64 bits, big-endian)."""
    if isinstance(value, int):
        return value & HASH_MASK
    return int.from_bytes(value, "big") & HASH_MASK
