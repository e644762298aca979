"""`warmgate up --engine vllm`: real vLLM engines behind the gateway, in one command.

Builds the small local model once (cached; `gateway.launch.models`), starts N vLLM engines
from the engine's own virtual environment (`bash scripts/install-engine.sh`), one core each,
with prefix caching, prompt-token details and KV events on ipc sockets
(`gateway.launch.vllm_fleet`), then the gateway in precise mode with the block size and hash
algorithm each engine reports (`vllm:cache_config_info`), vLLM's unseeded sha256_cbor seed
and its events topic. Ctrl-C, SIGTERM or SIGHUP stop the gateway, then every engine's whole
process tree (API server, EngineCore, Worker); a SIGKILL of `up` itself still takes the
children down (they get SIGTERM when their parent dies).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from contracts.otel import engine_traces_endpoint
from gateway.engine.vllm_metrics import cache_config
from gateway.fleet.engine_check import EngineConfigMismatch
from gateway.launch.banner import Interrupted, banner_text
from gateway.launch.models import EngineEnvMissing, ensure_tiny_model, require_engine_python
from gateway.launch.process import ChildFailedError, ProcessTree
from gateway.launch.tiered import TieredConfig, TieredFleet
from gateway.launch.vllm_fleet import FleetConfig, VllmFleet
from gateway.pipeline import hf_tokenizer

SERVED_MODEL = "warmgate-tiny"


Fleet = VllmFleet | TieredFleet


def gateway_config(args: argparse.Namespace, fleet: Fleet) -> dict[str, Any]:
    """The gateway's YAML: precise mode with what the engines themselves report."""
    block_sizes: set[int] = set()
    algos: set[str] = set()
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        for e in fleet:
            info = cache_config(client.get(f"{e.url}/metrics").text)
            if info is None:
                raise EngineConfigMismatch(f"{e.id} publishes no vllm:cache_config_info")
            if info.block_size is not None:
                block_sizes.add(info.block_size)
            if info.hash_algo is not None:
                algos.add(info.hash_algo)
    if len(block_sizes) != 1 or len(algos) != 1:
        raise EngineConfigMismatch(f"the engines disagree: block sizes {block_sizes}, hash {algos}")
    precise: dict[str, Any] = {
        "hash": "vllm",
        "vllm_hash_algo": algos.pop(),
        "block_size": block_sizes.pop(),
    }
    if fleet.cfg.hash_seed is not None:
        precise["hash_seed"] = fleet.cfg.hash_seed
    if hf_tokenizer.available():  # the engines' tokenizer files: no /tokenize round trips
        precise["tokenizer_dir"] = str(fleet.cfg.model_dir)
    routing: dict[str, Any] = {"mode": "precise", "precise": precise}
    if args.policy:
        routing["policy"] = args.policy
    tierds = fleet.tierd_urls if isinstance(fleet, TieredFleet) else {}
    tierd_events = fleet.tierd_events if isinstance(fleet, TieredFleet) else {}
    instances = [
        {
            "id": e.id,
            "url": e.url,
            "engine": "vllm",
            "models": [fleet.cfg.served_model_name],
            "kv_events_endpoint": e.kv_events_endpoint,
            "kv_events_replay_endpoint": e.kv_replay_endpoint,
            "priority_scheduling": fleet.cfg.scheduling_policy == "priority",
            # its tierd: prefetch hints (engine block hashes) and measured tier bandwidths
            **({"tierd_url": tierds[e.id]} if e.id in tierds else {}),
            # and its residency (host memory, array, snapshots): priced by the router
            **({"tierd_events_endpoint": tierd_events[e.id]} if e.id in tierd_events else {}),
        }
        for e in fleet
    ]
    return {
        "host": args.host,
        "port": args.port,
        "instances": instances,
        "routing": routing,
        # tierd's connector keys slices by the engine's block hashes: hint in those
        **({"tiers": {"hint_keys": "engine"}} if tierds else {}),
        "kv_events": {"enabled": True, "topic": fleet.cfg.kv_events_topic},
    }


