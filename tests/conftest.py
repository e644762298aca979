"""Fixtures shared by every test: ports, temp dirs, a real Redis."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.procs import free_port
from tests.support.redis_server import shared_redis_url
from tests.support.vllm import VllmFleets
from tests.support.vllm_fleets import FleetSlot


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, there when it is
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `pytest -n 2`: a unit of work per module, the real-engine modules one
    (tests/support/xdist_scopes.py)."""
    from tests.support.xdist_scopes import ModuleScopes

    return ModuleScopes(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked `fleet(kind)` run together, grouped by kind in the order the kinds
    first appear: the session's one fleet slot then starts each kind of real-engine fleet once
    (alphabetically, test_vllm_priority fell between two modules of the plain kind, which
    restarted the plain fleet: ~25 s). Without xdist they run after the rest. Under xdist
    every real-engine module (`fleet` or `engines`) runs first, on one worker: its engines
    start while the other worker runs the simulated-engine modules, instead of after them;
    the ones without a fleet (they start engines of their own) go before the fleets, which
    they would otherwise stop."""

    def kind(item: pytest.Item) -> str | None:
        mark = item.get_closest_marker("fleet")
        return None if mark is None else str(mark.args[0])

    def real_engines(item: pytest.Item) -> bool:
        return kind(item) is not None or item.get_closest_marker("engines") is not None

    order: dict[str | None, int] = {None: 0}
    for item in items:
        order.setdefault(kind(item), len(order))
    if "PYTEST_XDIST_WORKER" in os.environ:
        items.sort(key=lambda item: (not real_engines(item), order[kind(item)]))
    else:
        items.sort(key=lambda item: order[kind(item)])  # stable: the order within a kind stays


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis; tests isolate themselves by key prefix (a unique pool name)."""
    url, server = shared_redis_url()
    yield url
    if server is not None:
        server.stop()


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[Any]:
    """One real OTLP/HTTP receiver for the session (tests/support/otlp.py): fleets that live
    longer than a module export to it."""
    from tests.support.otlp import Receiver  # opentelemetry-proto: only where asked for

    receiver = Receiver()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="session")
def session_fleets() -> Iterator[FleetSlot]:
    """The one slot real-vLLM fleets share: at most one fleet (2 engines) alive at a time."""
    slot = FleetSlot()
    yield slot
    slot.release()


@pytest.fixture(scope="session")
def vllm_fleets(session_fleets: FleetSlot) -> VllmFleets:
    """Plain real-vLLM fleets by configuration, in that slot (tests/support/vllm.py)."""
    return VllmFleets(session_fleets)
