"""The base of every nested settings model: unknown keys are refused, so a misspelt
`helth:` in YAML or `WARMGATE_HELTH__INTERVAL_S` is an error naming the key, never a
setting silently left at its default."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
