"""World versions (issue 22, item 4) against a real gateway in front of simulated engines: a
zone's new world state, reached by several sessions within seconds, is warmed on the other
instances (not herded onto one); the old shared prefix does not trigger it; a version
announced in `x-warmgate-world-version` is warmed on every instance at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.fleet import MODEL, Fleet, wait_until

WINDOW_S = 1.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    world = {"window_s": WINDOW_S, "min_sessions": 3, "retry_s": 5.0}
    f = Fleet(tmp_path_factory.mktemp("gw-world"), 3, settings={"warm": {"world": world}})
    yield f.start()
    f.stop()


@pytest.fixture
def client(fleet: Fleet) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fleet.base, timeout=60) as c:
        yield c


def world(zone: str, version: int) -> dict[str, str]:
    lore = " ".join(f"The harbour of {zone} keeps its old charter, article {i}." for i in range(30))
    status = " ".join(f"Bulletin {version}.{i}: the tide of {zone} turns." for i in range(20))
    return {"role": "system", "content": f"{lore}\nStatus, version {version}: {status}"}


def turn(zone: str, version: int, npc: int, line: str) -> list[dict[str, str]]:
    persona = " ".join(f"Keeper {npc} of {zone} recalls voyage {i}." for i in range(12))
    return [world(zone, version), {"role": "system", "content": persona},
            {"role": "user", "content": line}]  # fmt: skip


def ask(client: httpx.Client, messages: list[dict[str, str]], session: str, **kw: Any) -> str:
    body = {"model": MODEL, "messages": messages, "user": session, "max_tokens": 2}
    r = client.post("/v1/chat/completions", json=body, **kw)
    assert r.status_code == 200, r.text
    return r.headers["x-warmgate-instance"]


def world_counts(client: httpx.Client) -> dict[str, int]:
    stats = client.get("/admin/stats").json()["warm"]["world"]
    assert stats is not None
    counts: dict[str, int] = stats["counts"]
    return counts


def held_by(client: httpx.Client, message: dict[str, str]) -> dict[str, bool]:
    """Whether the router sees each instance holding the world message's full blocks (all
    but the last, which holds what the chat template appends)."""
    body = {"model": MODEL, "messages": [message]}
    r = client.post("/admin/route/explain", json=body)
    assert r.status_code == 200, r.text
    seen = r.json()
    bt = seen["request"]["block_tokens"]
    full = ((seen["request"]["prompt_tokens"] - 1) // bt - 1) * bt
    assert full > 0
    return {
        c["instance"]: c["cached_tokens_by_tier"].get("hbm", 0) >= full for c in seen["candidates"]
    }


def test_a_new_world_version_is_warmed_on_the_zones_other_instances(client: httpx.Client) -> None:
    zone = "saltmere"
    for i in range(6):
        ask(client, turn(zone, 1, i, "Any ships today?"), f"p{i}:{zone}")
    time.sleep(WINDOW_S * 1.5)  # version 1 is established now

    # the old shared prefix again, by every session: not a new version
    for i in range(6):
        ask(client, turn(zone, 1, i, "And tomorrow?"), f"p{i}:{zone}")
    assert world_counts(client).get("detected", 0) == 0

    assert not any(held_by(client, world(zone, 2)).values())  # version 2 is nowhere yet
    for i in range(3):  # three sessions reach version 2 within the window
        ask(client, turn(zone, 2, i, "What happened at the docks?"), f"p{i}:{zone}")

    def replicated() -> dict[str, int] | None:
        counts = world_counts(client)
        return counts if counts.get("ok", 0) >= 1 else None

    counts = wait_until(replicated, 20, "the new version warmed elsewhere")
    assert counts["detected"] == 1
    held = held_by(client, world(zone, 2))
    assert all(held.values()), held  # every instance holds version 2's world state now
    last = client.get("/admin/stats").json()["warm"]["world"]["last"]
    assert last["trigger"] == "detected" and last["sessions"] == 3
    assert last["superseded_blocks"] > 0  # the sessions moved from version 1


def test_an_announced_version_is_warmed_everywhere_at_once(client: httpx.Client) -> None:
    zone = "brinehold"
    header = {"x-warmgate-world-version": f"{zone}:7"}
    before = world_counts(client).get("announced", 0)
    assert not any(held_by(client, world(zone, 7)).values())
    # one request, one session: without the announcement only its instance would hold it
    ask(client, turn(zone, 7, 0, "Hello there."), f"q0:{zone}", headers=header)

    def everywhere() -> dict[str, bool] | None:
        held = held_by(client, world(zone, 7))
        return held if all(held.values()) else None

    wait_until(everywhere, 20, "the announced version on every instance")
    ask(client, turn(zone, 7, 1, "Hello again."), f"q1:{zone}", headers=header)
    assert world_counts(client)["announced"] == before + 1  # the same version: once
