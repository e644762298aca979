"""`warmgate` command line: dispatches `warmgate <command> [<sub>] ...` to the module that owns
it, imported only when used, so each command's module parses its own flags."""

from __future__ import annotations

import pkgutil
import sys
from collections.abc import Sequence

# (command, subcommand or None) -> "module:function"; function(argv: list[str]) -> int
COMMANDS: dict[tuple[str, str | None], tuple[str, str]] = {
    ("up", None): (
        "gateway.launch.up:main",
        "start engines (simulated, or --engine vllm) + the gateway",
    ),
    ("serve", None): ("gateway.launch.serve:main", "serve the gateway for configured instances"),
    ("admin", None): ("gateway.admin.cli:main", "the admin API: instances, stats, drain, ..."),
    ("bench", "cluster"): ("bench.cluster_cli:main", "discrete-event cluster simulation"),
    ("bench", "router"): ("bench.router_bench:main", "routing decision speed and index memory"),
    ("bench", "soak"): ("bench.soak:main", "long run at a share of capacity: leaks, TTFT drift"),
    ("bench", "fuzz"): ("bench.fuzz:main", "schema fuzzing and hostile bodies: no 5xx"),
    ("bench", "chaos"): ("bench.chaos:main", "faults injected under a game load, one row each"),
    ("bench", "compare"): ("bench.compare:main", "live side-by-side replay against peers"),
    ("bench", "overhead"): (
        "bench.overhead_ab:main",
        "gateway CPU per request and added latency, per upstream transport",
    ),
    ("bench", "idle"): ("bench.idle_cpu:main", "each gateway's CPU with no traffic"),
    ("bench", "convergence"): (
        "bench.convergence:main",
        "ttft cost model: predicted vs observed TTFT from its prior",
    ),
    ("bench", "simfit"): (
        "bench.simfit:main",
        "fit a simulator profile to real vLLM and check the simulator against real runs",
    ),
    ("trace", "game"): ("sim.players.cli:main", "write a game-workload trace"),
}


# what the lab commands need that the product does not install (the `lab` extra)
LAB_MODULES = frozenset({"numpy", "matplotlib"})


def _usage() -> str:
    lines = ["usage: warmgate <command> [<subcommand>] [options]", "", "commands:"]
    for (cmd, sub), (_, help_text) in COMMANDS.items():
        name = cmd if sub is None else f"{cmd} {sub}"
        lines.append(f"  {name:<16} {help_text}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help"}:
        print(_usage())
        return 0
    cmd = args[0]
    if (cmd, None) in COMMANDS:
        target, rest = COMMANDS[(cmd, None)][0], args[1:]
    elif len(args) > 1 and (cmd, args[1]) in COMMANDS:
        target, rest = COMMANDS[(cmd, args[1])][0], args[2:]
    else:
        print(_usage(), file=sys.stderr)
        return 2
    try:
        func = pkgutil.resolve_name(target)  # our own command module, imported when used
    except ModuleNotFoundError as exc:
        if exc.name not in LAB_MODULES:
            raise
        print(
            f"warmgate {' '.join(args[:2])} needs the lab extra ({exc.name} is missing): "
            "pip install 'warmgate[lab]'",
            file=sys.stderr,
        )
        return 2
    result: int = func(rest)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
