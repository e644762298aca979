"""Real vLLM engines for side-by-side runs: a fresh fleet per gateway, warmed up, stopped whole.

`RealFleet` wraps `gateway.launch.vllm_fleet.VllmFleet` (the one engine launcher: the tiny
local model, one core per engine, prefix caching with `sha256_cbor`, prompt-token details,
KV events on ipc://) for `bench.peers`: `engines` (instance id -> base URL), `model`, and
the warmgate configuration that matches the engines, read from them where they say it (the
block size from `vllm:cache_config_info`, the hash seed the launcher knows it gave them).

`real_fleet_with_gateway(spec, name)` starts the engines (in a thread: the launcher
blocks), sends each one warm-up request of its own text (the first request after a start
costs 1.5-3 s extra, REAL_ENGINES.md), then starts gateway `name` in front; on exit the
gateway, then every engine's process tree, are stopped and the logs copied.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.peers import ASYNC_TIER_RUNS, WARMGATE_POLICIES, base_gateway, gateway_in_front
from gateway.launch.models import ensure_tiny_model
from gateway.launch.tiered import TieredConfig, TieredFleet
from gateway.launch.vllm_fleet import FleetConfig, VllmFleet
from gateway.pipeline import hf_tokenizer

# vLLM extra fields every replayed request carries: a random-weight model may stop at once or
# emit only special tokens (empty deltas); with these every reply is `max_tokens` of text.
VLLM_BODY_EXTRA: dict[str, Any] = {"ignore_eos": True, "skip_special_tokens": False}


@dataclass(frozen=True, slots=True)
class RealFleetSpec:
    """How every gateway's engines are started (identical for all of a comparison)."""

    instances: int = 2
    kv_cache_gib: float = 1.0
    block_size: int | None = None  # None: the engine's default (128 on CPU)
    num_gpu_blocks: int | None = None  # each engine's KV in blocks (None: kv_cache_gib's)
    start_timeout_s: float = 300.0
    # tierd beside each engine for warmgate's own gateways (the KV connector, one shared
    # array, `tierd_url` in warmgate's config: prefetch hints and measured tier bandwidths);
    # peers always get plain engines. `bench compare --tiers`.
    tiers: bool = False
    # the connector's modes (gateway.launch.tiered.TieredConfig): sync loads before the
    # forward pass or async ones beside it; lookups on vLLM's scheduler loop or off it
    tier_load: str = "sync"
    tier_lookup: str = "sync"
    # vLLM's --scheduling-policy; with "priority" warmgate marks the instances
    # priority_scheduling and sends each class's level (bench.priority_real)
    scheduling_policy: str = "fcfs"
    # the engines' own spans (vLLM's, tierd's connector's): (url, protocol) as
    # FleetConfig.otlp_traces; `bench compare --breakdown`
    otlp_traces: tuple[str, str] | None = None
    # more vLLM flags for every engine (`step_engine_args`: bench.priority_real, warm_real)
    engine_args: tuple[str, ...] = ()
    # every process of an engine on its core (FleetConfig.pin_tree; None: where the machine
    # has no core to spare); `bench compare --pin-engines on|off|auto`
    pin_engines: bool | None = None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of tokens, not {text}")
    return value


def add_step_option(parser: argparse.ArgumentParser) -> None:
    """`--max-num-batched-tokens` and `--long-prefill-token-threshold`, for the benches
    whose figure is a line's wait for a step."""
    parser.add_argument(
        "--max-num-batched-tokens",
        type=_positive_int,
        default=None,
        help="vLLM's token budget a step (default: the engine's): a smaller one shortens the "
        "step a line that arrives mid-prefill waits for",
    )
    parser.add_argument(
        "--long-prefill-token-threshold",
        type=_positive_int,
        default=None,
        help="vLLM's cap on one prefill's tokens a step while other requests share it "
        "(default: none): running prefills then leave room in the budget for lines that "
        "arrive beside them",
    )


