"""Prometheus metrics (`tierd_` prefix) read from the store's counters at scrape time,
registered in a registry of the app's own (no global registry)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from contracts.tiers import TIERD_ARENA, TIERD_ARRAY, TIERD_SNAPSHOT
from tierd.daemon import Daemon


class TierdCollector(Collector):
    """Exports one daemon's counters and tier usage."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[Metric]:
        st = self.daemon.store
        c = st.counters
        inst = self.daemon.settings.instance_id

        def counter(name: str, doc: str, label: str, values: dict[str, int]) -> Metric:
            m = CounterMetricFamily(f"tierd_{name}", doc, labels=["instance", label])
            for k, v in sorted(values.items()):
                m.add_metric([inst, k], v)
            return m

        yield counter("bytes_moved", "Bytes moved, by direction.", "direction", c.bytes_moved)
        yield counter("hits", "Slice gets, by the tier that served them.", "tier", c.hits)
        yield counter("prefetch_slices", "Prefetched slices, by outcome.", "outcome", c.prefetch)
        yield counter("evictions", "Slices evicted, by tier.", "tier", c.evictions)
        yield counter("demotions", "Slices written down, by path.", "path", c.demotions)
        yield counter("corrupt_slices", "Slices that failed checks.", "tier", c.corrupt)
        yield counter(
            "gated", "L1 victims dropped by the frequency gate.", "reason", {"first_touch": c.gated}
        )
        yield counter(
            "dropped_slices",
            "Evicted slices lost because the array could not take them (full disk, I/O error).",
            "reason",
            {"array_write_failed": c.write_failures},
        )
        usage = GaugeMetricFamily(
            "tierd_tier_usage_bytes", "Bytes held per tier.", labels=["instance", "tier"]
        )
        usage.add_metric([inst, TIERD_ARENA.key], st.l1.used_bytes)
        usage.add_metric([inst, TIERD_ARRAY.key], st.array_bytes)
        usage.add_metric(
            [inst, TIERD_SNAPSHOT.key], sum(s.object_bytes for s in st.snapshots.values())
        )
        yield usage
        slices = GaugeMetricFamily(
            "tierd_tier_slices", "Slices held per tier.", labels=["instance", "tier"]
        )
        slices.add_metric([inst, TIERD_ARENA.key], len(st.l1))
        slices.add_metric([inst, TIERD_ARRAY.key], len(st.array_index))
        slices.add_metric([inst, TIERD_SNAPSHOT.key], len(st.snap_index))
        yield slices
        bw = GaugeMetricFamily(
            "tierd_measured_bandwidth_bytes_per_second",
            "Recent load bandwidth into L1, by source tier.",
            labels=["instance", "tier"],
        )
        for k, meter in st.meters.items():
            rate = meter.rate()
            if rate is not None:
                bw.add_metric([inst, k], rate)
        yield bw


def make_registry(daemon: Daemon) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TierdCollector(daemon))
    return registry
