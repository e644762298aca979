"""Fleets and gateways for side-by-side runs: start them from a clean state, stop them for sure.

A `Fleet` is N simulated engines (`python -m sim.engine`), each with its own tier daemon
(`tierd serve`) when tierd is installed, all started fresh in a new temporary directory with
the same seed, so every gateway meets identical engines. A gateway is one of:

- `warmgate-ttft`, `warmgate-prefix`, `round-robin`: `warmgate serve` with that policy
  (`warmgate-ttft-game`: ttft, its replay sending the game server's warms and classes)
  (`ttft`, `prefix`, `round_robin`), configured through a YAML file (`WARMGATE_CONFIG`);
- `smg`: the SGLang model gateway 1.13, `smg launch --policy cache_aware` (PROTOCOLS §3);
  `smg-prefix-hash`: the same with `--policy prefix_hash`;
- `sglang-router`: sglang-router 0.3.2 (smg's predecessor), `--policy cache_aware`;
- `smg-tuned`, `sglang-router-tuned`: the same two with the balance thresholds their docs
  advise for a small fleet's shallow queues (`TUNED_BALANCE`);
- `litellm`: the LiteLLM proxy, one deployment per engine under one model name,
  `routing_strategy: least-busy`;
- `dynamo`: NVIDIA Dynamo's vLLM worker; `peer_missing()` tries to import it and reports why
  it cannot run here;
- `floor`: not a peer but a reference, `bench.proxy_floor` taking the engines in turn: the
  least a Python proxy on warmgate's stack does (no parsing, routing or accounting), so that
  its time outside the engines, set beside warmgate's in the same run, splits warmgate's
  into what the Python hop costs and what warmgate's own work adds.

A fleet is anything with `engines` (instance id -> base URL), `model` and
`warmgate_config(policy, port)`: the simulated `Fleet` here, or real vLLM engines
(`bench.real_fleet.RealFleet`). Peers live in their own virtual environments (`.venv-peers`,
`bash scripts/install-peers.sh`), never in warmgate's dependencies; `peer_missing()` says how
to install one that is not there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from bench import proxy_floor
from bench.procs import Proc
from gateway.launch.ports import free_port

REPO = Path(__file__).resolve().parents[1]
PEERS_VENV = Path(os.environ.get("WARMGATE_PEERS_VENV", REPO / ".venv-peers"))
PEER_INSTALL = "bash scripts/install-peers.sh"
WARMGATE_POLICIES = {
    "warmgate-ttft": "ttft",
    "warmgate-prefix": "prefix",
    "round-robin": "round_robin",
    "warmgate-ttft-bare": "ttft",  # with --tiers: warmgate ttft on engines without tierd
    # real engines: warmgate ttft tokenizing through the engines' /tokenize, not locally
    "warmgate-ttft-tokenize": "ttft",
    # warmgate ttft with the game server's hints sent (GAME_SERVER_RUNS): beside
    # warmgate-ttft in one comparison, the hints' effect on the same lines
    "warmgate-ttft-game": "ttft",
    # with --tiers: ttft + tierd whose connector loads and looks up asynchronously whatever
    # --tier-load / --tier-lookup say (ASYNC_TIER_RUNS): both modes in one rotated comparison
    "warmgate-ttft-async": "ttft",
}
ASYNC_TIER_RUNS = frozenset({"warmgate-ttft-async"})
# `base@label`: warmgate gateway `base` run under another name, so that one comparison can
# run it twice with different settings (`bench compare --gateway-env NAME:KEY=VALUE`)
VARIANT_MARK = "@"
# the runs whose replay sends what a game server knows ahead: POST /v1/warm before each
# dialogue's first line, each line's priority class (bench.replay's warms, send_priority)
GAME_SERVER_RUNS = frozenset({"warmgate-ttft-game"})
# gateways run beside the peers as a yardstick, never counted as a peer (compare_repeats)
REFERENCE_GATEWAYS = frozenset({"floor"})
PEER_BINARIES = {
    "smg": PEERS_VENV / "bin" / "smg",
    "smg-prefix-hash": PEERS_VENV / "bin" / "smg",
    "sglang-router": PEERS_VENV / "sglang-router" / "bin" / "smg",
    "smg-tuned": PEERS_VENV / "bin" / "smg",
    "sglang-router-tuned": PEERS_VENV / "sglang-router" / "bin" / "smg",
    "litellm": PEERS_VENV / "bin" / "litellm",
    "dynamo": PEERS_VENV / "dynamo" / "bin" / "python",
}
SMG_POLICIES = {
    "smg": "cache_aware",
    "smg-prefix-hash": "prefix_hash",
    "sglang-router": "cache_aware",
    "smg-tuned": "cache_aware",
    "sglang-router-tuned": "cache_aware",
}
# `-tuned`: the balance thresholds as the peers' docs tell a user to set them, for a small
# fleet. smg's routing guide (docs/configuration/routing.md, lightseekorg/smg): "set
# --balance-abs-threshold based on expected request queue depth" and the relative one "based
# on acceptable load imbalance (1.5 = 50% difference)"; its cache-aware page: lower
# thresholds for bursty traffic. The defaults (64 and 1.5; sglang-router 0.3.2 the same) are
# sized for deep queues: with two engines and one or two requests in flight the absolute gate
# never opens, so cache affinity alone decides. Our queue depth is 1-2 requests an engine,
# hence 2 (a gap of 3 requests spills; 1 is the in-flight count's own noise) and 1.5 kept.
TUNED_BALANCE = ("--balance-abs-threshold", "2", "--balance-rel-threshold", "1.5")
PEER_EXTRA_ARGS: dict[str, tuple[str, ...]] = {
    "smg-tuned": TUNED_BALANCE,
    "sglang-router-tuned": TUNED_BALANCE,
}


class EngineFleet(Protocol):
    """What a gateway needs to know of the engines it fronts."""

    engines: dict[str, str]

    @property
    def model(self) -> str: ...

    def warmgate_config(self, policy: str, port: int) -> dict[str, Any]: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def base_gateway(name: str) -> str:
    """What gateway `name` runs: `base` for a variant `base@label`, else `name`."""
    return name.split(VARIANT_MARK, 1)[0]


def peer_missing(name: str) -> str | None:
    """Why gateway `name` cannot run here (with the command that fixes it), or None."""
    if base_gateway(name) in WARMGATE_POLICIES:
        return None
    if VARIANT_MARK in name:
        return f"{name}: only warmgate's gateways have variants ({', '.join(WARMGATE_POLICIES)})"
    if name in REFERENCE_GATEWAYS:
        return None
    binary = PEER_BINARIES.get(name)
    if binary is None:
        return f"unknown gateway {name!r}"
    if not binary.exists():
        return f"{binary} not installed; install with: {PEER_INSTALL}"
    if name == "dynamo":
        return dynamo_missing(binary)
    return None


def dynamo_missing(python: Path) -> str:
    """Why Dynamo's vLLM worker cannot front the engines here, found by importing it.

    Even where it imports, this harness has no launcher for Dynamo's frontend, worker and
    their NATS/etcd planes, and says so rather than pretending to run it."""
    probe = subprocess.run(
        [str(python), "-c", "import dynamo.vllm.main"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if probe.returncode != 0:
        lines = [ln for ln in probe.stderr.splitlines() if ln.strip()]
        where = [ln.strip() for ln in lines if ln.lstrip().startswith('File "')][-2:]
        return (
            f"`python -m dynamo.vllm` cannot start: `import dynamo.vllm.main` fails with "
            f"{lines[-1] if lines else probe.returncode} ({' <- '.join(reversed(where))})"
        )
    return "dynamo.vllm imports, but bench.peers has no launcher for Dynamo's frontend + worker"


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """How to start the engines; identical for every gateway of a comparison."""

    instances: int = 3
    model: str = "sim-qwen2.5-32b"
    profile: str = "qwen2.5-32b-h200"
    time_scale: float = 1.0
    seed: int = 0
    block_tokens: int = 16  # engine KV block size (vLLM default)
    kv_capacity_tokens: int | None = None
    tierd: bool = True  # run a tierd beside each engine (when tierd is installed)
    array: bool = True  # one array directory shared by all tierds (False: one each)
    l1_bytes: int = 256 * 1024 * 1024
    # Characters per tierd slice, which is also warmgate's approximate routing block (so its
    # prefetch hints name the slices the engines store); None: the defaults (256 = 64 tokens).
    tier_block_chars: int | None = None
    extra_engine_args: tuple[str, ...] = ()


@dataclass
class Fleet:
    """Running engines (and their tierds); `engines` maps instance id -> base URL."""

    spec: FleetSpec
    workdir: Path
    engines: dict[str, str] = field(default_factory=dict)
    tierds: dict[str, str] = field(default_factory=dict)
    engine_args: dict[str, list[str]] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)

    def _dirs(self, inst: str) -> tuple[Path, Path]:
        """(snapshot dir, array dir) of one instance's tierd, created."""
        snap = self.workdir / f"snap-{inst}"
        array = self.workdir / ("array" if self.spec.array else f"array-{inst}")
        snap.mkdir(parents=True, exist_ok=True)
        array.mkdir(parents=True, exist_ok=True)
        return snap, array

    async def start(self) -> None:
        """Start every tierd, then every engine; return when all answer."""
        spec = self.spec
        use_tierd = spec.tierd
        waits = []
        for n in range(spec.instances):
            inst = f"e{n}"
            args = [
                sys.executable, "-m", "sim.engine", "--host", "127.0.0.1",
                "--port", str(port := free_port()), "--instance-id", inst,
                "--model", spec.model, "--profile", spec.profile,
                "--time-scale", str(spec.time_scale), "--seed", str(spec.seed),
                "--block-tokens", str(spec.block_tokens), *spec.extra_engine_args,
            ]  # fmt: skip
            if spec.kv_capacity_tokens is not None:
                args += ["--kv-capacity-tokens", str(spec.kv_capacity_tokens)]
            if use_tierd:
                tport = free_port()
                snap, array = await asyncio.to_thread(self._dirs, inst)
                # tierd emulates the real model's array/snapshot load time on the engines'
                # clock (--time-scale), so the bandwidths it measures and the gateway's ttft
                # policy reads are in real-model bytes per modelled second, not the scaled
                # payload's; the engine then charges only tierd's arena hits itself.
                targs = [
                    sys.executable, "-m", "tierd.cli", "serve", "--host", "127.0.0.1",
                    "--port", str(tport), "--l1-bytes", str(spec.l1_bytes),
                    "--snapshot-dir", str(snap), "--instance-id", inst,
                    "--array-dir", str(array), "--emulate", spec.profile,
                    "--time-scale", str(spec.time_scale),
                ]  # fmt: skip
                log = self.workdir / f"tierd-{inst}.log"
                tproc = await Proc.spawn(f"tierd-{inst}", targs, log)
                self.procs.append(tproc)
                self.tierds[inst] = f"http://127.0.0.1:{tport}"
                waits.append(tproc.wait_http(self.tierds[inst] + "/livez"))
                args += ["--tierd-url", self.tierds[inst]]
                if spec.tier_block_chars is not None:
                    args += ["--tier-block-chars", str(spec.tier_block_chars)]
            self.engines[inst] = f"http://127.0.0.1:{port}"
            self.engine_args[inst] = args
        await asyncio.gather(*waits)  # engines ask their tierd for its stats at start
        engine_waits = []
        for inst, args in self.engine_args.items():
            proc = await Proc.spawn(inst, args, self.workdir / f"{inst}.log")
            self.procs.append(proc)
            engine_waits.append(proc.wait_http(self.engines[inst] + "/health"))
        await asyncio.gather(*engine_waits)

    async def stop(self) -> None:
        await asyncio.gather(*(p.stop_async() for p in self.procs), return_exceptions=True)

    @property
    def model(self) -> str:
        return self.spec.model

    def warmgate_config(self, policy: str, port: int) -> dict[str, Any]:
        return warmgate_config(self, policy, port)


