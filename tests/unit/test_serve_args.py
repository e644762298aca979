"""`warmgate serve --policy` is validated as `routing.policy` in the settings is: an unknown
name is refused with a clear error, a known one is typed with its parameters."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.launch.serve import parse_args, settings_from_args


def test_an_unknown_policy_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WARMGATE_CONFIG", raising=False)
    with pytest.raises(ValidationError, match="no-such-policy"):
        settings_from_args(parse_args(["--policy", "no-such-policy"]))


def test_a_known_policy_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WARMGATE_CONFIG", raising=False)
    settings = settings_from_args(parse_args(["--policy", "prefix"]))
    assert settings.routing.policy == "prefix"
