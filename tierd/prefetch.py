"""Prefetch on the gateway's hint: bring a block chain into L1 before a deadline.

A hint carries the chain, a deadline (seconds from now) and optionally the session key.
With a session key the hint opens a new turn of that dialogue (`tierd.sessions`), which
protects the chain's slices in L1. The leading blocks the engine already holds in its own
device cache (`tierd.residency`, from its KV events) are passed over: the engine asks only
for the blocks past them, so only those are worth reading. The other slices not yet in L1
are joined to single-flight transfers (`tierd.loader`); the prefetch waits for them until
the deadline and not a moment longer. Per slice the outcome is one of: ``on_engine`` (held
by the engine, passed over), ``hit`` (already in L1), ``on_time`` (in L1 before the
deadline), ``abandoned`` (not in L1 at the deadline; its transfer is cancelled unless
someone else still waits for it), ``late`` (the deadline passed while the transfer was
still needed by another waiter, so it goes on) or ``miss`` (in no tier, or unreadable).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from tierd.hints import HintLedger
from tierd.loader import Loaded, Loader, Transfer
from tierd.residency import EngineResidency
from tierd.store import TieredStore

OUTCOMES = ("on_engine", "hit", "on_time", "late", "abandoned", "miss")


class ChainPrefetcher:
    """Runs prefetch hints against one store."""

    def __init__(
        self,
        store: TieredStore,
        loader: Loader,
        hints: HintLedger | None = None,
        residency: EngineResidency | None = None,
    ) -> None:
        self.store = store
        self.loader = loader
        self.hints = hints
        self.residency = residency

    async def prefetch(
        self, hashes: list[int], deadline_s: float, session: str | None = None
    ) -> dict[str, Any]:
        st = self.store
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, deadline_s)
        st.counters.prefetch_requests += 1
        if self.hints is not None:
            self.hints.hinted(hashes)
        if session:
            st.sessions.new_turn(session)
            st.sessions.add(session, hashes)
        outcome: Counter[str] = Counter()
        on_engine = self.residency.held_prefix(hashes) if self.residency is not None else 0
        outcome["on_engine"] = on_engine
        fetch = hashes[on_engine:]
        wanted = set(fetch)
        transfers, missing = await self.loader.plan(fetch)
        moving: set[int] = set()
        for t in transfers:
            moving.update(wanted.intersection(t.hashes))
        outcome["miss"] += len(set(missing))
        if self.hints is not None:
            self.hints.absent(missing)
        outcome["hit"] = len(wanted) - len(moving) - len(set(missing))  # in L1 at plan time
        pending: set[asyncio.Task[Loaded]] = set()
        by_task: dict[asyncio.Task[Loaded], Transfer] = {}
        for t in transfers:
            assert t.task is not None
            pending.add(t.task)
            by_task[t.task] = t
        remaining = deadline - loop.time()
        done: set[asyncio.Task[Loaded]] = set()
        if pending and remaining > 0:
            done, pending = await asyncio.wait(pending, timeout=remaining)
        elif pending:
            done = {p for p in pending if p.done()}
            pending -= done
        for task in done:
            t = by_task[task]
            mine = wanted.intersection(t.hashes)
            if task.cancelled() or task.exception() is not None:
                outcome["miss"] += len(mine)
            else:
                loaded = task.result()
                ok = sum(1 for h in mine if h in loaded and h in st.l1)
                outcome["on_time"] += ok
                outcome["miss"] += len(mine) - ok
            self.loader.release(t)
        for task in pending:
            t = by_task[task]
            mine = wanted.intersection(t.hashes)
            cancelled = self.loader.release(t)
            outcome["abandoned" if cancelled else "late"] += len(mine)
        for key, n in outcome.items():
            st.counters.prefetch[key] += n
        return {"blocks": len(hashes), **{k: outcome.get(k, 0) for k in OUTCOMES}}
