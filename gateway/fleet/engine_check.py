"""Precise mode checked against the engines at startup: block size and hash algorithm.

Precise routing only works when the gateway cuts and hashes blocks exactly as the engines
do. An engine says how it does on its metrics page, read by its kind's adapter
(`Engine.cache_config`: vLLM's `vllm:cache_config_info`, `block_size` and
`prefix_caching_hash_algo`), so before serving the gateway asks every instance it can reach:

- a configured value the engines contradict refuses startup with `EngineConfigMismatch`
  (a wrong block size would otherwise be accepted silently and no prediction would ever
  match), unless `routing.precise.adopt_engine_config` is set: then the engines' values are
  used, and logged;
- `routing.precise.block_size` left unset is taken from the engines;
- engines that disagree with each other always refuse startup;
- an engine that is down or does not publish the metric is skipped (logged); with no
  engine answering, an unset block size falls back to the default;
- the hash seed the settings (after adopting) leave must be reproducible for the fleet's
  engine kinds (`gateway.engine.hashing`): `Reconciled.hashing` is what precise mode hashes
  with.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from contracts.errors import ConfigurationError
from gateway.config.settings import InstanceSettings, PreciseSettings, Settings
from gateway.engine.base import Engine, EngineCacheConfig
from gateway.engine.hashing import FleetHashing, UnseededHashError

log = logging.getLogger("warmgate.engine_check")


class EngineConfigMismatch(ConfigurationError, RuntimeError):
    """The engines hash or cut blocks otherwise than routing.precise says."""


@dataclass(frozen=True)
class Reconciled:
    precise: PreciseSettings
    reported: dict[str, EngineCacheConfig]
    adopted: dict[str, Any]
    hashing: FleetHashing | None  # None: precise.hash is warmgate's own xxh3


async def _ask(
    client: httpx.AsyncClient, inst: InstanceSettings, timeout_s: float
) -> EngineCacheConfig | None:
    url = f"{inst.url}{inst.adapter.metrics_path}"
    try:
        resp = await client.get(url, timeout=timeout_s)
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        log.warning("cannot read %s to check precise mode: %r", url, exc)
        return None
    return inst.adapter.cache_config(resp.text)


def _agreed(reported: dict[str, EngineCacheConfig], attr: str) -> Any:
    values = {i: getattr(c, attr) for i, c in reported.items() if getattr(c, attr) is not None}
    if len(set(values.values())) > 1:
        raise EngineConfigMismatch(
            f"the engines disagree on {attr}: {values}; precise routing needs one value"
        )
    return next(iter(values.values()), None)


def reconcile(
    precise: PreciseSettings, reported: dict[str, EngineCacheConfig], engines: Sequence[Engine]
) -> Reconciled:
    """The precise settings to serve with, given what each engine reported and the fleet's
    engine kinds (`Settings.engines()`) (pure)."""
    block = _agreed(reported, "block_size")
    algo = _agreed(reported, "hash_algo")
    reproducible = algo is not None and all(algo in e.hash_algos for e in engines)
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
        if precise.adopt_engine_config and reproducible:
            adopted["vllm_hash_algo"] = algo
        else:
            problems.append(
                f"routing.precise.vllm_hash_algo is {precise.vllm_hash_algo!r} but the engines "
                f"hash with {algo!r}" + ("" if reproducible else " (not reproducible)")
            )
    if problems:
        who = ", ".join(f"{i}: {c.block_size}/{c.hash_algo}" for i, c in reported.items())
        raise EngineConfigMismatch(
            "precise mode does not match the engines ("
            + who
            + "): "
            + "; ".join(problems)
            + ". Fix the config, or set routing.precise.adopt_engine_config: true to use "
            "the engines' values."
        )
    new = precise.model_copy(update=adopted) if adopted else precise
    hashing = None
    if new.hash == "vllm":
        try:
            hashing = new.hashing(engines)
        except UnseededHashError as exc:
            raise EngineConfigMismatch(
                f"the engines hash with {new.vllm_hash_algo}, which their kind seeds randomly "
                f"without a seed: set it on the engines and routing.precise.hash_seed ({exc})"
            ) from exc
        except ConfigurationError as exc:
            raise EngineConfigMismatch(f"precise mode cannot hash as the engines: {exc}") from exc
    return Reconciled(new, reported, adopted, hashing)


async def check_engines(settings: Settings, client: httpx.AsyncClient) -> Reconciled:
    """Ask every instance's metrics page, then `reconcile` (raises EngineConfigMismatch)."""
    timeout = max(settings.health.timeout_s, 2.0)
    answers = await asyncio.gather(*(_ask(client, i, timeout) for i in settings.instances))
    reported = {i.id: a for i, a in zip(settings.instances, answers, strict=True) if a is not None}
    result = reconcile(settings.routing.precise, reported, settings.engines())
    if result.adopted:
        log.warning("precise mode adopts the engines' %s", result.adopted)
    if not reported:
        log.warning(
            "no engine reported its cache config; precise mode uses block size %d",
            result.precise.effective_block_size,
        )
    return result
