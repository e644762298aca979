"""The connector's saves off the critical path (`tierd.connector.saver`): `submit` returns
while the copy runs; a later step that may write a block still being copied out waits for
it first (`before_writes`, the step's first hook), one that writes other blocks does not,
and what was waited is counted."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence

from tierd.connector.saver import AsyncSaver


class GatedMover:
    """A mover whose save copies only once the test opens the gate."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.saved: list[list[tuple[int, int, int | None]]] = []
        self.streams: list[int | None] = []

    def save(
        self,
        items: Sequence[tuple[int, int, int | None]],
        block_size: int,
        stream: int | None = None,
    ) -> None:
        assert self.gate.wait(10), "the test never opened the gate"
        self.saved.append(list(items))
        self.streams.append(stream)


def test_submit_returns_before_the_copy_and_drain_waits_for_it() -> None:
    mover, counters = GatedMover(), Counter[str]()
    saver = AsyncSaver(mover, counters)
    # the gate is shut: would block if sync; 77: the engine's stream, taken on its thread
    saver.submit([(1, 10, None), (2, 11, 1)], 128, 77)
    assert mover.saved == []
    threading.Timer(0.05, mover.gate.set).start()
    saver.drain()  # returns only once the copy is done
    assert mover.saved == [[(1, 10, None), (2, 11, 1)]]
    assert mover.streams == [77]  # the save thread copies after that stream's work
    assert counters["saves_async"] == 1 and counters["save_waits"] == 1
    assert counters["save_wait_us"] > 0
    saver.close()


def test_a_step_waits_only_if_it_writes_a_block_still_being_copied() -> None:
    mover, counters = GatedMover(), Counter[str]()
    saver = AsyncSaver(mover, counters)
    saver.submit([(1, 10, None), (2, 11, 1)], 128)
    saver.before_writes({20, 21})  # other blocks: no wait, the copy goes on
    assert mover.saved == [] and counters["save_waits"] == 0
    threading.Timer(0.05, mover.gate.set).start()
    saver.before_writes([11, 30])  # block 11 is handed out again: its bytes first
    assert mover.saved == [[(1, 10, None), (2, 11, 1)]]
    assert counters["save_waits"] == 1 and counters["save_wait_us"] > 0
    saver.close()


def test_a_save_done_before_the_next_step_costs_no_wait() -> None:
    mover, counters = GatedMover(), Counter[str]()
    mover.gate.set()
    saver = AsyncSaver(mover, counters)
    saver.submit([(1, 10, None)], 128)
    saver.submit([], 128)  # a step without full blocks: nothing to do
    deadline = time.monotonic() + 10
    while not mover.saved and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.01)  # the future settles right after the copy returns
    saver.drain()
    assert counters["saves_async"] == 1 and counters["save_waits"] == 0
    saver.close()


def test_a_failing_save_is_counted_not_raised() -> None:
    class Broken:
        def save(self, items: Sequence[tuple[int, int, int | None]], block_size: int) -> None:
            raise RuntimeError("a bug in the copy")

    counters = Counter[str]()
    saver = AsyncSaver(Broken(), counters)
    saver.submit([(1, 10, None)], 128)
    saver.drain()
    assert counters["save_errors"] == 1
    saver.close()
