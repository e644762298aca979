"""What a game server tells the gateway, in the cluster simulator (issue 22, item 5): warms
ahead of a dialogue's first line, priority classes, and world versions replicated rather
than herded. `HintedSimulator` is the `ClusterSimulator` with the gateway's handling of
them; every rule it applies is the gateway's own, imported, not copied:

- **Warms** (a trace record's `warm_lead_ms`): `warm_lead_ms` before the line, its context
  (the first `warm_blocks` blocks) is routed as the line would be (the same `Router.route`
  over every instance); a warm the gateway admits binds the session (`warm_binds`; a deferred
  one binds nothing, as gateway/pipeline/warm.py refuses it from a preview): the line goes
  where its warm went unless that instance is then clearly overloaded
  (gateway/pipeline/binding_rule.py). The
  gateway's admission (`WarmSettings.refusal`: warms and real requests in flight, the
  engine's waiting queue) defers it, or the instance computes it at the lowest priority
  (sim.cluster.warms: only while idle, cut by real work: the gateway's yield and resume).
  Where the gateway's warms give up instead of resuming (`WarmSettings.gives_up_on_yield`)
  a real request ends the instance's warms.
- **Priority classes** (`priority`): a request's class is its level
  (`PrioritySettings.levels`, lower first) in its instance's waiting queue, as vLLM's
  priority scheduling orders it, and admission sheds background work first
  (`PrioritySettings.sheds`: the request gets no answer, counted in `shed`).
- **World versions**: every dispatch with a session key is shown to the gateway's
  `VersionDetector` (gateway/pipeline/world_versions.py); a `Bump` warms the new version's
  hot prefix on the zone's instances that do not hold it (gateway/pipeline/world_replicate.py:
  every instance when the zone is one so far), retrying deferred warms every
  `retry_after_s` for `world.retry_s`. With `announce`, a record's `world_version` tag warms
  its first `world_blocks` blocks on every instance at once (the explicit header's path).

Not modelled: tierd's demotion of the superseded version (the simulator's L2 and array
know no versions), bindings past a warmed first line (the memory backend's: the policy
decides every other turn, with warms on or off), a warm's partial last block (the engine
computes it; it is never cached, so it changes nothing here but the warm's cost).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.config.warm import PRIORITY_CLASSES, PriorityClass, PrioritySettings, WarmSettings
from gateway.pipeline.binding_rule import overloaded
from gateway.pipeline.world_versions import Bump, VersionDetector
from router.policies.base import Policy
from router.types import Decision, RouteRequest
from sim.cluster.request import SimRequest
from sim.cluster.simulator import MODEL, ClusterConfig, ClusterSimulator, RunRecord, SimClock
from sim.cluster.warms import SimWarm, WarmQueue
from sim.profiles import Profile
from sim.traces import TraceRequest


@dataclass(frozen=True, slots=True)
class HintSettings:
    """Which of the game server's hints the simulated gateway acts on (all off: the plain
    simulator), with the gateway's own settings of each (their defaults unless given)."""

    warms: bool = False
    priority_classes: bool = False
    replication: bool = False
    announce: bool = False
    # an admitted warm binds its session (the gateway's decide after admission, with the
    # Redis backend's bindings); False: the single replica's memory backend, which binds nobody
    warm_binds: bool = True
    warm: WarmSettings = field(default_factory=WarmSettings)
    priority: PrioritySettings = field(default_factory=PrioritySettings)

    @property
    def any(self) -> bool:
        return self.warms or self.priority_classes or self.replication or self.announce


