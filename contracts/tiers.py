"""Where a block's KV sits: one set of names, one meaning each, everywhere.

- `Tier.HBM` ("hbm"): the engine's own KV cache in accelerator memory. Medium: vLLM `GPU`.
- `Tier.HOST` ("host"): host memory of that instance: vLLM's CPU offload (medium `CPU`) and
  tierd's arena in front of the engine (tierd publishes it as `CPU` too).
- `Tier.ARRAY` ("array"): the shared storage array, reachable from every instance. Mediums:
  vLLM `STORAGE` (a storage connector), tierd `ARRAY`.
- `Tier.SNAPSHOT` ("snapshot"): cold compressed snapshots of that instance's tierd. Medium:
  tierd `SNAPSHOT`.

The value orders tiers by cost (fastest first); `len(Tier)` is the number of residency bits
the router's index keeps per instance (`router.index`). Mediums are the strings KV events
carry: vLLM's (`GPU`, `CPU`, `STORAGE`; vLLM on CPU still says `GPU` for its own cache) and
tierd's own.

Bandwidths into HBM from each slower tier are defined here once (`DEFAULT_BANDWIDTH_BPS`):
the simulator's profiles (`sim.profiles`, a `Tier`-keyed map), tierd's emulated links
(`tierd.emulation`) and the ttft cost model's prior (`router.cost`, by label) take them from
here.

tierd's three levels keep the names of its wire formats (its HTTP/JSON API, KV socket, stats
and metrics), a remnant of the simulator's L1/L2/L3 history; what each level is, is defined
once, in `TIERD_LEVELS`, and tierd, the simulated engine and the connector translate through it:

| level (tierd/tiers/)       | `Tier`     | API name (lookup, evict) | medium     | stats key  |
|----------------------------|------------|--------------------------|------------|------------|
| arena, L1 (`l1_arena`)     | `HOST`     | `GPU`                    | `CPU`      | `l1`       |
| array, L2 (`l2_array`)     | `ARRAY`    | `ARRAY`                  | `ARRAY`    | `array`    |
| snaps, L3 (`l3_snapshots`) | `SNAPSHOT` | `SNAPSHOT`               | `SNAPSHOT` | `snapshot` |

tierd's measured and configured bandwidths (`/v1/stats` `bandwidth_bytes_per_s`) are keyed by
`Tier.label` ("host", "array", "snapshot"), as every bandwidth map is. The simulated engine's
`warmgate_sim_tier_loaded_tokens` labels (`sim.engine.tiers.LOADED_LABEL`) are keyed by `Tier`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Tier(IntEnum):
    """Where a block's KV sits, fastest first. The value orders tiers by cost."""

    HBM = 0  # the engine's own KV cache on the accelerator of that instance
    HOST = 1  # that instance's host memory
    ARRAY = 2  # the shared storage array: reachable from every instance
    SNAPSHOT = 3  # cold snapshots

    @property
    def label(self) -> str:
        """The lower-case name used in JSON, metrics labels and bandwidth maps."""
        return _LABELS[self]


_LABELS = {Tier.HBM: "hbm", Tier.HOST: "host", Tier.ARRAY: "array", Tier.SNAPSHOT: "snapshot"}
TIER_BY_LABEL: dict[str, Tier] = {t.label: t for t in Tier}

# Bytes per second into HBM from each slower tier on the reference deployment (an H200
# node), defined here once: the simulator's profiles, tierd's emulated links and the ttft
# cost model's prior all start from these until a tierd reports measured rates.
DEFAULT_BANDWIDTH_BPS: dict[Tier, float] = {
    Tier.HOST: 25e9,  # host DRAM -> HBM over PCIe Gen4 x16
    Tier.ARRAY: 10e9,  # shared NVMe-oF array, parallel reads, staged through host memory
    Tier.SNAPSHOT: 3e9,  # compressed cold snapshots: read + decompress
}


class Medium:
    """The `medium` strings of KV events."""

    GPU = "GPU"  # vLLM: its own KV cache (on every device kind, CPU builds included)
    CPU = "CPU"  # vLLM: its CPU offload (host memory)
    STORAGE = "STORAGE"  # vLLM: a storage connector (disk, remote)
    ARRAY = "ARRAY"  # tierd: the shared array
    SNAPSHOT = "SNAPSHOT"  # tierd: its snapshots


# Where each medium's blocks live. ARRAY blocks are reachable from every instance: the
# router indexes them under a pseudo-instance (`router.index.ARRAY`).
TIER_OF_MEDIUM: dict[str, Tier] = {
    Medium.GPU: Tier.HBM,
    Medium.CPU: Tier.HOST,
    Medium.STORAGE: Tier.ARRAY,
    Medium.ARRAY: Tier.ARRAY,
    Medium.SNAPSHOT: Tier.SNAPSHOT,
}


def tier_of_medium(medium: str | None) -> Tier | None:
    """The tier of an event's medium (none given means vLLM's own cache); None when the
    medium is unknown, and the event is then skipped."""
    return TIER_OF_MEDIUM.get((medium or Medium.GPU).upper())


@dataclass(frozen=True, slots=True)
class TierdLevel:
    """One of tierd's three levels: the tier it is and the names its wire formats keep."""

    tier: Tier
    name: str  # tierd's API: `lookup`'s `tiers`/`leading`/`counts`, `evict(tier=)`, KV socket
    medium: str  # what its KV events carry (`TIER_OF_MEDIUM[medium]` is `tier`)
    key: str  # in `/v1/stats` (`tiers`, `hits`, `evictions`, ...) and tierd's metric labels


TIERD_ARENA = TierdLevel(Tier.HOST, "GPU", Medium.CPU, "l1")  # host memory in front of HBM
TIERD_ARRAY = TierdLevel(Tier.ARRAY, "ARRAY", Medium.ARRAY, "array")
TIERD_SNAPSHOT = TierdLevel(Tier.SNAPSHOT, "SNAPSHOT", Medium.SNAPSHOT, "snapshot")
TIERD_LEVELS: tuple[TierdLevel, ...] = (TIERD_ARENA, TIERD_ARRAY, TIERD_SNAPSHOT)
TIERD_LEVEL_BY_NAME: dict[str, TierdLevel] = {lv.name: lv for lv in TIERD_LEVELS}
TIERD_LEVEL_OF_TIER: dict[Tier, TierdLevel] = {lv.tier: lv for lv in TIERD_LEVELS}
