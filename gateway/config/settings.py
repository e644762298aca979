"""Gateway settings: pydantic-settings with env prefix `WARMGATE_` (nested keys joined by `__`,
lists and dicts as JSON) over an optional YAML file (`config_file=` or `WARMGATE_CONFIG`).

Precedence, highest first: explicit keyword arguments, environment, the YAML file, defaults
(`contracts.settings_sources`, tierd's too). A `WARMGATE_*` variable that names no setting and
is not one of the names other parts read (`gateway.config.env_names`) is refused with an
`UnknownEnvironmentError` naming it and the closest valid name.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveInt, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from contracts.settings_sources import check_env, sources
from gateway.config.base import SettingError, StrictModel
from gateway.config.collector import CollectorSettings
from gateway.config.env_names import OTHER_NAMES, OTHER_PREFIXES
from gateway.config.epp import EppSettings
from gateway.config.guards import AuthSettings, LimitSettings, RequestLimits, ServerLimits
from gateway.config.policy import validate_params
from gateway.config.warm import PrioritySettings, WarmSettings
from gateway.engine.base import Engine
from gateway.engine.hashing import FleetHashing, fleet_hashing
from gateway.engine.registry import DEFAULT_KIND, ENGINES, engine_for
from router.policies.registry import default_registry


class InstanceSettings(StrictModel):
    """One inference instance behind the gateway."""

    id: str = Field(min_length=1)
    url: str = Field(min_length=1)  # engine base URL, e.g. http://127.0.0.1:9001 (no /v1)
    tierd_url: str | None = None  # its tier daemon, for prefetch hints and tier stats
    models: list[str] = Field(default_factory=list)  # empty: discovered from the engine
    kv_events_endpoint: str | None = None  # ZMQ PUB endpoint of its KV events
    # vLLM's replay (ROUTER) endpoint: what the engine holds, asked for at start and after
    # the gateway lost sight of it (restart, sequence gap, health recovery)
    kv_events_replay_endpoint: str | None = None
    # its tierd's residency events (ZMQ PUB; `gateway.fleet.tierd_events`): host memory, the array
    # and snapshots, so the router prices what the engine will load from tierd
    tierd_events_endpoint: str | None = None
    # the engine kind there (gateway.engine.registry: vllm, sim): how the gateway reads its
    # metrics, KV events, block hashes, /tokenize and health (`adapter`)
    engine: str = DEFAULT_KIND
    # the engine schedules by priority (vLLM --scheduling-policy priority): send the class's
    # level in the engine kind's priority header
    priority_scheduling: bool = False

    @field_validator("url", "tierd_url")
    @classmethod
    def _strip_slash(cls, value: str | None) -> str | None:
        return value.rstrip("/") if value else value

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, value: str) -> str:
        engine_for(value)  # UnknownEngineError (a ConfigurationError) names the known kinds
        return value

    @model_validator(mode="after")
    def _engine_can(self) -> InstanceSettings:
        engine = self.adapter
        if self.priority_scheduling and engine.priority_header is None:
            raise SettingError(
                f"instance {self.id}: priority_scheduling, but {engine.label} "
                f"(engine: {engine.kind}) does not schedule by priority"
            )
        if self.kv_events_replay_endpoint and engine.kv_events.replay is None:
            raise SettingError(
                f"instance {self.id}: kv_events_replay_endpoint, but {engine.label} "
                f"(engine: {engine.kind}) has no KV event replay"
            )
        return self

    @property
    def adapter(self) -> Engine:
        """The instance's engine kind (`gateway.engine.base.Engine`)."""
        return engine_for(self.engine)

    @property
    def priority_header(self) -> str | None:
        """The header an attempt carries its priority level in; None: send none."""
        return self.adapter.priority_header if self.priority_scheduling else None


DEFAULT_BLOCK_SIZE = 16  # when neither the config nor any engine says (vLLM's GPU default)


