"""Polls each instance's tierd stats and hands the measured tier bandwidths to the routing
policy (`policy.set_bandwidths(instance, {"host": bps, "array": bps, "snapshot": bps})`, keyed
by `contracts.tiers.Tier.label`). The last stats are kept for `/admin/instances`.

Bandwidths (bytes per second into HBM) come from tierd's `bandwidth_bytes_per_s` (measured
rates preferred over configured ones).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from contracts.tiers import Tier
from router.policies.base import Policy
from tierd.client import TierdClient

log = logging.getLogger("warmgate.tiers")

_LABELS = tuple(t.label for t in Tier if t is not Tier.HBM)


def _pick(source: Any) -> dict[str, float]:
    if not isinstance(source, Mapping):
        return {}
    out: dict[str, float] = {}
    for label in _LABELS:
        value = source.get(label)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            out[label] = float(value)
    return out


def extract_bandwidths(stats: Mapping[str, Any]) -> dict[str, float]:
    """Tier label -> bytes/s found in a tierd stats answer (missing tiers left out).

    tierd answers `bandwidth_bytes_per_s: {measured: {array, snapshot}, configured: {...}}`;
    a measured rate wins over the configured one, tier by tier. A flat `bandwidths` mapping
    is read too."""
    nested = stats.get("bandwidth_bytes_per_s")
    if isinstance(nested, Mapping):
        return {**_pick(nested.get("configured")), **_pick(nested.get("measured"))}
    return _pick(stats.get("bandwidths"))


async def poll_once(
    clients: Mapping[str, TierdClient],
    policy: Policy,
    into: dict[str, dict[str, Any]],
    timeout_s: float,
) -> None:
    """Each tierd's stats into `into` (by instance), its bandwidths to the routing policy."""
    for instance, client in list(clients.items()):
        try:
            stats = await asyncio.wait_for(client.stats(), timeout=timeout_s)
        except Exception as exc:
            into[instance] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        if not isinstance(stats, Mapping):
            continue
        into[instance] = dict(stats)
        bandwidths = extract_bandwidths(stats)
        if bandwidths:
            policy.set_bandwidths(instance, bandwidths)


async def run_poller(
    clients: Mapping[str, TierdClient],
    policy: Policy,
    into: dict[str, dict[str, Any]],
    *,
    interval_s: float,
    timeout_s: float,
) -> None:
    """Poll forever every `interval_s` (cancelled at shutdown)."""
    while True:
        try:
            await poll_once(clients, policy, into, timeout_s)
        except Exception as exc:  # a bad round is logged; the next one tries again
            log.warning("tier stats poll failed: %r", exc)
        await asyncio.sleep(interval_s)
