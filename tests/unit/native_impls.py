"""The implementations of tierd.native under test: the C extension and the pure-Python
fallback. The C extension may only be missing outside CI (it is skipped there, with why)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

from tierd.native import _fallback


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def c_extension() -> ModuleType:
    """The C extension; fails in CI and skips elsewhere when it was not built."""
    try:
        return importlib.import_module("tierd.native._native")
    except ImportError as exc:
        if in_ci():
            pytest.fail(f"the C extension must be built in CI: {exc}")
        pytest.skip(f"C extension not built here: {exc}")


@pytest.fixture(params=["c", "python"])
def impl(request: pytest.FixtureRequest) -> ModuleType:
    return c_extension() if request.param == "c" else _fallback
