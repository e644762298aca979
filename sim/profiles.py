"""Timing profiles: how long prefill and decode take on one inference instance, and how fast
KV moves between its tiers. Shared by `sim.engine` (live) and `sim.cluster` (simulated time).

Prefill of U uncached tokens after C cached ones (one request, or a batch's sum):

    prefill_s = overhead + per_token * U + attention * U * (C + U / 2)

the linear term being the model's dense FLOPs (2 x params per token) at a realistic MFU and
the quadratic term attention over the context each new token sees. Decode, one step of a
batch of B sequences whose KV totals K tokens:

    step_s = step_base + per_seq * B + per_kv_token * K

`step_base` reads the weights once per step (memory bound), `per_kv_token` reads each
sequence's KV (bytes per token / HBM bandwidth). Each profile names its source.

Loads from the slower tiers take `tokens x kv_bytes_per_token / bandwidths[tier]`, the
bandwidths keyed by `contracts.tiers.Tier` and, unless a profile says otherwise (`zero`: free
loads), `contracts.tiers.DEFAULT_BANDWIDTH_BPS`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contracts.errors import ConfigurationError
from contracts.tiers import DEFAULT_BANDWIDTH_BPS, Tier

GIB = 1024**3


def default_bandwidths() -> dict[Tier, float]:
    """Bytes per second into HBM from each slower tier: the reference deployment's,
    `contracts.tiers.DEFAULT_BANDWIDTH_BPS` (a copy, so no profile can change them)."""
    return dict(DEFAULT_BANDWIDTH_BPS)


class ProfileBandwidthError(ConfigurationError, ValueError):
    """A profile whose bandwidths miss a tier slower than HBM or are not positive."""


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    source: str
    kv_bytes_per_token: int
    prefill_overhead_s: float
    prefill_per_token_s: float
    prefill_attention_s: float  # per (new token x context token)
    step_base_s: float
    step_per_seq_s: float
    step_per_kv_token_s: float
    kv_capacity_tokens: int  # HBM left for KV after weights and activations
    max_batch_tokens: int = 8192  # chunked-prefill token budget per step
    max_num_seqs: int = 64
    # a step taken while another instance on the same machine computes takes this many
    # times as long (CPU engines sharing a machine's cores: sim.cluster.cores); 1: own hardware
    shared_core_slowdown: float = 1.0
    # bytes/s into HBM by tier (every tier slower than HBM): the contracts' defaults unless a
    # profile overrides them
    bandwidths: Mapping[Tier, float] = field(default_factory=default_bandwidths)

    def __post_init__(self) -> None:
        bad = [
            t.label
            for t in DEFAULT_BANDWIDTH_BPS
            if not self.bandwidths.get(t, 0.0) > 0 or not math.isfinite(self.bandwidths[t])
        ]
        if bad:
            raise ProfileBandwidthError(
                f"profile {self.name!r}: no positive finite bandwidth for {', '.join(bad)}"
            )

    def prefill_seconds(self, uncached_tokens: int, cached_tokens: int = 0) -> float:
        """Time to prefill `uncached_tokens` new tokens that follow `cached_tokens` cached ones."""
        if uncached_tokens <= 0:
            return self.prefill_overhead_s
        u, c = float(uncached_tokens), float(cached_tokens)
        return (
            self.prefill_overhead_s
            + self.prefill_per_token_s * u
            + self.prefill_attention_s * u * (c + u / 2.0)
        )

    def decode_step_seconds(self, batch_size: int, kv_tokens: int) -> float:
        """One decode step for `batch_size` sequences holding `kv_tokens` tokens of KV in all."""
        if batch_size <= 0:
            return 0.0
        return (
            self.step_base_s
            + self.step_per_seq_s * batch_size
            + self.step_per_kv_token_s * kv_tokens
        )

    def load_seconds(self, tokens: int, bandwidth_bytes_per_s: float) -> float:
        """Time to bring `tokens` tokens of KV into HBM at the given bandwidth."""
        if tokens <= 0:
            return 0.0
        return tokens * self.kv_bytes_per_token / bandwidth_bytes_per_s


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="qwen2.5-32b-h200",
            source=(
                "Qwen2.5-32B with FP8 weights (W8A8, vLLM --quantization fp8) and bf16 KV on "
                "one H200 (TP1), computed: 64 layers, 8 KV heads x 128 dims -> 256 KiB "
                "KV/token; dense 2x32.8e9 FLOP/token at ~45% of the 1,979 TFLOP/s FP8 dense "
                "peak (NVIDIA H200 datasheet) -> 74 us/token (about 1.6x the bf16 rate, the "
                "FP8 prefill speed-up usually reported for vLLM; bf16 at ~55% MFU would be "
                "120 us); attention in bf16, 4x64x5120 FLOP per (new, context) token pair at "
                "~600 TFLOP/s (FlashAttention-3 reports 600-740 on H100-class compute) -> "
                "2.2e-9 s; decode reads 33 GB of FP8 weights at ~4.0 TB/s effective of 4.8 "
                "-> 8.5 ms/step, bf16 KV 256 KiB at 4.0 TB/s -> 65 ns per KV token; "
                "141 GB - 33 GB weights - 10 GB activations -> 98 GB of KV = 375k tokens"
            ),
            kv_bytes_per_token=256 * 1024,
            prefill_overhead_s=0.015,
            prefill_per_token_s=74e-6,
            prefill_attention_s=2.2e-9,
            step_base_s=0.0085,
            step_per_seq_s=0.0002,
            step_per_kv_token_s=65e-9,
            kv_capacity_tokens=375_000,
        ),
        Profile(
            name="llama3-8b-h100",
            source=(
                "Llama-3-8B bf16 on one H100, computed: 32 layers, 8 KV heads x 128 dims "
                "-> 128 KiB KV/token; Vidur's Llama-2-7B/H100 linear fit 2.9 ms + 20 us/token "
                "(PROTOCOLS §5) scaled to 8B -> 3 ms + 23 us/token; attention 4x32x4096 FLOP "
                "per pair -> 1.3e-9 s at 400 TFLOP/s; decode 16 GB weights at 3.0 TB/s "
                "-> 5.5 ms/step, KV 128 KiB at 3.0 TB/s -> 44 ns per KV token; "
                "80 GB - 16 GB - 8 GB -> 56 GB of KV = 430k tokens"
            ),
            kv_bytes_per_token=128 * 1024,
            prefill_overhead_s=0.003,
            prefill_per_token_s=23e-6,
            prefill_attention_s=1.3e-9,
            step_base_s=0.0055,
            step_per_seq_s=0.0001,
            step_per_kv_token_s=44e-9,
            kv_capacity_tokens=430_000,
        ),
        Profile(
            name="zero",
            source="no compute time at all: measures a gateway's own overhead",
            kv_bytes_per_token=256 * 1024,
            prefill_overhead_s=0.0,
            prefill_per_token_s=0.0,
            prefill_attention_s=0.0,
            step_base_s=0.0,
            step_per_seq_s=0.0,
            step_per_kv_token_s=0.0,
            kv_capacity_tokens=10_000_000,
            # this profile's own figures, deliberately not the defaults: loads are free
            bandwidths=dict.fromkeys(DEFAULT_BANDWIDTH_BPS, 1e18),
        ),
    )
}

DEFAULT_PROFILE = "qwen2.5-32b-h200"
# Profiles fitted to real engines (`warmgate bench simfit`), one JSON file each, by name
FITTED_DIR = Path(__file__).with_name("fitted")


class UnknownProfileError(ConfigurationError, ValueError):
    """A timing profile name that is not in `PROFILES`."""


class ProfileFileError(ConfigurationError, ValueError):
    """A fitted profile's JSON file that does not describe a profile."""


