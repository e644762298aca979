"""Saves off the engine's critical path: copy out and return.

vLLM calls the connector's `wait_for_save` at the end of every step, before the step's
output (a request's first token, say) leaves the worker; a synchronous save there — reserve
slots (a round trip to tierd), copy 1.5 MiB a block into its arena, commit — delayed every
token of that step (3.7-4.9 ms a block measured on the CPU engines). `AsyncSaver` hands the
step's save to one thread and returns at once; the copy releases the GIL, so it runs while
the engine sends the output and schedules the next step.

Why the blocks still hold the right bytes when the thread copies them: a full block that
was computed is never written again while it belongs to its request; it is written only
once vLLM hands it out again (the request finished, was preempted, or the cached block was
evicted), and a block handed out in a step appears in that step's scheduler output (new
requests' blocks, running requests' new blocks, blocks an async load fills), which the
scheduler side passes to the workers as ``fresh_blocks``. vLLM calls `handle_preemptions`
first thing in every step, before it zeroes new blocks, loads into them or runs the forward
pass; `before_writes(fresh_blocks)` there waits for the saves still in flight only if one of
them reads a block this step may write. The wait is counted (``save_waits`` steps,
``save_wait_us``): what is left of the save on the critical path.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

log = logging.getLogger("vllm.tierd.connector")  # under vllm.: vLLM prints only those
Items = Sequence[tuple[int, int, int | None]]


class Mover(Protocol):
    """What the saver needs of `tierd.connector.worker.BlockMover` (torch-free here)."""

    def save(self, items: Items, block_size: int, stream: int | None = None) -> None: ...


class AsyncSaver:
    """One save thread for a worker's `BlockMover`."""

    def __init__(self, mover: Mover, counters: Counter[str]) -> None:
        self.mover = mover
        self.counters = counters
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tierd-save")
        self._inflight: list[tuple[Future[None], frozenset[int]]] = []

    def submit(
        self, items: Items, block_size: int, stream: int | None = None
    ) -> Future[None] | None:
        """Start saving these (key, block id, parent key); returns at once, with the save's
        future (None when there is nothing to save). `stream`: the engine's stream (taken on
        its thread) that native GPU copies must follow."""
        if not items:
            return None
        fut = self._pool.submit(self.mover.save, list(items), block_size, stream)
        self._inflight.append((fut, frozenset(b for _, b, _ in items)))
        self.counters["saves_async"] += 1
        return fut

    def before_writes(self, blocks: Collection[int]) -> None:
        """A step is about to write `blocks`: wait for the saves that still read any."""
        self._reap()
        fresh = blocks if isinstance(blocks, set | frozenset) else set(blocks)
        if any(not ids.isdisjoint(fresh) for _, ids in self._inflight):
            self.drain()

    def drain(self) -> None:
        """Wait until every submitted save has copied its blocks out."""
        if not self._inflight:
            return
        t0 = time.perf_counter()
        waited = any(not f.done() for f, _ in self._inflight)
        for fut, _ in self._inflight:
            self._settle(fut)
        self._inflight.clear()
        if waited:
            self.counters["save_waits"] += 1
            self.counters["save_wait_us"] += int((time.perf_counter() - t0) * 1e6)

    def _reap(self) -> None:
        """Forget the saves that are done (counting any that failed)."""
        still = []
        for fut, ids in self._inflight:
            if fut.done():
                self._settle(fut)
            else:
                still.append((fut, ids))
        self._inflight = still

    def _settle(self, fut: Future[None]) -> None:
        try:
            fut.result()
        except Exception as exc:  # a bug in the copy: the blocks are only not saved
            log.warning("tierd save failed: %r", exc)
            self.counters["save_errors"] += 1

    def close(self) -> None:
        self.drain()
        self._pool.shutdown(wait=True)
