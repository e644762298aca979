"""Gateway settings: YAML file, `WARMGATE_*` env (nested with `__`, JSON lists), explicit
arguments, in that order of precedence; invalid settings refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.config.settings import load_settings

YAML = """
port: 9000
instances:
  - {id: a, url: "http://127.0.0.1:9001/", tierd_url: "http://127.0.0.1:9101", kv_events_endpoint: "tcp://127.0.0.1:5557"}
  - {id: b, url: "http://127.0.0.1:9002", models: [m1, m2]}
routing: {policy: session, block_tokens: 32, params: {eps: 0.5}}
health: {interval_s: 0.5}
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in (
        "WARMGATE_PORT",
        "WARMGATE_CONFIG",
        "WARMGATE_INSTANCES",
        "WARMGATE_ROUTING__BLOCK_TOKENS",
    ):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "gw.yaml"
    path.write_text(YAML)
    return path


def test_yaml_file(config: Path) -> None:
    s = load_settings(config)
    assert s.port == 9000
    assert [i.id for i in s.instances] == ["a", "b"]
    assert s.instances[0].url == "http://127.0.0.1:9001"  # trailing slash dropped
    assert s.instances[0].kv_events_endpoint == "tcp://127.0.0.1:5557"
    assert s.instances[1].models == ["m1", "m2"]
    assert s.routing.policy == "session" and s.routing.params == {"eps": 0.5}
    assert s.routing.block_chars == 32 * 4
    assert s.health.interval_s == 0.5 and s.health.failure_threshold == 2


def test_env_overrides_yaml_and_arguments_override_env(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARMGATE_CONFIG", str(config))
    monkeypatch.setenv("WARMGATE_PORT", "18000")
    monkeypatch.setenv("WARMGATE_ROUTING__BLOCK_TOKENS", "16")
    s = load_settings()
    assert s.port == 18000
    assert s.routing.block_tokens == 16 and s.routing.policy == "session"  # merged, not replaced
    assert load_settings(port=1234).port == 1234


def test_instances_from_env_json(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMGATE_INSTANCES", '[{"id": "x", "url": "http://h:1"}]')
    s = load_settings()
    assert [(i.id, i.url, i.tierd_url) for i in s.instances] == [("x", "http://h:1", None)]


def test_invalid_settings_are_refused(config: Path) -> None:
    with pytest.raises(ValidationError):
        load_settings(instances=[{"id": "a", "url": "http://x"}, {"id": "a", "url": "http://y"}])
    with pytest.raises(ValidationError):
        load_settings(state={"backend": "redis"})  # no redis_url
    with pytest.raises(ValidationError):
        load_settings(routing={"block_tokens": 0})


def test_kv_events_topic_defaults_to_vllms() -> None:
    """vLLM publishes on topic "" (KVEventsConfig.topic) unless told otherwise."""
    from gateway.config.settings import KvEventsSettings

    assert KvEventsSettings().topic == ""


def test_the_hash_seed_rule_says_what_vllm_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """sha256_cbor without PYTHONHASHSEED is seeded with "vllm-none-hash" (no seed needed);
    only xxhash_cbor is random per process without one (the vLLM engine kind's rule, read by
    the settings for a fleet of the default kind)."""
    from gateway.config.settings import Settings

    for name in ("WARMGATE_CONFIG", "WARMGATE_INSTANCES"):
        monkeypatch.delenv(name, raising=False)

    hashing = Settings.model_validate({"routing": {"mode": "precise"}}).fleet_hashing()
    assert hashing is not None and hashing.seed == "vllm-none-hash"
    with pytest.raises(ValidationError, match="xxhash_cbor with random bytes per process"):
        Settings.model_validate(
            {"routing": {"mode": "precise", "precise": {"vllm_hash_algo": "xxhash_cbor"}}}
        )


def test_ttft_cost_params_can_be_set_in_yaml(tmp_path: Path) -> None:
    """routing.params.params is a mapping of CostParams fields in YAML (it crashed startup)."""
    from gateway.pipeline.router_build import build_router

    path = tmp_path / "gw.yaml"
    path.write_text(
        "routing:\n  policy: ttft\n  params:\n    prior_weight: 1.0\n"
        "    params: {prefill_per_token_s: 0.003, prefill_overhead_s: 0.05}\n"
    )
    router = build_router(load_settings(path).routing)
    model = router.policy.model  # type: ignore[attr-defined]
    assert model.params.prefill_per_token_s == 0.003 and model.prior_weight == 1.0
    path.write_text("routing:\n  policy: ttft\n  params:\n    params: {per_token: 1}\n")
    with pytest.raises(ValueError, match="unknown ttft cost params"):
        load_settings(path)  # refused with the settings, before anything starts


@pytest.mark.parametrize(
    ("yaml_text", "where"),
    [
        ("helth: {interval_s: 1}\n", "helth"),
        ("health: {intervl_s: 1}\n", "health.intervl_s"),
        ("routing: {policy: ttft, params: {tie_rell: 0.1}}\n", "tie_rell"),
        ("instances: [{id: a, url: 'http://x', tierd_ulr: 'http://y'}]\n", "tierd_ulr"),
    ],
)
def test_a_misspelt_key_is_an_error_naming_it(tmp_path: Path, yaml_text: str, where: str) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted") as info:
        load_settings(path)
    assert where in str(info.value)


def test_a_misspelt_env_key_is_an_error_and_other_warmgate_variables_are_not(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARMGATE_NATIVE", "python")  # read by the native modules, not here
    monkeypatch.setenv("WARMGATE_UP_START_TIMEOUT", "5")  # `warmgate up`'s own flags
    assert load_settings().port == 8000
    monkeypatch.setenv("WARMGATE_HEALTH__HELTH", "1")
    with pytest.raises(ValidationError, match=r"health\.helth"):
        load_settings()


def test_policy_params_are_typed_from_the_policy_and_settable_from_env(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy's constructor types them: strings from env become numbers, a wrong type
    or an unknown policy is refused with the settings."""
    monkeypatch.setenv("WARMGATE_ROUTING__POLICY", "ttft")
    monkeypatch.setenv("WARMGATE_ROUTING__PARAMS__TIE_REL", "0.2")
    monkeypatch.setenv("WARMGATE_ROUTING__PARAMS__SESSION_WINDOW_S", "100")
    s = load_settings()
    assert s.routing.params == {"tie_rel": 0.2, "session_window_s": 100.0}
    for name in ("POLICY", "PARAMS__TIE_REL", "PARAMS__SESSION_WINDOW_S"):
        monkeypatch.delenv(f"WARMGATE_ROUTING__{name}")
    with pytest.raises(ValidationError, match="load_cap"):
        load_settings(routing={"policy": "ttft", "params": {"load_cap": "lots"}})
    with pytest.raises(ValidationError, match="unknown policy 'nope'"):
        load_settings(routing={"policy": "nope"})
    with pytest.raises(ValidationError, match="vnodes must be positive"):
        load_settings(routing={"policy": "session", "params": {"vnodes": 0}})
