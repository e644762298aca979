"""The game workload: prompt layout, chained hash ids exactly as in the Mooncake traces,
growing contexts, raids, determinism, and a sidecar whose text gives back the hash ids."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from router.blocks import render_chat
from sim.players.cli import main as trace_game_main
from sim.players.encode import ChainIds, iter_sidecar, to_trace, write_sidecar
from sim.players.params import GameParams, WorkloadParamsError
from sim.players.workload import GameRequest, generate
from sim.traces import load_mooncake

PARAMS = GameParams(
    players=24, minutes=4, seed=3, start_spread_s=20.0, raid_first_s=(60.0, 90.0),
    think_median_s=8.0,
)  # fmt: skip
BT = 64


@pytest.fixture(scope="module")
def requests() -> list[GameRequest]:
    return generate(PARAMS)


def test_prompts_are_laid_out_stable_to_volatile(requests: list[GameRequest]) -> None:
    assert len(requests) > 100
    assert [r.at_s for r in requests] == sorted(r.at_s for r in requests)
    assert all(r.at_s < PARAMS.minutes * 60 for r in requests)
    for r in requests[:50]:
        roles = [m["role"] for m in r.messages]
        assert roles[:3] == ["system", "system", "system"]  # world, persona, player
        assert roles[-1] == "user"
        assert r.messages[0]["content"].startswith("World of zone")
        assert PARAMS.reply_tokens[0] <= r.output_tokens <= PARAMS.reply_tokens[1]
        assert r.session.startswith("player-")


def test_hash_ids_are_chained_like_the_mooncake_traces(requests: list[GameRequest]) -> None:
    trace = to_trace(requests, BT)
    parent: dict[int, int | None] = {}
    position: dict[int, int] = {}
    for t in trace:
        assert len(t.hash_ids) == -(-t.input_length // BT)
        for i, h in enumerate(t.hash_ids):
            before = t.hash_ids[i - 1] if i else None
            # an id always sits at the same position after the same id: it names a prefix
            assert parent.setdefault(h, before) == before
            assert position.setdefault(h, i) == i
    # the zone's world state and the persona are shared across players
    first_ids = {t.hash_ids[0] for t in trace}
    assert len(first_ids) <= PARAMS.zones * 8  # world versions, not one per request
    assert len(first_ids) < len({t.session for t in trace})


def test_contexts_grow_turn_by_turn(requests: list[GameRequest]) -> None:
    trace = to_trace(requests, BT)
    by_session: dict[str, list[tuple[int, tuple[int, ...]]]] = defaultdict(list)
    for t in trace:
        assert t.session is not None
        by_session[t.session].append((t.input_length, t.hash_ids))
    pairs = grows = reused = 0
    for turns in by_session.values():
        for (n0, ids0), (n1, ids1) in itertools.pairwise(turns):
            pairs += 1
            grows += n1 > n0
            full = n0 // BT  # full blocks of the earlier turn come back as a prefix
            reused += ids1[:full] == ids0[:full]
    assert pairs > 50
    assert grows / pairs > 0.9
    assert reused / pairs > 0.8  # the rest: a new world version or player sheet
    big = GameParams(players=40, minutes=3, seed=5)
    assert max(len(render_chat(r.messages)) // 4 for r in generate(big)) > 30_000


def test_a_raid_opens_many_sessions_within_seconds(requests: list[GameRequest]) -> None:
    raid = [r for r in requests if r.tag.endswith("/raid")]
    assert raid
    first_turns: dict[str, float] = {}
    for r in raid:
        first_turns.setdefault(r.session, r.at_s)
    starts = sorted(first_turns.values())
    expected = round(PARAMS.raid_share * PARAMS.players) * PARAMS.raid_npcs
    assert len(starts) >= expected
    assert starts[expected - 1] - starts[0] <= PARAMS.raid_window_s


def test_same_seed_same_workload() -> None:
    small = GameParams(players=8, minutes=2, seed=11)
    a, b = generate(small), generate(small)
    assert [(r.at_s, r.messages, r.session) for r in a] == [
        (r.at_s, r.messages, r.session) for r in b
    ]
    other = generate(GameParams(players=8, minutes=2, seed=12))
    assert [r.at_s for r in other] != [r.at_s for r in a]


def test_sidecar_text_gives_back_the_hash_ids(requests: list[GameRequest], tmp_path: Path) -> None:
    path = tmp_path / "side.jsonl"
    assert write_sidecar(path, requests) == len(requests)
    trace = to_trace(requests, BT)
    chains = ChainIds(BT)
    count = 0
    for body, rec, req in zip(iter_sidecar(path), trace, requests, strict=True):
        assert body["user"] == rec.session == req.session
        assert body["max_tokens"] == rec.output_length
        assert body["timestamp"] == pytest.approx(rec.timestamp_ms)
        assert tuple(chains.ids(render_chat(body["messages"]))) == rec.hash_ids
        count += 1
    assert count == len(trace)
    # texts are stored once: the sidecar is far smaller than the prompts it encodes
    total_chars = sum(len(render_chat(r.messages)) for r in requests)
    assert path.stat().st_size < total_chars / 3


def test_trace_game_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "game.jsonl"
    rc = trace_game_main(["--players", "10", "--minutes", "2", "--seed", "7",
                          "--block-tokens", "64", "--out", str(out)])  # fmt: skip
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    trace = load_mooncake(out)
    assert summary["requests"] == len(trace) > 0
    sidecar = Path(str(out) + ".text.jsonl")
    assert sum(1 for _ in iter_sidecar(sidecar)) == len(trace)
    assert trace_game_main(["--players", "0", "--out", str(out)]) == 2


def test_params_are_checked() -> None:
    with pytest.raises(ValueError):
        GameParams(players=0)
    with pytest.raises(ValueError):
        GameParams(turns=(10, 5))
    with pytest.raises(ValueError):
        GameParams(raid_npcs=99)


# -- what a game server tells the gateway (issue 22, item 5) ---------------------------

# sha256 of PARAMS' requests as the code before warm leads, bumps and barks generated them
BEFORE_ISSUE_22 = "f1a2f70689ad78b3e398f0ab18466127e322ecb3e35c44cd819e6757deaa7937"


def _fingerprint(requests: list[GameRequest]) -> str:
    rows = [[r.at_s, list(r.messages), r.output_tokens, r.session, r.tag] for r in requests]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def test_new_params_off_leave_the_workload_as_before(requests: list[GameRequest]) -> None:
    assert _fingerprint(requests) == BEFORE_ISSUE_22
    assert all(r.warm_lead_s is None and r.priority is None for r in requests)


def test_warm_lead_marks_only_each_dialogues_first_line(requests: list[GameRequest]) -> None:
    warmed = generate(dataclasses.replace(PARAMS, warm_lead_s=3.0))
    assert _fingerprint(warmed) == BEFORE_ISSUE_22  # the lead changes no prompt
    marked = {i for i, r in enumerate(warmed) if r.warm_lead_s is not None}
    assert {warmed[i].warm_lead_s for i in marked} == {3.0}
    firsts, continued = _firsts_and_continued(warmed)
    assert firsts <= marked  # every session's first line is warmed
    # later lines are not: a dialogue is several turns (a returning dialogue with the same
    # NPC extends its memory, so "extends the previous prompt" cannot tell them apart)
    assert len(continued - marked) > 2 * len(marked)


def _firsts_and_continued(requests: list[GameRequest]) -> tuple[set[int], set[int]]:
    """Each session's first line; lines that extend the session's previous prompt."""
    last: dict[str, GameRequest] = {}
    firsts, continued = set(), set()
    for i, r in enumerate(requests):
        prev = last.get(r.session)
        if prev is None:
            firsts.add(i)
        elif r.messages[: len(prev.messages)] == prev.messages:
            continued.add(i)
        last[r.session] = r
    return firsts, continued


def test_a_bump_gives_every_zone_a_new_world_at_that_time() -> None:
    bumped = generate(dataclasses.replace(PARAMS, bump_at_s=(100.0,)))
    before = {r.messages[0]["content"] for r in bumped if r.at_s < 100.0}
    after = [r for r in bumped if r.at_s >= 100.0]
    assert after
    # a world text first used after the bump is no text from before it
    zones_after = {r.tag.split("/")[0] for r in after}
    new_worlds = {r.tag.split("/")[0] for r in after if r.messages[0]["content"] not in before}
    assert new_worlds == zones_after
    assert all(r.messages[0]["content"] not in before for r in after)


def test_barks_are_background_lines_beside_unchanged_dialogues(
    requests: list[GameRequest],
) -> None:
    barking = generate(dataclasses.replace(PARAMS, bark_rate_per_s=0.5, priority_classes=True))
    barks = [r for r in barking if r.tag.endswith("/bark")]
    lines = [r for r in barking if not r.tag.endswith("/bark")]
    assert len(barks) > 50
    assert all(r.session == "" and r.priority == "background" for r in barks)
    assert all(r.priority == "interactive" for r in lines)
    assert _fingerprint(lines) == BEFORE_ISSUE_22  # own RNG: the dialogues are the same
    plain = generate(dataclasses.replace(PARAMS, bark_rate_per_s=0.5))
    assert all(r.priority is None for r in plain)


@pytest.mark.parametrize(
    "bad", [{"warm_lead_s": -1.0}, {"bark_rate_per_s": -0.1}, {"bump_at_s": (-5.0,)}]
)
def test_bad_issue_22_params_raise(bad: dict[str, Any]) -> None:
    with pytest.raises(WorkloadParamsError):
        GameParams(**bad)
