"""Precise mode: vLLM's sha256_cbor block hash against the reference values of
PROTOCOLS §2, extra keys, the xxh3 variant, and building a RouteRequest from a tokenizer."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import cbor2
import pytest
import xxhash

from router.blocks import chain_seed
from router.precise import (
    VllmBlockHasher,
    Xxh3BlockHasher,
    cut_blocks,
    event_int,
    precise_route_request,
)

NONE_HASH_SEED0 = "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
BLOCK0 = "d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c"
BLOCK1 = "fedd9e4abebebbe6f6cf96b682f08d316063fe2f22a5c552192dd62904fcccac"


def test_sha256_cbor_reference_values() -> None:
    hasher = VllmBlockHasher(hash_seed="0", block_size=16)
    assert hasher.none_hash.hex() == NONE_HASH_SEED0
    digests = hasher.block_digests(list(range(40)))  # 2 full blocks, 8 tokens dropped
    assert [d.hex() for d in digests] == [BLOCK0, BLOCK1]
    assert hasher.block_hashes(list(range(32))) == [12687895063098490012, 1814341696565857452]
    assert event_int(bytes.fromhex(BLOCK0)) == 12687895063098490012


def test_chain_continues_from_parent() -> None:
    hasher = VllmBlockHasher(hash_seed="0", block_size=16)
    first = hasher.block_digests(list(range(16)))
    rest = hasher.block_digests(list(range(16, 32)), parent=first[0])
    assert rest[0].hex() == BLOCK1


def test_cache_salt_is_an_extra_key_of_the_first_block_only() -> None:
    hasher = VllmBlockHasher(hash_seed="0", block_size=4)
    salted = hasher.block_digests(list(range(8)), cache_salt="tenant-a")
    none = bytes.fromhex(NONE_HASH_SEED0)
    # vLLM tags each extra key: ("cache_salt", salt), ("lora", name, path)
    tagged = (("cache_salt", "tenant-a"),)
    want0 = hashlib.sha256(cbor2.dumps((none, (0, 1, 2, 3), tagged), canonical=True)).digest()
    want1 = hashlib.sha256(cbor2.dumps((want0, (4, 5, 6, 7), None), canonical=True)).digest()
    assert salted == [want0, want1]
    assert salted != hasher.block_digests(list(range(8)))
    lora = hasher.block_digests(list(range(8)), lora_name="npc", lora_path="/a/npc", cache_salt="s")
    key = ("lora", "npc", "/a/npc")
    want0 = hashlib.sha256(
        cbor2.dumps((none, (0, 1, 2, 3), (key, ("cache_salt", "s"))), canonical=True)
    ).digest()
    want1 = hashlib.sha256(cbor2.dumps((want0, (4, 5, 6, 7), (key,)), canonical=True)).digest()
    assert lora == [want0, want1]


def test_hash_seed_and_algo_change_everything() -> None:
    a = VllmBlockHasher(hash_seed="0", block_size=16).block_hashes(list(range(16)))
    b = VllmBlockHasher(hash_seed="1", block_size=16).block_hashes(list(range(16)))
    x = VllmBlockHasher(hash_seed="0", block_size=16, algo="xxhash_cbor")
    assert x.none_hash == xxhash.xxh3_128_digest(cbor2.dumps("0", canonical=True))
    assert len({a[0], b[0], x.block_hashes(list(range(16)))[0]}) == 3
    with pytest.raises(ValueError):
        VllmBlockHasher(hash_seed="0", algo="sha256")  # type: ignore[arg-type]


def test_cut_blocks_keeps_full_blocks() -> None:
    assert cut_blocks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4]]
    assert cut_blocks([1], 2) == []
    with pytest.raises(ValueError):
        cut_blocks([1], 0)


def test_xxh3_variant_definition_and_prefix_sharing() -> None:
    hasher = Xxh3BlockHasher(model="m", block_size=4)
    tokens = [7, 8, 9, 10, 11, 12, 13, 14, 15]
    seed = chain_seed("m")
    h0 = xxhash.xxh3_64_intdigest(b"".join(t.to_bytes(4, "little") for t in tokens[:4]), seed)
    h1 = xxhash.xxh3_64_intdigest(b"".join(t.to_bytes(4, "little") for t in tokens[4:8]), h0)
    assert hasher.block_hashes(tokens) == [h0, h1]
    longer = hasher.block_hashes([*tokens[:8], 99, 98, 97, 96])
    assert longer[:2] == [h0, h1]
    assert hasher.block_hashes(tokens, cache_salt="x")[0] != h0
    assert Xxh3BlockHasher(model="other", block_size=4).block_hashes(tokens)[0] != h0
    with pytest.raises(ValueError):
        hasher.block_hashes([-1, 2, 3, 4])


async def test_route_request_from_async_and_sync_tokenizers() -> None:
    calls: list[str] = []

    async def remote_tokenize(payload: dict[str, str]) -> Sequence[int]:
        calls.append(payload["prompt"])
        return list(range(40))

    hasher = VllmBlockHasher(hash_seed="0", block_size=16)
    r = await precise_route_request(
        {"prompt": "hi"}, tokenize=remote_tokenize, hasher=hasher, model="m", session_key="p"
    )
    assert calls == ["hi"]
    assert r.block_hashes == [12687895063098490012, 1814341696565857452]
    assert (r.prompt_tokens, r.block_tokens, r.session_key) == (40, 16, "p")

    def local_tokenize(payload: str) -> list[int]:
        return list(range(16 * 100))  # long enough to be hashed in a worker thread

    r = await precise_route_request("x", tokenize=local_tokenize, hasher=hasher, model="m")
    assert len(r.block_hashes) == 100
    assert r.block_hashes[:2] == [12687895063098490012, 1814341696565857452]