def profile_to_json(profile: Profile) -> dict[str, Any]:
    """A profile as JSON (bandwidths by tier label)."""
    obj = asdict(profile)
    obj["bandwidths"] = {t.label: bps for t, bps in profile.bandwidths.items()}
    return obj


def profile_from_json(obj: Mapping[str, Any]) -> Profile:
    """The profile `profile_to_json` wrote (missing bandwidths: the contracts' defaults)."""
    fields = dict(obj)
    by_label = {t.label: t for t in Tier}
    try:
        if "bandwidths" in fields:
            fields["bandwidths"] = {by_label[k]: float(v) for k, v in fields["bandwidths"].items()}
        return Profile(**fields)
    except (KeyError, TypeError) as exc:
        raise ProfileFileError(f"not a timing profile: {exc}") from None


def fitted_profile_names() -> list[str]:
    return sorted(p.stem for p in FITTED_DIR.glob("*.json"))


def get_profile(name: str) -> Profile:
    """A built-in profile, else a fitted one from `FITTED_DIR`."""
    known = PROFILES.get(name)
    if known is not None:
        return known
    path = FITTED_DIR / f"{name}.json"
    if path.is_file():
        return profile_from_json(json.loads(path.read_text(encoding="utf-8")))
    raise UnknownProfileError(
        f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES) + fitted_profile_names())}"
    )
