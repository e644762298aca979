"""A bounded sample of `warmgate bench fuzz` on every CI run: schemathesis against the
OpenAPI schemas the gateway and tierd serve (every phase, `not_a_server_error`) and a few
hundred hostile bodies (lone surrogates, NaN, integers past 64 bits, deep nesting, invalid
UTF-8, ...); not one response may be a 5xx, and the gateway stays ready."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.fuzz import ADMIN_KEY, run_schemathesis
from bench.hostile import send
from bench.sim_fleet import MODEL, SimFleet


def _have_schemathesis() -> bool:
    return shutil.which("st") is not None or Path(sys.executable).with_name("st").exists()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    if not _have_schemathesis():
        if os.environ.get("CI") == "true":
            pytest.fail("schemathesis missing in CI: pip install -e '.[dev]'")
        pytest.skip("schemathesis not installed: pip install -e '.[dev]'")
    f = SimFleet(
        tmp_path_factory.mktemp("fuzz"),
        instances=1,
        tierd=True,
        time_scale=0.001,
        gateway_settings={"auth": {"admin_keys": [ADMIN_KEY]}},
    ).start()
    yield f
    f.stop()


def test_schema_fuzzing_finds_no_server_error(fleet: SimFleet, tmp_path: Path) -> None:
    gw = run_schemathesis(
        f"{fleet.gateway_urls[0]}/openapi.json", 3, tmp_path / "gw.json", 7,
        [f"Authorization: Bearer {ADMIN_KEY}"],
    )  # fmt: skip
    assert gw["cases"] > 300 and gw["operations_tested"] >= 10
    assert gw["with_failures"] == 0, gw["failures"]
    td = run_schemathesis(f"{fleet.tierd_urls[0]}/openapi.json", 3, tmp_path / "td.json", 7)
    assert td["cases"] > 50
    assert td["with_failures"] == 0, td["failures"]


def test_hostile_bodies_get_no_server_error(fleet: SimFleet) -> None:
    tally = asyncio.run(send(fleet.gateway_urls[0], 300, MODEL, ADMIN_KEY, seed=3))
    assert tally.cases == 300
    assert tally.server_errors == []
    assert tally.by_status[400] > 100  # the mutations are refused, not served
    assert httpx.get(f"{fleet.gateway_urls[0]}/readyz").status_code == 200
