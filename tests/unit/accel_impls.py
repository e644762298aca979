"""The implementations of router.accel under test: the C extension `router._accel` and the
pure-Python `router._accel_py`. The C extension may only be missing outside CI (it is
skipped there, with why)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType

import pytest

from router import _accel_py, accel
from tests.unit.native_impls import in_ci

IMPLS = ["c", "python"]


def accel_module(name: str) -> ModuleType:
    """The implementation called `name`; the C one fails in CI and skips elsewhere when it
    was not built."""
    if name == "python":
        return _accel_py
    try:
        return importlib.import_module("router._accel")
    except ImportError as exc:
        if in_ci():
            pytest.fail(f"router._accel must be built in CI: {exc}")
        pytest.skip(f"router._accel not built here: {exc}")


def use_accel(name: str) -> Iterator[ModuleType]:
    """For a fixture: route router.accel (and so router.blocks and router.index) through
    implementation `name` until the fixture ends."""
    module = accel_module(name)
    with pytest.MonkeyPatch.context() as mp:
        for attr in ("IMPLEMENTATION", "hash_blocks", "lookup_runs", "new_block_map"):
            mp.setattr(accel, attr, getattr(module, attr))
        yield module