@dataclass
class Gateway:
    """A running gateway in front of a fleet."""

    name: str
    base_url: str  # ends in /v1
    proc: Proc
    instance_by_url: dict[str, str]
    api_key: str | None = None

    async def stop(self) -> None:
        await self.proc.stop_async()


def warmgate_config(fleet: Fleet, policy: str, port: int) -> dict[str, Any]:
    routing: dict[str, Any] = {"policy": policy}
    if fleet.spec.tier_block_chars is not None:
        routing["block_tokens"] = fleet.spec.tier_block_chars // 4  # 4 chars a token
    return {
        "host": "127.0.0.1",
        "port": port,
        "log_level": "warning",
        "instances": [
            {
                "id": inst,
                "url": url,
                "models": [fleet.spec.model],
                **({"tierd_url": fleet.tierds[inst]} if inst in fleet.tierds else {}),
            }
            for inst, url in fleet.engines.items()
        ],
        "routing": routing,
    }


def litellm_config(fleet: EngineFleet, master_key: str) -> dict[str, Any]:
    return {
        "model_list": [
            {
                "model_name": fleet.model,
                "litellm_params": {
                    "model": f"openai/{fleet.model}",
                    "api_base": url + "/v1",
                    "api_key": "none",
                },
                "model_info": {"id": inst},
            }
            for inst, url in fleet.engines.items()
        ],
        "router_settings": {"routing_strategy": "least-busy", "num_retries": 0},
        "litellm_settings": {"drop_params": True, "request_timeout": 600},
        "general_settings": {"master_key": master_key},
    }