class PreciseSettings(StrictModel):
    """Precise mode: blocks cut from real tokens and hashed as the engines hash them.

    The block size and hash algorithm are checked against what each engine reports
    (its kind's cache config, vLLM's `vllm:cache_config_info`) at startup: a mismatch refuses
    to start, unless `adopt_engine_config` is set, in which case the engines' values are used.
    A `block_size` left unset is always taken from the engines. What the hash settings mean
    is the instances' engine kind's (`Settings.fleet_hashing`, `gateway.engine.hashing`)."""

    # `vllm`: the engines' own block hash, as their kind hashes (vLLM's portable block hash,
    # which the simulated engine shares; the name is historical); `xxh3`: warmgate's own
    hash: Literal["vllm", "xxh3"] = "vllm"
    # the engines' block hash algorithm, one of their kind's `hash_algos` (vLLM's
    # prefix_caching_hash_algo, whatever the kind: the name is kept for existing configs)
    vllm_hash_algo: str = "sha256_cbor"
    # the engines' hash seed (vLLM's PYTHONHASHSEED, the sim's --hash-seed); None: the engines
    # run without one, which their kind may seed reproducibly (vLLM's sha256_cbor) or not
    hash_seed: str | None = None
    block_size: int | None = Field(default=None, ge=1)  # None: what the engines report
    adopt_engine_config: bool = False  # take the engines' block size / hash algo on mismatch
    # LoRA adapters the engines serve, name -> path as given to vLLM's --lora-modules: vLLM
    # keys a LoRA request's blocks by ("lora", name, path)
    lora_adapters: dict[str, str] = Field(default_factory=dict)
    tokenizer: str | None = None  # "module:factory" returning a local tokenizer; None: /tokenize
    # the engines' Hugging Face tokenizer directory, read by gateway.pipeline.hf_tokenizer:
    # no /tokenize round trip; requests it cannot reproduce exactly still go to /tokenize
    tokenizer_dir: str | None = None
    tokenize_timeout_s: float = Field(default=2.0, gt=0)
    # tokens of chat prompt pieces (one message each) the local tokenizer remembers, so a
    # dialogue's next turn encodes only its new lines (pipeline.token_segments); 0: off
    segment_cache_tokens: int = Field(default=1_000_000, ge=0)

    @field_validator("vllm_hash_algo")
    @classmethod
    def _an_engine_algo(cls, value: str) -> str:
        known = sorted({a for e in ENGINES.values() for a in e.hash_algos})
        if value not in known:
            raise SettingError(
                f"routing.precise.vllm_hash_algo {value!r} is no engine kind's block hash: "
                f"one of {', '.join(known)}"
            )
        return value

    def hashing(self, engines: Iterable[Engine]) -> FleetHashing:
        """The block hash of a fleet of `engines` under these settings (raises a
        `ConfigurationError` saying what to set when it cannot be reproduced)."""
        return fleet_hashing(engines, self.vllm_hash_algo, self.hash_seed)

    @property
    def effective_block_size(self) -> int:
        return self.block_size if self.block_size is not None else DEFAULT_BLOCK_SIZE

    @model_validator(mode="after")
    def _one_local_tokenizer(self) -> PreciseSettings:
        if self.tokenizer is not None and self.tokenizer_dir is not None:
            raise SettingError(
                "routing.precise: set tokenizer (a module:factory) or tokenizer_dir, not both"
            )
        return self


class RoutingSettings(StrictModel):
    """Which policy routes, with what parameters, over which block size."""

    mode: Literal["approximate", "precise"] = "approximate"
    precise: PreciseSettings = Field(default_factory=lambda: PreciseSettings())
    policy: str = "ttft"  # the TTFT-predicting policy; "prefix" is the SGLang-style baseline
    # the policy's parameters, typed by its constructor (gateway/config/policy.py)
    params: dict[str, Any] = Field(default_factory=dict)
    block_tokens: int = Field(default=64, ge=1)  # tokens per block (approximate mode)
    chars_per_token: int = Field(default=4, ge=1)  # block_chars = block_tokens x this
    index_ttl_s: float = Field(default=600.0, gt=0)  # predict-on-route entries live this long
    index_capacity_blocks: int = Field(default=1_000_000, ge=1)  # per instance

    @property
    def block_chars(self) -> int:
        return self.block_tokens * self.chars_per_token

    @property
    def index_block_tokens(self) -> int:
        """Tokens per block of the prefix index: the engines' block size in precise mode
        (requests that cannot be tokenized fall back to approximate blocks)."""
        return self.precise.effective_block_size if self.mode == "precise" else self.block_tokens

    @model_validator(mode="after")
    def _typed_params(self) -> RoutingSettings:
        self.params = validate_params(self.policy, self.params)
        try:  # a policy checks its values as it is built (cheap, no I/O): fail here, not later
            default_registry().create(self.policy, **self.params)
        except (TypeError, ValueError) as exc:
            raise SettingError(f"routing.params for {self.policy}: {exc}") from exc
        return self


class TimeoutSettings(StrictModel):
    """Upstream HTTP timeouts (seconds)."""

    connect_s: float = Field(default=2.0, gt=0)
    read_s: float = Field(default=300.0, gt=0)  # between two bytes of the upstream response
    write_s: float = Field(default=30.0, gt=0)
    pool_s: float = Field(default=5.0, gt=0)
    max_connections: int = Field(default=1000, ge=1)
    max_keepalive: int = Field(default=200, ge=0)
    # Per request: an engine that sends nothing for this long after the request (headers and
    # first chunk) is treated as failed and the request fails over; a stream silent this long
    # between two chunks is cut (then continued elsewhere, or ended with an error event).
    first_byte_s: float = Field(default=60.0, gt=0)
    stall_s: float = Field(default=30.0, gt=0)


