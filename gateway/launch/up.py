"""`warmgate up`: a whole local stack in one command, no Redis needed.

`--engine sim` (the default) is described here; `--engine vllm` runs real vLLM engines
instead (`gateway.launch.up_vllm`).

Starts N simulated engines (`python -m sim.engine`), one `tierd serve` per instance sharing
one array directory (when tierd's server is installed), waits until each answers, then
starts the gateway (`warmgate serve` on a generated YAML config) and waits for its `/readyz`.
Prints the base URL and an OpenAI SDK example, then supervises: Ctrl-C or SIGTERM stops
everything (gateway first, then engines, then tierds), as does the gateway dying.

Every child runs in its own session (Ctrl-C reaches only this supervisor, which stops the
children in order) and logs to a file in the run directory.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from gateway.launch.banner import Interrupted, banner_text
from gateway.launch.ports import free_port
from gateway.launch.process import ChildFailedError, ChildNotReadyError, ProcessTree
from gateway.launch.process import wait_http as wait_for

DEFAULT_MODEL = "sim-qwen2.5-32b"
DEFAULT_PROFILE = "qwen2.5-32b-h200"
DEFAULT_TIME_SCALE = 0.1  # 10x faster than the profile's real time: a responsive quickstart


def _env(name: str, default: str) -> str:
    return os.environ.get(name) or default


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="warmgate up", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--engine",
        choices=("sim", "vllm"),
        default=_env("WARMGATE_UP_ENGINE", "sim"),
        help="simulated engines, or real vLLM ones (needs `bash scripts/install-engine.sh`) "
        "(env WARMGATE_UP_ENGINE, default sim)",
    )
    p.add_argument(
        "--instances",
        type=int,
        default=int(os.environ["WARMGATE_UP_INSTANCES"])
        if os.environ.get("WARMGATE_UP_INSTANCES")
        else None,
        help="engines to start (env WARMGATE_UP_INSTANCES, default 3 simulated or 2 vLLM)",
    )
    p.add_argument(
        "--kv-cache-gib",
        type=int,
        default=int(_env("WARMGATE_UP_KV_CACHE_GIB", "1")),
        help="vLLM only: KV cache per engine in GiB (env WARMGATE_UP_KV_CACHE_GIB, default 1)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=int(_env("WARMGATE_PORT", "8000")),
        help="gateway port (env WARMGATE_PORT, default 8000)",
    )
    p.add_argument(
        "--host",
        default=_env("WARMGATE_HOST", "127.0.0.1"),
        help="gateway address (env WARMGATE_HOST, default 127.0.0.1)",
    )
    p.add_argument(
        "--profile",
        default=_env("WARMGATE_UP_PROFILE", DEFAULT_PROFILE),
        help=f"engine timing profile (env WARMGATE_UP_PROFILE, default {DEFAULT_PROFILE})",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=float(_env("WARMGATE_UP_TIME_SCALE", str(DEFAULT_TIME_SCALE))),
        help="wall seconds per simulated second; 1 = real time "
        f"(env WARMGATE_UP_TIME_SCALE, default {DEFAULT_TIME_SCALE})",
    )
    p.add_argument(
        "--model",
        default=_env("WARMGATE_UP_MODEL", DEFAULT_MODEL),
        help=f"model id the engines serve (env WARMGATE_UP_MODEL, default {DEFAULT_MODEL})",
    )
    p.add_argument(
        "--policy",
        default=os.environ.get("WARMGATE_ROUTING__POLICY"),
        help="routing policy (env WARMGATE_ROUTING__POLICY; default: the gateway's)",
    )
    p.add_argument(
        "--no-tierd",
        action="store_true",
        default=_env("WARMGATE_UP_NO_TIERD", "") not in ("", "0", "false"),
        help="run the engines without tierds (env WARMGATE_UP_NO_TIERD=1)",
    )
    p.add_argument(
        "--l1-bytes",
        type=int,
        default=int(_env("WARMGATE_UP_L1_BYTES", str(256 << 20))),
        help="each tierd's L1 arena in bytes (env WARMGATE_UP_L1_BYTES, default 256 MiB)",
    )
    p.add_argument(
        "--run-dir",
        default=os.environ.get("WARMGATE_UP_RUN_DIR"),
        help="where logs, config and the shared array go (env WARMGATE_UP_RUN_DIR; "
        "default: a temporary directory removed on exit)",
    )
    p.add_argument(
        "--start-timeout",
        type=float,
        default=float(_env("WARMGATE_UP_START_TIMEOUT", "120")),
        help="seconds to wait for each part to answer (env WARMGATE_UP_START_TIMEOUT)",
    )
    args = p.parse_args(list(argv))
    if args.instances is None:
        args.instances = 2 if args.engine == "vllm" else 3
    if args.instances < 1:
        p.error("--instances must be at least 1")
    return args


@dataclass
class Child:
    """One supervised process (`gateway.launch.process.ProcessTree`: a session of its own,
    its whole tree stopped), logging to a file."""

    name: str
    args: list[str]
    log_path: Path
    drop_env: tuple[str, ...] = ()  # variables the child must not inherit
    tree: ProcessTree | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in self.drop_env}
        env["PYTHONUNBUFFERED"] = "1"
        self.tree = ProcessTree.start(self.name, self.args, self.log_path, env=env)

    def alive(self) -> bool:
        return self.tree is not None and self.tree.alive()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.tree is not None:
            self.tree.stop(timeout_s)

    def tail(self, n: int = 20) -> str:
        return self.tree.tail(n) if self.tree is not None else ""


def wait_http(child: Child, url: str, timeout_s: float) -> None:
    if child.tree is None:
        raise ChildFailedError(f"{child.name} was not started")
    wait_for(child.tree, url, timeout_s)


def banner(base_url: str, model: str, run_dir: Path, args: argparse.Namespace, tierds: bool) -> str:
    headline = (
        f"warmgate is up: {args.instances} simulated instances ({args.profile}, time scale "
        f"{args.time_scale:g}){', each with a tierd' if tierds else ''}"
    )
    return banner_text(headline, base_url, model, [f"  logs:      {run_dir}"])


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="warmgate-up-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    use_tierd = not args.no_tierd
    py = sys.executable
    tierds: list[Child] = []
    engines: list[Child] = []
    gateway: Child | None = None
    try:
        instances: list[dict[str, Any]] = []
        array_dir = run_dir / "array"
        for i in range(args.instances):
            iid = f"sim-{i}"
            tierd_url = None
            if use_tierd:
                tport = free_port()
                snap = run_dir / f"snapshots-{iid}"
                array_dir.mkdir(exist_ok=True)
                snap.mkdir(exist_ok=True)
                t = Child(
                    f"tierd {iid}",
                    [
                        py,
                        "-m",
                        "tierd.cli",
                        "serve",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(tport),
                        "--l1-bytes",
                        str(args.l1_bytes),
                        "--array-dir",
                        str(array_dir),
                        "--snapshot-dir",
                        str(snap),
                        "--emulate",
                        args.profile,
                        "--time-scale",
                        str(args.time_scale),
                        # the sim engine's scaled slices are a few KiB: small L1 slots
                        "--slice-bytes",
                        "16384",
                        "--instance-id",
                        iid,
                    ],
                    run_dir / f"tierd-{iid}.log",
                )
                t.start()
                tierds.append(t)
                tierd_url = f"http://127.0.0.1:{tport}"
            eport = free_port()
            e_args = [
                py,
                "-m",
                "sim.engine",
                "--host",
                "127.0.0.1",
                "--port",
                str(eport),
                "--instance-id",
                iid,
                "--model",
                args.model,
                "--profile",
                args.profile,
                "--time-scale",
                str(args.time_scale),
                "--seed",
                str(i),
            ]
            if tierd_url:
                e_args += ["--tierd-url", tierd_url]
            instances.append(
                {
                    "id": iid,
                    "url": f"http://127.0.0.1:{eport}",
                    "tierd_url": tierd_url,
                    "models": [args.model],
                    "engine": "sim",
                }
            )
            engines.append(Child(f"engine {iid}", e_args, run_dir / f"engine-{iid}.log"))
        for t, inst in zip(tierds, instances, strict=False):
            wait_http(t, f"{inst['tierd_url']}/livez", args.start_timeout)
        for e in engines:
            e.start()
        for e, inst in zip(engines, instances, strict=True):
            wait_http(e, f"{inst['url']}/health", args.start_timeout)
        config: dict[str, Any] = {"host": args.host, "port": args.port, "instances": instances}
        if args.policy:
            config["routing"] = {"policy": args.policy}
        config_path = run_dir / "gateway.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        gateway = Child(
            "gateway",
            [
                py,
                "-m",
                "gateway.launch.serve",
                "--config",
                str(config_path),
                "--host",
                args.host,
                "--port",
                str(args.port),
            ],
            run_dir / "gateway.log",
            drop_env=("WARMGATE_INSTANCES",),  # the generated config names the instances
        )
        gateway.start()
        probe_host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
        wait_http(gateway, f"http://{probe_host}:{args.port}/readyz", args.start_timeout)
        print(
            banner(f"http://{probe_host}:{args.port}/v1", args.model, run_dir, args, use_tierd),
            flush=True,
        )
        while gateway.alive():
            time.sleep(0.5)
        print(
            f"warmgate up: the gateway exited; log {gateway.log_path}:\n{gateway.tail()}",
            file=sys.stderr,
        )
        return 1
    except Interrupted:
        print("\nwarmgate up: stopping...", file=sys.stderr, flush=True)
        return 0
    except (RuntimeError, ChildNotReadyError) as exc:  # a child that failed or never answered
        print(f"warmgate up: {exc}", file=sys.stderr)
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # nothing may cut shutdown
            signal.signal(sig, signal.SIG_IGN)
        for child in ([gateway] if gateway else []) + engines + tierds:
            child.stop()
        if not args.run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    if args.engine == "vllm":
        from gateway.launch import up_vllm

        return up_vllm.run(args)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
