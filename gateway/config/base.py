"""The base of every nested settings model: unknown keys are refused, so a misspelt
`helth:` in YAML or `WARMGATE_HEALTH__HELTH` is an error naming the key, never a
setting silently left at its default (a misspelt top-level name, `WARMGATE_HELTH__...`, is
`contracts.settings_sources.check_env`'s to refuse). `SettingError` is what the settings'
validators raise."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from contracts.errors import ConfigurationError


class SettingError(ConfigurationError, ValueError):
    """A setting's value is refused. Raised in the settings' validators: a ValueError, so
    pydantic reports it in the model's ValidationError with the setting's location."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