def step_engine_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The vLLM flags of `add_step_option`'s values (none for the engine's defaults)."""
    flags: tuple[str, ...] = ()
    if args.max_num_batched_tokens is not None:
        flags += ("--max-num-batched-tokens", str(args.max_num_batched_tokens))
    if args.long_prefill_token_threshold is not None:
        flags += ("--long-prefill-token-threshold", str(args.long_prefill_token_threshold))
    return flags


def engine_block_size(metrics_text: str) -> int | None:
    """The block size an engine reports in `vllm:cache_config_info`."""
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name.startswith("vllm:cache_config_info") and "block_size" in sample.labels:
                return int(sample.labels["block_size"])
    return None


class RealFleet:
    """Fresh vLLM engines, one core each."""

    def __init__(
        self, spec: RealFleetSpec, run_dir: Path, *, tiered: bool = False, **tiered_args: Any
    ) -> None:
        """`tiered_args`: `gateway.launch.tiered.TieredConfig` fields (`redis_url`, ...)."""
        self.spec = spec
        self.cfg = FleetConfig(
            model_dir=ensure_tiny_model(), engines=spec.instances, run_dir=run_dir,
            block_size=spec.block_size, kv_cache_gib=spec.kv_cache_gib,
            num_gpu_blocks=spec.num_gpu_blocks,
            # vLLM refuses a context its KV cannot hold: a small cache gets a shorter one
            max_model_len=(spec.num_gpu_blocks - 1) * (spec.block_size or 128)
            if spec.num_gpu_blocks else None,
            start_timeout_s=spec.start_timeout_s, scheduling_policy=spec.scheduling_policy,
            otlp_traces=spec.otlp_traces, extra_args=spec.engine_args,
            pin_tree=spec.pin_engines,
            # spans exported twice a second, not every 5 s: the run's are in before it ends
            extra_env={"OTEL_BSP_SCHEDULE_DELAY": "500"} if spec.otlp_traces else {},
        )  # fmt: skip
        self.fleet: VllmFleet | TieredFleet = (
            TieredFleet(TieredConfig(self.cfg, **tiered_args)) if tiered else VllmFleet(self.cfg)
        )
        tf = self.fleet if isinstance(self.fleet, TieredFleet) else None
        self.tierd_urls = tf.tierd_urls if tf else {}
        self.tierd_events = tf.tierd_events if tf else {}
        self.engines = {e.id: e.url for e in self.fleet.engines}
        self.block_size: int | None = None

    @property
    def model(self) -> str:
        return self.cfg.served_model_name

    async def start(self) -> None:
        await asyncio.to_thread(self.fleet.start)
        async with httpx.AsyncClient(timeout=120.0, trust_env=False) as client:
            sizes = set()
            for url in self.engines.values():
                r = await client.get(f"{url}/metrics")
                sizes.add(engine_block_size(r.text))
            if len(sizes) != 1 or None in sizes:
                raise RuntimeError(f"engines report block sizes {sizes}")
            self.block_size = sizes.pop()
            await asyncio.gather(*(self._warm(client, url) for url in self.engines.values()))

    async def _warm(self, client: httpx.AsyncClient, url: str) -> None:
        """One request of text no workload shares, so it leaves nothing a replay could hit."""
        words = " ".join(secrets.token_hex(3) for _ in range(120))
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": f"warm-up {words}"}],
            "max_tokens": 4,
            **VLLM_BODY_EXTRA,
        }
        r = await client.post(f"{url}/v1/chat/completions", json=body)
        r.raise_for_status()

    async def stop(self) -> None:
        await asyncio.to_thread(self.fleet.stop)

    def warmgate_config(self, policy: str, port: int) -> dict[str, Any]:
        """warmgate in precise mode, hashing as these engines hash and hearing their events."""
        seed = self.cfg.effective_hash_seed
        if seed is None or self.block_size is None:
            raise RuntimeError("the engines' hash seed and block size must be known")
        return {
            "host": "127.0.0.1",
            "port": port,
            "log_level": "warning",
            "instances": [
                {
                    "id": e.id,
                    "url": e.url,
                    **({"tierd_url": self.tierd_urls[e.id]} if e.id in self.tierd_urls else {}),
                    **(
                        {"tierd_events_endpoint": self.tierd_events[e.id]}
                        if e.id in self.tierd_events
                        else {}
                    ),
                    "models": [self.model],
                    **(
                        {"kv_events_endpoint": e.kv_events_endpoint} if e.kv_events_endpoint else {}
                    ),
                    **(
                        {"priority_scheduling": True}
                        if self.cfg.scheduling_policy == "priority"
                        else {}
                    ),
                }
                for e in self.fleet.engines
            ],
            "routing": {
                "policy": policy,
                "mode": "precise",
                "precise": {
                    "hash": "vllm",
                    "vllm_hash_algo": self.cfg.hash_algo,
                    "hash_seed": seed,
                    "block_size": self.block_size,
                    # the engines' tokenizer files, read by the gateway: no /tokenize calls
                    **(
                        {"tokenizer_dir": str(self.cfg.model_dir)}
                        if hf_tokenizer.available()
                        else {}
                    ),
                },
            },
            "kv_events": {"enabled": self.cfg.kv_events, "topic": self.cfg.kv_events_topic},
            **({"tiers": {"hint_keys": "engine"}} if self.tierd_urls else {}),
        }


@contextlib.asynccontextmanager
async def real_fleet_with_gateway(
    spec: RealFleetSpec,
    gateway: str | None,
    keep_logs: Path | None = None,
    warmgate_env: Mapping[str, str] | None = None,
    source_tree: Path | None = None,
) -> Any:
    """Fresh engines (warmed up) and optionally one gateway; yields (fleet, gateway or None).
    `source_tree`: where tierd and the connector come from (None: this checkout)."""
    # short path: ipc:// socket paths must fit in 107 bytes
    workdir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="wg-cmp-"))
    # warmgate's own gateways (round robin included) get tierds; `-bare` and peers do not
    base = base_gateway(gateway) if gateway is not None else None
    tiered = spec.tiers and base in WARMGATE_POLICIES and not str(base).endswith("-bare")
    load, lookup = (
        ("async", "async") if base in ASYNC_TIER_RUNS else (spec.tier_load, spec.tier_lookup)
    )
    # may build the model once
    tree = {"source_root": source_tree} if source_tree is not None else {}
    fleet = await asyncio.to_thread(
        lambda: RealFleet(spec, workdir, tiered=tiered, load=load, lookup=lookup, **tree)
    )
    async with gateway_in_front(fleet, gateway, workdir, keep_logs, warmgate_env) as pair:
        yield pair
