"""World versions replicated instead of herded (issue 22, item 4).

After a zone's world state changes, every prompt of the zone starts from new blocks, and a
prefix-aware policy sends every session to the one instance that computed them first. This
module warms the new version on the zone's other instances instead, so sessions stay where
the rest of their dialogue is, and demotes the superseded version's blocks first in tierd.

- Implicit: every dispatch with a session key is shown to `VersionDetector`
  (gateway/pipeline/world_versions.py says how a new version is told from an ordinary shared
  prefix). On a `Bump` the prompt to warm is cut from the request that completed the count: the
  most leading messages whose full blocks are all in the new version's hot prefix.
- Explicit: a request or warm carrying `warm.world.header` (`zone:version` or `version`) with
  a version not seen before for that zone announces it: its first `version_messages` messages
  are warmed at once on every healthy instance serving the model.

Warms go through `Warmer.warm_on` (lowest priority, deferred with 429 under load: retried
for `retry_s`). Demotion is tierd's existing `POST /v1/evict` of the arena tier (demote per
its gate), with the keys tierd holds only (skipped when they are not the routing chain's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter as Tally
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from gateway.config.settings import Settings, hint_keys
from gateway.errors import OpenAIError
from gateway.pipeline.decide import RequestPipeline
from gateway.pipeline.parse import ParsedRequest, parse_chat
from gateway.pipeline.world_versions import Bump, VersionDetector
from router.types import Decision, RouteRequest

log = logging.getLogger("warmgate.world")

WarmOn = Callable[[ParsedRequest, str], Awaitable[Any]]  # Warmer.warm_on
_BODIES_KEPT = 1024  # recent requests by session: the text a replication warms
_MAX_CUT = 8  # leading messages tried when cutting the warm's prompt


class WorldReplicator:
    """See the module docstring. Built by the `Warmer`, which it warms through."""

    def __init__(
        self,
        settings: Settings,
        pipeline: RequestPipeline,
        candidates: Callable[[str], Sequence[str]],
        tierds: Mapping[str, Any],
        warm_on: WarmOn,
        registry: CollectorRegistry,
    ) -> None:
        self.settings = settings
        self.config = settings.warm.world
        self.pipeline = pipeline
        self.candidates = candidates  # healthy instances serving a model
        self.tierds = tierds  # instance -> TierdClient
        self.warm_on = warm_on
        cfg = self.config
        self.detector = VersionDetector(
            window_s=cfg.window_s, min_sessions=cfg.min_sessions, max_blocks=cfg.max_blocks
        )
        self.events = Counter(
            "warmgate_world_versions",
            "New world versions by how they were found (detected, announced).",
            ["trigger"],
            registry=registry,
        )
        self.warms = Counter(
            "warmgate_world_warms",
            "Warms of new world versions on the zone's instances, by outcome (ok, held, "
            "deferred, failed, no_body), and superseded blocks demoted in tierd (demoted).",
            ["outcome"],
            registry=registry,
        )
        self.tally: Tally[str] = Tally()
        self.last: dict[str, Any] | None = None  # the latest version handled, for stats
        self._bodies: OrderedDict[str, ParsedRequest] = OrderedDict()
        self._announced: dict[tuple[str, str], tuple[str, tuple[int, ...]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- inputs --------------------------------------------------------------------------

    def note(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> None:
        """A completion request or warm about to be routed: keep its body for a replication,
        and act on an announced version."""
        if parsed.session_key is not None and parsed.kind == "chat":
            self._bodies[parsed.session_key] = parsed
            self._bodies.move_to_end(parsed.session_key)
            if len(self._bodies) > _BODIES_KEPT:
                self._bodies.popitem(last=False)
        announced = headers.get(self.config.header)
        if announced:
            zone, _, version = announced.rpartition(":")
            key = (parsed.model, zone)
            previous = self._announced.get(key)
            if previous is None or previous[0] != version:
                self._announced[key] = (version, previous[1] if previous else ())
                self._spawn(self._announce(parsed, key, version))

    def dispatched(self, rr: RouteRequest, decision: Decision, instance: str) -> None:
        """A `Router.dispatch_observers` hook (pure, in memory; work goes to a task)."""
        if rr.session_key is None or not rr.block_hashes:
            return  # the replication's own warms have none
        bump = self.detector.observe(rr.block_hashes, rr.session_key, instance, time.monotonic())
        if bump is not None:
            self._spawn(self._replicate(bump, rr.model))

    # -- acting --------------------------------------------------------------------------

    async def _replicate(self, bump: Bump, model: str) -> None:
        self.events.labels("detected").inc()
        self.tally["detected"] += 1
        source = self._bodies.get(bump.session)
        cut = await self._cut(source, bump.chain) if source is not None else None
        if cut is None:
            self._count("no_body")
            log.info("world version detected (%d sessions) but no prompt to warm", bump.sessions)
            return
        healthy = list(self.candidates(model))
        zone = [i for i in bump.zone if i in healthy]
        if len(zone) < 2:  # one instance seen so far: the zone is every instance of the model
            zone = healthy
        targets = [i for i in zone if i not in bump.holders]
        self.last = {
            "trigger": "detected",
            "sessions": bump.sessions,
            "blocks": len(bump.chain),
            "stem_blocks": bump.stem_blocks,
            "warmed_on": targets,
            "superseded_blocks": len(bump.superseded),
        }
        log.info("world version detected: %s", self.last)
        await asyncio.gather(*(self._warm(cut, i) for i in targets))
        await self._demote(bump.superseded, healthy)

    async def _announce(self, parsed: ParsedRequest, key: tuple[str, str], version: str) -> None:
        self.events.labels("announced").inc()
        self.tally["announced"] += 1
        messages = parsed.body.get("messages")
        if parsed.kind != "chat" or not isinstance(messages, list):
            self._count("no_body")
            return
        cut = self._parse(parsed, messages[: self.config.version_messages])
        healthy = list(self.candidates(parsed.model))
        if not healthy:
            return
        rr = await self.pipeline.route_request(cut, healthy)
        chain = tuple(rr.block_hashes)
        self.detector.forget(chain)  # announced: the implicit path leaves it alone
        _, old = self._announced.get(key, (version, ()))
        self._announced[key] = (version, chain)
        self.last = {"trigger": "announced", "zone": key[1], "version": version,
                     "blocks": len(chain), "warmed_on": healthy}  # fmt: skip
        await asyncio.gather(*(self._warm(cut, i) for i in healthy))
        await self._demote(old[_common(old, chain) :], healthy)

    async def _cut(self, source: ParsedRequest, chain: Sequence[int]) -> ParsedRequest | None:
        """The most leading messages of `source` whose full blocks all lie in `chain` (the
        last block may differ: it holds what the chat template appends to the prompt)."""
        messages = source.body.get("messages")
        if not isinstance(messages, list):
            return None
        healthy = list(self.candidates(source.model))
        for k in range(min(len(messages) - 1, _MAX_CUT), 0, -1):
            cut = self._parse(source, messages[:k])
            rr = await self.pipeline.route_request(cut, healthy)
            hashes = rr.block_hashes
            common = _common(hashes, chain)
            if common > 0 and common >= len(hashes) - 1:
                return cut
        return None

    def _parse(self, source: ParsedRequest, messages: list[Any]) -> ParsedRequest:
        """A session-less chat body of `messages` (a replication binds nobody)."""
        body = {"model": source.model, "messages": messages}
        return parse_chat(body, None, b"", source.fast_json, self.settings.request_limits)

    async def _warm(self, parsed: ParsedRequest, instance: str) -> None:
        deadline = time.monotonic() + self.config.retry_s
        while True:
            try:
                result = await self.warm_on(parsed, instance)
            except OpenAIError as err:
                if err.status == 429 and time.monotonic() < deadline:
                    await asyncio.sleep(self.settings.warm.retry_after_s)
                    continue
                self._count("deferred" if err.status == 429 else "failed")
                return
            self._count("held" if result.source == "held" else "ok")
            return

    async def _demote(self, superseded: Sequence[int], instances: Sequence[str]) -> None:
        """The superseded version's blocks first out of each tierd's arena."""
        if not superseded or not self.config.demote_superseded:
            return
        if self.settings.routing.mode == "precise" and hint_keys(self.settings) != "engine":
            self._count("demote_skipped")  # tierd names its slices otherwise
            return
        for instance in instances:
            client = self.tierds.get(instance)
            if client is None:
                continue
            try:
                n = await client.evict(list(superseded), tier="GPU")
            except Exception as exc:  # a demotion is advice: tierd evicts on its own later
                log.info("demoting the superseded version in %s's tierd failed: %r", instance, exc)
                continue
            self.tally["demoted"] += n
            self.warms.labels("demoted").inc(n)

    def _count(self, outcome: str) -> None:
        self.warms.labels(outcome).inc()
        self.tally[outcome] += 1

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(_logged(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stats(self) -> dict[str, Any]:
        return {"counts": dict(sorted(self.tally.items())), "last": self.last}


async def _logged(work: Awaitable[None]) -> None:
    try:
        await work
    except Exception:  # a replication is advice: its failure never reaches a request
        log.exception("world version replication failed")


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
