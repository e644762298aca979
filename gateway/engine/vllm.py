"""The vLLM engine kind (`instances[].engine: vllm`, the default): an `Engine`
(`gateway.engine.base`) for vLLM's OpenAI-compatible server, as of vLLM 0.32.

- routes: `/health`, `/v1/models` (`{"data": [{"id": ...}, ...]}`), `/metrics`, `/tokenize`
  (the tokenize payload as the body; the answer's `tokens`);
- metrics: vLLM's series (`gateway.engine.vllm_metrics`), `vllm:cache_config_info` for the
  block size, hash algorithm and capacity (`num_gpu_blocks` x `block_size`);
- KV events: `contracts.kv_events` with vLLM's replay (`gateway.engine.kv_wire.VLLM_EVENTS`);
- block hashes: `router.precise.VllmBlockHasher` (`sha256_cbor`, the default, or
  `xxhash_cbor`), seeded by the engines' `PYTHONHASHSEED`; without it vLLM seeds sha256_cbor
  with "vllm-none-hash" (vllm/v1/core/kv_cache_utils.py `init_none_hash`) and xxhash_cbor
  with random bytes;
- priority: `X-Vllm-Priority` (vLLM's PRIORITY_HEADER, entrypoints), read before the body's
  `priority` by an engine run with `--scheduling-policy priority`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.engine import vllm_metrics
from gateway.engine.base import EngineCacheConfig, EngineLoad, KvEventWire, MetricNames
from gateway.engine.kv_wire import VLLM_EVENTS
from router.precise import BlockHasher, UnsupportedHashError, VllmBlockHasher, VllmHashAlgo

VLLM_UNSEEDED_SHA256_CBOR = "vllm-none-hash"
VLLM_PRIORITY_HEADER = "x-vllm-priority"
VLLM_HASH_ALGOS: tuple[VllmHashAlgo, ...] = ("sha256_cbor", "xxhash_cbor")


class VllmEngine:
    """vLLM, as the gateway talks to it. Stateless: one object serves every instance (the
    protocol's read-only members are plain class attributes)."""

    kind: str = "vllm"
    label: str = "vLLM"
    health_path: str = "/health"
    models_path: str = "/v1/models"
    metrics_path: str = "/metrics"
    load_path: str = vllm_metrics.LOAD_PATH
    tokenize_path: str = "/tokenize"
    metric_names: MetricNames = vllm_metrics.NAMES
    kv_events: KvEventWire = VLLM_EVENTS
    hash_scheme: str = "vllm_cbor"  # router.precise.VllmBlockHasher
    hash_algos: tuple[str, ...] = VLLM_HASH_ALGOS
    hash_seed_source: str = "PYTHONHASHSEED"
    priority_header: str | None = VLLM_PRIORITY_HEADER

    def served_models(self, answer: Any) -> list[str] | None:
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list):
            return None
        return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]

    def tokenize_body(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        return dict(payload)  # the tokenize payload is vLLM's /tokenize body

    def tokens(self, answer: Any) -> list[int] | None:
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            return None
        return [int(t) for t in tokens]

    def load(self, metrics_text: str) -> EngineLoad:
        return vllm_metrics.parse_load(metrics_text)

    def cache_config(self, metrics_text: str) -> EngineCacheConfig | None:
        return vllm_metrics.cache_config(metrics_text)

    def kv_capacity(self, metrics_text: str) -> int | None:
        config = self.cache_config(metrics_text)
        return config.kv_capacity_tokens if config is not None else None

    def unseeded_hash_seed(self, algo: str) -> str | None:
        return VLLM_UNSEEDED_SHA256_CBOR if algo == "sha256_cbor" else None

    def block_hasher(self, *, algo: str, seed: str, block_size: int) -> BlockHasher:
        for known in VLLM_HASH_ALGOS:
            if algo == known:
                return VllmBlockHasher(hash_seed=seed, block_size=block_size, algo=known)
        raise UnsupportedHashError(
            f"{self.label} block hash {algo!r} cannot be reproduced; one of {self.hash_algos}"
        )


VLLM = VllmEngine()
