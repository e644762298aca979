"""sim.engine.block_hash against the reference values of PROTOCOLS §2 (vLLM sha256_cbor)."""

from __future__ import annotations

import pytest

from router.precise import VllmBlockHasher
from sim.engine.block_hash import BlockHasher, event_int


def test_sha256_cbor_matches_reference_values() -> None:
    hasher = BlockHasher(16, "sha256_cbor", seed="0")
    assert hasher.none_hash.hex() == (
        "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
    )
    h0, h1 = hasher.chain([*range(32), 99])  # the partial third block is not hashed
    assert h0.hex() == "d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c"
    assert h1.hex() == "fedd9e4abebebbe6f6cf96b682f08d316063fe2f22a5c552192dd62904fcccac"
    assert event_int(h0) == 12687895063098490012
    assert event_int(h1) == 1814341696565857452


def test_chain_can_be_extended_one_block_at_a_time() -> None:
    hasher = BlockHasher(4, "xxhash_cbor", seed="7")
    tokens = list(range(40))
    full = hasher.chain(tokens)
    assert len(full) == 10 and len(full[0]) == 16  # xxh3-128 digests
    assert hasher.block(None, tokens[:4]) == full[0]
    assert hasher.block(full[4], tokens[20:24]) == full[5]
    with pytest.raises(ValueError):
        hasher.block(full[0], tokens[:3])


def test_cache_salt_changes_every_block_and_seed_matters() -> None:
    hasher = BlockHasher(4, seed="0")
    tokens = list(range(12))
    plain, salted = hasher.chain(tokens), hasher.chain(tokens, cache_salt="tenant-a")
    assert all(a != b for a, b in zip(plain, salted, strict=True))
    assert BlockHasher(4, seed="1").chain(tokens) != plain
    assert BlockHasher(4, seed=None).none_hash != BlockHasher(4, seed=None).none_hash


def test_rejects_unknown_algorithm() -> None:
    with pytest.raises(ValueError):
        BlockHasher(16, "md5")


def test_memo_is_bounded_and_never_changes_a_hash() -> None:
    reference = VllmBlockHasher(hash_seed="0", block_size=4)
    hasher = BlockHasher(4, seed="0", memo_limit=5)
    for start in (0, 0, 100, 0, 7):
        tokens = list(range(start, start + 40))
        for salt in (None, "t"):
            assert hasher.chain(tokens, cache_salt=salt) == reference.block_digests(
                tokens, cache_salt=salt
            )
            assert len(hasher._memo) <= 5
