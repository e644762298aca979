"""Emulated transfer time: charge each load into L1 the time the real model's KV would take.

tierd cannot import `sim`, so it keeps a small table of its own, named as `sim.profiles`'
profiles: KV bytes per token (the same as the simulator's profile of that name,
tests/unit/test_tier_vocabulary.py checks it) and tier bandwidths, bytes/s, taken from
`contracts.tiers.DEFAULT_BANDWIDTH_BPS` as the simulator's are (sources: PROTOCOLS §5–6):
``array`` is the shared array → HBM path, ``snapshot`` is cold snapshots read + decompress.
A slice put with a token count is charged tokens × KV bytes per token; without one, its
payload length. Each tier is one link: transfers queue on it (start = max(now, busy until),
busy until += bytes ÷ bandwidth), so concurrent loads share the bandwidth as a real link
does; the caller sleeps (cancellably) until its transfer's end; a transfer cancelled with
nothing queued behind it hands its unused time back. Flags `--array-gbps` and
`--snapshot-gbps` override a profile's figures (or give them without a profile). `--time-scale`
matches the simulated engines' clock (0.1 = ten times faster than real time), so emulated
loads and emulated compute stay in proportion.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from contracts.errors import ConfigurationError
from contracts.tiers import DEFAULT_BANDWIDTH_BPS, Tier


class EmulationError(ConfigurationError, ValueError):
    """An unknown emulation profile or a time scale that is not positive."""


@dataclass(frozen=True, slots=True)
class EmulationProfile:
    name: str
    kv_bytes_per_token: int
    array_bps: float
    snapshot_bps: float
    source: str


PROFILES: dict[str, EmulationProfile] = {
    p.name: p
    for p in (
        EmulationProfile(
            "qwen2.5-32b-h200",
            256 * 1024,
            DEFAULT_BANDWIDTH_BPS[Tier.ARRAY],
            DEFAULT_BANDWIDTH_BPS[Tier.SNAPSHOT],
            "Qwen2.5-32B bf16 KV (64 layers × 8 KV heads × 128 × 2 × 2 B); NVMe-oF array "
            "with parallel reads staged through host ~10 GB/s; snapshots read+zstd ~3 GB/s",
        ),
        EmulationProfile(
            "llama3-8b-h100",
            128 * 1024,
            DEFAULT_BANDWIDTH_BPS[Tier.ARRAY],
            DEFAULT_BANDWIDTH_BPS[Tier.SNAPSHOT],
            "Llama-3-8B bf16 KV (32 × 8 × 128 × 2 × 2 B); same array and snapshot links",
        ),
        EmulationProfile("zero", 256 * 1024, 0.0, 0.0, "no transfer time charged"),
    )
}


class Link:
    """One emulated tier → L1 link of a fixed bandwidth (0 = free)."""

    def __init__(self, bytes_per_s: float, time_scale: float = 1.0) -> None:
        self.bytes_per_s = bytes_per_s
        self.time_scale = time_scale  # wall seconds per emulated second (engines' --time-scale)
        self._busy_until = 0.0

    @property
    def busy_until(self) -> float:
        """When the transfers queued so far will be done (time.monotonic() clock)."""
        return self._busy_until

    async def transfer(self, nbytes: int) -> None:
        if self.bytes_per_s <= 0 or nbytes <= 0:
            return
        now = time.monotonic()
        start = max(now, self._busy_until)
        end = start + nbytes / self.bytes_per_s * self.time_scale
        self._busy_until = end
        try:
            await asyncio.sleep(end - now)
        except asyncio.CancelledError:
            # an abandoned transfer stops using the link: give back its unused time
            # when nothing was queued behind it
            if self._busy_until == end:
                self._busy_until = max(start, time.monotonic())
            raise


class Emulator:
    """The links of one tierd and how many bytes a slice counts for."""

    def __init__(
        self,
        profile: str | None,
        array_gbps: float | None = None,
        snapshot_gbps: float | None = None,
        time_scale: float = 1.0,
    ) -> None:
        p = PROFILES.get(profile) if profile else None
        if profile and p is None:
            raise EmulationError(
                f"unknown emulation profile {profile!r}; known: {sorted(PROFILES)}"
            )
        self.profile = p
        array_bps = array_gbps * 1e9 if array_gbps is not None else (p.array_bps if p else 0.0)
        snap_bps = (
            snapshot_gbps * 1e9 if snapshot_gbps is not None else (p.snapshot_bps if p else 0.0)
        )
        if time_scale <= 0:
            raise EmulationError("time_scale must be positive")
        self.time_scale = time_scale
        self.array = Link(array_bps, time_scale)
        self.snapshot = Link(snap_bps, time_scale)

    def charged_bytes(self, payload_bytes: int, tokens: int | None) -> int:
        if self.profile is not None and tokens:
            return tokens * self.profile.kv_bytes_per_token
        return payload_bytes

    def describe(self) -> dict[str, object]:
        return {
            "profile": self.profile.name if self.profile else None,
            "source": self.profile.source if self.profile else None,
            "kv_bytes_per_token": self.profile.kv_bytes_per_token if self.profile else None,
            "array_bytes_per_s": self.array.bytes_per_s or None,
            "snapshot_bytes_per_s": self.snapshot.bytes_per_s or None,
            "time_scale": self.time_scale,
        }