def _wait_gateway(tree: ProcessTree, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if not tree.alive():
                raise ChildFailedError(f"the gateway exited; log {tree.log_path}:\n{tree.tail()}")
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    raise ChildFailedError(f"the gateway did not answer {url}; log {tree.log_path}:\n{tree.tail()}")


def banner(base_url: str, fleet: Fleet, run_dir: Path, config: dict[str, Any]) -> str:
    precise = config["routing"]["precise"]
    model = fleet.cfg.served_model_name
    headline = (
        f"warmgate is up: {len(fleet.engines)} vLLM engines ({model}, one core each), "
        f"precise mode (block size {precise['block_size']}, {precise['vllm_hash_algo']}, "
        f"tokens {'from the model directory' if 'tokenizer_dir' in precise else 'by /tokenize'})"
    )
    details = [f"  engines:   {', '.join(e.url for e in fleet)}"]
    if isinstance(fleet, TieredFleet):
        details.append(
            f"  tierds:    {', '.join(fleet.tierd_urls.values())} "
            f"(KV connector, shared array {fleet.array_dir})"
        )
    details.append(f"  logs:      {run_dir}")
    notes = ("(random weights: the text is noise; the caching, routing and timing are real.)",)
    return banner_text(headline, base_url, model, details, call="max_tokens=16, ", notes=notes)


def run(args: argparse.Namespace) -> int:
    """Start the model, engines and gateway; supervise until a signal or a death."""
    run_dir = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="wg-up-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    fleet: Fleet | None = None
    gateway: ProcessTree | None = None
    try:
        python = require_engine_python()
        print("warmgate up: building the local model (cached after the first time)...", flush=True)
        model_dir = ensure_tiny_model(python=python)
        fleet_cfg = FleetConfig(
            model_dir=model_dir,
            engines=args.instances,
            run_dir=run_dir,
            served_model_name=SERVED_MODEL,
            python=python,
            kv_cache_gib=args.kv_cache_gib,
            start_timeout_s=max(args.start_timeout, 300.0),
            otlp_traces=engine_traces_endpoint(os.environ),  # engines join the gateway's traces
        )
        # a tierd beside each engine (the KV connector, one shared array) unless --no-tierd
        fleet = (
            VllmFleet(fleet_cfg)
            if getattr(args, "no_tierd", False)
            else TieredFleet(TieredConfig(fleet_cfg))
        )
        print(
            f"warmgate up: starting {args.instances} vLLM engines (about a minute)...", flush=True
        )
        fleet.start()
        config = gateway_config(args, fleet)
        config_path = run_dir / "gateway.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        argv = [sys.executable, "-m", "gateway.launch.serve", "--config", str(config_path)]
        argv += ["--host", args.host, "--port", str(args.port)]
        env = {k: v for k, v in os.environ.items() if k != "WARMGATE_INSTANCES"}
        gateway = ProcessTree.start("gateway", argv, run_dir / "gateway.log", env=env)
        probe_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
        _wait_gateway(gateway, f"http://{probe_host}:{args.port}/readyz", args.start_timeout)
        print(banner(f"http://{probe_host}:{args.port}/v1", fleet, run_dir, config), flush=True)
        while gateway.alive() and all(e.alive() for e in fleet):
            time.sleep(0.5)
        dead = "the gateway" if not gateway.alive() else "an engine"
        print(f"warmgate up: {dead} exited; logs in {run_dir}", file=sys.stderr)
        return 1
    except Interrupted:
        print("\nwarmgate up: stopping...", file=sys.stderr, flush=True)
        return 0
    except (RuntimeError, EngineEnvMissing) as exc:
        print(f"warmgate up: {exc}", file=sys.stderr)
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # let nothing cut shutdown
            signal.signal(sig, signal.SIG_IGN)
        if gateway is not None:
            gateway.stop(10.0)
        if fleet is not None:
            fleet.stop()
        if not args.run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
