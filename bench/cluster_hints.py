"""`warmgate bench cluster --trace game --seeds A-B --hints-ab`: issue 22's figures at scale,
each hint on against off in the same run, over many seeds (a figure is a median and a
spread over seeds, never one seed).

Per seed, from the same game (`bench.cluster_seeds.game_trace`), on the same simulated fleet
(L1 sized from the plain trace of the seed):
- `warm`: the trace with a warm lead on each dialogue's first line; the simulated gateway
  warms and the warm binds the session (`on`, the gateway with Redis bindings), warms
  without binding (`on_unbound`, a single replica's memory backend) or not (`off`).
  First-line TTFT, the other requests' TTFT (the warms' neighbours), and the cached share
  of the warmed full blocks;
- `replication`: the trace with world bumps; no replication (`off`), the gateway's detection
  (`detected`), the explicit announcement (`announced`). TTFT of the requests arriving in
  the 30 s after each bump (`bench.game_figures.BUMP_WINDOW_S`);
- `barks`: the plain trace (`none`: no background load) against the same dialogues with
  ambient barks at `bark_rate` (default 2x the fleet's bark capacity, measured below), with
  priority classes (`classes`) and without (`unclassed`). TTFT of the dialogue lines.

The bark capacity is measured in the simulator before any seed, on a calibration seed of
its own (`CAPACITY_SEED`): a burst of `CAPACITY_BARKS` barks at once on one instance of the
fleet's size, completions over the makespan (the instance saturated: full batches).
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench.cluster_seeds import HintRun, _fields, distinct_block_tokens, game_trace
from bench.game_figures import BUMP_WINDOW_S
from sim.cluster.hints import HintSettings
from sim.cluster.runner import Prior, run_policy
from sim.cluster.simulator import ClusterConfig
from sim.players.encode import to_trace
from sim.players.params import GameParams
from sim.players.workload import generate
from sim.traces import load_trace

CAPACITY_SEED = 1000  # never one of the measured seeds
CAPACITY_BARKS = 1024
OFF = HintSettings()
# figure -> (trace, arm -> what the simulated gateway acts on)
ARMS: dict[str, dict[str, tuple[str, HintSettings]]] = {
    "warm": {
        "off": ("warm", OFF),
        "on": ("warm", HintSettings(warms=True)),
        "on_unbound": ("warm", HintSettings(warms=True, warm_binds=False)),
    },
    "replication": {
        "off": ("bumps", OFF),
        "detected": ("bumps", HintSettings(replication=True)),
        "announced": ("bumps", HintSettings(announce=True)),
    },
    "barks": {
        "none": ("plain", OFF),
        "classes": ("barks", HintSettings(priority_classes=True)),
        "unclassed": ("barks", OFF),
    },
}


def bark_capacity(config: ClusterConfig, policy: str, prior: Prior, probe: bool) -> float:
    """Barks a second one instance of `config` completes when saturated (module docstring)."""
    params = GameParams(players=1, minutes=25.0, seed=CAPACITY_SEED, bark_rate_per_s=1.0)
    barks = [r for r in generate(params) if r.tag.endswith("/bark")][:CAPACITY_BARKS]
    trace = [dataclasses.replace(t, timestamp_ms=0.0) for t in to_trace(barks, config.block_tokens)]
    one = dataclasses.replace(config, instances=1, rate_scale=1.0)
    figures = run_policy(trace, one, policy, prior=prior, probe=probe)
    return float(len(trace) / figures["simulated_s"])


def _arm(
    path: str,
    config: ClusterConfig,
    policy: str,
    params: dict[str, Any] | None,
    prior: Prior,
    probe: bool,
    run: HintRun,
) -> dict[str, Any]:
    trace = load_trace(path, block_tokens=config.block_tokens)
    f = run_policy(
        trace,
        config,
        policy,
        params,
        prior=prior,
        probe=probe,
        hints=run.hints,
        bumps_s=run.bumps_s,
        bump_window_s=run.bump_window_s,
    )
    keep = ("requests", "token_hit_rate", "ttft_p50_s", "ttft_p99_s", "utilisation_mean")
    return {k: f[k] for k in keep} | {"hints": f["hints"]}


def run_hints_ab(
    *,
    seeds: Sequence[int],
    policies: Sequence[str],
    base: ClusterConfig,
    l1_share: float | None,
    players: int,
    minutes: float,
    prior: Prior,
    probe: bool,
    params: dict[str, dict[str, Any]],
    jobs: int,
    lead_s: float,
    bumps_s: Sequence[float],
    bark_rate: float | None,
    figures: Sequence[str] = tuple(ARMS),
) -> dict[str, Any]:
    """Every (seed, policy, figure, arm); per seed the arms' figures, over seeds the spread
    of each with/without ratio (`summarise`)."""
    bt = base.block_tokens
    servers: dict[str, dict[str, Any]] = {
        "plain": {},
        "warm": {"warm_lead_s": lead_s},
        "bumps": {"bump_at_s": tuple(bumps_s)},
    }
    with (
        tempfile.TemporaryDirectory(prefix="warmgate-hints-") as tmp,
        ProcessPoolExecutor(max_workers=jobs) as pool,
    ):
        paths = {(seed, name): str(Path(tmp) / f"{name}-{seed}.jsonl") for seed in seeds
                 for name in (*servers, "barks")}  # fmt: skip

        def write(names: Sequence[str]) -> list[Any]:
            return [
                pool.submit(
                    game_trace,
                    Path(paths[(seed, name)]),
                    players=players,
                    minutes=minutes,
                    seed=seed,
                    block_tokens=bt,
                    server=servers[name] or None,
                )
                for seed in seeds
                for name in names
            ]

        for done in write(["plain"]):
            done.result()
        later = write([t for f, t in (("warm", "warm"), ("replication", "bumps")) if f in figures])
        configs: dict[int, ClusterConfig] = {}
        for seed in seeds:
            l1 = base.l1_tokens
            if l1_share is not None:
                t = load_trace(paths[(seed, "plain")], block_tokens=bt)
                l1 = max(bt, round(distinct_block_tokens(t, bt) * l1_share))
            configs[seed] = ClusterConfig(**{**_fields(base), "l1_tokens": l1})
        per_instance = None
        if bark_rate is None and "barks" in figures:
            per_instance = bark_capacity(configs[seeds[0]], policies[0], prior, probe)
            bark_rate = 2.0 * per_instance * base.instances
        servers["barks"] = {"bark_rate_per_s": bark_rate, "priority_classes": True}
        for done in [*later, *write(["barks"] if "barks" in figures else [])]:
            done.result()
        tasks: dict[tuple[int, str, str, str], tuple[Any, ...]] = {}
        for seed in seeds:
            for policy in policies:
                for figure in figures:
                    for arm, (trace, hints) in ARMS[figure].items():
                        bumps = tuple(bumps_s) if trace == "bumps" else ()
                        run = HintRun(servers[trace], hints, bumps, BUMP_WINDOW_S)
                        tasks[(seed, policy, figure, arm)] = (
                            paths[(seed, trace)],
                            configs[seed],
                            policy,
                            params.get(policy),
                            prior,
                            probe,
                            run,
                        )
        futures = {k: pool.submit(_arm, *a) for k, a in tasks.items()}
        runs = {k: f.result() for k, f in futures.items()}
    per_seed: dict[str, Any] = {}
    for (seed, policy, figure, arm), row in runs.items():
        per_seed.setdefault(str(seed), {}).setdefault(policy, {}).setdefault(figure, {})[arm] = row
    return {
        "seeds": list(seeds),
        "policies": list(policies),
        "warm_lead_s": lead_s,
        "bumps_s": list(bumps_s),
        "bump_window_s": BUMP_WINDOW_S,
        "bark_rate_per_s": bark_rate,
        "bark_capacity_per_instance_per_s": per_instance,
        "per_seed": per_seed,
        "figures": list(figures),
        "summary": {p: summarise(per_seed, p, figures) for p in policies},
    }


def _get(arm: dict[str, Any], *path: str) -> float | None:
    value: Any = arm["hints"]
    for key in path:
        if not isinstance(value, dict) or value.get(key) is None:
            return None
        value = value[key]
    return float(value)


# figure -> (name, arm with, arm without, path into the hint figures; None: absolute, of `with`)
MEASURES: tuple[tuple[str, str, str, str | None, tuple[str, ...]], ...] = (
    ("first-line TTFT p50, warm / none", "warm", "on", "off", ("first_lines", "ttft_p50_s")),
    ("first-line TTFT p99, warm / none", "warm", "on", "off", ("first_lines", "ttft_p99_s")),
    ("first-line TTFT p50, unbound warm / none", "warm", "on_unbound", "off",
     ("first_lines", "ttft_p50_s")),
    ("first-line TTFT p99, unbound warm / none", "warm", "on_unbound", "off",
     ("first_lines", "ttft_p99_s")),
    ("other lines TTFT p50, warms / none", "warm", "on", "off", ("other_lines", "ttft_p50_s")),
    ("other lines TTFT p99, warms / none", "warm", "on", "off", ("other_lines", "ttft_p99_s")),
    ("other lines TTFT p99, unbound warms / none", "warm", "on_unbound", "off",
     ("other_lines", "ttft_p99_s")),
    ("cached / warmed full blocks", "warm", "on", None, ("warms", "cached_over_warmed_blocks")),
    ("cached / warmed full blocks, unbound", "warm", "on_unbound", None,
     ("warms", "cached_over_warmed_blocks")),
    ("30 s after bumps p50, detected / off", "replication", "detected", "off",
     ("after_bumps", "ttft_p50_s")),
    ("30 s after bumps p99, detected / off", "replication", "detected", "off",
     ("after_bumps", "ttft_p99_s")),
    ("30 s after bumps p99, announced / off", "replication", "announced", "off",
     ("after_bumps", "ttft_p99_s")),
    ("all requests p99, detected / off", "replication", "detected", "off", ("all", "ttft_p99_s")),
    ("interactive p50, barks with classes / no barks", "barks", "classes", "none",
     ("classes", "interactive", "ttft_p50_s")),
    ("interactive p99, barks with classes / no barks", "barks", "classes", "none",
     ("classes", "interactive", "ttft_p99_s")),
    ("interactive p99, barks unclassed / no barks", "barks", "unclassed", "none",
     ("classes", "interactive", "ttft_p99_s")),
)  # fmt: skip
# the `none` arm's trace has no classes: its dialogue lines are all its requests
_WITHOUT_PATH = {("barks", "none"): ("all",)}


def summarise(per_seed: dict[str, Any], policy: str, figures: Sequence[str]) -> dict[str, Any]:
    """Per measure of `figures`: each seed's ratio (or value), and their median and range."""
    out: dict[str, Any] = {}
    for name, figure, with_arm, without_arm, path in MEASURES:
        if figure not in figures:
            continue
        values: list[float] = []
        for seed_rows in per_seed.values():
            arms = seed_rows[policy][figure]
            x = _get(arms[with_arm], *path)
            if without_arm is None:
                if x is not None:
                    values.append(x)
                continue
            base_path = _WITHOUT_PATH.get((figure, without_arm), path[:-1]) + path[-1:]
            y = _get(arms[without_arm], *base_path)
            if x is not None and y:
                values.append(x / y)
        out[name] = _spread(values)
    return out


