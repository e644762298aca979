"""sim.engine.config: flags, their env twins, and flags winning over env."""

from __future__ import annotations

import pytest

from sim.engine.config import DEFAULT_MODEL, parse_config


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    c = parse_config([])
    assert c.model == DEFAULT_MODEL and c.block_tokens == 16 and c.time_scale == 1.0
    assert c.block_hash == "sha256_cbor" and c.hash_seed is None and c.tierd_url is None


def test_env_twins_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMGATE_ENGINE__TIME_SCALE", "0.01")
    monkeypatch.setenv("WARMGATE_ENGINE__KV_CAPACITY_TOKENS", "4096")
    monkeypatch.setenv("WARMGATE_ENGINE__INSTANCE_ID", "from-env")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    c = parse_config(["--instance-id", "from-flag"])
    assert c.time_scale == 0.01 and c.kv_capacity_tokens == 4096
    assert c.instance_id == "from-flag" and c.hash_seed == "0"


def test_negative_time_scale_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse_config(["--time-scale", "-1"])
