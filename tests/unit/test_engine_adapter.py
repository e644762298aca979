"""The engine adapter (issue 20, step 3): every registered kind satisfies `Engine` and passes
one contract (a new kind must too: the contract tests run over `ENGINES`); an unknown
`instances[].engine` is refused naming the known kinds; the vLLM kind reads vLLM's pages
and frames, the sim kind a real simulated engine's answers (the app in-process); what a
kind cannot do is refused at settings validation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from contracts import kv_events
from contracts.errors import ConfigurationError
from contracts.kv_events import BlockStored, EventBatch, MalformedEventError
from gateway.config.settings import InstanceSettings, Settings
from gateway.engine import base
from gateway.engine.base import EngineLoad
from gateway.engine.hashing import MixedHashSchemesError, UnseededHashError, fleet_hashing
from gateway.engine.registry import DEFAULT_KIND, ENGINES, UnknownEngineError, engine_for
from gateway.engine.sim import SIM
from gateway.engine.vllm import VLLM, VllmEngine
from router.precise import UnsupportedHashError
from sim.engine.app import create_app
from sim.engine.config import EngineConfig
from tests.unit.test_engine_load import PAGE as VLLM_LOAD_PAGE
from tests.unit.test_gateway_kv_capacity import VLLM_PAGE as VLLM_CACHE_PAGE

KINDS = sorted(ENGINES)
# every member the protocol names (properties and methods), so a kind missing one fails here
MEMBERS = sorted(n for n in vars(base.Engine) if not n.startswith("_"))


@pytest.fixture(params=KINDS)
def engine(request: pytest.FixtureRequest) -> base.Engine:
    return ENGINES[request.param]


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WARMGATE_CONFIG", "WARMGATE_INSTANCES", "WARMGATE_ROUTING__MODE"):
        monkeypatch.delenv(name, raising=False)


# --- the contract, for every registered kind ---------------------------------------------


def test_the_kinds_are_vllm_and_sim_and_vllm_is_the_default() -> None:
    assert KINDS == ["sim", "vllm"] and DEFAULT_KIND == "vllm"
    assert InstanceSettings(id="a", url="http://e").adapter is VLLM


def test_each_kind_has_every_member_of_the_protocol(engine: base.Engine) -> None:
    missing = [m for m in MEMBERS if not hasattr(engine, m)]
    assert not missing, f"{engine.kind} lacks {missing}"
    assert {"load", "cache_config", "block_hasher", "kv_events", "hash_algos"} <= set(MEMBERS)
    assert engine_for(engine.kind) is engine and engine.kind.isidentifier()
    assert engine.label
    for path in (engine.health_path, engine.models_path, engine.metrics_path):
        assert path.startswith("/")
    assert engine.load_path.startswith(engine.metrics_path)
    assert engine.tokenize_path.startswith("/")
    assert (
        engine.priority_header is None or engine.priority_header == engine.priority_header.lower()
    )


def test_each_kind_reads_nothing_from_an_empty_or_torn_page(engine: base.Engine) -> None:
    for page in ("", "garbage{", "# HELP nothing here\n"):
        load = engine.load(page)
        assert load == EngineLoad() and load.empty
        assert engine.cache_config(page) is None and engine.kv_capacity(page) is None


def test_each_kind_says_none_for_an_answer_without_its_fields(engine: base.Engine) -> None:
    for answer in (None, "text", [], {"object": "list"}):
        assert engine.served_models(answer) is None
        assert engine.tokens(answer) is None
    payload = {"model": "m", "prompt": "hello"}
    body = engine.tokenize_body(payload)
    assert isinstance(body, dict) and payload == {"model": "m", "prompt": "hello"}


def test_each_kind_hashes_reproducibly_with_each_of_its_algorithms(engine: base.Engine) -> None:
    assert engine.hash_algos and engine.hash_scheme and engine.hash_seed_source
    for algo in engine.hash_algos:
        a = engine.block_hasher(algo=algo, seed="0", block_size=4)
        again = engine.block_hasher(algo=algo, seed="0", block_size=4)
        other = engine.block_hasher(algo=algo, seed="1", block_size=4)
        hashes = a.block_hashes(list(range(10)))
        assert len(hashes) == 2 and all(0 <= h < 2**64 for h in hashes)  # full blocks only
        assert hashes == again.block_hashes(list(range(10))) != other.block_hashes(list(range(10)))
        seed = engine.unseeded_hash_seed(algo)
        assert seed is None or isinstance(seed, str)
    with pytest.raises(UnsupportedHashError):
        engine.block_hasher(algo="md5", seed="0", block_size=4)


def test_each_kind_decodes_its_kv_event_frames(engine: base.Engine) -> None:
    batch = EventBatch(
        1.0, (BlockStored((1, 2), None, tuple(range(8)), 4, None, "GPU", None),), None
    )
    frames = kv_events.encode_frames("t", 7, kv_events.encode_batch(batch, "map"))
    wire = engine.kv_events
    message = wire.decode_frames(frames)
    assert (message.topic, message.seq) == ("t", 7)
    assert wire.decode_batch(message.payload).events == batch.events
    with pytest.raises(MalformedEventError):
        wire.decode_frames([b"only one frame"])
    with pytest.raises(MalformedEventError):
        wire.decode_batch(b"\xc1 not msgpack")
    if wire.replay is not None:
        assert all(isinstance(f, bytes) for f in wire.replay.request(0))


def test_each_kind_is_an_instance_setting_and_says_what_it_cannot(engine: base.Engine) -> None:
    spec = InstanceSettings(id="a", url="http://e", engine=engine.kind)
    assert spec.adapter is engine and spec.priority_header is None  # not asked for
    spec = {"id": "a", "url": "http://e", "engine": engine.kind}
    if engine.priority_header is None:
        with pytest.raises(ValidationError, match="does not schedule by priority"):
            InstanceSettings(**spec, priority_scheduling=True)
    else:
        prio = InstanceSettings(**spec, priority_scheduling=True)
        assert prio.priority_header == engine.priority_header
    if engine.kv_events.replay is None:
        with pytest.raises(ValidationError, match="has no KV event replay"):
            InstanceSettings(**spec, kv_events_replay_endpoint="tcp://127.0.0.1:1")
    seeded = Settings(
        instances=[spec],
        routing={"mode": "precise", "precise": {"hash_seed": "0"}},
    )
    hashing = seeded.fleet_hashing()
    assert hashing is not None and hashing.engine is engine and hashing.seed == "0"


# --- unknown kinds, precise mode over kinds ------------------------------------------------


def test_an_unknown_engine_is_refused_naming_the_known_kinds() -> None:
    with pytest.raises(ValidationError, match="unknown engine kind 'sglang'") as info:
        Settings(instances=[{"id": "a", "url": "http://e", "engine": "sglang"}])
    (error,) = info.value.errors()
    assert error["loc"] == ("instances", 0, "engine")
    assert isinstance(error["ctx"]["error"], UnknownEngineError)
    assert isinstance(error["ctx"]["error"], ConfigurationError)
    assert "one of sim, vllm" in str(info.value)
    with pytest.raises(UnknownEngineError, match="sim, vllm"):
        engine_for("sglang")


def test_precise_mode_reads_the_seed_rule_of_the_instances_kinds() -> None:
    vllm = {"id": "v", "url": "http://v"}
    sim = {"id": "s", "url": "http://s", "engine": "sim"}
    precise = {"mode": "precise"}
    hashing = Settings(instances=[vllm], routing=precise).fleet_hashing()
    assert hashing is not None and hashing.seed == "vllm-none-hash"  # vLLM's sha256_cbor
    with pytest.raises(ValidationError, match="--hash-seed"):
        Settings(instances=[sim], routing=precise)  # the sim seeds randomly without one
    with pytest.raises(ValidationError, match=r"needs routing\.precise\.hash_seed"):
        Settings(instances=[vllm, sim], routing=precise)  # the kinds' unseeded seeds differ
    both = Settings(
        instances=[vllm, sim], routing={**precise, "precise": {"hash_seed": "42"}}
    ).fleet_hashing()
    assert both is not None and both.seed == "42"
    assert Settings(instances=[sim]).fleet_hashing() is None  # approximate mode: none
    with pytest.raises(ValidationError, match="no engine kind's block hash"):
        Settings(routing={**precise, "precise": {"vllm_hash_algo": "sha1"}})


def test_engines_of_another_hash_scheme_cannot_share_precise_mode() -> None:
    class OtherScheme(VllmEngine):
        @property
        def kind(self) -> str:
            return "other"

        @property
        def hash_scheme(self) -> str:
            return "other_scheme"

    with pytest.raises(MixedHashSchemesError, match="hash otherwise than each other"):
        fleet_hashing([VLLM, OtherScheme()], "sha256_cbor", "0")
    with pytest.raises(UnseededHashError, match="random bytes per process"):
        fleet_hashing([SIM], "sha256_cbor", None)
    assert fleet_hashing([SIM, SIM], "xxhash_cbor", "0").engine is SIM


# --- the vLLM kind on vLLM's pages ---------------------------------------------------------


def test_vllm_reads_vllms_metrics_pages() -> None:
    load = VLLM.load(VLLM_LOAD_PAGE)
    assert (load.waiting, load.running, load.kv_usage) == (3.0, 1.0, 0.25)
    assert load.prompt_tokens_by_source == {"local_compute": 900.0, "local_cache_hit": 300.0}
    config = VLLM.cache_config(VLLM_CACHE_PAGE)
    assert config is not None
    assert (config.block_size, config.hash_algo, config.prefix_caching) == (16, "sha256_cbor", True)
    assert VLLM.kv_capacity(VLLM_CACHE_PAGE) == 27317 * 16
    assert VLLM.metric_names.waiting == "vllm:num_requests_waiting"
    assert VLLM.metric_names.cache_config == "vllm:cache_config_info"


def test_vllm_reads_its_answers_and_replays() -> None:
    models = {"object": "list", "data": [{"id": "qwen", "max_model_len": 4096}, {"x": 1}]}
    assert VLLM.served_models(models) == ["qwen"]
    assert VLLM.tokens({"count": 2, "tokens": [1, 2], "max_model_len": 9}) == [1, 2]
    replay = VLLM.kv_events.replay
    assert replay is not None
    assert replay.request(5) == [b"", (5).to_bytes(8, "big")]
    end = (-1).to_bytes(8, "big", signed=True)
    assert replay.answer([b"", b"", end, b""]) == "end"
    assert replay.answer([b"", b"t", b"\x00" * 8, b"payload"]) == [b"t", b"\x00" * 8, b"payload"]
    assert replay.answer([b"", b"not replay"]) is None
    assert VLLM.unseeded_hash_seed("sha256_cbor") == "vllm-none-hash"
    assert VLLM.unseeded_hash_seed("xxhash_cbor") is None
    assert VLLM.priority_header == "x-vllm-priority"


# --- the sim kind on a real simulated engine -----------------------------------------------


@pytest.fixture
async def sim_engine() -> AsyncIterator[httpx.AsyncClient]:
    config = EngineConfig(
        instance_id="sim-a",
        model="sim-m",
        time_scale=0.001,
        kv_capacity_tokens=4096,
        block_tokens=16,
        block_hash="xxhash_cbor",
        hash_seed="0",
    )
    app = create_app(config)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim.test") as http:
            yield http


async def test_sim_reads_the_simulated_engines_answers(sim_engine: httpx.AsyncClient) -> None:
    http = sim_engine
    assert (await http.get(SIM.health_path)).status_code == 200
    assert SIM.served_models((await http.get(SIM.models_path)).json()) == ["sim-m"]
    page = (await http.get(SIM.metrics_path)).text
    load = SIM.load(page)
    assert (load.waiting, load.running, load.kv_usage) == (0.0, 0.0, 0.0) and not load.empty
    config = SIM.cache_config(page)
    assert config is not None
    assert (config.block_size, config.hash_algo, config.prefix_caching) == (16, "xxhash_cbor", True)
    assert SIM.kv_capacity(page) == 4096
    # the load scrape's page: its series alone (prometheus_client's `name[]`, as vLLM's)
    restricted = (await http.get(SIM.load_path)).text
    assert SIM.load(restricted) == load and len(restricted) * 4 < len(page)
    assert SIM.cache_config(restricted) is None
    payload: dict[str, Any] = {
        "model": "sim-m",
        "messages": [{"role": "user", "content": "hello there"}],
        "add_generation_prompt": True,
    }
    r = await http.post(SIM.tokenize_path, json=SIM.tokenize_body(payload))
    tokens = SIM.tokens(r.json())
    assert tokens and all(isinstance(t, int) for t in tokens)
    # what the simulated engine differs in: no replay, a random seed without one, no priority
    assert SIM.kv_events.replay is None and SIM.priority_header is None
    assert all(SIM.unseeded_hash_seed(a) is None for a in SIM.hash_algos)