class UpstreamSettings(StrictModel):
    """How the proxy talks to the engines (gateway/upstream/transport.py): `h1pool`, hand-written
    keep-alive pool on httptools; `aiohttp` (the `transports` extra) or `httpx`, the same
    seam over those libraries' clients. Limits and timeouts are `timeouts`' for all three."""

    transport: Literal["h1pool", "aiohttp", "httpx"] = "h1pool"


class HealthSettings(StrictModel):
    """Background checks of each instance's `/health`."""

    interval_s: float = Field(default=2.0, gt=0)
    timeout_s: float = Field(default=1.0, gt=0)
    failure_threshold: int = Field(default=2, ge=1)  # consecutive failures -> unhealthy
    success_threshold: int = Field(default=1, ge=1)  # consecutive successes -> healthy again


class StateSettings(StrictModel):
    """Shared state between replicas (gateway/pipeline/shared_state.py, session_bindings.py)."""

    backend: Literal["memory", "redis"] = "memory"
    redis_url: str | None = None
    pool: str = "default"
    replica_id: str | None = None
    session_ttl_s: float = 1800.0
    inflight_ttl_s: float = 15.0

    @model_validator(mode="after")
    def _redis_needs_url(self) -> StateSettings:
        if self.backend == "redis" and not self.redis_url:
            raise SettingError("state.backend=redis needs state.redis_url")
        return self


class ResponsesSettings(StrictModel):
    """The Responses API's stored responses, for `previous_response_id`
    (gateway/pipeline/response_store.py): in Redis when `state.backend` is, else in memory."""

    ttl_s: float = Field(default=3600.0, gt=0)  # a stored response is kept this long
    max_bytes: int = Field(default=1024 * 1024, ge=1024)  # one larger is not stored
    memory_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)  # the memory store's all
    timeout_s: float = Field(default=0.5, gt=0)  # each Redis call


class KvEventsSettings(StrictModel):
    """Consumption of engines' KV events (gateway/fleet/kv_events.py)."""

    enabled: bool = False
    topic: str = ""  # vLLM's default (KVEventsConfig.topic)


class EngineMetricsSettings(StrictModel):
    """Scraping each engine's own metrics (gateway/fleet/engine_load.py): load and an overload
    veto, and the engine's prompt-token accounting."""

    enabled: bool = True
    interval_s: float = Field(default=2.0, gt=0)
    veto_waiting: int | None = Field(default=32, ge=1)  # None: never veto on the queue
    veto_kv_usage: float | None = Field(default=0.99, gt=0, le=1)  # None: never on KV use


class TierSettings(StrictModel):
    """The gateway's side of tierd: prefetch hints and tier-bandwidth polling."""

    prefetch: bool = True  # send a prefetch hint to the chosen instance's tierd
    prefetch_deadline_s: float = Field(default=2.0, gt=0)
    # How long a request may wait for its hint's reads into tierd's host memory before it
    # is sent (0: not at all, the hint races the request). The engine's connector loads
    # synchronously: a read not finished at its ask stalls the engine's whole step, every
    # request on it; held, only this request waits, about as long as it would anyway.
    prefetch_hold_s: float = Field(default=0.0, ge=0, le=1.0)
    stats_interval_s: float = Field(default=5.0, gt=0)  # poll tierd stats for bandwidths
    # The keys tierd holds slices under (contracts.slices): `approximate` (the gateway's
    # character blocks, what `sim.engine` stores) or `engine` (the engine's own block hashes,
    # what tierd's vLLM KV connector stores; precise mode computes the same chain). `auto`:
    # the routing mode's (`engine` in precise mode, else `approximate`); see `hint_keys()`.
    hint_keys: Literal["auto", "approximate", "engine"] = "auto"


def hint_keys(settings: Settings) -> Literal["approximate", "engine"]:
    """The keys a prefetch hint names: `tiers.hint_keys`, or with `auto` the routing mode's
    slice keys (the engine's block hashes in precise mode)."""
    keys = settings.tiers.hint_keys
    if keys == "auto":
        return "engine" if settings.routing.mode == "precise" else "approximate"
    return keys


class FleetSettings(StrictModel):
    """Runtime fleet changes (gateway/fleet/runtime.py): how often replicas look for them, and how
    long a drain waits before trusting that every replica has seen it."""

    poll_interval_s: float = Field(default=0.5, gt=0)
    drain_grace_s: float = Field(default=2.0, ge=0)


