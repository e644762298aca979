"""Warms in the cluster simulator (issue 22): a warm makes the KV of a prompt's full blocks
resident on one instance, at the lowest priority there is.

A `WarmQueue` is an instance's `IdleWork` (sim.cluster.instance): it computes its warms one
after another, in chunks of the profile's step budget, only in steps where the instance has
nothing real to do, and a real request arriving cuts such a step at that instant (the
tokens computed by then count, pro rata). So a warm never makes a real request wait; what
it can change for the others is the cache (its blocks push the least recently used out of
L1) and the router's view (a dispatch like any other). The blocks a warm has computed are
resident and unpinned (cached, as a finished request's are) from the end of each step.

How a warm ends (`SimWarm.outcome`): `done` (every block resident), `held` (they already
were when it reached the front), `yielded` (a real request reached the instance and the
gateway's warm gives up rather than resume: `WarmSettings.gives_up_on_yield`; a resumed one
is what this queue computes anyway, in the idle steps between real work), `timed_out` (not
done within the gateway's `engine_timeout_s`), `superseded` (the request it precedes
reached the instance first: it computes the rest itself). A warm the gateway's admission
refuses (`WarmSettings.refusal`) never gets here: `deferred`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from router.types import Decision, RouteRequest
from sim.cluster.kvcache import L1Store
from sim.profiles import Profile


@dataclass(slots=True, eq=False)
class SimWarm:
    """One warm: where it was sent, what it is to make resident, how it ended."""

    kind: str  # "first_line" (a dialogue's), "replication", "announced" (a world version)
    sent_s: float
    chain: tuple[int, ...]  # the full blocks to make resident
    route: RouteRequest
    target: int | None = None  # the trace index of the request it precedes (first lines)
    instance: int = -1
    decision: Decision | None = None
    outcome: str = "queued"
    cached_blocks: int = 0  # resident when it was admitted
    computed_tokens: int = 0
    ended_s: float | None = None


class WarmQueue:
    """An instance's warms, computed only while it is idle (module docstring)."""

    def __init__(
        self,
        l1: L1Store,
        profile: Profile,
        block_tokens: int,
        *,
        timeout_s: float,
        stored: Callable[[list[int]], None],  # blocks newly resident (residency events)
        ended: Callable[[SimWarm, float], None],
    ) -> None:
        self.l1 = l1
        self.profile = profile
        self.block_tokens = block_tokens
        self.timeout_s = timeout_s
        self._stored = stored
        self._ended = ended
        self.pending: deque[SimWarm] = deque()
        self.busy_s = 0.0  # simulated seconds spent computing warms
        # the step in flight: its warm, first block, tokens, start and end
        self._step: tuple[SimWarm, int, int, float, float] | None = None

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, warm: SimWarm) -> None:
        self.pending.append(warm)

    def drop(self, outcome: str, now: float, *, target: int | None = None) -> None:
        """End every pending warm (or only the one preceding `target`) with `outcome`."""
        keep: deque[SimWarm] = deque()
        for w in self.pending:
            if target is None or w.target == target:
                if self._step is not None and self._step[0] is w:
                    self._step = None  # its step's end finds nothing to add
                self._end(w, outcome, now)
            else:
                keep.append(w)
        self.pending = keep

    # -- IdleWork ---------------------------------------------------------------------------

    def begin(self, now: float) -> float | None:
        bt = self.block_tokens
        while self.pending:
            w = self.pending[0]
            if now - w.sent_s > self.timeout_s:
                self.pending.popleft()
                self._end(w, "timed_out", now)
                continue
            matched = self.l1.leading_match(w.chain)
            if matched >= len(w.chain):
                self.pending.popleft()
                self._end(w, "done" if w.computed_tokens else "held", now)
                continue
            tokens = min((len(w.chain) - matched) * bt, self.profile.max_batch_tokens)
            end = now + self.profile.prefill_seconds(tokens, matched * bt)
            self._step = (w, matched, tokens, now, end)
            return end
        return None

    def end(self, now: float) -> None:
        self._advance(now, whole=True)

    def cut(self, now: float) -> None:
        self._advance(now, whole=False)

    def _advance(self, now: float, *, whole: bool) -> None:
        if self._step is None:
            return
        w, first, tokens, start, end = self._step
        self._step = None
        self.busy_s += now - start
        done = tokens if whole or end <= start else int(tokens * (now - start) / (end - start))
        w.computed_tokens += done
        blocks = list(w.chain[first : first + done // self.block_tokens])
        if blocks:
            new = self.l1.insert_cached(blocks)
            if new:
                self._stored(new)

    def _end(self, w: SimWarm, outcome: str, now: float) -> None:
        w.outcome = outcome
        w.ended_s = now
        self._ended(w, now)
