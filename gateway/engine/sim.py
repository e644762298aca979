"""The simulated engine kind (`instances[].engine: sim`, `python -m sim.engine`): an `Engine`
(`gateway.engine.base`) that reuses vLLM's wire behaviour, since the simulated engine mimics
vLLM by design: the same routes and answers (`/health`, `/v1/models`, `/tokenize`), the same
`/metrics` series (`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`,
`vllm:cache_config_info`, ...; not the prompt-token-by-source counters), the same KV event
messages and the same block hashes (`router.precise.VllmBlockHasher`, `--block-hash
sha256_cbor|xxhash_cbor`).

Where it differs, this kind says so:
- its KV events have no replay endpoint (`instances[].kv_events_replay_endpoint` is refused);
- its hash seed is `--hash-seed` (`WARMGATE_ENGINE__HASH_SEED`), and without one it seeds
  both algorithms with random bytes (vLLM seeds sha256_cbor with "vllm-none-hash"): precise
  mode over simulated engines needs `routing.precise.hash_seed`;
- it schedules first come, first served: no priority header (`priority_scheduling` is refused).
"""

from __future__ import annotations

from gateway.engine.kv_wire import PUBLISHED_EVENTS
from gateway.engine.vllm import VllmEngine


class SimEngine(VllmEngine):
    """`sim.engine`, as the gateway talks to it: vLLM's behaviour but for the above."""

    kind = "sim"
    label = "the simulated engine"
    kv_events = PUBLISHED_EVENTS
    hash_seed_source = "--hash-seed"
    priority_header = None

    def unseeded_hash_seed(self, algo: str) -> str | None:
        return None  # sim.engine.block_hash: a random seed string per process


SIM = SimEngine()