class HintedSimulator(ClusterSimulator):
    """The cluster simulator acting on the hints a trace carries (module docstring)."""

    def __init__(
        self,
        config: ClusterConfig,
        policy: Policy,
        clock: SimClock | None = None,
        *,
        hints: HintSettings,
        profile: Profile | None = None,
    ) -> None:
        super().__init__(config, policy, clock, profile=profile)
        self.hints = hints
        self.warms: list[SimWarm] = []  # every warm sent, deferred ones too
        self.shed: set[int] = set()  # trace indexes of requests admission refused
        self.versions: list[dict[str, Any]] = []  # world versions found or announced
        self._bound: dict[str, int] = {}  # session -> instance its warm was routed to
        self._trace: Sequence[TraceRequest] = ()
        self.queues: list[WarmQueue] = []
        for k, inst in enumerate(self.instances):
            queue = WarmQueue(
                inst.l1,
                self.profile,
                config.block_tokens,
                timeout_s=hints.warm.engine_timeout_s,
                stored=self._stored_by(k),
                ended=self._warm_ended,
            )
            inst.idle_work = queue
            self.queues.append(queue)
        self.detector: VersionDetector | None = None
        if hints.replication or hints.announce:
            world = hints.warm.world
            self.detector = VersionDetector(
                window_s=world.window_s,
                min_sessions=world.min_sessions,
                max_blocks=world.max_blocks,
            )
        if hints.replication:
            self.router.dispatch_observers.append(self._observed)

    def _stored_by(self, k: int) -> Any:
        return lambda blocks: self.on_blocks_stored(k, blocks)

    # -- the run -----------------------------------------------------------------------------

    def run(self, trace: Sequence[TraceRequest]) -> RunRecord:
        self._trace = trace
        if self.hints.warms:
            scale = 1.0 / self.config.rate_scale
            for i, t in enumerate(trace):
                if t.warm_lead_ms and t.warm_blocks and t.session:
                    at = max(0.0, (t.timestamp_ms - t.warm_lead_ms) / 1000.0 * scale)
                    self.call_at(at, self._first_line_warm(i))
        return super().run(trace)

    def _overloaded(self, k: int) -> bool:
        """The gateway's rule for a bound instance too loaded to keep its session."""
        loads = [self.router.load.view(name)[0] for name in self.names]
        return overloaded(loads[k], loads)

    def real_in_flight(self, k: int) -> int:
        """Real requests on instance `k` not finished (the gateway's in-flight count)."""
        inst = self.instances[k]
        return len(inst.running) + len(inst.waiting)

    def _arrive(self, req: SimRequest) -> None:
        t = self._trace[req.idx]
        hints = self.hints
        klass: PriorityClass | None = None
        if hints.priority_classes and t.priority in PRIORITY_CLASSES:
            klass = t.priority
            req.level = hints.priority.levels[klass]
        session = req.route.session_key
        bound = self._bound.pop(session, None) if session else None
        if bound is not None and self._overloaded(bound):
            bound = None  # the binding moves: the policy decides
        candidates = self.names if bound is None else [self.names[bound]]
        decision = self.router.route(req.route, candidates)
        k = self.names.index(decision.instance)
        if hints.priority.sheds(klass, self.real_in_flight(k)):
            self.shed.add(req.idx)
            return
        self._dispatch(req, decision)
        queue = self.queues[k]
        queue.drop("superseded", self.now, target=req.idx)  # the line computes the rest
        if hints.warm.gives_up_on_yield():  # else its warms go on in idle steps, as resumed
            queue.drop("yielded", self.now)
        if hints.announce and t.world_version and t.world_blocks:
            self._announce(t.hash_ids[: t.world_blocks])

    # -- warms -------------------------------------------------------------------------------

    def _first_line_warm(self, i: int) -> Any:
        def send() -> None:
            t = self._trace[i]
            chain = t.hash_ids[: t.warm_blocks]
            rr = self._warm_route(chain, t.warm_tokens, t.session)
            decision = self.router.route(rr, self.names)
            k = self.names.index(decision.instance)
            assert t.session is not None
            admitted = self._submit(
                SimWarm("first_line", self.now, chain, rr, target=i), k, decision
            )
            if self.hints.warm_binds and admitted:  # the gateway binds admitted warms only
                self._bound[t.session] = k

        return send

    def _warm_route(
        self, chain: tuple[int, ...], tokens: int | None, session: str | None
    ) -> RouteRequest:
        bt = self.config.block_tokens
        return RouteRequest(
            model=MODEL,
            block_hashes=chain,
            block_tokens=bt,
            prompt_tokens=tokens or len(chain) * bt,
            session_key=session,
            max_tokens=1,
        )

    def _submit(self, warm: SimWarm, k: int, decision: Decision) -> bool:
        """The gateway's admission, then the instance's warm queue; False when deferred."""
        self.warms.append(warm)
        inst = self.instances[k]
        why = self.hints.warm.refusal(
            len(self.queues[k]), self.real_in_flight(k), len(inst.waiting)
        )
        warm.instance = k
        if why is not None:
            warm.outcome = "deferred"
            warm.ended_s = self.now
            return False
        warm.decision = decision
        warm.cached_blocks = inst.l1.leading_match(warm.chain)
        self.router.on_dispatch(warm.route, decision, self.names[k])
        self.queues[k].add(warm)
        inst.offer_idle_work(self.now)
        return True

    def _warm_ended(self, warm: SimWarm, now: float) -> None:
        assert warm.decision is not None
        self.router.on_complete(
            warm.route,
            warm.decision,
            self.names[warm.instance],
            ttft_s=None,
            reported_cached_tokens=warm.cached_blocks * self.config.block_tokens,
            ok=warm.outcome in ("done", "held"),
        )

    def _warm_on(self, kind: str, chain: tuple[int, ...], k: int, until_s: float) -> None:
        """A session-less warm of `chain` on instance `k` (the gateway's `warm_on`), retried
        while deferred until `until_s`."""
        if self.instances[k].l1.leading_match(chain) >= len(chain):
            warm = SimWarm(kind, self.now, chain, self._warm_route(chain, None, None))
            warm.instance, warm.outcome, warm.ended_s = k, "held", self.now
            self.warms.append(warm)
            return
        rr = self._warm_route(chain, None, None)
        decision = self.router.route(rr, [self.names[k]])
        if not self._submit(SimWarm(kind, self.now, chain, rr), k, decision):
            retry = self.now + self.hints.warm.retry_after_s
            if retry <= until_s:
                self.call_at(retry, lambda: self._warm_on(kind, chain, k, until_s))

    # -- world versions ------------------------------------------------------------------

    def _observed(self, rr: RouteRequest, decision: Decision, instance: str) -> None:
        """A `Router.dispatch_observers` hook, as the gateway's `WorldReplicator.dispatched`."""
        if rr.session_key is None or not rr.block_hashes or self.detector is None:
            return
        bump = self.detector.observe(rr.block_hashes, rr.session_key, instance, self.now)
        if bump is not None:  # acted on after this dispatch, at the same instant
            self.call_at(self.now, lambda: self._replicate(bump))

    def _replicate(self, bump: Bump) -> None:
        zone = [self.names.index(i) for i in bump.zone]
        if len(zone) < 2:  # one instance seen so far: the zone is every instance
            zone = list(range(len(self.names)))
        targets = [k for k in zone if self.names[k] not in bump.holders]
        self.versions.append(
            {
                "trigger": "detected",
                "at_s": self.now,
                "sessions": bump.sessions,
                "blocks": len(bump.chain),
                "stem_blocks": bump.stem_blocks,
                "warmed_on": [self.names[k] for k in targets],
            }
        )
        until = self.now + self.hints.warm.world.retry_s
        for k in targets:
            self._warm_on("replication", bump.chain, k, until)

    def _announce(self, chain: tuple[int, ...]) -> None:
        if self.detector is not None:
            self.detector.forget(chain)  # announced: the implicit path leaves it alone
        self.versions.append({"trigger": "announced", "at_s": self.now, "blocks": len(chain)})
        until = self.now + self.hints.warm.world.retry_s
        for k in range(len(self.names)):
            self._warm_on("announced", chain, k, until)
