"""Settings of one simulated engine, and the command line that sets them."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

from sim.engine.block_hash import HASH_ALGORITHMS
from sim.engine.kv_events import ENCODINGS
from sim.profiles import DEFAULT_PROFILE, PROFILES

DEFAULT_MODEL = "sim-qwen2.5-32b"


@dataclass(frozen=True)
class EngineConfig:
    instance_id: str = "sim-0"
    model: str = DEFAULT_MODEL
    host: str = "127.0.0.1"
    port: int = 8100
    profile: str = DEFAULT_PROFILE
    time_scale: float = 1.0
    seed: int = 0
    kv_capacity_tokens: int | None = None  # default: the profile's
    block_tokens: int = 16
    max_model_len: int = 131_072
    max_num_seqs: int | None = None  # default: the profile's
    max_batch_tokens: int | None = None  # default: the profile's
    block_hash: str = "sha256_cbor"
    hash_seed: str | None = None  # vLLM's PYTHONHASHSEED; None: random per process
    tierd_url: str | None = None
    tier_block_chars: int = 256  # the gateway's approximate block: 64 tokens x 4 chars
    tier_payload_bytes_per_token: int = 64  # real bytes moved per token (scaled payload)
    kv_events_endpoint: str | None = None
    kv_events_topic: str = "kv-events"
    kv_events_encoding: str = "map"
    log_level: str = "warning"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sim.engine",
        description="Simulated OpenAI-compatible inference engine (vLLM-like).",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--instance-id", default="sim-0")
    p.add_argument("--model", default=DEFAULT_MODEL, help="served model id")
    p.add_argument("--profile", default=DEFAULT_PROFILE, choices=sorted(PROFILES))
    p.add_argument(
        "--time-scale", type=float, default=1.0, help="wall seconds per simulated second"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the generated text")
    p.add_argument("--kv-capacity-tokens", type=int, default=None)
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=131_072)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-batch-tokens", type=int, default=None)
    p.add_argument("--block-hash", default="sha256_cbor", choices=sorted(HASH_ALGORITHMS))
    p.add_argument(
        "--hash-seed",
        default=os.environ.get("PYTHONHASHSEED"),
        help="seed of NONE_HASH (default: $PYTHONHASHSEED; unset: random, as in vLLM)",
    )
    p.add_argument("--tierd-url", default=None, help="keep slower KV tiers in this tierd")
    p.add_argument(
        "--tier-block-chars",
        type=int,
        default=256,
        help="characters per tierd slice: the gateway's approximate block size",
    )
    p.add_argument(
        "--tier-payload-bytes-per-token",
        type=int,
        default=64,
        help="bytes actually stored per token (transfer time is charged for the real size)",
    )
    p.add_argument("--kv-events-endpoint", default=None, help="e.g. tcp://127.0.0.1:5557")
    p.add_argument("--kv-events-topic", default="kv-events")
    p.add_argument("--kv-events-encoding", default="map", choices=ENCODINGS)
    p.add_argument("--log-level", default="warning")
    return p


def parse_config(argv: Sequence[str] | None = None) -> EngineConfig:
    a = build_parser().parse_args(argv)
    if a.time_scale < 0:
        raise SystemExit("--time-scale must be >= 0")
    return EngineConfig(
        instance_id=a.instance_id,
        model=a.model,
        host=a.host,
        port=a.port,
        profile=a.profile,
        time_scale=a.time_scale,
        seed=a.seed,
        kv_capacity_tokens=a.kv_capacity_tokens,
        block_tokens=a.block_tokens,
        max_model_len=a.max_model_len,
        max_num_seqs=a.max_num_seqs,
        max_batch_tokens=a.max_batch_tokens,
        block_hash=a.block_hash,
        hash_seed=a.hash_seed,
        tierd_url=a.tierd_url,
        tier_block_chars=a.tier_block_chars,
        tier_payload_bytes_per_token=a.tier_payload_bytes_per_token,
        kv_events_endpoint=a.kv_events_endpoint,
        kv_events_topic=a.kv_events_topic,
        kv_events_encoding=a.kv_events_encoding,
        log_level=a.log_level,
    )
