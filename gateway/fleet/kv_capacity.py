"""Learns each instance's HBM KV capacity from its engine's Prometheus metrics and hands it
to the routing policy (`policy.set_kv_capacity(instance, tokens)`, for a policy that
`wants_kv_capacity`;
the `ttft` policy prices the active sessions' KV a placement would push out of HBM).

The instance's engine kind reads it (`Engine.kv_capacity`): vLLM publishes its cache
configuration as the labels of `vllm:cache_config_info` (value 1), and `num_gpu_blocks` x
`block_size` is what the instance holds in HBM, in tokens. An engine that does not publish it
(or still says `num_gpu_blocks="None"`, before its memory profiling) is asked again after
`retry_s`; a known capacity is read again after `refresh_s`, since an engine may restart with
another configuration. A configured `kv_capacity_tokens` in the policy's params stays the
default for instances that never tell.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.config.settings import InstanceSettings
from gateway.state import AppState

log = logging.getLogger("warmgate.kv_capacity")


async def read_capacity(state: AppState, inst: InstanceSettings) -> int | None:
    engine = inst.adapter
    r = await state.client.get(
        f"{inst.url}{engine.metrics_path}", timeout=state.settings.health.timeout_s
    )
    r.raise_for_status()
    return engine.kv_capacity(r.text)


async def discover_once(state: AppState) -> dict[str, int]:
    """Ask every instance once; returns (and hands the policy) the capacities found."""
    found: dict[str, int] = {}
    for inst in state.health.instances():  # the fleet as it is now (it changes at runtime)
        try:
            tokens = await read_capacity(state, inst)
        except Exception as exc:  # an engine without /metrics, or down: ask again later
            log.debug("kv capacity of %s unknown: %r", inst.id, exc)
            continue
        if tokens is not None:
            found[inst.id] = tokens
            state.router.policy.set_kv_capacity(inst.id, tokens)
    return found


async def run_discovery(state: AppState, *, retry_s: float, refresh_s: float = 300.0) -> None:
    """Discover until every instance has told, then refresh (cancelled at shutdown)."""
    known: set[str] = set()
    while True:
        known |= set(await discover_once(state))
        everyone = {inst.id for inst in state.health.instances()}
        await asyncio.sleep(refresh_s if known >= everyone else retry_s)
