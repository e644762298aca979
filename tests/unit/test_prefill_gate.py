"""Background prefills per instance (gateway.pipeline.prefill_gate): at most `limit` at once,
the rest in arrival order, a wait that ends in GateTimeout, and no slot lost to a timeout,
a cancelled waiter or a double release."""

from __future__ import annotations

import asyncio

import pytest

from gateway.pipeline.prefill_gate import GateTimeout, PrefillGate


async def test_one_at_a_time_in_arrival_order() -> None:
    gate = PrefillGate(limit=1, wait_s=5)
    first = await gate.enter("a")
    order: list[str] = []

    async def waiter(name: str) -> None:
        slot = await gate.enter("a")
        order.append(name)
        await asyncio.sleep(0)
        slot.release()

    tasks = [asyncio.create_task(waiter(n)) for n in ("b", "c", "d")]
    await asyncio.sleep(0.01)
    assert order == [] and gate.queued("a") == 3 and gate.prefilling("a") == 1
    other = await gate.enter("z")  # another instance has its own slots
    first.release()
    first.release()  # a second release frees nothing more
    await asyncio.gather(*tasks)
    assert order == ["b", "c", "d"]
    assert gate.prefilling("a") == 0 and gate.prefilling("z") == 1
    other.release()


async def test_a_wait_that_runs_out_is_refused_and_leaks_nothing() -> None:
    gate = PrefillGate(limit=1, wait_s=0.05)
    held = await gate.enter("a")
    with pytest.raises(GateTimeout, match="background prefill"):
        await gate.enter("a")
    held.release()
    assert gate.prefilling("a") == 0
    again = await gate.enter("a")  # the timed-out waiter holds no slot
    assert gate.prefilling("a") == 1
    again.release()


async def test_a_cancelled_waiter_leaks_nothing() -> None:
    gate = PrefillGate(limit=2, wait_s=5)
    a, b = await gate.enter("a"), await gate.enter("a")
    waiting = asyncio.create_task(gate.enter("a"))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    a.release()
    b.release()
    assert gate.prefilling("a") == 0 and gate.queued("a") == 0


async def test_a_slot_handed_over_as_the_wait_ends_is_passed_on() -> None:
    gate = PrefillGate(limit=1, wait_s=0.05)
    held = await gate.enter("a")
    late = asyncio.create_task(gate.enter("a"))
    behind = asyncio.create_task(gate.enter("a"))
    await asyncio.sleep(0.049)
    held.release()  # hands the slot to `late`, whose wait may be running out right now
    results = await asyncio.gather(late, behind, return_exceptions=True)
    slots = [r for r in results if not isinstance(r, BaseException)]
    for slot in slots:
        slot.release()
    assert gate.prefilling("a") == 0
