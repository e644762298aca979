"""`warmgate serve`'s garbage collector: thresholds from the settings (`gc:`, env
`WARMGATE_GC__*`), and what the app's lifespan built frozen once it has started."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest
from fastapi import FastAPI
from pydantic import ValidationError

from gateway.config.collector import CollectorSettings
from gateway.config.settings import Settings
from gateway.launch.serve import freeze_when_started
from gateway.observe.gc_pauses import tune_collector


@pytest.fixture
def collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WARMGATE_CONFIG", raising=False)
    monkeypatch.setenv("WARMGATE_GC__YOUNG", "20000")
    monkeypatch.setenv("WARMGATE_GC__FREEZE_AFTER_START", "false")
    s = Settings()
    assert (s.gc.young, s.gc.middle, s.gc.old, s.gc.freeze_after_start) == (20000, 10, 10, False)
    with pytest.raises(ValidationError):
        CollectorSettings(young=0)


def test_thresholds_are_set(collector: None) -> None:
    tune_collector(CollectorSettings(young=12345, middle=7, old=3))
    assert gc.get_threshold() == (12345, 7, 3)


async def test_what_the_lifespan_built_is_frozen_once_started(collector: None) -> None:
    built: list[object] = []

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        built.extend({"n": [i]} for i in range(2000))  # tracked: a dict holding a list
        yield

    app = FastAPI(lifespan=lifespan)
    freeze_when_started(app)
    gc.unfreeze()
    before = gc.get_freeze_count()
    async with app.router.lifespan_context(app):
        assert gc.get_freeze_count() >= before + 4000  # the dicts and their lists