def _spread(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "median": None, "min": None, "max": None, "values": []}
    return {
        "n": len(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "values": [round(v, 4) for v in values],
    }


def _cell(s: dict[str, Any]) -> str:
    if not s["n"]:
        return "-"
    return f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]"


def _abs(rows: dict[str, Any], policy: str, figure: str, arm: str, path: Sequence[str]) -> str:
    vals = [
        v
        for seed_rows in rows.values()
        if (v := _get(seed_rows[policy][figure][arm], *path)) is not None
    ]
    return f"{statistics.median(vals):.3f}" if vals else "-"


def hints_markdown(results: dict[str, Any]) -> str:
    """The ratios' median [range] per policy, then the arms' median absolute figures."""
    seeds = results["seeds"]
    lines = [
        f"Seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}); warm lead {results['warm_lead_s']:g} s; "
        f"bumps at {', '.join(f'{b:g}' for b in results['bumps_s'])} s (window "
        f"{results['bump_window_s']:g} s); barks "
        + (f"{results['bark_rate_per_s']:.2f}/s" if results["bark_rate_per_s"] else "not run")
        + (
            f" (2x the measured capacity, {results['bark_capacity_per_instance_per_s']:.2f}/s "
            "per instance)"
            if results["bark_capacity_per_instance_per_s"]
            else ""
        ),
        "",
        "| measure | " + " | ".join(results["policies"]) + " |",
        "|---|" + "---|" * len(results["policies"]),
    ]
    for name, figure, *_ in MEASURES:
        if figure not in results["figures"]:
            continue
        cells = [_cell(results["summary"][p][name]) for p in results["policies"]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Median over seeds of each arm's figure (s):", ""]
    lines += ["| policy | figure | arm | first lines p50 / p99 | other lines p50 / p99 "
              "| after bumps p50 / p99 | interactive p50 / p99 | all p50 / p99 | warms |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    rows = results["per_seed"]
    for p in results["policies"]:
        for figure in results["figures"]:
            for arm in ARMS[figure]:

                def two(*path: str, pol: str = p, fig: str = figure, a: str = arm) -> str:
                    lo = _abs(rows, pol, fig, a, (*path, "ttft_p50_s"))
                    hi = _abs(rows, pol, fig, a, (*path, "ttft_p99_s"))
                    return f"{lo} / {hi}"

                warms = _warm_outcomes(rows, p, figure, arm)
                lines.append(
                    f"| {p} | {figure} | {arm} | {two('first_lines')} | {two('other_lines')} "
                    f"| {two('after_bumps')} | {two('classes', 'interactive')} | {two('all')} "
                    f"| {warms} |"
                )
    return "\n".join(lines)


def _warm_outcomes(rows: dict[str, Any], policy: str, figure: str, arm: str) -> str:
    """Warm outcomes summed over seeds, `kind outcome n` (empty for a run without warms)."""
    total: dict[str, int] = {}
    for seed_rows in rows.values():
        warms = seed_rows[policy][figure][arm]["hints"].get("warms") or {}
        for kind, outcomes in (warms.get("by_kind") or {}).items():
            for outcome, n in outcomes.items():
                total[f"{kind} {outcome}"] = total.get(f"{kind} {outcome}", 0) + n
    return ", ".join(f"{k} {n}" for k, n in sorted(total.items()))
