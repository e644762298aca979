"""Real vLLM for tests: the engine environment, or a skip (outside CI) / failure (in CI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.launch.models import INSTALL_HINT, EngineEnvMissing, require_engine_python


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def engine_python_or_skip() -> Path:
    """The engine venv's python; outside CI a skip naming the install command, in CI a failure."""
    try:
        return require_engine_python()
    except EngineEnvMissing as exc:
        if in_ci():
            pytest.fail(f"CI needs the real engine: {exc}")
        pytest.skip(f"real vLLM not installed (`{INSTALL_HINT}`): {exc}")
