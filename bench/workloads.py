"""Workloads for live replay, as `ReplayItem`s: the game workload (sim.players, generated in
process, or read from the text sidecar `warmgate trace game` writes) and Mooncake-format
trace files (text synthesised by bench.synth_text)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

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


# The game scaled to what two CPU engines (one core each, ~430 prompt tokens/s) can serve:
# prompts of about 0.5k-3k tokens instead of 6k-34k, a couple of zones so that players share
# world state, dialogues of a few turns with think times of seconds, a raid in the second
# minute. Chosen from the engines' capacity before any run, not fitted to a seed's results.
CPU_SCALE = GameParams(
    zones=2,
    npcs_per_zone=4,
    world_tokens=(200, 500),
    world_version_mean_s=120.0,
    persona_tokens=(60, 200),
    player_state_tokens=(50, 150),
    turns=(3, 8),
    line_tokens=(10, 40),
    reply_tokens=(8, 24),
    think_median_s=8.0,
    think_sigma=0.6,
    think_range_s=(1.5, 30.0),
    reply_s_per_token=0.02,
    idle_mean_s=15.0,
    favourite_npcs=2,
    prior_history_tokens=(0, 600),
    max_history_tokens=1200,
    summary_tokens=100,
    start_spread_s=30.0,
    raid_first_s=(50.0, 70.0),
    raid_share=0.5,
    raid_npcs=1,
    raid_window_s=5.0,
    raid_turns=(2, 4),
)
# The same game on engines whose own KV cache is too small for it (`--scale cpu-overflow`):
# 20 players, longer thinks and pauses, and each engine's KV cut to 48 blocks of 128 tokens
# (6,144 tokens, `--num-gpu-blocks-override`) where the players' contexts add up to several
# times that, so a player's next turn finds its KV evicted from the engine. Sized before any
# run with an LRU model of each engine's prefix cache over the generated requests (seed 11,
# sessions sticky to an engine): hits 0.75 of prompt blocks with an unbounded cache, 0.56
# with 48 blocks, i.e. 49k against 88k prompt tokens to compute, within two CPU engines.
OVERFLOW_SCALE = replace(CPU_SCALE, think_median_s=12.0, idle_mean_s=20.0)
OVERFLOW_DEFAULTS = {"players": 20, "engine_kv_blocks": 48}
SCALES = {"default": GameParams(), "cpu": CPU_SCALE, "cpu-overflow": OVERFLOW_SCALE}


def scale_defaults(scale: str | None) -> dict[str, int]:
    """`bench compare` defaults a scale brings (explicit flags win)."""
    return dict(OVERFLOW_DEFAULTS) if scale == "cpu-overflow" else {}


def game_items(
    players: int, minutes: float, seed: int, scale: str = "default", **server: Any
) -> list[ReplayItem]:
    """The game workload for `players` over `minutes` at `scale` (`default`: sim.players'
    parameters; `cpu`: CPU_SCALE; `cpu-overflow`: OVERFLOW_SCALE), generated in process:
    each request's messages, reply length and session key. `server`: what the game server
    tells the gateway, GameParams fields (warm_lead_s, bump_at_s, bark_rate_per_s,
    priority_classes), carried on each item as its warm lead and priority class."""
    base = SCALES[scale]
    params = replace(base, players=players, minutes=minutes, seed=seed, **server)
    requests = generate(params)
    return [
        ReplayItem(
            at_s=r.at_s,
            messages=[dict(m) for m in r.messages],
            max_tokens=r.output_tokens,
            session=r.session,
            tag=r.tag,
            warm_lead_s=r.warm_lead_s,
            priority=r.priority,
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
