"""tierd's settings: one pydantic-settings model, filled from CLI flags, `WARMGATE_TIERD__*`
environment variables (every flag has an env twin; see `tierd.serve`) and an optional YAML
file (`config_file`, `tierd serve --config`).

Precedence, highest first, as the gateway's (`contracts.settings_sources`): flags (keyword
arguments), the environment, the YAML file, defaults. Unknown keys are refused, in YAML and
keywords (`extra="forbid"`) and in the environment: a `WARMGATE_TIERD__*` variable naming no
setting is an `UnknownEnvironmentError` naming it and the closest valid name. YAML keys may
be spelt as the flags are (`l1-bytes`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from contracts.settings_sources import check_env, sources

ENV_PREFIX = "WARMGATE_TIERD__"


class TierdSettings(BaseSettings):
    """Everything a tier daemon needs; sizes in bytes, bandwidths in bytes per second."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    config_file: Path | None = None  # YAML file of settings (`--config`)
    host: str = "127.0.0.1"
    port: int = 8100
    instance_id: str = "tierd-0"
    # L1: the "HBM" arena (host memory on a machine without a GPU), cut into fixed slots.
    l1_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    slice_bytes: int = Field(default=256 * 1024, gt=0)
    l1_backend: Literal["auto", "host", "cuda", "hip", "shm"] = "auto"
    # L2: the (possibly shared) array directory; 0 = no capacity bound of our own.
    array_dir: Path = Path("./tierd-array")
    array_bytes: int = Field(default=0, ge=0)
    fsync: bool = False
    # O_DIRECT array reads where the filesystem allows. Off when the tierds sharing the
    # array share one machine: a slice a peer just wrote is in the page cache, and O_DIRECT
    # would read it from the disk again (measured here: 141 MB/s against GB/s).
    array_o_direct: bool = True
    # L3: cold snapshots.
    snapshot_dir: Path = Path("./tierd-snapshots")
    snapshot_bytes: int = Field(default=0, ge=0)  # 0 = no capacity bound
    zstd_level: int = 3
    snapshot_idle_sessions: bool = True  # a dialogue idle past session_ttl_s → one object
    # Policies.
    lru_k: int = Field(default=2, ge=1)
    history_entries: int = Field(default=1_000_000, gt=0)
    protect_fraction: float = Field(default=0.5, ge=0.0, le=1.0)
    session_ttl_s: float = Field(default=120.0, gt=0)
    max_sessions: int = Field(default=100_000, gt=0)
    temp_grace_s: float = Field(default=60.0, ge=0)
    # Emulated transfer time (see tierd.emulation); None = charge nothing, move bytes only.
    emulate: str | None = None
    array_gbps: float | None = None
    snapshot_gbps: float | None = None
    time_scale: float = Field(default=1.0, gt=0)  # wall seconds per emulated second
    # The KV socket an engine's connector attaches to (`tierd.kvserver`); with it L1 is a
    # memfd the connector maps. The namespace (model, dtype, block size, hash algorithm,
    # seed) is adopted from the first connector when unset; others are refused.
    kv_socket: Path | None = None
    kv_namespace: str | None = None
    # Connector saves go to the shared array at once (other instances read them there).
    connector_write_through: bool = True
    # The engine's own KV events (ZMQ SUB, e.g. tcp://127.0.0.1:5557): BlockRemoved tells
    # tierd a block left the engine, so L1's copy passes the gate to the array.
    engine_events: str | None = None
    # Residency events.
    events_endpoint: str | None = None
    events_topic: str = "kv-events"
    redis_url: str | None = None
    pool: str = "default"
    stream_maxlen: int = 100_000

    @model_validator(mode="before")
    @classmethod
    def _flag_spelling(cls, data: Any) -> Any:
        """`l1-bytes:` in YAML is `l1_bytes`; only YAML has dashes, and it is the lowest
        source, so a key the flags or the environment also gave keeps their value."""
        if not isinstance(data, dict):
            return data
        out = {k: v for k, v in data.items() if not (isinstance(k, str) and "-" in k)}
        for key, value in data.items():
            if isinstance(key, str) and "-" in key:
                out.setdefault(key.replace("-", "_"), value)
        return out

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        check_env(settings_cls, prefix=ENV_PREFIX)
        path = None
        if isinstance(init_settings, InitSettingsSource):
            path = init_settings.init_kwargs.get("config_file")
        return sources(settings_cls, init_settings, env_settings, path)
