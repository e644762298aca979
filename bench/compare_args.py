"""`warmgate bench compare`'s command line (bench/compare.py runs it): the flags, and the
defaults each engine kind (`--engines sim|vllm`) and game scale bring (explicit flags win)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.compare_repeats import DEFAULT_LOAD_MARGIN
from bench.peers import REPO, VARIANT_MARK, WARMGATE_POLICIES, base_gateway
from bench.workloads import SCALES, scale_defaults

OURS = ("warmgate-ttft", "warmgate-prefix", "round-robin")
OVERHEAD_GATEWAYS = ("warmgate-ttft", "smg", "litellm")
# --pin-engines: FleetConfig.pin_tree
PINNING: dict[str, bool | None] = {"on": True, "off": False, "auto": None}
# --engines vllm: what changes by default (explicit flags win)
VLLM_DEFAULTS = {
    "players": 16,
    "minutes": 1.5,
    "instances": 2,
    "seed": 11,  # not a seed anything was tuned on (the simulator's runs used 7)
    "scale": "cpu",
    "peers": "smg,smg-prefix-hash,sglang-router,litellm,dynamo",
}
SIM_DEFAULTS = {
    "players": 60, "minutes": 3.0, "instances": 3, "seed": 7, "scale": "default",
    "peers": "smg,litellm",
}  # fmt: skip


def seconds_list(text: str) -> tuple[float, ...]:
    """`--bump-at-s 40,80`: times in seconds, each >= 0."""
    try:
        out = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not seconds separated by commas: {text!r}") from None
    if any(t < 0 for t in out):
        raise argparse.ArgumentTypeError(f"a time before the start: {text!r}")
    return out


def gateway_env(entries: Sequence[str], gateways: Sequence[str]) -> dict[str, dict[str, str]]:
    """`--gateway-env NAME:KEY=VALUE` entries as {NAME: {KEY: VALUE}}: settings of warmgate
    gateway NAME (one of `gateways`; a variant `warmgate-ttft@label` runs warmgate-ttft under
    its own name), as WARMGATE_ environment variables (gateway.config.env_names)."""
    out: dict[str, dict[str, str]] = {}
    for entry in entries:
        name, _, setting = entry.partition(":")
        key, eq, value = setting.partition("=")
        if not (name and eq and key.startswith("WARMGATE_")):
            raise ValueError(f"--gateway-env {entry!r}: not NAME:WARMGATE_KEY=VALUE")
        if name not in gateways:
            raise ValueError(f"--gateway-env {entry!r}: {name} is not in --gateways")
        if base_gateway(name) not in WARMGATE_POLICIES:
            raise ValueError(f"--gateway-env {entry!r}: {name} is not one of warmgate's")
        out.setdefault(name, {})[key] = value
    return out


def source_trees(
    entries: Sequence[str], gateways: Sequence[str], env: dict[str, dict[str, str]]
) -> dict[str, Path]:
    """`--tree NAME=DIR` entries into `env`: warmgate gateway NAME (one of `gateways`) runs
    from the source tree DIR (an earlier commit's checkout, its C extensions built or
    copied), its packages ahead of this checkout's on the path, as `bench overhead --tree`
    runs one: a before/after of code in one rotated comparison. Returns NAME -> DIR, where
    real engines with tiers take tierd and the connector from too."""
    trees: dict[str, Path] = {}
    for entry in entries:
        name, eq, tree = entry.partition("=")
        if not (name and eq and tree):
            raise ValueError(f"--tree {entry!r}: not NAME=DIR")
        if name not in gateways or base_gateway(name) not in WARMGATE_POLICIES:
            raise ValueError(f"--tree {entry!r}: {name} is not one of warmgate's in --gateways")
        if not (Path(tree) / "gateway" / "cli.py").is_file():
            raise ValueError(f"--tree {entry!r}: {tree} holds no warmgate source tree")
        # -P's variable: the working directory (this checkout) is not put ahead of the tree
        env.setdefault(name, {}).update({"PYTHONSAFEPATH": "1", "PYTHONPATH": tree})
        trees[name] = Path(tree).resolve()
    return trees


def parse_args(argv: Sequence[str], description: str | None = None) -> argparse.Namespace:
    """`warmgate bench compare`'s flags, with the defaults `--engines` and `--scale` bring."""
    p = argparse.ArgumentParser(prog="warmgate bench compare", description=description)
    p.add_argument(
        "--workload", default=None,
        help="game | sidecar:FILE (a game text sidecar) | trace:FILE (Mooncake format)",
    )  # fmt: skip
    p.add_argument(
        "--engines", choices=("sim", "vllm"), default="sim",
        help="sim: simulated engines; vllm: real vLLM engines (bash scripts/install-engine.sh)",
    )  # fmt: skip
    p.add_argument("--players", type=int, default=None, help="game: players (60; vllm: 16)")
    p.add_argument("--minutes", type=float, default=None, help="minutes of traffic (3; vllm 1.5)")
    p.add_argument("--instances", type=int, default=None, help="engines (3; vllm: 2)")
    p.add_argument("--scale", choices=tuple(SCALES), default=None, help="game sizes")
    p.add_argument(
        "--engine-kv-blocks", type=int, default=None,
        help="vllm: each engine's KV cache in blocks (cpu-overflow: 48; default: 1 GiB's)",
    )  # fmt: skip
    p.add_argument(
        "--peers", default=None,
        help="comma list of smg, smg-prefix-hash, sglang-router, smg-tuned, "
        "sglang-router-tuned, litellm, dynamo; and floor, a reference (bench.proxy_floor "
        "taking the engines in turn: the least a Python hop adds), never counted a peer",
    )  # fmt: skip
    p.add_argument(
        "--repeats", type=int, default=1,
        help="run every gateway N times, fresh engines each, the order rotated each repeat; "
        "report each repeat, the medians, ratios to the peers, ties and each run's load",
    )  # fmt: skip
    p.add_argument(
        "--rotate-offset", type=int, default=0,
        help="rotate the gateways' order by this much before the first repeat (separate "
        "--repeats 1 runs, one per lock hold: 0, 1, 2, then --merge)",
    )  # fmt: skip
    p.add_argument(
        "--load-margin", type=float, default=DEFAULT_LOAD_MARGIN,
        help="flag a run whose machine load is more than this share off the other runs' "
        "median (0.5: 50%%)",
    )  # fmt: skip
    p.add_argument(
        "--merge", default=None, metavar="DIR,DIR,...",
        help="run nothing: join these results directories (each a results.json of the same "
        "comparison) as repeats, into bench/results/<date>-<name>/",
    )  # fmt: skip
    p.add_argument(
        "--warm-lead-s", type=float, default=0.0,
        help="game: warm each dialogue's first line this long before it (the -game runs "
        "send the warm: --gateways warmgate-ttft,warmgate-ttft-game); 0: none",
    )  # fmt: skip
    p.add_argument(
        "--bump-at-s", type=seconds_list, default=(), metavar="T,T,...",
        help="game: every zone's world state changes at these seconds (a new version)",
    )  # fmt: skip
    p.add_argument(
        "--barks", type=float, default=0.0, metavar="PER_S",
        help="game: ambient NPC barks per second (one-off lines, background class)",
    )  # fmt: skip
    p.add_argument(
        "--priority-classes", action="store_true",
        help="game: dialogue lines interactive, barks background (the -game runs send them)",
    )  # fmt: skip
    p.add_argument("--gateways", default=",".join(OURS), help="warmgate's own runs")
    p.add_argument(
        "--gateway-env", action="append", default=[], metavar="NAME:KEY=VALUE",
        help="a setting of warmgate gateway NAME as its environment variable (repeatable); "
        f"with a variant NAME (warmgate-ttft{VARIANT_MARK}label in --gateways, warmgate-ttft "
        "under its own name) one comparison runs a setting's two values, e.g. "
        f"warmgate-ttft{VARIANT_MARK}off:WARMGATE_ROUTING__PRECISE__SEGMENT_CACHE_TOKENS=0",
    )  # fmt: skip
    p.add_argument(
        "--tree", action="append", default=[], metavar="NAME=DIR",
        help="warmgate gateway NAME (a variant in --gateways) runs from the source tree DIR, "
        f"an earlier commit's checkout with its C extensions built, e.g. "
        f"warmgate-ttft{VARIANT_MARK}before=/tmp/before: a before/after of code in one run "
        "(with --engines vllm --tiers, its tierds and the engines' connector too)",
    )  # fmt: skip
    p.add_argument(
        "--tiers",
        action="store_true",
        help="vllm: a tierd with the KV connector beside each engine for warmgate's runs",
    )
    for mode in ("load", "lookup"):
        p.add_argument(
            f"--tier-{mode}", choices=("sync", "async"), default="sync",
            help=f"with --tiers: the KV connector's {mode} mode (tierd.connector)",
        )  # fmt: skip
    p.add_argument(
        "--pin-engines", choices=tuple(PINNING), default="auto",
        help="vllm: every process of an engine on its core (FleetConfig.pin_tree), not only "
        "its compute thread; unpinned, vLLM's busy-polling EngineCore takes CPU from the "
        "gateways beside it (docs/REAL_ENGINES.md); auto: pinned on a machine with fewer "
        "than 2 cores an engine plus one",
    )  # fmt: skip
    p.add_argument(
        "--breakdown", action="store_true",
        help="where the slowest 5%% of TTFTs went (bench.tail_breakdown): every request traced "
        "(a traceparent each), warmgate's gateway and the engines (vllm: vLLM's and tierd's "
        "spans) export to a receiver in this process; tracing's own cost is in each run",
    )  # fmt: skip
    p.add_argument("--json", dest="json_out", help="also write results.json here")
    p.add_argument("--seed", type=int, default=None, help="workload seed (7; vllm: 11)")
    p.add_argument("--profile", default="qwen2.5-32b-h200")
    p.add_argument(
        "--time-scale", type=float, default=0.5, help="engines' wall seconds per modelled second"
    )
    p.add_argument(
        "--compress", type=float, default=None, help="arrival compression (default 1/time-scale)"
    )
    p.add_argument("--concurrency", type=int, default=512, help="client cap on in-flight")
    p.add_argument("--kv-capacity-tokens", type=int, default=None, help="engine L1 KV tokens")
    p.add_argument("--trace-block-tokens", type=int, default=512)
    p.add_argument(
        "--tier-block-chars", type=int, default=1024,
        help="chars per tierd slice = warmgate's routing block: 1024 = 256 tokens, LMCache's "
        "chunk; smaller slices multiply the simulator's per-slice HTTP round trips",
    )  # fmt: skip
    p.add_argument("--name", default=None)
    p.add_argument("--results-dir", default=str(REPO / "bench" / "results"))
    p.add_argument("--no-overhead", action="store_true")
    p.add_argument("--no-claims", action="store_true")
    p.add_argument("--overhead-step-s", type=float, default=2.0)
    p.add_argument("--overhead-gateways", default=",".join(OVERHEAD_GATEWAYS))
    p.add_argument("--overhead-rates", default="10,25,50,100,200", help="req/s ladder")
    p.add_argument("--overhead-streams", default="64,512", help="concurrent stream caps")
    p.add_argument("--overhead-min-requests", type=int, default=60, help="per rate step")
    p.add_argument("--claims-levels", default="8,16", help="concurrent requests per instance")
    p.add_argument(
        "--claims-kv-capacity-tokens", type=int, default=128_000,
        help="engine HBM KV tokens in the claims runs (pressure: tiers matter when it overflows)",
    )  # fmt: skip
    p.add_argument("--claims-requests", type=int, default=240, help="requests per claims run")
    p.add_argument(
        "--claims-budget-s", type=float, default=35.0, help="wall seconds of sending per run"
    )
    args = p.parse_args(list(argv))
    if args.workload is None and args.merge is None:
        p.error("--workload is required (unless --merge)")
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    try:
        args.gateway_env = gateway_env(args.gateway_env, args.gateways.split(","))
        args.source_trees = source_trees(args.tree, args.gateways.split(","), args.gateway_env)
    except ValueError as exc:
        p.error(str(exc))
    defaults = {**(VLLM_DEFAULTS if args.engines == "vllm" else SIM_DEFAULTS)}
    for key, value in {**defaults, **scale_defaults(args.scale)}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.engines == "vllm":
        args.time_scale, args.no_claims, args.no_overhead = 1.0, True, True
    return args


def game_server(args: argparse.Namespace) -> dict[str, Any]:
    """The game server's hints the flags ask for, as GameParams fields (none: {})."""
    asked = {
        "warm_lead_s": args.warm_lead_s,
        "bump_at_s": args.bump_at_s,
        "bark_rate_per_s": args.barks,
        "priority_classes": args.priority_classes,
    }
    return {k: v for k, v in asked.items() if v}
