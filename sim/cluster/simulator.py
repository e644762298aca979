"""The discrete-event cluster simulator: a trace drives N simulated instances with tiers,
and the real `router.Router` (its `PrefixIndex`, `LoadView` and a policy) routes every
request, exactly as the gateway would.

Time is simulated. Events are arrivals (merged from the sorted trace), tier loads landing
and instance step ends, kept in one heap ordered by (time, sequence number), so a run is
deterministic: the same trace, configuration and policy give the same result.

The router's index is fed the way a deployment feeds it in precise mode: predict-on-route
insertions by the router itself (`Router.on_dispatch`), plus residency events from every
instance at the moment they happen: blocks stored in L1 when a prefill completes or a
prefetch lands, removed from L1 on eviction, stored in / removed from L2 and the shared
array as blocks are demoted and dropped (as vLLM's and tierd's KV events would report).

Tier loads start when the request reaches its instance (the gateway's prefetch hint):
the leading run of the prompt's chain after what L1 holds is read from the instance's L2
or, failing that, the shared array, block by block until a block is in neither, at
bytes / bandwidth on one link per tier per instance. The request is schedulable when its
loads have landed. Evicted L1 blocks are demoted to L2 (if configured) else the array;
L2 evictions go to the array; array evictions are dropped. With `array_write_through` every
block a prefill computes is also written to the array at once (in the background, as
LMCache-style connectors store to a remote backend), so any instance can load it.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from contracts.errors import ConfigurationError
from contracts.tiers import Tier
from router.index import ARRAY, PrefixIndex
from router.load import LoadView
from router.policies.base import Policy
from router.router import Router
from router.types import Decision, RouteRequest
from sim.cluster.connector import ConnectorHits
from sim.cluster.cores import SharedCores
from sim.cluster.instance import Instance
from sim.cluster.kvcache import LruStore
from sim.cluster.request import SimRequest
from sim.profiles import Profile, get_profile
from sim.traces import TraceRequest

_HOST, _ARRAY = Tier.HOST.label, Tier.ARRAY.label  # the tiers' JSON labels
_STEP, _READY, _CALL = 0, 1, 2
TIER_LOADS = ("arrival", "admission")
MODEL = "sim-cluster"


class SimulatorParamsError(ConfigurationError, ValueError):
    """A cluster simulation parameter out of range."""


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    instances: int = 8
    block_tokens: int = 512
    l1_tokens: int = 2_000_000  # per instance
    l2_tokens: int = 0  # per instance; 0 = no L2
    array_tokens: int = 0  # shared by all; 0 = no array
    profile: str = "qwen2.5-32b-h200"
    rate_scale: float = 1.0  # >1 compresses arrivals (more load)
    array_write_through: bool = False  # computed blocks are also written to the array at once
    predict_on_route: bool = True
    residency_events: bool = True
    # when tier hits count: "arrival" (the gateway's prefetch lands them in HBM before the
    # request is scheduled) or "admission" (vLLM's KV connector finds and loads them as the
    # scheduler admits it: tierd's connector, sim.cluster.connector)
    tier_loads: str = "arrival"

    def instance_names(self) -> list[str]:
        return [f"i{k}" for k in range(self.instances)]


@dataclass(slots=True)
class RunRecord:
    """Raw outcome of one run: per-request rows and per-instance counters."""

    requests: list[SimRequest]
    busy_s: list[float]
    prefill_busy_s: list[float]
    routed: list[int]
    span_s: float
    wall_s: float
    events: int
    router_stats: dict[str, object]


class SimClock:
    """Simulated time, readable as a clock callable (policies that keep time take one)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ClusterSimulator:
    def __init__(
        self,
        config: ClusterConfig,
        policy: Policy,
        clock: SimClock | None = None,
        *,
        profile: Profile | None = None,  # overrides config.profile (tests, custom hardware)
    ) -> None:
        if config.instances <= 0:
            raise SimulatorParamsError("instances must be positive")
        if config.rate_scale <= 0:
            raise SimulatorParamsError("rate_scale must be positive")
        if config.tier_loads not in TIER_LOADS:
            raise SimulatorParamsError(f"tier_loads must be one of {', '.join(TIER_LOADS)}")
        self.config = config
        self.profile: Profile = profile or get_profile(config.profile)
        # bytes/s of each instance's links, by the label its loads are counted under
        self._rates = {t.label: bps for t, bps in self.profile.bandwidths.items()}
        self.clock = clock or SimClock()
        self.names = config.instance_names()
        bt = config.block_tokens
        l1_blocks = max(1, config.l1_tokens // bt)
        self.index = PrefixIndex(capacity_blocks=l1_blocks, clock=self._clock)
        self.router = Router(
            policy,
            self.index,
            LoadView(),
            clock=self._clock,
            predict_on_route=config.predict_on_route,
        )
        self._heap: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._events = 0
        self._waiting_load: dict[int, SimRequest] = {}
        self._calls: dict[int, Callable[[], None]] = {}  # _CALL events by sequence number
        self.array = LruStore(config.array_tokens // bt, self._array_evicted)
        self.l2: list[LruStore | None] = []
        self.instances: list[Instance] = []
        self._links: list[dict[str, float]] = []
        for k in range(config.instances):
            self.l2.append(
                LruStore(config.l2_tokens // bt, self._l2_evict_cb(k))
                if config.l2_tokens >= bt
                else None
            )
            self.instances.append(
                Instance(
                    k,
                    self.profile,
                    l1_blocks=l1_blocks,
                    block_tokens=bt,
                    hooks=self,
                    demote=self._l1_demote_cb(k),
                )
            )
            self._links.append({_HOST: 0.0, _ARRAY: 0.0})
        self._attach_physics()

    def _attach_physics(self) -> None:
        """The models a configuration or profile asks for: loads by the KV connector at
        admission (sim.cluster.connector), engines sharing the machine's cores (.cores)."""
        cores = (
            SharedCores(self.profile.shared_core_slowdown)
            if self.profile.shared_core_slowdown != 1.0
            else None
        )
        for k, inst in enumerate(self.instances):
            inst.cores = cores
            if self.config.tier_loads == "admission":
                bt = self.config.block_tokens
                inst.connector = ConnectorHits(self.profile, bt, self.l2[k], self.array)

    @property
    def now(self) -> float:
        return self.clock.now

    @now.setter
    def now(self, value: float) -> None:
        self.clock.now = value

    def _clock(self) -> float:
        return self.clock.now

    # -- residency events -----------------------------------------------------------------

    def _emit(self, instance: str, blocks: list[int], tier: Tier, stored: bool) -> None:
        if not self.config.residency_events or not blocks:
            return
        if stored:
            self.index.insert(instance, blocks, tier, self.now)
        else:
            self.index.remove(instance, blocks, tier)

    def _l1_demote_cb(self, k: int) -> Callable[[int], None]:
        name = self.names[k]

        def demote(block: int) -> None:
            self._emit(name, [block], Tier.HBM, stored=False)
            l2 = self.l2[k]
            if l2 is not None:
                if l2.put(block):
                    self._emit(name, [block], Tier.HOST, stored=True)
            else:
                self._to_array(block)

        return demote

    def _l2_evict_cb(self, k: int) -> Callable[[int], None]:
        name = self.names[k]

        def evicted(block: int) -> None:
            self._emit(name, [block], Tier.HOST, stored=False)
            self._to_array(block)

        return evicted

    def _to_array(self, block: int) -> None:
        if self.array.capacity and self.array.put(block):
            self._emit(ARRAY, [block], Tier.ARRAY, stored=True)

    def _array_evicted(self, block: int) -> None:
        self._emit(ARRAY, [block], Tier.ARRAY, stored=False)

    # -- InstanceHooks --------------------------------------------------------------------

    def schedule_step_end(self, instance: int, at_s: float, version: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (at_s, self._seq, _STEP, instance, version))

    def on_blocks_stored(self, instance: int, blocks: list[int]) -> None:
        self._emit(self.names[instance], blocks, Tier.HBM, stored=True)
        if self.config.array_write_through:
            for block in blocks:
                self._to_array(block)

    def on_first_token(self, req: SimRequest, at_s: float) -> None:
        assert req.decision is not None
        self.router.on_first_token(
            req.route, req.decision, self.names[req.instance], at_s - req.arrival_s
        )

    def on_finish(self, req: SimRequest, at_s: float) -> None:
        assert req.decision is not None
        self.router.on_complete(
            req.route,
            req.decision,
            self.names[req.instance],
            ttft_s=req.ttft_s,
            reported_cached_tokens=req.cached_tokens,
            ok=True,
        )

    def call_at(self, at_s: float, call: Callable[[], None]) -> None:
        """Run `call` at simulated time `at_s` (extensions' own events: sim.cluster.hints)."""
        self._seq += 1
        self._calls[self._seq] = call
        heapq.heappush(self._heap, (at_s, self._seq, _CALL, -1, self._seq))

    # -- arrivals and loads -------------------------------------------------------------

    def _arrive(self, req: SimRequest) -> None:
        self._dispatch(req, self.router.route(req.route, self.names))

    def _dispatch(self, req: SimRequest, decision: Decision) -> None:
        k = self.names.index(decision.instance)
        req.decision = decision
        req.instance = k
        self.router.on_dispatch(req.route, decision, decision.instance)
        inst = self.instances[k]
        ready = self._start_loads(req, k)
        req.ready_s = ready
        if ready > self.now:
            self._waiting_load[req.idx] = req
            self._seq += 1
            heapq.heappush(self._heap, (ready, self._seq, _READY, k, req.idx))
        inst.enqueue(req, self.now)

    def _start_loads(self, req: SimRequest, k: int) -> float:
        if self.config.tier_loads == "admission":
            return self.now  # the connector loads at admission instead (sim.cluster.connector)
        chain = req.chain
        inst = self.instances[k]
        j = inst.l1.leading_match(chain)
        l2 = self.l2[k]
        tokens = {_HOST: 0, _ARRAY: 0}
        bt = self.config.block_tokens
        while j < len(chain):
            block = chain[j]
            if l2 is not None and block in l2:
                tier = _HOST
                l2.touch(block)
            elif block in self.array:
                tier = _ARRAY
                self.array.touch(block)
            else:
                break
            req.loaded_from[block] = tier
            tokens[tier] += min(bt, req.prompt_tokens - j * bt)
            j += 1
        if not req.loaded_from:
            return self.now
        rates = self._rates
        ready = self.now
        links = self._links[k]
        for tier, n in tokens.items():
            if n:
                start = max(self.now, links[tier])
                end = start + self.profile.load_seconds(n, rates[tier])
                links[tier] = end
                ready = max(ready, end)
        return ready

    def _loads_landed(self, k: int, idx: int) -> None:
        req = self._waiting_load.pop(idx)
        inst = self.instances[k]
        loaded = [b for b in req.chain if b in req.loaded_from]
        new = inst.l1.insert_cached(loaded)
        self._emit(self.names[k], new, Tier.HBM, stored=True)
        inst.poke(self.now)

    # -- the loop -----------------------------------------------------------------------

    def run(self, trace: Sequence[TraceRequest]) -> RunRecord:
        started = time.perf_counter()
        scale = 1.0 / self.config.rate_scale
        bt = self.config.block_tokens
        reqs: list[SimRequest] = []
        for i, t in enumerate(trace):
            reqs.append(
                SimRequest(
                    idx=i,
                    arrival_s=t.timestamp_ms / 1000.0 * scale,
                    prompt_tokens=t.input_length,
                    output_tokens=max(1, t.output_length),
                    chain=t.hash_ids,
                    route=RouteRequest(
                        model=MODEL,
                        block_hashes=t.hash_ids,
                        block_tokens=bt,
                        prompt_tokens=t.input_length,
                        session_key=t.session,
                        max_tokens=t.output_length,
                    ),
                )
            )
        reqs.sort(key=lambda r: r.arrival_s)
        heap = self._heap
        nxt = 0
        n = len(reqs)
        while nxt < n or heap:
            if nxt < n and (not heap or reqs[nxt].arrival_s <= heap[0][0]):
                req = reqs[nxt]
                nxt += 1
                self.now = req.arrival_s
                self._arrive(req)
            else:
                at, _, kind, k, arg = heapq.heappop(heap)
                self.now = at
                if kind == _STEP:
                    self.instances[k].step_end(arg, at)
                elif kind == _READY:
                    self._loads_landed(k, arg)
                else:
                    self._calls.pop(arg)()
            self._events += 1
        first = reqs[0].arrival_s if reqs else 0.0
        last = max((r.finish_s or 0.0 for r in reqs), default=0.0)
        return RunRecord(
            requests=reqs,
            busy_s=[inst.busy_s for inst in self.instances],
            prefill_busy_s=[inst.prefill_busy_s for inst in self.instances],
            routed=[inst.requests for inst in self.instances],
            span_s=max(0.0, last - first),
            wall_s=time.perf_counter() - started,
            events=self._events,
            router_stats=self.router.stats(),
        )
