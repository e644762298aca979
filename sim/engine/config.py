"""Settings of one simulated engine, and the command line that sets them (every flag has
an env twin, `WARMGATE_ENGINE__<FLAG>`, e.g. `WARMGATE_ENGINE__TIME_SCALE=0.01`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
    token_ids: bool = True  # honour `return_token_ids` (False: ignore it, as older engines)


ENV_PREFIX = "WARMGATE_ENGINE__"


def _option(p: argparse.ArgumentParser, flag: str, default: Any = None, **kw: Any) -> None:
    """A flag whose default comes from its env twin (`WARMGATE_ENGINE__<FLAG>`) if set."""
    env = ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()
    help_text = kw.pop("help", "")
    p.add_argument(
        flag, default=os.environ.get(env, default), help=f"{help_text} [env {env}]".strip(), **kw
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sim.engine",
        description="Simulated OpenAI-compatible inference engine (vLLM-like).",
    )
    _option(p, "--host", "127.0.0.1")
    _option(p, "--port", 8100, type=int)
    _option(p, "--instance-id", "sim-0", help="sent back in the x-engine-instance header")
    _option(p, "--model", DEFAULT_MODEL, help="served model id")
    _option(p, "--profile", DEFAULT_PROFILE, choices=sorted(PROFILES), help="timing profile")
    _option(p, "--time-scale", 1.0, type=float, help="wall seconds per simulated second")
    _option(p, "--seed", 0, type=int, help="seed of the generated text")
    _option(p, "--kv-capacity-tokens", type=int, help="KV cache size (default: the profile's)")
    _option(p, "--block-tokens", 16, type=int, help="tokens per KV block")
    _option(p, "--max-model-len", 131_072, type=int)
    _option(p, "--max-num-seqs", type=int, help="batch slots (default: the profile's)")
    _option(p, "--max-batch-tokens", type=int, help="tokens per step (default: the profile's)")
    _option(p, "--block-hash", "sha256_cbor", choices=sorted(HASH_ALGORITHMS))
    _option(
        p,
        "--hash-seed",
        os.environ.get("PYTHONHASHSEED"),
        help="seed of NONE_HASH (default: $PYTHONHASHSEED; unset: random, as in vLLM)",
    )
    _option(p, "--tierd-url", help="keep slower KV tiers in this tierd")
    _option(
        p,
        "--tier-block-chars",
        256,
        type=int,
        help="characters per tierd slice: the gateway's approximate block size",
    )
    _option(
        p,
        "--tier-payload-bytes-per-token",
        64,
        type=int,
        help="bytes actually stored per token (transfer time is charged for the real size)",
    )
    _option(p, "--kv-events-endpoint", help="ZMQ PUB bind address, e.g. tcp://127.0.0.1:5557")
    _option(p, "--kv-events-topic", "kv-events")
    _option(p, "--kv-events-encoding", "map", choices=ENCODINGS)
    _option(p, "--log-level", "warning")
    _option(
        p,
        "--token-ids",
        "returned",
        choices=("returned", "ignored"),
        help="return_token_ids honoured as vLLM does, or ignored as engines that lack it",
    )
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
        token_ids=a.token_ids == "returned",
    )
