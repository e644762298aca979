"""The fleet changes at runtime: instances are added, drained and removed without a restart,
and every gateway replica sharing the pool's state sees the change.

The configured instances are the seed; the fleet store's records (`gateway.fleet.store`)
override them. Each replica polls the store's version every `fleet.poll_interval_s` and,
when it moved, applies the records to its own parts: the health checker (the candidate
set), the shared-state sync (whose in-flight counts it publishes), the prefetcher's tierd
clients, the KV event consumer and the prefix index.

A drain takes the instance out of every candidate set at once (it is still health-checked
and its in-flight requests finish normally); it leaves the fleet when the pool's in-flight
count on it (this replica's and the others', as the shared state reports them) is zero and
`fleet.drain_grace_s` has passed since the drain began, long enough for every replica to
have seen the drain and published its counts. Whichever replica sees that first moves the
record from `draining` to `removed` (compare-and-set), and every replica then lets it go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from contracts.errors import AdminError
from gateway.config.settings import InstanceSettings
from gateway.fleet.store import FleetRecord, FleetStore, MemoryFleetStore, RedisFleetStore, Status
from gateway.fleet.tier_stats import run_poller
from gateway.fleet.tierd_events import subscribe, unsubscribe
from gateway.state import AppState
from router.state.base import StateUnavailableError
from router.state.sync import StateSync

log = logging.getLogger("warmgate.fleet")


class FleetError(AdminError):
    """A fleet change that cannot be made (unknown instance, already present)."""


class Fleet:
    """This replica's view of the pool's fleet, and the changes it makes to it."""

    def __init__(
        self,
        state: AppState,
        store: FleetStore,
        replica: str,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.store = store
        self.replica = replica
        self.poll_interval_s = state.settings.fleet.poll_interval_s
        self.drain_grace_s = state.settings.fleet.drain_grace_s
        self._clock = clock
        self.seed = {i.id: i for i in state.settings.instances}
        self.records: dict[str, FleetRecord] = {}
        self._version = -1
        self._lock = asyncio.Lock()  # one apply at a time (admin calls and the poll loop)
        self._applied = asyncio.Event()  # set by each apply: wakes a poll loop asleep

    # -- queries -------------------------------------------------------------------------

    def status_of(self, instance_id: str) -> dict[str, Any]:
        record = self.records.get(instance_id)
        if record is None:
            return {"status": "active", "since": None, "by": "configuration"}
        return {"status": record.status, "since": record.since_s, "by": record.by}

    def draining(self) -> dict[str, dict[str, Any]]:
        out = {}
        for iid in sorted(self.state.health.draining):
            in_flight = self.state.router.load.view(iid)[0]
            out[iid] = {**self.status_of(iid), "in_flight": in_flight}
        return out

    # -- changes -------------------------------------------------------------------------

    def _record(self, spec: InstanceSettings, status: Status) -> FleetRecord:
        return FleetRecord(spec.id, spec.model_dump(), status, self._clock(), self.replica)

    async def add(self, spec: InstanceSettings) -> None:
        if self.state.health.spec(spec.id) is not None:
            raise FleetError(f"instance {spec.id!r} is already in the fleet (remove it first)")
        await self.store.put(self._record(spec, "active"))
        await self.refresh(force=True)

    async def drain(self, instance_id: str) -> None:
        spec = self._known(instance_id)
        if instance_id not in self.state.health.draining:
            await self.store.put(self._record(spec, "draining"))
        await self.refresh(force=True)

    async def remove(self, instance_id: str) -> None:
        spec = self._known(instance_id)
        await self.store.put(self._record(spec, "removed"))
        await self.refresh(force=True)

    def _known(self, instance_id: str) -> InstanceSettings:
        spec = self.state.health.spec(instance_id)
        if spec is None:
            raise FleetError(f"no instance {instance_id!r} in the fleet")
        return spec

    # -- keeping in step with the store --------------------------------------------------

    async def refresh(self, *, force: bool = False) -> bool:
        """Read the store when its version moved (or `force`); apply it. True if read."""
        async with self._lock:
            version = await self.store.version()
            if version == self._version and not force:
                return False
            self.records = await self.store.records()
            self._version = version
            self._apply()
            self._applied.set()
            return True

    def _desired(self) -> dict[str, tuple[InstanceSettings, Status]]:
        desired: dict[str, tuple[InstanceSettings, Status]] = {
            iid: (spec, "active") for iid, spec in self.seed.items()
        }
        for iid, record in self.records.items():
            try:
                spec = InstanceSettings.model_validate(record.spec)
            except ValueError:
                log.warning("fleet record %s has unusable settings; ignored", iid)
                continue
            desired[iid] = (spec, record.status)
        return desired

    def _apply(self) -> None:
        health = self.state.health
        desired = self._desired()
        for iid in [i.id for i in health.instances()]:
            if iid not in desired or desired[iid][1] == "removed":
                self._leave(iid)
        for iid, (spec, status) in desired.items():
            if status == "removed":
                continue
            current = health.spec(iid)
            if current is not None and current != spec:
                self._leave(iid)  # same id, new settings: leave and join again
                current = None
            if current is None:
                self._join(spec)
            health.set_draining(iid, status == "draining")

    def _join(self, spec: InstanceSettings) -> None:
        state = self.state
        log.info("instance %s joins the fleet (%s)", spec.id, spec.url, extra={"instance": spec.id})
        state.health.add(spec)
        sync = _sync_of(state)
        if sync is not None and spec.id not in sync.instances:
            sync.instances.append(spec.id)
        state.prefetch.add(spec)
        subscribe(state.kv_events, state.tierd_events, spec)
        if state.kv_events is None and (spec.kv_events_endpoint or spec.tierd_events_endpoint):
            log.warning("instance %s: its events need kv_events.enabled at startup", spec.id)
        if state.prefetch.available and not _running(state, "tier-stats"):
            state.spawn(tier_stats_poller(state), "tier-stats")
        state.spawn(state.health.check(spec.id), f"first-check:{spec.id}")

    def _leave(self, instance_id: str) -> None:
        state = self.state
        log.info("instance %s leaves the fleet", instance_id, extra={"instance": instance_id})
        state.health.remove(instance_id)
        sync = _sync_of(state)
        if sync is not None and instance_id in sync.instances:
            sync.instances.remove(instance_id)
        state.router.load.set_remote(instance_id, 0)
        state.router.index.clear_instance(instance_id)
        state.prefetch.remove(instance_id)
        state.tier_stats.pop(instance_id, None)
        unsubscribe(state.kv_events, state.tierd_events, instance_id)

    async def finish_drains(self) -> list[str]:
        """Let go of each draining instance nobody in the pool has a request on any more."""
        finished: list[str] = []
        now = self._clock()
        for iid in sorted(self.state.health.draining):
            record = self.records.get(iid)
            if record is None or record.status != "draining":
                continue
            if now - record.since_s < self.drain_grace_s:
                continue
            if self.state.router.load.view(iid)[0] > 0:
                continue
            spec = InstanceSettings.model_validate(record.spec)
            if await self.store.transition(iid, "draining", self._record(spec, "removed")):
                log.info("drain of %s finished: no request in flight", iid)
                finished.append(iid)
        if finished:
            await self.refresh(force=True)
        return finished

    async def run(self) -> None:
        """Poll the store and finish drains, forever (cancelled at shutdown). A store no
        other replica changes (`memory`) moves only by this replica's own calls, which apply
        at once: then the loop sleeps until an apply leaves a drain to finish, instead of
        waking the gateway twice a second for nothing."""
        while True:
            while not self.store.shared and not self.state.health.draining:
                self._applied.clear()
                await self._applied.wait()
            with contextlib.suppress(StateUnavailableError):
                await self.refresh()
                await self.finish_drains()
            await asyncio.sleep(self.poll_interval_s)


def _sync_of(state: AppState) -> StateSync | None:
    """The shared-state sync (gateway.pipeline.shared_state), whose instance list it counts
    for."""
    return state.bindings.sync if state.bindings is not None else None


def _running(state: AppState, name: str) -> bool:
    return any(t.get_name() == name and not t.done() for t in state.background)


def build_store(state: AppState) -> FleetStore:
    s = state.settings.state
    if s.backend == "redis" and s.redis_url:
        return RedisFleetStore(s.redis_url, s.pool)
    return MemoryFleetStore()


def fleet_of(state: AppState) -> Fleet:
    fleet = state.fleet
    assert isinstance(fleet, Fleet), "gateway.fleet.runtime is attached in the lifespan"
    return fleet


async def attach_fleet(state: AppState) -> None:
    """Called from the gateway's lifespan, after the shared state: apply the stored fleet
    before the first request, then keep polling."""
    sync = _sync_of(state)
    replica = (sync.replica if sync is not None else None) or (
        state.settings.state.replica_id or "local"
    )
    fleet = Fleet(state, build_store(state), replica)
    with contextlib.suppress(StateUnavailableError):
        await fleet.refresh(force=True)
    state.fleet = fleet
    state.closers.append(fleet.store.close)
    state.spawn(fleet.run(), "fleet")


def tier_stats_poller(state: AppState) -> Coroutine[Any, Any, None]:
    """The tierd stats poller over this app's parts (started at startup, or when the first
    instance with a tierd joins)."""
    return run_poller(
        state.prefetch.clients,
        state.router.policy,
        state.tier_stats,
        interval_s=state.settings.tiers.stats_interval_s,
        timeout_s=state.settings.health.timeout_s,
    )
