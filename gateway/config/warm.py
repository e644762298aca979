"""Settings of warming (`POST /v1/warm`, gateway/pipeline/warm.py) and of per-request
priority classes and TTFT deadlines (gateway/pipeline/priority.py). Nested under `Settings`
(gateway/config/settings.py) as `warm` and `priority`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gateway.config.base import SettingError, StrictModel

PriorityClass = Literal["interactive", "normal", "background"]
PRIORITY_CLASSES: tuple[PriorityClass, ...] = ("interactive", "normal", "background")
_DEFAULT_LEVELS: tuple[tuple[PriorityClass, int], ...] = (
    ("interactive", -10),
    ("normal", 0),
    ("background", 10),
)


class WorldSettings(StrictModel):
    """World versions (gateway/pipeline/world_versions.py, world_replicate.py): a block first
    seen under an established stem and reached by `min_sessions` sessions within `window_s`
    is a zone's new world state; it is warmed on the zone's other instances and the version
    it replaced is demoted first in their tierds. A request or warm with the `header`
    (`zone:version` or `version`) announces a version: its first `version_messages` messages
    (the world state of the game layout) are warmed at once on every instance serving the
    model. `retry_s`: how long a replication keeps retrying warms deferred by load."""

    enabled: bool = True
    window_s: float = Field(default=10.0, gt=0)
    min_sessions: int = Field(default=4, ge=2)
    max_blocks: int = Field(default=1024, ge=1)
    header: str = "x-warmgate-world-version"
    version_messages: int = Field(default=1, ge=1)
    retry_s: float = Field(default=10.0, ge=0)
    demote_superseded: bool = True


class WarmSettings(StrictModel):
    """A warm is the lowest-priority work there is: it starts on an instance only while that
    instance has fewer than `max_real_in_flight` real requests in flight (from this
    replica) and its engine reports at most `max_engine_waiting` waiting requests, with at
    most `max_per_instance` warms at a time; otherwise 429 with Retry-After.

    A warm still computing gives way the moment a real request begins on its instance
    (`yield_to_real`): its engine request is cancelled, whatever the engine's scheduling
    (vLLM's priority scheduling orders only the waiting queue; a warm already running keeps
    its share of every step's token budget, so a line arriving beside it prefills at half
    speed). With `resume_after_yield` it goes on once no real request there is still
    prefilling (sent, no first token): the engine kept the full blocks it had computed
    (vLLM caches each block as its step is scheduled and keeps it, unpinned, after an
    abort), so only the rest is computed. After `max_yields` yields, or past
    `engine_timeout_s` in all, it ends with 429."""

    enabled: bool = True
    max_real_in_flight: int = Field(default=4, ge=1)
    max_engine_waiting: int = Field(default=0, ge=0)
    max_per_instance: int = Field(default=2, ge=1)
    yield_to_real: bool = True
    resume_after_yield: bool = True
    max_yields: int = Field(default=8, ge=0)
    tierd_wait_s: float = Field(default=2.0, gt=0)  # a restore from tierd waits this long
    engine_timeout_s: float = Field(default=30.0, gt=0)  # the one-token request's bound
    retry_after_s: int = Field(default=1, ge=1)
    priority: int = 20  # the vLLM priority of a warm (lower is earlier; below background)
    world: WorldSettings = Field(default_factory=WorldSettings)

    def refusal(self, warms: int, real: int, waiting: float | None) -> str | None:
        """Why an instance with `warms` warms and `real` real requests in flight, its engine
        reporting `waiting` requests waiting (None: unknown), cannot take an engine warm now;
        None when it can. The one rule: the gateway's `Warmer` and the cluster simulator."""
        if warms >= self.max_per_instance:
            return f"has {warms} warms in flight (limit {self.max_per_instance})"
        if real >= self.max_real_in_flight:
            return f"has {real} real requests in flight (warms run under {self.max_real_in_flight})"
        if waiting is not None and waiting > self.max_engine_waiting:
            return f"reports {waiting:.0f} requests waiting"
        return None

    def gives_up_on_yield(self) -> bool:
        """Whether a warm that gave way to a real request ends there (429) rather than going
        on after the instance's real prefills: the gateway's `Warmer` and the simulator."""
        return self.yield_to_real and not self.resume_after_yield


class PrioritySettings(StrictModel):
    """Priority classes (header `x-warmgate-priority` or body field `priority` naming a
    class) as vLLM priorities (lower is handled earlier), sent to instances that run with
    `--scheduling-policy priority` (`priority_scheduling: true` on the instance). Admission
    sheds background work first: a background request is refused with 429 while its
    instance has `background_max_in_flight` or more requests in flight. At most
    `background_prefills` background requests prefill on an instance at once (sent, no first
    token yet: gateway/pipeline/prefill_gate.py); the next waits up to `background_wait_s`,
    then is refused with 429. 0: no such limit."""

    levels: dict[PriorityClass, int] = Field(default_factory=lambda: dict(_DEFAULT_LEVELS))
    background_max_in_flight: int = Field(default=16, ge=1)
    background_prefills: int = Field(default=1, ge=0)
    background_wait_s: float = Field(default=30.0, gt=0)
    deadline_miss_status: Literal[429, 503] = 429  # when the caller names none
    retry_after_s: int = Field(default=1, ge=1)

    def sheds(self, klass: PriorityClass | None, in_flight: int) -> bool:
        """Whether admission refuses a request of `klass` on an instance with `in_flight`
        requests in flight: background work goes first (the gateway and the simulator)."""
        return klass == "background" and in_flight >= self.background_max_in_flight

    @model_validator(mode="after")
    def _every_class(self) -> PrioritySettings:
        missing = [c for c in PRIORITY_CLASSES if c not in self.levels]
        if missing:
            raise SettingError(f"priority.levels needs every class; missing {missing}")
        return self
