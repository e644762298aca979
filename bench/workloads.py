"""Workloads for live replay, as `ReplayItem`s: the game workload (sim.players, generated in
process, or read from the text sidecar `warmgate trace game` writes) and Mooncake-format
trace files (text synthesised by bench.synth_text)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.replay import ReplayItem
from bench.synth_text import mooncake_items
from sim.players.encode import iter_sidecar
from sim.players.params import GameParams
from sim.players.workload import generate


def trace_items(
    path: Path,
    *,
    minutes: float | None = None,
    block_tokens: int = 512,
    seed: int = 0,
    max_output_tokens: int | None = None,
) -> list[ReplayItem]:
    """The first `minutes` of a Mooncake-format trace file (all of it when None)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if minutes is not None:
        horizon_ms = minutes * 60_000.0
        lines = [ln for ln in lines if ln.strip() and json.loads(ln)["timestamp"] < horizon_ms]
    return mooncake_items(
        lines, block_tokens=block_tokens, seed=seed, max_output_tokens=max_output_tokens
    )


def game_items(players: int, minutes: float, seed: int) -> list[ReplayItem]:
    """The game workload for `players` over `minutes` (sim.players' defaults otherwise),
    generated in process: each request's messages, reply length and session key."""
    requests = generate(GameParams(players=players, minutes=minutes, seed=seed))
    return [
        ReplayItem(
            at_s=r.at_s,
            messages=[dict(m) for m in r.messages],
            max_tokens=r.output_tokens,
            session=r.session,
            tag=r.tag,
        )
        for r in requests
    ]


def sidecar_items(path: Path, *, minutes: float | None = None) -> list[ReplayItem]:
    """The requests of a game text sidecar (the first `minutes` of it when given)."""
    items: list[ReplayItem] = []
    for req in iter_sidecar(path):
        at_s = float(req["timestamp"]) / 1000.0
        if minutes is not None and at_s >= minutes * 60.0:
            continue
        items.append(
            ReplayItem(
                at_s=at_s,
                messages=list(req["messages"]),
                max_tokens=int(req["max_tokens"]),
                session=req["user"],
                tag=str(req.get("tag", "")),
            )
        )
    return items
