"""`warmgate bench cluster`'s flags for what a game server tells the gateway (issue 22; all
off by default): which hints the game traces carry, which the simulated gateway acts on, and
`--hints-ab` (bench.cluster_hints: each on against off, in the same run)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.cluster_hints import ARMS, run_hints_ab
from bench.cluster_seeds import HintRun, parse_seeds, parse_share
from bench.game_figures import BUMP_WINDOW_S
from contracts.errors import InputError
from sim.cluster.hints import HintSettings
from sim.cluster.simulator import ClusterConfig
from sim.profiles import get_profile


def add_hint_flags(p: argparse.ArgumentParser) -> None:
    """The game server's hints (module docstring)."""
    p.add_argument("--warm-lead-s", type=float, default=0.0, help="warm first lines S ahead")
    p.add_argument("--bumps", default="", help="world-version bumps at these seconds: 240,420")
    p.add_argument("--barks", type=float, default=0.0, help="ambient barks a second")
    p.add_argument("--priority-classes", action="store_true", help="classes, by priority")
    p.add_argument(
        "--replication",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="replicate detected world versions (the gateway's VersionDetector)",
    )
    p.add_argument("--announce-versions", action="store_true", help="warm tagged versions")
    p.add_argument("--hints-ab", action="store_true", help="each hint on against off")
    p.add_argument(
        "--hint-figures",
        default=",".join(ARMS),
        help=f"--hints-ab: which figures ({', '.join(ARMS)})",
    )


def hint_config(hinted: HintRun | None) -> dict[str, Any]:
    """The hints of a run for its JSON's config (nothing for a plain run: unchanged)."""
    if hinted is None:
        return {}
    h = hinted.hints
    acts = {} if h is None else {
        "warms": h.warms,
        "priority_classes": h.priority_classes,
        "replication": h.replication,
        "announce": h.announce,
    }  # fmt: skip
    return {"hints": {"trace": hinted.server, "simulated_gateway": acts}}


def parse_hint_figures(text: str) -> tuple[str, ...]:
    """`--hint-figures warm,barks`: the figures named, each a known one."""
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [n for n in names if n not in ARMS]
    if unknown or not names:
        raise HintFiguresError(f"--hint-figures: want some of {', '.join(ARMS)}, not {text!r}")
    return names


class HintFiguresError(InputError, ValueError):
    """`--hint-figures` naming no figure, or one that does not exist."""


def parse_bumps(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def hint_run(args: argparse.Namespace) -> HintRun | None:
    """The hints the flags ask for; None when none (the plain run)."""
    bumps = parse_bumps(args.bumps)
    server: dict[str, Any] = {}
    if args.warm_lead_s > 0:
        server["warm_lead_s"] = args.warm_lead_s
    if bumps:
        server["bump_at_s"] = bumps
    if args.barks > 0:
        server["bark_rate_per_s"] = args.barks
    if args.priority_classes:
        server["priority_classes"] = True
    hints = HintSettings(
        warms=args.warm_lead_s > 0,
        priority_classes=args.priority_classes,
        replication=args.replication,
        announce=args.announce_versions,
    )
    if not server and not hints.any:
        return None
    return HintRun(server, hints, bumps, BUMP_WINDOW_S)


def hints_ab(
    args: argparse.Namespace,
    base: ClusterConfig,
    policies: list[str],
    params: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """`--hints-ab`: issue 22's figures, each hint on against off (bench.cluster_hints)."""
    started = time.perf_counter()
    get_profile(args.profile)
    results = run_hints_ab(
        seeds=parse_seeds(args.seeds),
        policies=policies,
        base=base,
        l1_share=parse_share(args.l1_share) if args.l1_share is not None else None,
        players=args.players,
        minutes=args.minutes,
        prior=args.prior,
        probe=args.probe,
        params=params,
        jobs=max(1, args.jobs),
        lead_s=args.warm_lead_s or 4.0,
        bumps_s=parse_bumps(args.bumps) or (240.0, 420.0),
        bark_rate=args.barks or None,
        figures=parse_hint_figures(args.hint_figures),
    )
    results["config"] = {
        "instances": args.instances,
        "block_tokens": args.block_tokens,
        "l1_share": args.l1_share,
        "l1_tokens": None if args.l1_share is not None else args.l1_tokens,
        "profile": args.profile,
        "rate_scale": args.rate_scale,
        "players": args.players,
        "minutes": args.minutes,
        "ttft_prior": args.prior,
        "probe": args.probe,
    }
    results["wall_s"] = time.perf_counter() - started
    return results