def smg_command(name: str, worker_urls: Sequence[str], port: int, metrics_port: int) -> list[str]:
    """The command line of smg-family gateway `name` (smg 1.13, sglang-router 0.3.2)."""
    return [
        str(PEER_BINARIES[name]), "launch", "--host", "127.0.0.1",
        "--port", str(port), "--worker-urls", *worker_urls,
        "--policy", SMG_POLICIES[name], "--prometheus-port", str(metrics_port),
        "--prometheus-host", "127.0.0.1", "--log-level", "warn",
        *PEER_EXTRA_ARGS.get(name, ()),
    ]  # fmt: skip


async def start_gateway(
    name: str, fleet: EngineFleet, workdir: Path, warmgate_env: Mapping[str, str] | None = None
) -> Gateway:
    """Start gateway `name` in front of `fleet` and wait until it answers; warmgate's own
    gateways get `warmgate_env` too (the OTEL_ variables of `bench compare --breakdown`, a
    variant's settings)."""
    port = free_port()
    api_key: str | None = None
    by_url = {url: inst for inst, url in fleet.engines.items()}
    log = workdir / f"gateway-{name}.log"
    if (base := base_gateway(name)) in WARMGATE_POLICIES:
        cfg = workdir / f"warmgate-{name}.yaml"
        config = fleet.warmgate_config(WARMGATE_POLICIES[base], port)
        if base.endswith("-tokenize"):
            config.get("routing", {}).get("precise", {}).pop("tokenizer_dir", None)
        cfg.write_text(yaml.safe_dump(config))
        args = [sys.executable, "-m", "gateway.cli", "serve"]
        env = {"WARMGATE_CONFIG": str(cfg), "WARMGATE_PORT": str(port), **(warmgate_env or {})}
        proc = await Proc.spawn(name, args, log, env)
        await proc.wait_http(f"http://127.0.0.1:{port}/readyz", timeout_s=60)
    elif name == "floor":
        proc = await Proc.spawn(name, proxy_floor.command(port, list(fleet.engines.values())), log)
        await proc.wait_http(f"http://127.0.0.1:{port}/", timeout_s=60)
    elif name in SMG_POLICIES:
        args = smg_command(name, list(fleet.engines.values()), port, free_port())
        proc = await Proc.spawn(name, args, log)
        await proc.wait_http(f"http://127.0.0.1:{port}/health", timeout_s=90)
    elif name == "litellm":
        cfg = workdir / "litellm.yaml"
        api_key = "sk-bench-" + secrets.token_hex(16)  # the proxy refuses to start without one
        cfg.write_text(yaml.safe_dump(litellm_config(fleet, api_key)))
        args = [str(PEER_BINARIES["litellm"]), "--config", str(cfg),
                "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
        env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
               "DISABLE_SCHEMA_UPDATE": "True"}  # fmt: skip
        proc = await Proc.spawn(name, args, log, env)
        await proc.wait_http(f"http://127.0.0.1:{port}/health/liveliness", timeout_s=180)
    else:
        raise ValueError(f"unknown gateway {name!r}")
    return Gateway(name, f"http://127.0.0.1:{port}/v1", proc, by_url, api_key)


