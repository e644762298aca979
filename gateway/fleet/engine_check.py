"""Precise mode checked against the engines at startup: block size and hash algorithm.

Precise routing only works when the gateway cuts and hashes blocks exactly as the engines
do. vLLM says how it does in `vllm:cache_config_info` (`block_size`,
`prefix_caching_hash_algo`), so before serving the gateway asks every instance it can reach:

- a configured value the engines contradict refuses startup with `EngineConfigMismatch`
  (a wrong block size would otherwise be accepted silently and no prediction would ever
  match), unless `routing.precise.adopt_engine_config` is set: then the engines' values are
  used, and logged;
- `routing.precise.block_size` left unset is taken from the engines;
- engines that disagree with each other always refuse startup;
- an engine that is down or does not publish the metric is skipped (logged); with no
  engine answering, an unset block size falls back to the default.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import httpx

from contracts.errors import ConfigurationError
from gateway.config.settings import PreciseSettings, Settings
from gateway.engine.vllm_metrics import EngineCacheConfig, cache_config

log = logging.getLogger("warmgate.engine_check")


class EngineConfigMismatch(ConfigurationError, RuntimeError):
    """The engines hash or cut blocks otherwise than routing.precise says."""


@dataclass(frozen=True)
class Reconciled:
    precise: PreciseSettings
    reported: dict[str, EngineCacheConfig]
    adopted: dict[str, Any]


async def _ask(client: httpx.AsyncClient, url: str, timeout_s: float) -> EngineCacheConfig | None:
    try:
        resp = await client.get(f"{url}/metrics", timeout=timeout_s)
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        log.warning("cannot read %s/metrics to check precise mode: %r", url, exc)
        return None
    return cache_config(resp.text)


def _agreed(reported: dict[str, EngineCacheConfig], attr: str) -> Any:
    values = {i: getattr(c, attr) for i, c in reported.items() if getattr(c, attr) is not None}
    if len(set(values.values())) > 1:
        raise EngineConfigMismatch(
            f"the engines disagree on {attr}: {values}; precise routing needs one value"
        )
    return next(iter(values.values()), None)


def reconcile(precise: PreciseSettings, reported: dict[str, EngineCacheConfig]) -> Reconciled:
    """The precise settings to serve with, given what each engine reported (pure)."""
    block = _agreed(reported, "block_size")
    algo = _agreed(reported, "hash_algo")
    adopted: dict[str, Any] = {}
    problems: list[str] = []
    if block is not None and precise.block_size is None:
        adopted["block_size"] = block
    elif block is not None and block != precise.block_size:
        if precise.adopt_engine_config:
            adopted["block_size"] = block
        else:
            problems.append(
                f"routing.precise.block_size is {precise.block_size} but the engines use "
                f"{block} tokens per block"
            )
    if precise.hash == "vllm" and algo is not None and algo != precise.vllm_hash_algo:
        if precise.adopt_engine_config and algo in ("sha256_cbor", "xxhash_cbor"):
            adopted["vllm_hash_algo"] = algo
        else:
            problems.append(
                f"routing.precise.vllm_hash_algo is {precise.vllm_hash_algo!r} but the engines "
                f"hash with {algo!r}"
                + ("" if algo in ("sha256_cbor", "xxhash_cbor") else " (not reproducible)")
            )
    if problems:
        who = ", ".join(
            f"{i}: {c.labels.get('block_size')}/{c.hash_algo}" for i, c in reported.items()
        )
        raise EngineConfigMismatch(
            "precise mode does not match the engines ("
            + who
            + "): "
            + "; ".join(problems)
            + ". Fix the config, or set routing.precise.adopt_engine_config: true to use "
            "the engines' values."
        )
    new = precise.model_copy(update=adopted) if adopted else precise
    if new.effective_hash_seed is None:
        raise EngineConfigMismatch(
            "the engines hash with xxhash_cbor, which vLLM seeds randomly without "
            "PYTHONHASHSEED: set it on the engines and routing.precise.hash_seed"
        )
    return Reconciled(new, reported, adopted)


async def check_engines(settings: Settings, client: httpx.AsyncClient) -> Reconciled:
    """Ask every instance's /metrics, then `reconcile` (raises EngineConfigMismatch)."""
    timeout = max(settings.health.timeout_s, 2.0)
    answers = await asyncio.gather(*(_ask(client, i.url, timeout) for i in settings.instances))
    reported = {i.id: a for i, a in zip(settings.instances, answers, strict=True) if a is not None}
    result = reconcile(settings.routing.precise, reported)
    if result.adopted:
        log.warning("precise mode adopts the engines' %s", result.adopted)
    if not reported:
        log.warning(
            "no engine reported its cache config; precise mode uses block size %d",
            result.precise.effective_block_size,
        )
    return result
