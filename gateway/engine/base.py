"""What the gateway needs to know of an engine kind (issue 20, step 3): the `Engine` protocol,
and the engine-neutral records its parsers return. Pure: nothing here does I/O, and nothing
here imports the gateway's settings (they import this package to check `instances[].engine`).

An `Engine` (one immutable object per kind, `gateway.engine.registry.engine_for(kind)`) says:

- who it is: `kind` (the `instances[].engine` value) and `label` (for messages);
- its routes, relative to the instance's URL: `health_path` (200 is healthy), `models_path`
  (`served_models(answer)` reads the JSON answer), `metrics_path` (Prometheus text;
  `load_path` the page the load scrape reads, the same restricted to its series),
  `tokenize_path` (`tokenize_body(payload)` is the body for a tokenize payload, the shape
  local tokenizers take too: `model` and `prompt`, or `messages`, `tools` and
  `add_generation_prompt`; `tokens(answer)` the token ids of its JSON answer);
- what its `/metrics` page says: `metric_names` (the series read), `load(text)` (an
  `EngineLoad`, `empty` when the page has none of them), `cache_config(text)` (an
  `EngineCacheConfig`, None when not published) and `kv_capacity(text)` (its HBM KV tokens);
- its KV events: `kv_events`, a `KvEventWire` (how a message's frames and payload decode,
  and its replay protocol when it has one, `replay`);
- how it names its KV blocks, for precise mode: `hash_scheme` (engines of one scheme hash
  alike given the same algorithm, seed and block size), `hash_algos` (the algorithms precise
  mode reproduces, the engine's default first), `hash_seed_source` (what sets the seed on the
  engine, for messages), `unseeded_hash_seed(algo)` (the seed it uses when none is set; None:
  random per process), `block_hasher(algo=, seed=, block_size=)` (a `router.precise`
  `BlockHasher` naming blocks as the engine's KV events do);
- `priority_header`: the request header carrying a scheduling priority to an engine that
  schedules by it (`instances[].priority_scheduling`); None: it cannot.

A new kind is one module beside `vllm.py` and `sim.py` implementing this protocol, one line in
`registry.py`, and its tests; tests/unit/test_engine_adapter.py runs its contract over every
registered kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from contracts.kv_events import EventBatch, Frames
from router.precise import BlockHasher


@dataclass(frozen=True, slots=True)
class EngineCacheConfig:
    """The KV cache configuration an engine reports."""

    block_size: int | None
    hash_algo: str | None  # the prefix-caching block hash algorithm
    prefix_caching: bool | None
    num_gpu_blocks: int | None
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def kv_capacity_tokens(self) -> int | None:
        if self.block_size and self.num_gpu_blocks and self.num_gpu_blocks > 0:
            return self.block_size * self.num_gpu_blocks
        return None


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """One scrape of an engine's load and prompt-token accounting."""

    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None  # 0..1 (max over data-parallel ranks)
    prompt_tokens_by_source: Mapping[str, float] = field(default_factory=dict)
    cached_tokens_by_source: Mapping[str, float] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Nothing the gateway uses: not an engine page it can read."""
        return self.waiting is None and self.kv_usage is None and not self.prompt_tokens_by_source


@dataclass(frozen=True, slots=True)
class MetricNames:
    """The series an engine kind's `/metrics` page is read from."""

    waiting: str
    running: str
    kv_usage: str
    cache_config: str
    prompt_tokens_by_source: str
    cached_tokens_by_source: str


ReplayAnswer = Sequence[bytes] | Literal["end"] | None


class KvReplay(Protocol):
    """An engine's KV event replay: what it published since it started, asked for on demand
    (the socket work is `gateway.fleet.kv_replay`'s)."""

    def request(self, start_seq: int) -> list[bytes]:
        """The frames asking for every buffered batch from `start_seq`."""
        ...

    def answer(self, frames: Sequence[bytes]) -> ReplayAnswer:
        """One reply: a batch's `[topic, seq, payload]` frames, "end" after the last, or
        None for a reply that is not part of the replay (skipped)."""
        ...


class KvEventWire(Protocol):
    """How one publisher's KV event messages decode (raising
    `contracts.kv_events.MalformedEventError` on what does not)."""

    @property
    def replay(self) -> KvReplay | None: ...

    def decode_frames(self, frames: Sequence[bytes]) -> Frames: ...

    def decode_batch(self, payload: bytes) -> EventBatch: ...


class Engine(Protocol):
    """One engine kind, as the gateway talks to it (the module docstring says each member)."""

    @property
    def kind(self) -> str: ...

    @property
    def label(self) -> str: ...

    @property
    def health_path(self) -> str: ...

    @property
    def models_path(self) -> str: ...

    @property
    def metrics_path(self) -> str: ...

    @property
    def load_path(self) -> str:
        """The page the load scrape reads (`load()`): the metrics page, restricted to the
        load's series where the engine can do that."""
        ...

    @property
    def tokenize_path(self) -> str: ...

    @property
    def metric_names(self) -> MetricNames: ...

    @property
    def kv_events(self) -> KvEventWire: ...

    @property
    def hash_scheme(self) -> str: ...

    @property
    def hash_algos(self) -> tuple[str, ...]: ...

    @property
    def hash_seed_source(self) -> str: ...

    @property
    def priority_header(self) -> str | None: ...

    def served_models(self, answer: Any) -> list[str] | None:
        """The model ids of a models answer; None when it holds no model list."""
        ...

    def tokenize_body(self, payload: Mapping[str, Any]) -> dict[str, Any]: ...

    def tokens(self, answer: Any) -> list[int] | None:
        """The token ids of a tokenize answer; None when it holds none."""
        ...

    def load(self, metrics_text: str) -> EngineLoad:
        """The page's load (`EngineLoad.empty` when it has none of the series)."""
        ...

    def cache_config(self, metrics_text: str) -> EngineCacheConfig | None: ...

    def kv_capacity(self, metrics_text: str) -> int | None: ...

    def unseeded_hash_seed(self, algo: str) -> str | None: ...

    def block_hasher(self, *, algo: str, seed: str, block_size: int) -> BlockHasher:
        """Raises `router.precise.UnsupportedHashError` for an algorithm not in `hash_algos`."""
        ...
