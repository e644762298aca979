"""Fixtures shared by every test: ports, temp dirs, a real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.procs import free_port
from tests.support.redis_server import shared_redis_url


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
