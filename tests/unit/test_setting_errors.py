"""What the gateway settings' own validators refuse is in the exception tree: each error in
the ValidationError is a `ConfigurationError` (`gateway.config.base.SettingError`)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from contracts.errors import ConfigurationError
from gateway.config.settings import Settings


@pytest.mark.parametrize(
    ("given", "where"),
    [
        ({"state": {"backend": "redis"}}, "needs state.redis_url"),
        ({"instances": [{"id": "a", "url": "u"}, {"id": "a", "url": "v"}]}, "must be unique"),
        ({"routing": {"policy": "session", "params": {"vnodes": 0}}}, "vnodes"),
        ({"auth": {"client_keys": ["sha256:nothex"]}}, "64 lowercase hex"),
        (
            {"routing": {"mode": "precise", "precise": {"vllm_hash_algo": "xxhash_cbor"}}},
            "hash_seed",
        ),
    ],
)
def test_a_refused_value_is_a_configuration_error(
    given: dict[str, Any], where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WARMGATE_CONFIG", raising=False)
    with pytest.raises(ValidationError, match=where) as info:
        Settings(**given)
    (error,) = info.value.errors()
    assert isinstance(error["ctx"]["error"], ConfigurationError)
