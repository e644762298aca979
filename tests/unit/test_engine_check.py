"""gateway.fleet.engine_check.reconcile: precise settings against what engines report (pure)."""

from __future__ import annotations

import pytest

from gateway.config.settings import PreciseSettings
from gateway.engine.base import EngineCacheConfig
from gateway.engine.vllm import VLLM
from gateway.engine.vllm_metrics import cache_config
from gateway.fleet.engine_check import EngineConfigMismatch, reconcile

PAGE = (
    'vllm:cache_config_info{block_size="128",engine="0",enable_prefix_caching="True",'
    'num_gpu_blocks="682",prefix_caching_hash_algo="sha256_cbor"} 1.0\n'
)


def cfg(block: int = 128, algo: str = "sha256_cbor") -> EngineCacheConfig:
    return EngineCacheConfig(block, algo, True, 682, {"block_size": str(block)})


def test_the_page_is_parsed() -> None:
    c = cache_config(PAGE)
    assert c is not None
    assert (c.block_size, c.hash_algo, c.prefix_caching, c.kv_capacity_tokens) == (
        128,
        "sha256_cbor",
        True,
        87296,
    )


def test_an_unset_block_size_is_taken_from_the_engines() -> None:
    r = reconcile(PreciseSettings(), {"a": cfg(), "b": cfg()}, [VLLM])
    assert r.precise.block_size == 128 and r.adopted == {"block_size": 128}


def test_a_contradicted_block_size_or_algo_is_refused() -> None:
    with pytest.raises(EngineConfigMismatch, match="block_size is 16 but the engines use 128"):
        reconcile(PreciseSettings(block_size=16), {"a": cfg()}, [VLLM])
    with pytest.raises(EngineConfigMismatch, match="hash with 'xxhash_cbor'"):
        reconcile(PreciseSettings(block_size=128), {"a": cfg(algo="xxhash_cbor")}, [VLLM])
    with pytest.raises(EngineConfigMismatch, match="disagree on block_size"):
        reconcile(PreciseSettings(), {"a": cfg(), "b": cfg(16)}, [VLLM])


def test_adopting_takes_the_engines_values_when_asked() -> None:
    r = reconcile(
        PreciseSettings(block_size=16, adopt_engine_config=True, hash_seed="7"),
        {"a": cfg(algo="xxhash_cbor")},
        [VLLM],
    )
    assert (r.precise.block_size, r.precise.vllm_hash_algo) == (128, "xxhash_cbor")
    with pytest.raises(EngineConfigMismatch, match="seeds randomly"):
        reconcile(PreciseSettings(adopt_engine_config=True), {"a": cfg(algo="xxhash_cbor")}, [VLLM])


def test_no_engine_answering_keeps_the_config() -> None:
    assert reconcile(PreciseSettings(block_size=32), {}, [VLLM]).precise.block_size == 32