class CalibrationSettings(StrictModel):
    """The join probe (gateway/fleet/calibration_probe.py): when an instance joins (configured,
    added at runtime, healthy again), a few cold prompts of `probe_tokens` sizes, each with a
    unique `cache_salt`, `max_tokens` 1, price it for the policy before routed requests land
    there; it stays out of the candidates (while others remain) for at most
    `probe_timeout_s`."""

    probe: bool = True
    probe_timeout_s: float = Field(default=10.0, gt=0)
    probe_tokens: list[PositiveInt] = Field(default_factory=lambda: [256, 1024, 4096], min_length=1)


class UiSettings(StrictModel):
    """The operator page (gateway/admin/ui/): how often it samples history (the engines' own
    figures are the `engine_metrics` scrapes)."""

    sample_interval_s: float = Field(default=5.0, gt=0)  # one history point per interval
    history_s: float = Field(default=900.0, gt=0)  # kept this long


ENV_PREFIX = "WARMGATE_"


class Settings(BaseSettings):
    """Everything the gateway needs; see README 'Configuration'."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",  # a misspelt key (YAML or keyword) is an error naming it
    )

    config_file: Path | None = None  # YAML file (also WARMGATE_CONFIG)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    log_level: str = "info"
    instances: list[InstanceSettings] = Field(default_factory=list)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)
    upstream: UpstreamSettings = Field(default_factory=UpstreamSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    state: StateSettings = Field(default_factory=StateSettings)
    responses: ResponsesSettings = Field(default_factory=ResponsesSettings)
    kv_events: KvEventsSettings = Field(default_factory=KvEventsSettings)
    tiers: TierSettings = Field(default_factory=TierSettings)
    engine_metrics: EngineMetricsSettings = Field(default_factory=EngineMetricsSettings)
    fleet: FleetSettings = Field(default_factory=FleetSettings)
    calibration: CalibrationSettings = Field(default_factory=CalibrationSettings)
    ui: UiSettings = Field(default_factory=UiSettings)
    gc: CollectorSettings = Field(default_factory=CollectorSettings)  # `warmgate serve`'s
    warm: WarmSettings = Field(default_factory=WarmSettings)  # POST /v1/warm
    priority: PrioritySettings = Field(default_factory=PrioritySettings)  # classes, deadlines
    epp: EppSettings = Field(default_factory=EppSettings)  # the Endpoint Picker (gateway/epp/)
    # Stream from the engine even for non-streaming clients (the answer is assembled): the
    # gateway then sees TTFT and can fail over until the last byte.
    stream_upstream: bool = True
    api_keys: list[str] = Field(default_factory=list)  # client keys (as auth.client_keys)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    request_limits: RequestLimits = Field(default_factory=RequestLimits)
    server: ServerLimits = Field(default_factory=ServerLimits)
    # A stream whose engine fails after its first byte goes on on the next instance (the
    # prompt plus the text sent so far); off: it ends with an error event.
    continue_streams: bool = True
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    retry_after_s: int = Field(default=1, ge=0)  # Retry-After on 503 (no healthy instance)
    stats_window_s: float = Field(default=300.0, gt=0)  # TTFT percentiles over this window
    stats_window_max: int = Field(default=10_000, ge=1)  # and at most this many samples

    @model_validator(mode="after")
    def _unique_ids(self) -> Settings:
        ids = [i.id for i in self.instances]
        if len(ids) != len(set(ids)):
            raise SettingError(f"instance ids must be unique: {ids}")
        return self

    @model_validator(mode="after")
    def _precise_hashing(self) -> Settings:
        self.fleet_hashing()  # raises, naming what to set, when it cannot be had
        return self

    def engines(self) -> list[Engine]:
        """The configured instances' engine kinds (the default kind's when none is)."""
        return [i.adapter for i in self.instances] or [engine_for(DEFAULT_KIND)]

    def fleet_hashing(self) -> FleetHashing | None:
        """How precise mode names blocks as the engines do (`routing.precise.hash: vllm`);
        None in approximate mode or with warmgate's own xxh3 chain."""
        routing = self.routing
        if routing.mode != "precise" or routing.precise.hash != "vllm":
            return None
        return routing.precise.hashing(self.engines())

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        check_env(
            settings_cls,
            prefix=ENV_PREFIX,
            nested_delimiter="__",
            allowed=OTHER_NAMES,
            allowed_prefixes=OTHER_PREFIXES,
        )
        path: str | None = None
        if isinstance(init_settings, InitSettingsSource):
            given = init_settings.init_kwargs.get("config_file")
            path = str(given) if given else None
        path = path or os.environ.get(f"{ENV_PREFIX}CONFIG") or None
        return sources(settings_cls, init_settings, env_settings, path)


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from env and YAML (`config_file` wins over WARMGATE_CONFIG)."""
    if config_file is not None:
        overrides["config_file"] = Path(config_file)
    return Settings(**overrides)