@contextlib.asynccontextmanager
async def fleet_with_gateway(
    spec: FleetSpec,
    gateway: str | None,
    keep_logs: Path | None = None,
    warmgate_env: Mapping[str, str] | None = None,
) -> Any:
    """Fresh engines and (optionally) one gateway; both stopped and cleaned on exit.
    Yields (fleet, gateway or None). Logs are copied to `keep_logs` when given."""
    workdir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="warmgate-bench-"))
    fleet = Fleet(spec, workdir)
    async with gateway_in_front(fleet, gateway, workdir, keep_logs, warmgate_env) as pair:
        yield pair


@contextlib.asynccontextmanager
async def gateway_in_front(
    fleet: EngineFleet,
    gateway: str | None,
    workdir: Path,
    keep_logs: Path | None,
    warmgate_env: Mapping[str, str] | None = None,
) -> Any:
    """Start `fleet` and (optionally) gateway `gateway` in front of it; on exit stop both,
    copy the logs to `keep_logs` when given and remove `workdir`. Yields (fleet, gateway)."""
    gw: Gateway | None = None
    try:
        await fleet.start()
        if gateway is not None:
            gw = await start_gateway(gateway, fleet, workdir, warmgate_env)
        yield fleet, gw
    finally:
        if gw is not None:
            await gw.stop()
        await fleet.stop()
        if keep_logs is not None:
            await asyncio.to_thread(_copy_logs, workdir, keep_logs)
        await asyncio.to_thread(shutil.rmtree, workdir, True)


def _copy_logs(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for log in src.glob("*.log"):
        shutil.copy2(log, dst / log.name)
