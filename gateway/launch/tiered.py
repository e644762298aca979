"""Real vLLM engines each with a tierd beside it: the connector wired in, one shared array.

Each instance i is a `tierd serve` (this environment's python) with a KV socket and its L1
in shared memory, and a `VllmEngine` started with `--kv-transfer-config` naming
`tierd.connector.vllm_v1` (the repository root on the engine's PYTHONPATH, the engine's own
venv otherwise), `kv_load_failure_policy: recompute`. Every tierd shares `array_dir`, so a
block one engine computed is found by every other. API (blocking; call from a thread):

    fleet = TieredFleet(TieredConfig(model_dir=ensure_tiny_model(), engines=2, run_dir=d))
    fleet.start()
    fleet.instances[0].engine.url, .tierd.url, .stats()   # connector counters
    fleet.instances[1].tierd.kill(); ...; fleet.instances[1].tierd.start()
    fleet.stop()
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from gateway.launch.ports import free_port
from gateway.launch.process import ChildFailedError, ProcessTree
from gateway.launch.vllm_fleet import FleetConfig, FleetConfigError, VllmEngine
from tierd.slices import HEADER_BYTES, decode_header

REPO_ROOT = Path(__file__).resolve().parents[2]
CONNECTOR_MODULE = "tierd.connector.vllm_v1"


def kv_block_bytes(model_dir: Path, block_size: int, dtype_bytes: int = 4) -> int:
    """Bytes of one KV block of all layers (K and V) for a HF config.json model."""
    cfg = json.loads((model_dir / "config.json").read_text())
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    return 2 * int(cfg["num_hidden_layers"]) * kv_heads * head_dim * dtype_bytes * block_size


def connector_config(
    socket: Path,
    stats_dir: Path | None,
    load: str = "sync",
    lookup: str = "sync",
    save: str = "async",
) -> str:
    """The engine's `--kv-transfer-config` for tierd's connector."""
    extra: dict[str, Any] = {"socket": str(socket), "load": load, "lookup": lookup, "save": save}
    if stats_dir is not None:
        extra["stats_dir"] = str(stats_dir)
    return json.dumps(
        {
            "kv_connector": "TierdConnector",
            "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": extra,
        }
    )


def source_env(root: Path) -> dict[str, str]:
    """A child's environment that imports tierd from `root`: first on the path, and the
    working directory (`-m`'s usual first entry, maybe another checkout) not on it."""
    return {"PYTHONPATH": str(root), "PYTHONSAFEPATH": "1"}


@dataclass(frozen=True)
class TieredConfig:
    """A fleet of engines with tierds; `fleet` holds what every engine runs with."""

    fleet: FleetConfig
    array_dir: Path | None = None  # shared by every tierd; None: <run_dir>/array
    l1_bytes: int = 512 * 1024 * 1024
    load: str = "sync"  # the connector's load mode: sync | async
    loads: tuple[str, ...] = ()  # per engine, overriding `load` (tests run one of each)
    lookup: str = "sync"  # the connector's lookup mode: sync | async (off the loop)
    lookups: tuple[str, ...] = ()  # per engine, overriding `lookup`
    save: str = "async"  # the connector's save mode: async (off the critical path) | sync
    saves: tuple[str, ...] = ()  # per engine, overriding `save`
    python: str = sys.executable  # tierd's interpreter (this environment)
    # the source tree tierd and the engines' connector run from: this checkout, or an
    # earlier commit's for a before/after of tierd's code (`bench compare --tree`)
    source_root: Path = REPO_ROOT
    # Residency events: each tierd publishes on ipc://<run_dir>/tierd-<i>.events and, with a
    # Redis, into the pool's stream, which the gateway's index reads (state backend redis).
    redis_url: str | None = None
    pool: str = "default"


class TierdProcess:
    """One `tierd serve` with a KV socket."""

    def __init__(
        self, name: str, run_dir: Path, args: list[str], source_root: Path = REPO_ROOT
    ) -> None:
        self.name = name
        self.source_root = source_root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.socket = run_dir / f"{name}.sock"
        self.log_path = run_dir / f"{name}.log"
        self.args = [*args, "--port", str(self.port), "--kv-socket", str(self.socket)]
        self.tree: ProcessTree | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        env = {**os.environ, **source_env(self.source_root)}
        self.tree = ProcessTree.start(self.name, self.args, self.log_path, env=env)
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                if not self.tree.alive():
                    raise ChildFailedError(f"{self.name} exited:\n{self.tree.tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/readyz").status_code == 200:
                        return
                time.sleep(0.1)
        raise ChildFailedError(f"{self.name} not ready after {timeout_s:.0f}s:\n{self.tree.tail()}")

    def stats(self) -> dict[str, Any]:
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            out: dict[str, Any] = client.get(f"{self.url}/v1/stats").json()
            return out

    def kill(self) -> None:
        if self.tree is not None:
            self.tree.kill_all()

    def stop(self) -> None:
        if self.tree is not None:
            self.tree.stop(10.0)


class TieredInstance:
    """One engine and its tierd."""

    def __init__(self, index: int, cfg: TieredConfig, run_dir: Path, array_dir: Path) -> None:
        fc = cfg.fleet
        block = fc.block_size or 128
        name = f"tierd-{index}"
        self.tierd = TierdProcess(
            name,
            run_dir,
            [
                cfg.python,
                "-m",
                "tierd.cli",
                "serve",
                "--instance-id",
                name,
                "--l1-bytes",
                str(cfg.l1_bytes),
                "--slice-bytes",
                str(kv_block_bytes(fc.model_dir, block)),
                "--array-dir",
                str(array_dir),
                "--snapshot-dir",
                str(run_dir / f"snapshots-{index}"),
                "--log-level",
                "info",
                # one machine: a peer's fresh slice is in the page cache; O_DIRECT rereads it
                "--no-array-o-direct",
                "--events-endpoint",
                f"ipc://{run_dir}/{name}.events",
                *(["--redis-url", cfg.redis_url, "--pool", cfg.pool] if cfg.redis_url else []),
            ],
            cfg.source_root,
        )
        self.events_endpoint = f"ipc://{run_dir}/{name}.events"
        self.stats_dir = run_dir / f"connector-{index}"
        ecfg = replace(
            fc,
            engines=1,
            extra_args=[
                *fc.extra_args,
                "--kv-transfer-config",
                connector_config(
                    self.tierd.socket,
                    self.stats_dir,
                    cfg.loads[index] if index < len(cfg.loads) else cfg.load,
                    cfg.lookups[index] if index < len(cfg.lookups) else cfg.lookup,
                    cfg.saves[index] if index < len(cfg.saves) else cfg.save,
                ),
            ],
            extra_env={**fc.extra_env, **source_env(cfg.source_root)},
        )
        ncpu = os.cpu_count() or 1
        core = fc.cores[index] if fc.cores else index % ncpu
        port = fc.ports[index] if fc.ports else free_port(fc.host)
        self.engine = VllmEngine(ecfg, index, port, core, run_dir)
        if self.engine.kv_events_endpoint is not None:  # BlockRemoved: a block left the engine
            self.tierd.args += ["--engine-events", self.engine.kv_events_endpoint]

    def stats(self) -> dict[str, int]:
        """The connector's counters, scheduler and worker side summed."""
        total: dict[str, int] = {}
        for f in sorted(self.stats_dir.glob("*.json")) if self.stats_dir.is_dir() else []:
            with contextlib.suppress(OSError, ValueError):
                for k, v in json.loads(f.read_text()).items():
                    total[k] = total.get(k, 0) + int(v)
        return total


class TieredFleet:
    """Engines with tierds, started together; `stop()` leaves nothing behind."""

    def __init__(self, cfg: TieredConfig) -> None:
        run_dir = cfg.fleet.run_dir
        if run_dir is None:
            raise FleetConfigError("a tiered fleet needs a run_dir (sockets, logs, the array)")
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self.cfg = cfg.fleet  # what VllmFleet's users read (hash seed, algorithm, ...)
        self.tiered = cfg
        self.array_dir = cfg.array_dir or run_dir / "array"
        self.instances = [
            TieredInstance(i, cfg, run_dir, self.array_dir) for i in range(cfg.fleet.engines)
        ]

    def __iter__(self) -> Iterator[VllmEngine]:
        return iter(self.engines)

    def __enter__(self) -> TieredFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def engines(self) -> list[VllmEngine]:
        """The engines, as `VllmFleet.engines` (a tiered fleet stands in for a plain one)."""
        return [inst.engine for inst in self.instances]

    @property
    def tierd_urls(self) -> dict[str, str]:
        """Engine id -> its tierd's HTTP API (the gateway's `tierd_url`)."""
        return {inst.engine.id: inst.tierd.url for inst in self.instances}

    @property
    def tierd_events(self) -> dict[str, str]:
        """Engine id -> its tierd's residency events endpoint (`tierd_events_endpoint`)."""
        return {inst.engine.id: inst.events_endpoint for inst in self.instances}

    def chain_since(self, before: set[Path]) -> list[int]:
        """Block hashes of the slice files added to the array since `before` (a set of
        paths), in chain order by their parent links: one prompt's blocks, first to last."""
        by_parent: dict[int | None, int] = {}
        for path in set(self.array_dir.glob("??/*.slice")) - before:
            with open(path, "rb") as f:
                meta = decode_header(f.read(HEADER_BYTES))
            by_parent[meta.parent] = meta.hash
        chain: list[int] = []
        parent: int | None = None
        while parent in by_parent:
            parent = by_parent.pop(parent)
            chain.append(parent)
        return chain

    def start(self) -> None:
        try:
            for inst in self.instances:
                inst.tierd.start()
            for inst in self.instances:
                inst.engine.start()
            for inst in self.instances:
                inst.engine.wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for inst in self.instances:
            with contextlib.suppress(Exception):
                inst.engine.stop()
            with contextlib.suppress(Exception):
                inst.tierd.stop()
