"""The router's errors, in the project's tree (contracts/errors.py)."""

from __future__ import annotations

from contracts.errors import ConfigurationError


class PolicyConfigError(ConfigurationError, ValueError):
    """A policy or cost-model setting out of range, an unknown policy or parameter. A
    ValueError too, so pydantic reports it as a validation error where settings build it."""
