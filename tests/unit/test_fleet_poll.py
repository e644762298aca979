"""The fleet's poll loop over a store only this process changes (`memory`): asleep while
nothing drains, awake (polling, finishing the drain) from the moment one begins."""

from __future__ import annotations

import asyncio

from gateway.app import build_state
from gateway.config.settings import Settings
from gateway.fleet.runtime import Fleet
from gateway.fleet.store import MemoryFleetStore


class CountingStore(MemoryFleetStore):
    """The real memory store, counting how often its version is read."""

    def __init__(self) -> None:
        super().__init__()
        self.version_reads = 0

    async def version(self) -> int:
        self.version_reads += 1
        return await super().version()


async def test_a_private_fleet_store_is_polled_only_while_a_drain_is_under_way() -> None:
    settings = Settings.model_validate(
        {
            "instances": [{"id": "a", "url": "http://127.0.0.1:9"}],
            "fleet": {"poll_interval_s": 0.01, "drain_grace_s": 0.0},
        }
    )
    state = build_state(settings)
    store = CountingStore()
    fleet = Fleet(state, store, "r")
    loop = asyncio.create_task(fleet.run())
    try:
        await asyncio.sleep(0.2)  # twenty poll intervals
        assert store.version_reads == 0  # asleep: nothing to read back, nothing draining
        await fleet.drain("a")  # no request in flight and no grace: the loop ends it
        for _ in range(500):
            if fleet.status_of("a")["status"] == "removed":
                break
            await asyncio.sleep(0.01)
        assert fleet.status_of("a")["status"] == "removed"
        reads = store.version_reads
        await asyncio.sleep(0.2)
        assert store.version_reads == reads  # asleep again once the drain is done
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        for task in list(state.background):
            task.cancel()
        await asyncio.gather(*state.background, return_exceptions=True)
        await state.client.aclose()
        for close in state.closers:
            await close()
